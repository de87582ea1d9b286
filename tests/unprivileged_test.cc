// Workers as the image runs them: uid 10001, no capabilities (deploy/).
// What they write is read back by the same user: a checkpoint `tessera
// save` wrote (every file 0644, owned by the worker's user) loads back in
// another layout, and the shards a --store_dir keeps (0600) are served
// again after a SIGKILL. As root nothing of this shows: root opens a file
// whatever its mode. And a worker at its limit of tasks (a container's pid
// limit) refuses the data connections it has no thread for, and lives on.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/tessera_client.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cluster.h"
#include "tests/test_arrays.h"

namespace tessera {
namespace {

constexpr uid_t kImageUser = 10001;

struct Result {
  int code = -1;
  std::string out;
  std::string err;
};

// Every file under `dir` with its owner and permission bits.
void ExpectFiles(const std::string& dir, mode_t mode, int* count) {
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    struct stat st {};
    ASSERT_EQ(stat(entry.path().c_str(), &st), 0);
    EXPECT_EQ(st.st_uid, kImageUser) << entry.path();
    EXPECT_EQ(st.st_mode & 0777, mode) << entry.path();
    ++*count;
  }
}

// A directory of its own (removed with it) holding a copy of the worker:
// Bazel's output tree lies under a home no other user may enter.
class WorkerCopy {
 public:
  WorkerCopy() {
    char base_template[] = "/tmp/tessera-uid10001-XXXXXX";
    if (mkdtemp(base_template) == nullptr) {
      ADD_FAILURE() << std::strerror(errno);
      return;
    }
    base_ = base_template;
    EXPECT_EQ(chmod(base_.c_str(), 0755), 0);
    std::filesystem::copy_file(TestCluster::BinaryPath("worker/tessera-worker"),
                               binary());
    EXPECT_EQ(chmod(binary().c_str(), 0755), 0);
  }
  ~WorkerCopy() {
    if (!base_.empty()) std::filesystem::remove_all(base_);
  }
  const std::string& base() const { return base_; }
  std::string binary() const { return base_ + "/tessera-worker"; }

