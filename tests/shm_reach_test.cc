// Shared memory reaches every host shard on its host, as CLI.md says: a
// shard too small for a segment of its own (it lives in the worker's
// private memory) is staged through the worker's shared memory for a
// same-host reader, so `--transport=shm` reads it — regions, rows and
// whole tensors — instead of refusing it; a put forced to shared memory
// writes such shards too.
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/npy_file.h"
#include "client/tessera_client.h"
#include "gtest/gtest.h"
#include "tests/cluster.h"
#include "tests/test_arrays.h"

namespace tessera {
namespace {

class ShmReachTest : public ClusterSuite<ShmReachTest> {};

TEST_F(ShmReachTest, SmallShardsAreReadThroughSharedMemoryToo) {
  InitSpec arange;
  arange.kind = InitSpec::Kind::kArange;
  // 4 KiB shards: far below the size from which shards get a segment.
  ASSERT_TRUE(client_
                  ->Create("small", {64, 64}, DType::kInt32,
                           LayoutSpec::Chunk(0, Ranks({0, 1, 2, 3})), arange)
                  .ok());
  const std::string dir = std::getenv("TEST_TMPDIR");
  const std::string cli = TestCluster::BinaryPath("client/tessera");
  const std::string coordinator =
      absl::StrCat("--coordinator=", cluster_->coordinator_address());
  // The whole tensor, and a region across shards.
  for (const std::vector<std::string>& how :
       {std::vector<std::string>{}, {"--region=10:40,5:9"}}) {
    std::vector<std::string> argv = {
        cli,     coordinator, "--transport=shm",
        "get",   "small",     absl::StrCat("--output=", dir, "/s.npy"),
        "--json"};
    argv.insert(argv.end(), how.begin(), how.end());
    std::string out, err;
    ASSERT_EQ(TestCluster::Run(argv, &out, &err), 0) << err;
    EXPECT_TRUE(absl::StrContains(out, "\"transport\": {\"shm\": ")) << out;
    absl::StatusOr<HostArray> got =
        ReadNpyFile(absl::StrCat(dir, "/s.npy"), std::nullopt);
    ASSERT_TRUE(got.ok()) << got.status();
    if (how.empty()) {
      for (int i = 0; i < 64 * 64; ++i) ASSERT_EQ(got->As<int32_t>()[i], i);
    } else {
      EXPECT_EQ(got->As<int32_t>()[0], 10 * 64 + 5);
      EXPECT_EQ(got->As<int32_t>()[got->NumElements() - 1], 39 * 64 + 8);
    }
  }
  // Rows, through the SDK forced to shared memory.
  ClientOptions shm;
  shm.transport = "shm";
  auto client = Client::Connect(cluster_->coordinator_address(), shm);
  ASSERT_TRUE(client.ok()) << client.status();
  const std::vector<int64_t> rows = {63, 0, 17, 17};
  absl::StatusOr<HostArray> gathered = (*client)->GatherRows("small", rows);
  ASSERT_TRUE(gathered.ok()) << gathered.status();
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(gathered->As<int32_t>()[i * 64], rows[i] * 64);
  }
  EXPECT_GT((*client)->TransferStats().bytes.at("shm"), 0);
}

// Writes reach them too: a put forced to shared memory whose shards are
// too small for a segment (kept in the workers' private memory) succeeds,
// from the CLI and the SDK, its bytes counted as shm and read back whole.
TEST_F(ShmReachTest, SmallShardsAreWrittenThroughSharedMemoryToo) {
  const HostArray data = Iota(DType::kInt32, {64, 64}, 4);
  const std::string npy =
      absl::StrCat(std::getenv("TEST_TMPDIR"), "/small-put.npy");
  ASSERT_TRUE(WriteNpyFile(npy, data).ok());
  std::string out, err;
  ASSERT_EQ(
      TestCluster::Run(
          {TestCluster::BinaryPath("client/tessera"),
           absl::StrCat("--coordinator=", cluster_->coordinator_address()),
           "--transport=shm", "put", "small-put", "--input=" + npy,
           "--chunk_dim=0", "--placements=w0,w1,w2,w3", "--json"},
          &out, &err),
      0)
      << err;
  absl::StatusOr<HostArray> back = client_->Get("small-put");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(SameBytes(*back, data));

  ClientOptions shm;
  shm.transport = "shm";
  auto client = Client::Connect(cluster_->coordinator_address(), shm);
  ASSERT_TRUE(client.ok()) << client.status();
  const HostArray more = Iota(DType::kFloat32, {32, 16}, 5);
  ASSERT_TRUE((*client)
                  ->Put("small-put-sdk", more,
                        LayoutSpec::Chunk(1, Ranks({3, 2, 1, 0})))
                  .ok());
  EXPECT_EQ((*client)->TransferStats().bytes.at("shm"), more.num_bytes);
  back = client_->Get("small-put-sdk");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(SameBytes(*back, more));
}

}  // namespace
}  // namespace tessera
