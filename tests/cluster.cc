#include "tests/cluster.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/tessera_client.h"
#include "core/testing/temp_files.h"
#include "tests/test_arrays.h"

namespace tessera {
namespace {

using ::tessera::testing::ReadFileToString;

int WaitExit(pid_t pid) {
  int status = 0;
  if (waitpid(pid, &status, 0) < 0) return -1;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + WTERMSIG(status);
}

}  // namespace

std::vector<std::string> TlsFlags(const std::string& dir,
                                  const std::string& name) {
  return {absl::StrCat("--tls_ca=", dir, "/ca.crt"),
          absl::StrCat("--tls_cert=", dir, "/", name, ".crt"),
          absl::StrCat("--tls_key=", dir, "/", name, ".key")};
}

std::string FetchMetrics(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string response;
  // A port that never answers fails the fetch instead of hanging the test.
  const timeval timeout{20, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string request =
        "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (write(fd, request.data(), request.size()) ==
        static_cast<ssize_t>(request.size())) {
      char buf[16384];
      for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;)
        response.append(buf, static_cast<size_t>(n));
    }
  }
  close(fd);
  return response;
}

double MetricSum(const std::string& text, const std::string& metric,
                 const std::string& labels) {
  double total = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::StartsWith(line, metric)) continue;
    const absl::string_view rest = line.substr(metric.size());
    if (rest.empty() || (rest[0] != '{' && rest[0] != ' ')) continue;
    if (!labels.empty() && !absl::StrContains(rest, labels)) continue;
    const size_t space = line.rfind(' ');
    double value = 0;
    if (space != absl::string_view::npos &&
        absl::SimpleAtod(line.substr(space + 1), &value)) {
      total += value;
    }
  }
  return total;
}

int64_t TotalBytesUsedBecomes(Client& client, int64_t want) {
  const absl::Time deadline = absl::Now() + absl::Seconds(3);
  int64_t total = TotalBytesUsed(client);
  while (total != want && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(100));
    total = TotalBytesUsed(client);
  }
  return total;
}

int64_t TotalBytesUsed(Client& client) {
  auto workers = client.Workers();
  EXPECT_TRUE(workers.ok()) << workers.status();
  int64_t total = 0;
  if (workers.ok()) {
    for (const WorkerInfo& w : *workers) total += w.bytes_used;
  }
  return total;
}

std::unique_ptr<Client> Connect(const TestCluster& cluster) {
  auto client = Client::Connect(cluster.coordinator_address());
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

absl::Status CreateArange(Client& client, const std::string& name,
                          const Shape& shape,
                          std::initializer_list<int> ranks) {
  InitSpec init;
  init.kind = InitSpec::Kind::kArange;
  return client
      .Create(name, shape, DType::kInt32, LayoutSpec::Chunk(0, Ranks(ranks)),
              init)
      .status();
}

bool Eventually(const std::function<bool()>& done, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(100));
  }
  return done();
}

std::string TestCluster::BinaryPath(const std::string& target) {
  if (const char* dir = std::getenv("TESSERA_BIN_DIR");
      dir != nullptr && *dir != '\0') {
    return absl::StrCat(dir, "/", target);
  }
  if (const char* srcdir = std::getenv("TEST_SRCDIR"); srcdir != nullptr) {
    return absl::StrCat(srcdir, "/tessera/", target);
  }
  return absl::StrCat("bazel-bin/", target);
}

int TestCluster::Run(const std::vector<std::string>& argv, std::string* out,
                     std::string* err) {
  char out_path[] = "/tmp/tessera_run_out_XXXXXX";
  char err_path[] = "/tmp/tessera_run_err_XXXXXX";
  int out_fd = mkstemp(out_path);
  int err_fd = mkstemp(err_path);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(out_fd, 1);
    dup2(err_fd, 2);
    ExecOrExit(argv);
  }
  close(out_fd);
  close(err_fd);
  int code = WaitExit(pid);
  if (out != nullptr) *out = ReadFileToString(out_path);
  if (err != nullptr) *err = ReadFileToString(err_path);
  unlink(out_path);
  unlink(err_path);
  return code;
}

