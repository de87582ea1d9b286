// Cluster identity on real processes: a coordinator started on an empty
// --data_dir is a new cluster, and workers never free the shards of their
// own cluster on its word. They keep them (quarantined), serve the new
// cluster meanwhile, and give them back to their own coordinator when it
// returns on its original --data_dir.
#include <signal.h>
#include <stdio.h>

#include <filesystem>
#include <memory>
#include <string>

#include "client/tessera_client.h"
#include "core/testing/status_matchers.h"
#include "core/testing/temp_files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cluster.h"
#include "tests/test_arrays.h"

namespace tessera {
namespace {

using ::tessera::testing::ReadFileToString;
using ::testing::HasSubstr;

TEST(ClusterIdentityTest, ACoordinatorOfAnotherClusterNeverFreesTheShards) {
  TestClusterOptions options;
  options.num_workers = 2;
  options.durable = true;
  options.coordinator_flags = {"--heartbeat_ms=200"};
  auto cluster = TestCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string data_dir = (*cluster)->data_dir();
  const HostArray array = Iota(DType::kFloat32, {64, 33}, 7);
  int64_t bytes = 0;
  {
    auto client = Connect(**cluster);
    ASSERT_NE(client, nullptr);
    ASSERT_OK(client->Put("t", array, LayoutSpec::Chunk(0, Ranks({0, 1}))));
    bytes = TotalBytesUsed(*client);
    ASSERT_EQ(bytes, 64 * 33 * 4);
  }

  // The same coordinator address, an empty --data_dir: another cluster.
  ASSERT_EQ((*cluster)->StopCoordinator(SIGTERM), 0);
  ASSERT_EQ(rename(data_dir.c_str(), (data_dir + ".own").c_str()), 0);
  ASSERT_OK((*cluster)->RestartCoordinator());
  {
    auto client = Connect(**cluster);
    ASSERT_NE(client, nullptr);
    auto list = client->List();
    ASSERT_OK(list);
    EXPECT_TRUE(list->empty());
    // Several heartbeats: the workers were told to free every shard they
    // hold, and keep them.
    absl::SleepFor(absl::Seconds(1.5));
    EXPECT_EQ(TotalBytesUsed(*client), bytes);
    // `workers` shows what each keeps for its own cluster.
    auto workers = client->Workers();
    ASSERT_OK(workers);
    int64_t quarantined_bytes = 0;
    for (const WorkerInfo& w : *workers) {
      EXPECT_EQ(w.quarantined_shards, 1) << w.name;
      quarantined_bytes += w.quarantined_bytes;
    }
    EXPECT_EQ(quarantined_bytes, bytes);
    // And so does the CLI.
    const std::string coordinator =
        "--coordinator=" + (*cluster)->coordinator_address();
    std::string out, err;
    ASSERT_EQ(TestCluster::Run({TestCluster::BinaryPath("client/tessera"),
                                coordinator, "workers"},
                               &out, &err),
              0)
        << err;
    EXPECT_THAT(out, HasSubstr("quarantined for another cluster"));
  }
  std::string logs;
  for (int i = 0; i < 2; ++i) {
    logs += ReadFileToString(std::filesystem::path(data_dir).parent_path() /
                             ((*cluster)->worker_name(i) + ".log"));
  }
  EXPECT_THAT(logs, HasSubstr("quarantined"));
  EXPECT_THAT(ReadFileToString(std::filesystem::path(data_dir).parent_path() /
                               "coordinator.log"),
              HasSubstr("NEW CLUSTER"));

  // Their own coordinator returns: the tensor is whole, nothing was lost.
  ASSERT_EQ((*cluster)->StopCoordinator(SIGTERM), 0);
  std::filesystem::remove_all(data_dir);
  ASSERT_EQ(rename((data_dir + ".own").c_str(), data_dir.c_str()), 0);
  ASSERT_OK((*cluster)->RestartCoordinator());
  auto client = Connect(**cluster);
  ASSERT_NE(client, nullptr);
  auto got = client->Get("t");
  ASSERT_OK(got);
  EXPECT_TRUE(SameBytes(*got, array));
  EXPECT_EQ(TotalBytesUsed(*client), bytes);
  logs.clear();
  for (int i = 0; i < 2; ++i) {
    logs += ReadFileToString(std::filesystem::path(data_dir).parent_path() /
                             ((*cluster)->worker_name(i) + ".log"));
  }
  EXPECT_THAT(logs, HasSubstr("rejoined cluster"));
  absl::SleepFor(absl::Milliseconds(600));
  auto workers = client->Workers();
  ASSERT_OK(workers);
  for (const WorkerInfo& w : *workers) {
    EXPECT_EQ(w.quarantined_shards, 0) << w.name;
    EXPECT_EQ(w.quarantined_bytes, 0) << w.name;
  }
  // And it frees them when told to by its own cluster.
  ASSERT_OK(client->Delete("t"));
  EXPECT_EQ(TotalBytesUsedBecomes(*client, 0), 0);
}

TEST(ClusterIdentityTest, QuarantinedShardsAreFreedAfterTheGrace) {
  TestClusterOptions options;
  options.num_workers = 1;
  options.durable = true;
  options.coordinator_flags = {"--heartbeat_ms=200"};
  options.worker_flags = {"--quarantine_grace=2s"};
  auto cluster = TestCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string data_dir = (*cluster)->data_dir();
  {
    auto client = Connect(**cluster);
    ASSERT_NE(client, nullptr);
    ASSERT_OK(client->Put("t", Iota(DType::kFloat32, {16, 16}),
                          LayoutSpec::Chunk(0, Ranks({0}))));
  }
  // Another cluster's coordinator, and the own one never returns.
  ASSERT_EQ((*cluster)->StopCoordinator(SIGTERM), 0);
  std::filesystem::remove_all(data_dir);
  ASSERT_OK((*cluster)->RestartCoordinator());
  auto client = Connect(**cluster);
  ASSERT_NE(client, nullptr);
  absl::SleepFor(absl::Milliseconds(600));
  EXPECT_EQ(TotalBytesUsed(*client), 16 * 16 * 4);
  // Past the grace: freed, and `workers` shows nothing kept.
  const absl::Time deadline = absl::Now() + absl::Seconds(6);
  while (absl::Now() < deadline && TotalBytesUsed(*client) != 0)
    absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(TotalBytesUsed(*client), 0);
  absl::SleepFor(absl::Milliseconds(600));
  auto workers = client->Workers();
  ASSERT_OK(workers);
  EXPECT_EQ((*workers)[0].quarantined_shards, 0);
  EXPECT_THAT(ReadFileToString(std::filesystem::path(data_dir).parent_path() /
                               ((*cluster)->worker_name(0) + ".log")),
              HasSubstr("--quarantine_grace"));
}

}  // namespace
}  // namespace tessera