 private:
  std::string base_;
};

// Runs a worker as `uid` (the command line before the worker's).
std::vector<std::string> AsUser(uid_t uid) {
  return {"/usr/bin/setpriv", absl::StrCat("--reuid=", uid),
          absl::StrCat("--regid=", uid), "--clear-groups", "--"};
}

TEST(UnprivilegedWorkerTest, SavesLoadsAndKeepsShardsAsTheImageUser) {
  ASSERT_EQ(geteuid(), 0u)
      << "this test starts workers as uid 10001 and needs root to do so";
  // The worker's files go in a directory of its user's.
  const WorkerCopy copy;
  ASSERT_FALSE(copy.base().empty());
  const std::string& base = copy.base();
  const std::string worker = copy.binary();
  const std::string root = base + "/ckpt";
  for (const std::string& dir :
       {root, base + "/store-w0", base + "/store-w1", base + "/store-w2"}) {
    ASSERT_EQ(mkdir(dir.c_str(), 0755), 0);
    ASSERT_EQ(chown(dir.c_str(), kImageUser, kImageUser), 0);
  }

  TestClusterOptions options;
  options.num_workers = 3;
  options.worker_binary = worker;
  options.worker_prefix = [](int) { return AsUser(kImageUser); };
  options.per_worker_flags = [&](int i) {
    return std::vector<std::string>{
        "--checkpoint_root=" + root,
        absl::StrCat("--store_dir=", base, "/store-w", i)};
  };
  absl::StatusOr<std::unique_ptr<TestCluster>> cluster =
      TestCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  // Each worker does run as the image user.
  for (int i = 0; i < 3; ++i) {
    struct stat st {};
    ASSERT_EQ(
        stat(absl::StrCat("/proc/", (*cluster)->worker_pid(i)).c_str(), &st),
        0);
    EXPECT_EQ(st.st_uid, kImageUser);
  }
  absl::StatusOr<std::unique_ptr<Client>> client =
      Client::Connect((*cluster)->coordinator_address());
  ASSERT_OK(client.status());
  auto tessera = [&](const std::vector<std::string>& args) {
    std::vector<std::string> argv = {
        TestCluster::BinaryPath("client/tessera"),
        "--coordinator=" + (*cluster)->coordinator_address()};
    argv.insert(argv.end(), args.begin(), args.end());
    Result r;
    r.code = TestCluster::Run(argv, &r.out, &r.err);
    return r;
  };

  const HostArray data = Iota(DType::kFloat32, {96, 64});
  ASSERT_OK((*client)->Put("w", data, LayoutSpec::Chunk(0, Ranks({0, 1, 2}))));
  Result r = tessera({"save", "saved/one", "w"});
  ASSERT_EQ(r.code, 0) << r.err;
  int files = 0;
  ExpectFiles(root + "/saved/one", 0644, &files);
  EXPECT_GE(files, 4);  // tessera.json and a file per worker

  r = tessera({"load", "saved/one", "--chunk_dim=-1", "--placements=w2,w1,w0",
               "--prefix=back/"});
  ASSERT_EQ(r.code, 0) << r.err;
  absl::StatusOr<HostArray> back = (*client)->Get("back/w");
  ASSERT_OK(back.status());
  EXPECT_TRUE(SameBytes(*back, data));

  // The store's shard files are the worker's own, private, and taken back.
  int shards = 0;
  ExpectFiles(base + "/store-w1/shards", 0600, &shards);
  EXPECT_GE(shards, 2);  // a shard of w and one of back/w, with records
  (*cluster)->StopWorker(1, SIGKILL);
  ASSERT_OK((*cluster)->RestartWorker(1));
  back = (*client)->Get("w");
  ASSERT_OK(back.status());
  EXPECT_TRUE(SameBytes(*back, data));
  EXPECT_THAT((*cluster)->worker_log(1),
              ::testing::HasSubstr("2 shard(s) re-attached"));
  EXPECT_THAT((*cluster)->worker_log(1),
              ::testing::Not(::testing::ContainsRegex("[1-9] damaged")));
}

// A container's limit on tasks (podman's --pids-limit, a pod's pid limit)
// as RLIMIT_NPROC: a worker that meets it while connections flood its data
// port refuses the ones it has no thread for and lives on; once the flood
// is gone it serves again. Its own user, so that no other test's workers
// count toward the limit.
TEST(UnprivilegedWorkerTest, AWorkerAtItsLimitOfThreadsRefusesConnections) {
  ASSERT_EQ(geteuid(), 0u)
      << "this test starts a worker as another user and needs root to do so";
  constexpr uid_t kFloodedUser = 10003;
  // An idle worker runs about 22 threads; the rest of the limit goes to
  // connections.
  constexpr int kTasks = 64;
  const WorkerCopy copy;
  ASSERT_FALSE(copy.base().empty());
  TestClusterOptions options;
  options.num_workers = 1;
  options.worker_binary = copy.binary();
  options.worker_prefix = [](int) {
    std::vector<std::string> argv = {
        "/usr/bin/prlimit", absl::StrCat("--nproc=", kTasks, ":", kTasks),
        "--"};
    for (std::string& arg : AsUser(kFloodedUser)) argv.push_back(arg);
    return argv;
  };
  absl::StatusOr<std::unique_ptr<TestCluster>> cluster =
      TestCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ClientOptions over_tcp;
  over_tcp.transport = "tcp";
  absl::StatusOr<std::unique_ptr<Client>> client =
      Client::Connect((*cluster)->coordinator_address(), over_tcp);
  ASSERT_OK(client.status());
  const HostArray data = Iota(DType::kFloat32, {256, 64});
  ASSERT_OK((*client)->Put("f", data, LayoutSpec::Chunk(0, Ranks({0}))));
  absl::StatusOr<std::vector<WorkerInfo>> workers = (*client)->Workers();
  ASSERT_OK(workers.status());
  ASSERT_EQ(workers->size(), 1u);
  const std::string& data_address = (*workers)[0].data_address;
  const size_t colon = data_address.rfind(':');
  ASSERT_NE(colon, std::string::npos) << data_address;
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port =
      htons(static_cast<uint16_t>(std::stoi(data_address.substr(colon + 1))));
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);

  // Three times the limit of connections, held open.
  std::vector<int> flood;
  auto close_flood = absl::MakeCleanup([&] {
    for (int fd : flood) close(fd);
  });
  for (int i = 0; i < 3 * kTasks; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(fd, 0) << std::strerror(errno);
    flood.push_back(fd);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)), 0)
        << std::strerror(errno);
  }
  const std::string said = "no thread to serve a connection";
  const absl::Time give_up = absl::Now() + absl::Seconds(20);
  while (!absl::StrContains((*cluster)->worker_log(0), said) &&
         absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_THAT((*cluster)->worker_log(0), ::testing::HasSubstr(said));
  // Alive, not a zombie waiting to be reaped.
  std::ifstream stat_file(
      absl::StrCat("/proc/", (*cluster)->worker_pid(0), "/stat"));
  std::string stat;
  std::getline(stat_file, stat);
  const size_t name_end = stat.rfind(')');
  ASSERT_NE(name_end, std::string::npos) << stat;
  EXPECT_NE(stat.substr(name_end + 2, 1), "Z") << "the worker died";
  EXPECT_THAT((*cluster)->worker_log(0),
              ::testing::Not(::testing::HasSubstr("terminate called")));

  // The flood gone, its threads end and the port serves again.
  std::move(close_flood).Invoke();
  absl::StatusOr<HostArray> back;
  for (int attempt = 0; attempt < 50; ++attempt) {
    back = (*client)->Get("f");
    if (back.ok()) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_OK(back.status());
  EXPECT_TRUE(SameBytes(*back, data));
}

}  // namespace
}  // namespace tessera