absl::StatusOr<std::unique_ptr<TestCluster>> TestCluster::Start(
    TestClusterOptions options) {
  std::unique_ptr<TestCluster> cluster(new TestCluster());
  cluster->options_ = std::move(options);
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string pattern =
      absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/cluster_XXXXXX");
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  if (mkdtemp(buf.data()) == nullptr)
    return absl::InternalError("mkdtemp failed");
  cluster->dir_ = buf.data();
  if (cluster->options_.durable)
    cluster->data_dir_ = absl::StrCat(cluster->dir_, "/metadata");
  cluster->coordinator_address_ =
      absl::StrCat(cluster->options_.coordinator_host, ":", PickFreePort());
  if (absl::Status s = cluster->StartCoordinator(); !s.ok()) return s;
  cluster->workers_.resize(cluster->options_.num_workers);
  for (int i = 0; i < cluster->options_.num_workers; ++i) {
    cluster->workers_[i].address = cluster->NewWorkerAddress(i);
    if (absl::Status s = cluster->StartWorker(i); !s.ok()) return s;
  }
  // Ports are picked and released before the daemons bind them: another
  // process may take one meanwhile. A worker that could not listen gets a
  // new port (a few times); any other early exit fails the start.
  for (int moved = 0;; ++moved) {
    absl::Status s = cluster->WaitAlive(absl::Seconds(30));
    if (s.ok()) return cluster;
    if (!absl::IsAborted(s) ||
        !absl::StrContains(s.message(), "cannot listen") || moved == 3) {
      return s;
    }
    for (int i = 0; i < cluster->num_workers(); ++i) {
      if (cluster->workers_[i].pid > 0) continue;
      cluster->workers_[i].address = cluster->NewWorkerAddress(i);
      if (absl::Status started = cluster->StartWorker(i); !started.ok()) {
        return started;
      }
    }
  }
}

std::vector<std::string> TestCluster::CoordinatorCommand() const {
  std::vector<std::string> argv = {
      BinaryPath("coordinator/tessera-coordinator"),
      absl::StrCat("--listen=", coordinator_address_)};
  for (const std::string& f : options_.coordinator_flags) argv.push_back(f);
  if (!data_dir_.empty())
    argv.push_back(absl::StrCat("--data_dir=", data_dir_));
  return argv;
}

absl::Status TestCluster::StartCoordinator(
    const std::vector<std::string>& extra_flags) {
  coordinator_.address = coordinator_address_;
  coordinator_.log = absl::StrCat(dir_, "/coordinator.log");
  std::vector<std::string> argv = CoordinatorCommand();
  argv.insert(argv.end(), extra_flags.begin(), extra_flags.end());
  coordinator_.pid = SpawnDaemon(argv, coordinator_.log);
  return coordinator_.pid > 0 ? absl::OkStatus()
                              : absl::InternalError("fork failed");
}

std::string TestCluster::NewWorkerAddress(int i) const {
  const std::string host =
      options_.worker_host ? options_.worker_host(i) : "127.0.0.1";
  return absl::StrCat(host, ":", PickFreePort());
}

absl::Status TestCluster::StartWorker(int i) {
  Process& w = workers_[i];
  w.log = absl::StrCat(dir_, "/", worker_name(i), ".log");
  std::vector<std::string> argv;
  if (options_.worker_prefix) argv = options_.worker_prefix(i);
  for (const std::string& arg :
       {options_.worker_binary.empty() ? BinaryPath("worker/tessera-worker")
                                       : options_.worker_binary,
        absl::StrCat("--coordinator=", coordinator_address_),
        absl::StrCat("--listen=", w.address),
        absl::StrCat("--name=", worker_name(i)), absl::StrCat("--rank=", i)}) {
    argv.push_back(arg);
  }
  for (const std::string& f : options_.worker_flags) {
    argv.push_back(absl::StrReplaceAll(f, {{"{name}", worker_name(i)}}));
  }
  if (options_.per_worker_flags) {
    for (std::string& f : options_.per_worker_flags(i))
      argv.push_back(std::move(f));
  }
  w.pid = SpawnDaemon(argv, w.log, options_.worker_open_files);
  return w.pid > 0 ? absl::OkStatus() : absl::InternalError("fork failed");
}

