#include "client/testing/local_cluster.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/tessera_client.h"

namespace tessera {
namespace {

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

// Starts argv with stdout and stderr to `out` and `err` (paths).
pid_t Spawn(const std::vector<std::string>& argv, const std::string& out,
            const std::string& err) {
  const pid_t pid = fork();
  if (pid == 0) {
    const int o = open(out.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    const int e = open(err.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (o >= 0) dup2(o, 1);
    if (e >= 0) dup2(e, 2);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  return pid;
}

int WaitExit(pid_t pid) {
  int status = 0;
  if (waitpid(pid, &status, 0) < 0) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

std::string LocalCluster::BinaryPath(const std::string& target) {
  if (const char* dir = std::getenv("TESSERA_BIN_DIR");
      dir != nullptr && *dir != '\0') {
    return absl::StrCat(dir, "/", target);
  }
  if (const char* srcdir = std::getenv("TEST_SRCDIR"); srcdir != nullptr) {
    return absl::StrCat(srcdir, "/tessera/", target);
  }
  return absl::StrCat("bazel-bin/", target);
}

LocalCluster::Result LocalCluster::Run(const std::vector<std::string>& argv) {
  static int counter = 0;
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string base = absl::StrCat(tmp != nullptr ? tmp : "/tmp",
                                        "/run_", getpid(), "_", counter++);
  const std::string out = base + ".out", err = base + ".err";
  Result r;
  r.code = WaitExit(Spawn(argv, out, err));
  r.out = ReadFile(out);
  r.err = ReadFile(err);
  unlink(out.c_str());
  unlink(err.c_str());
  return r;
}

LocalCluster::Result LocalCluster::Tessera(
    const std::vector<std::string>& args) const {
  std::vector<std::string> argv = {BinaryPath("client/tessera"),
                                   absl::StrCat("--coordinator=", address_)};
  argv.insert(argv.end(), args.begin(), args.end());
  return Run(argv);
}

absl::StatusOr<std::unique_ptr<LocalCluster>> LocalCluster::Start(
    int num_workers) {
  std::unique_ptr<LocalCluster> c(new LocalCluster());
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string pattern =
      absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/local_cluster_XXXXXX");
  if (mkdtemp(pattern.data()) == nullptr) {
    return absl::InternalError("mkdtemp failed");
  }
  c->dir_ = pattern;
  c->address_ = absl::StrCat("127.0.0.1:", FreePort());
  const std::string log = c->dir_ + "/coordinator.log";
  c->coordinator_ =
      Spawn({BinaryPath("coordinator/tessera-coordinator"),
             absl::StrCat("--listen=", c->address_)},
            log, log);
  for (int i = 0; i < num_workers; ++i) {
    const std::string wlog = absl::StrCat(c->dir_, "/w", i, ".log");
    c->workers_.push_back(
        Spawn({BinaryPath("worker/tessera-worker"),
               absl::StrCat("--coordinator=", c->address_),
               absl::StrCat("--listen=127.0.0.1:", FreePort()),
               absl::StrCat("--name=w", i), absl::StrCat("--rank=", i)},
              wlog, wlog));
  }
  if (absl::Status s = c->WaitAlive(num_workers); !s.ok()) return s;
  return c;
}

absl::Status LocalCluster::WaitAlive(int num_workers) {
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  std::string last = "not checked";
  while (absl::Now() < deadline) {
    ClientOptions options;
    options.connect_timeout = absl::Seconds(2);
    auto client = Client::Connect(address_, options);
    if (client.ok()) {
      auto workers = (*client)->Workers();
      if (workers.ok()) {
        int alive = 0;
        for (const WorkerInfo& w : *workers) alive += w.alive ? 1 : 0;
        if (alive == num_workers) return absl::OkStatus();
        last = absl::StrCat(alive, " of ", num_workers, " workers alive");
      } else {
        last = workers.status().ToString();
      }
    } else {
      last = client.status().ToString();
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("cluster did not come up: ", last, "\ncoordinator log:\n",
                   ReadFile(dir_ + "/coordinator.log")));
}

void LocalCluster::KillWorker(int i) {
  if (workers_[i] <= 0) return;
  kill(workers_[i], SIGKILL);
  WaitExit(workers_[i]);
  workers_[i] = -1;
}

LocalCluster::~LocalCluster() {
  for (pid_t w : workers_) {
    if (w > 0) kill(w, SIGTERM);
  }
  for (pid_t w : workers_) {
    if (w > 0) WaitExit(w);
  }
  if (coordinator_ > 0) {
    kill(coordinator_, SIGTERM);
    WaitExit(coordinator_);
  }
}

}  // namespace tessera
