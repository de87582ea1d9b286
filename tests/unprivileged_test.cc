// Workers as the image runs them: uid 10001, no capabilities (deploy/).
// What they write is read back by the same user: a checkpoint `tessera
// save` wrote (every file 0644, owned by the worker's user) loads back in
// another layout, and the shards a --store_dir keeps (0600) are served
// again after a SIGKILL. As root nothing of this shows: root opens a file
// whatever its mode.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
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

TEST(UnprivilegedWorkerTest, SavesLoadsAndKeepsShardsAsTheImageUser) {
  ASSERT_EQ(geteuid(), 0u)
      << "this test starts workers as uid 10001 and needs root to do so";
  // Bazel's output tree lies under a home no other user may enter: the
  // worker runs from a copy, its files in a directory of its user's.
  char base_template[] = "/tmp/tessera-uid10001-XXXXXX";
  ASSERT_NE(mkdtemp(base_template), nullptr) << std::strerror(errno);
  const std::string base = base_template;
  auto remove = absl::MakeCleanup([&] { std::filesystem::remove_all(base); });
  ASSERT_EQ(chmod(base.c_str(), 0755), 0);
  const std::string worker = base + "/tessera-worker";
  std::filesystem::copy_file(TestCluster::BinaryPath("worker/tessera-worker"),
                             worker);
  ASSERT_EQ(chmod(worker.c_str(), 0755), 0);
  const std::string root = base + "/ckpt";
  for (const std::string& dir :
       {root, base + "/store-w0", base + "/store-w1", base + "/store-w2"}) {
    ASSERT_EQ(mkdir(dir.c_str(), 0755), 0);
    ASSERT_EQ(chown(dir.c_str(), kImageUser, kImageUser), 0);
  }

  TestClusterOptions options;
  options.num_workers = 3;
  options.worker_binary = worker;
  options.worker_prefix = [](int) {
    return std::vector<std::string>{
        "/usr/bin/setpriv", absl::StrCat("--reuid=", kImageUser),
        absl::StrCat("--regid=", kImageUser), "--clear-groups", "--"};
  };
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

}  // namespace
}  // namespace tessera