absl::Status TestCluster::WaitAlive(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Status last = absl::UnavailableError("not checked");
  while (absl::Now() < deadline) {
    ClientOptions options = options_.client;
    options.connect_timeout = absl::Seconds(2);
    // A worker that exited will not come up: say why at once.
    for (int i = 0; i < num_workers(); ++i) {
      Process& w = workers_[i];
      int status = 0;
      if (w.pid > 0 && waitpid(w.pid, &status, WNOHANG) == w.pid) {
        w.pid = -1;
        return absl::AbortedError(absl::StrCat("worker ", worker_name(i),
                                               " exited while starting:\n",
                                               ReadFileToString(w.log)));
      }
    }
    auto client = Client::Connect(coordinator_address_, options);
    if (client.ok()) {
      auto workers = (*client)->Workers();
      if (workers.ok()) {
        int alive = 0;
        for (const WorkerInfo& w : *workers) {
          for (int i = 0; i < num_workers(); ++i) {
            if (workers_[i].pid > 0 && w.name == worker_name(i) && w.alive &&
                w.address == workers_[i].address) {
              ++alive;
            }
          }
        }
        int expected = 0;
        for (const Process& p : workers_) expected += p.pid > 0 ? 1 : 0;
        if (alive == expected) return absl::OkStatus();
        last = absl::UnavailableError(
            absl::StrCat(alive, " of ", expected, " workers alive"));
      } else {
        last = workers.status();
      }
    } else {
      last = client.status();
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("cluster did not come up: ", last.message(),
                   "\ncoordinator log:\n", ReadFileToString(coordinator_.log)));
}

void TestCluster::StopWorker(int i, int sig) {
  Process& w = workers_[i];
  if (w.pid <= 0) return;
  kill(w.pid, sig);
  WaitExit(w.pid);
  w.pid = -1;
}

absl::Status TestCluster::RestartWorker(int i) {
  StopWorker(i, SIGTERM);
  auto registrations = [&] {
    const std::string log = ReadFileToString(workers_[i].log);
    size_t count = 0;
    for (size_t pos = log.find("registered with coordinator");
         pos != std::string::npos;
         pos = log.find("registered with coordinator", pos + 1)) {
      ++count;
    }
    return count;
  };
  const size_t before = registrations();
  if (absl::Status s = StartWorker(i); !s.ok()) return s;
  // The coordinator may still hold the old process's lease: wait for the new
  // process itself to register.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (registrations() == before) {
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(worker_name(i), " did not register again"));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return WaitAlive(absl::Seconds(30));
}

int TestCluster::StopCoordinator(int sig) {
  if (coordinator_.pid <= 0) return -1;
  kill(coordinator_.pid, sig);
  int code = WaitExit(coordinator_.pid);
  coordinator_.pid = -1;
  return code;
}

absl::Status TestCluster::RestartCoordinator(
    const std::vector<std::string>& extra_flags) {
  if (coordinator_.pid > 0) StopCoordinator(SIGTERM);
  if (absl::Status s = StartCoordinator(extra_flags); !s.ok()) return s;
  return WaitAlive(absl::Seconds(30));
}

std::string TestCluster::worker_log(int i) const {
  return ReadFileToString(workers_[i].log);
}

std::string TestCluster::coordinator_log() const {
  return ReadFileToString(coordinator_.log);
}

namespace {

// The value of /proc/PID/status line `field` ("VmRSS:"), in bytes; -1: none.
int64_t StatusBytes(pid_t pid, const std::string& field) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) == 0) {
      return std::strtoll(line.c_str() + field.size(), nullptr, 10) * 1024;
    }
  }
  return -1;
}

}  // namespace

int64_t TestCluster::ResidentBytes(pid_t pid) {
  return StatusBytes(pid, "VmRSS:");
}

int64_t TestCluster::AnonymousResidentBytes(pid_t pid) {
  return StatusBytes(pid, "RssAnon:");
}

TestCluster::~TestCluster() {
  for (Process& w : workers_) {
    if (w.pid > 0) kill(w.pid, SIGTERM);
  }
  for (Process& w : workers_) {
    if (w.pid > 0) WaitExit(w.pid);
  }
  if (coordinator_.pid > 0) {
    kill(coordinator_.pid, SIGTERM);
    WaitExit(coordinator_.pid);
  }
}

TerminalRun RunOnTerminalWithWorkerStopped(const std::string& command,
                                           pid_t worker,
                                           const std::string& log) {
  TerminalRun run;
  kill(worker, SIGSTOP);
  std::thread runner([&] {
    run.code = std::system(
        absl::StrCat("script -qefc '", command, "' ", log, " >/dev/null 2>&1")
            .c_str());
  });
  absl::SleepFor(absl::Milliseconds(2500));
  kill(worker, SIGCONT);
  runner.join();
  std::ifstream in(log);
  run.text.assign(std::istreambuf_iterator<char>(in),
                  std::istreambuf_iterator<char>());
  return run;
}

ProgressLines ProgressOf(const std::string& text, const std::string& label) {
  ProgressLines out;
  for (absl::string_view line : absl::StrSplit(text, '\r')) {
    if (line.find(label) == absl::string_view::npos) continue;
    out.lines.emplace_back(line);
    const size_t open = line.find('(');
    const size_t pct = line.find("%)");
    int64_t percent = -1;
    if (open != absl::string_view::npos && pct != absl::string_view::npos &&
        absl::SimpleAtoi(line.substr(open + 1, pct - open - 1), &percent)) {
      out.partial |= percent > 0 && percent < 100;
    }
  }
  return out;
}

}  // namespace tessera
