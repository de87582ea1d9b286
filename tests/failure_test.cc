// Fault tests on real processes: workers killed mid-transfer or restarted
// empty, the coordinator killed and restarted from its --data_dir, a torn
// metadata log. Every case ends in a clear error or a full recovery, never
// in wrong data or a hang.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <utility>

#include "client/tessera_client.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cluster.h"
#include "tests/test_arrays.h"

namespace tessera {
namespace {

using ::tessera::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

// Long enough that a worker starved of CPU on a loaded 2-core machine still
// heartbeats in time; short enough that lease expiry is quick to observe.
constexpr int kLeaseMs = 2500;

TestClusterOptions FaultOptions() {
  TestClusterOptions options;
  options.durable = true;
  options.coordinator_flags = {"--lease_ms=" + std::to_string(kLeaseMs),
                               "--heartbeat_ms=200", "--retire_grace_ms=200"};
  return options;
}

// Waits until `workers` reports `name` as alive == want.
void WaitAlive(Client& client, const std::string& name, bool want) {
  for (int i = 0; i < 200; ++i) {
    auto workers = client.Workers();
    if (workers.ok()) {
      for (const WorkerInfo& w : *workers) {
        if (w.name == name && w.alive == want) return;
      }
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  FAIL() << name << " never became " << (want ? "alive" : "dead");
}

TEST(FailureTest, WorkerKilledMidGatherFailsClearlyAndOthersKeepWorking) {
  auto cluster = TestCluster::Start(FaultOptions());
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto client = Connect(**cluster);
  ASSERT_NE(client, nullptr);
  HostArray small = Iota(DType::kFloat32, {64, 64});
  ASSERT_OK(
      client->Put("elsewhere", small, LayoutSpec::Chunk(0, Ranks({0, 2, 3}))));
  HostArray big = Iota(DType::kFloat32, {16384, 4096});  // 256 MiB
  ASSERT_OK(client->Put("big", big, LayoutSpec::Chunk(0, Ranks({0, 1, 2, 3}))));

  absl::Status gather_status;
  absl::Duration elapsed;
  std::thread reader([&] {
    const absl::Time start = absl::Now();
    HostArray out = HostArray::Allocate(DType::kFloat32, big.shape);
    gather_status =
        client->GetInto("big", std::nullopt, out.data(), out.num_bytes);
    elapsed = absl::Now() - start;
    if (gather_status.ok()) {
      EXPECT_TRUE(SameBytes(out, big));
    }
  });
  absl::SleepFor(absl::Milliseconds(20));
  (*cluster)->StopWorker(1, SIGKILL);
  reader.join();
  if (gather_status.ok()) {
    // The gather won the race; the next one must fail.
    gather_status = client->Get("big").status();
  }
  EXPECT_THAT(gather_status,
              StatusIs(absl::StatusCode::kUnavailable,
                       AllOf(HasSubstr("w1"), HasSubstr("unavailable"))));
  EXPECT_LT(elapsed, absl::Milliseconds(kLeaseMs) + absl::Seconds(4))
      << "the gather hung";

  // Once the lease expires, reads fail fast before any transfer, naming the
  // worker.
  WaitAlive(*client, "w1", false);
  auto meta = client->Describe("big");
  ASSERT_OK(meta);
  EXPECT_FALSE(meta->shards[1].replicas[0].available);
  EXPECT_TRUE(meta->shards[0].replicas[0].available);
  EXPECT_THAT(
      client->Get("big", Box{{5000, 0}, {10, 10}}).status(),
      StatusIs(absl::StatusCode::kUnavailable,
               AllOf(HasSubstr("big"), HasSubstr("shard 1"), HasSubstr("w1"))));
  // Regions and tensors that avoid w1 keep working.
  auto rows = client->Get("big", Box{{0, 0}, {100, 4096}});
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_TRUE(SameBytes(*rows, Slice(big, Box{{0, 0}, {100, 4096}})));
  auto other = client->Get("elsewhere");
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_TRUE(SameBytes(*other, small));
}

// Zones are what each worker's --zone says (its host's name without one),
// and a worker past its lease is shown dead, keeping its zone.
TEST(FailureTest, WorkersShowTheirZonesAndADeadWorkerIsDead) {
  TestClusterOptions options = FaultOptions();
  options.num_workers = 3;
  options.per_worker_flags = [](int i) -> std::vector<std::string> {
    if (i == 2) return {};
    return {"--zone=rack-" + std::to_string(i)};
  };
  auto cluster = TestCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto client = Connect(**cluster);
  ASSERT_NE(client, nullptr);
  char host[256] = {};
  ASSERT_EQ(gethostname(host, sizeof(host) - 1), 0);
  auto zones = [&]() {
    std::map<std::string, std::pair<std::string, WorkerState>> out;
    auto workers = client->Workers();
    EXPECT_TRUE(workers.ok()) << workers.status();
    if (workers.ok()) {
      for (const WorkerInfo& w : *workers) out[w.name] = {w.zone, w.state};
    }
    return out;
  };
  using Entry = std::pair<std::string, WorkerState>;
  auto before = zones();
  EXPECT_EQ(before["w0"], Entry("rack-0", WorkerState::kReady));
  EXPECT_EQ(before["w1"], Entry("rack-1", WorkerState::kReady));
  EXPECT_EQ(before["w2"], Entry(host, WorkerState::kReady));

  (*cluster)->StopWorker(1, SIGKILL);
  WaitAlive(*client, "w1", false);
  auto after = zones();
  EXPECT_EQ(after["w1"], Entry("rack-1", WorkerState::kDead));
  EXPECT_EQ(after["w0"].second, WorkerState::kReady);

  // A malformed zone stops the worker before it serves, saying so.
  for (const std::string& zone :
       {std::string("two words"), std::string(65, 'z'), std::string("a;b")}) {
    std::string out, err;
    EXPECT_EQ(TestCluster::Run(
                  {TestCluster::BinaryPath("worker/tessera-worker"),
                   "--coordinator=" + (*cluster)->coordinator_address(),
                   "--listen=127.0.0.1:0", "--name=odd", "--zone=" + zone},
                  &out, &err),
              2);
    EXPECT_THAT(out + err, HasSubstr("--zone=" + zone.substr(0, 64)));
  }
  EXPECT_EQ(zones().count("odd"), 0u);
}

// With two replicas per shard, a worker's death loses no data: once its
// lease ends, every read is served by the surviving replicas, which were
// written by the put like the first ones.
TEST(FailureTest, AReplicatedTensorOutlivesAWorker) {
  TestClusterOptions options = FaultOptions();
  // What reads do before any repair (replica_repair_test covers repair).
  options.coordinator_flags.push_back("--repair=false");
  options.per_worker_flags = [](int i) -> std::vector<std::string> {
    return {"--zone=zone-" + std::to_string(i % 2)};
  };
  auto cluster = TestCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto client = Connect(**cluster);
  ASSERT_NE(client, nullptr);
  HostArray data = Iota(DType::kFloat32, {64, 100});
  ASSERT_OK(client->Put("kept", data, ReplicatedChunks({0, 1, 2, 3}, 2)));
  ASSERT_OK_AND_ASSIGN(TensorMetadata meta, client->Describe("kept"));
  std::map<std::string, std::string> zone_of = {
      {"w0", "zone-0"}, {"w1", "zone-1"}, {"w2", "zone-0"}, {"w3", "zone-1"}};
  for (size_t i = 0; i < meta.shards.size(); ++i) {
    const Replicas& replicas = meta.shards[i].replicas;
    ASSERT_EQ(replicas.size(), 2u);
    EXPECT_EQ(replicas[0].worker, "w" + std::to_string(i));
    // The second replica is on the other zone.
    EXPECT_NE(zone_of[replicas[1].worker], zone_of[replicas[0].worker]);
  }

  (*cluster)->StopWorker(0, SIGKILL);
  // Before its lease ends w0 still looks available: a whole or region read
  // goes on to the other replica of the shards it cannot get from w0.
  ASSERT_OK_AND_ASSIGN(HostArray early, client->Get("kept"));
  EXPECT_TRUE(SameBytes(early, data));
  WaitAlive(*client, "w0", false);
  ASSERT_OK_AND_ASSIGN(HostArray whole, client->Get("kept"));
  EXPECT_TRUE(SameBytes(whole, data));
  ASSERT_OK_AND_ASSIGN(HostArray rows, client->GatherRows("kept", {0, 15, 63}));
  EXPECT_EQ(rows.shape, (Shape{3, 100}));
  ASSERT_OK_AND_ASSIGN(meta, client->Describe("kept"));
  for (const Replica& r : meta.shards[0].replicas) {
    EXPECT_EQ(r.available, r.worker != "w0") << r.worker;
  }
  // A one-replica tensor on the dead worker is unavailable, as before.
  EXPECT_THAT(client->Put("lone", data, LayoutSpec::Chunk(0, Ranks({0}))),
              StatusIs(absl::StatusCode::kUnavailable));
}

TEST(FailureTest, RestartedWorkerWithoutItsShardsLeavesThemLostNeverZeros) {
  auto cluster = TestCluster::Start(FaultOptions());
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto client = Connect(**cluster);
  ASSERT_NE(client, nullptr);
  HostArray a = Iota(DType::kInt32, {40, 10}, 4);
  ASSERT_OK(client->Put("lost", a, LayoutSpec::Chunk(0, Ranks({0, 1}))));
  (*cluster)->StopWorker(1, SIGKILL);
  ASSERT_OK((*cluster)->RestartWorker(1));
  WaitAlive(*client, "w1", true);
  auto meta = client->Describe("lost");
  ASSERT_OK(meta);
  EXPECT_TRUE(meta->shards[0].replicas[0].available);
  EXPECT_FALSE(meta->shards[1].replicas[0].available);
  EXPECT_THAT(client->Get("lost").status(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("w1")));
  auto first_half = client->Get("lost", Box{{0, 0}, {20, 10}});
  ASSERT_OK(first_half);
  EXPECT_TRUE(SameBytes(*first_half, Slice(a, Box{{0, 0}, {20, 10}})));
  // New tensors can use the restarted worker.
  ASSERT_OK(client->Put("fresh", a, LayoutSpec::Chunk(0, Ranks({1}))));
  auto fresh = client->Get("fresh");
  ASSERT_OK(fresh);
  EXPECT_TRUE(SameBytes(*fresh, a));
}

TEST(FailureTest, CoordinatorKilledAndRestartedServesEveryTensorAgain) {
  auto cluster = TestCluster::Start(FaultOptions());
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  std::vector<HostArray> arrays;
  {
    auto client = Connect(**cluster);
    ASSERT_NE(client, nullptr);
    for (int i = 0; i < 5; ++i) {
      arrays.push_back(Iota(DType::kFloat64, {30 + i, 7}, i));
      ASSERT_OK(client->Put("model.layers." + std::to_string(i) + ".weight",
                            arrays.back(),
                            LayoutSpec::Chunk(i % 2, Ranks({0, 1, 2, 3}))));
    }
    ASSERT_OK(client->Reshard("model.layers.0.weight",
                              LayoutSpec::Chunk(0, Ranks({3}))));
    ASSERT_OK(client->Delete("model.layers.4.weight"));
  }
  EXPECT_EQ((*cluster)->StopCoordinator(SIGKILL), 128 + SIGKILL);
  ASSERT_OK((*cluster)->RestartCoordinator());
  auto client = Connect(**cluster);
  ASSERT_NE(client, nullptr);
  auto list = client->List();
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->size(), 4u);
  for (int i = 0; i < 4; ++i) {
    const std::string name = "model.layers." + std::to_string(i) + ".weight";
    auto got = client->Get(name);
    ASSERT_TRUE(got.ok()) << name << ": " << got.status();
    EXPECT_TRUE(SameBytes(*got, arrays[i])) << name;
  }
  auto meta = client->Describe("model.layers.0.weight");
  ASSERT_OK(meta);
  EXPECT_EQ(meta->version, 2u);
  EXPECT_EQ(meta->shards.size(), 1u);
  // New work after the restart gets fresh shard ids and works.
  ASSERT_OK(client->Put("after_restart", arrays[1],
                        LayoutSpec::Chunk(0, Ranks({2, 1}))));
  auto after = client->Get("after_restart");
  ASSERT_OK(after);
  EXPECT_TRUE(SameBytes(*after, arrays[1]));
}

TEST(FailureTest, CoordinatorKilledDuringACreateLeavesNoTrace) {
  auto cluster = TestCluster::Start(FaultOptions());
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  int64_t before = 0;
  {
    auto client = Connect(**cluster);
    ASSERT_NE(client, nullptr);
    ASSERT_OK(client->Put("kept", Iota(DType::kFloat32, {8, 8}),
                          LayoutSpec::Chunk(0, Ranks({0}))));
    before = TotalBytesUsed(*client);
    std::thread creator([&] {
      InitSpec rand;
      rand.kind = InitSpec::Kind::kRand;
      rand.seed = 3;
      // 1 GiB of random fill: long enough to be cut short.
      client
          ->Create("half_made", {1 << 16, 4096}, DType::kFloat32,
                   LayoutSpec::Chunk(0, Ranks({0, 1, 2, 3})), rand)
          .IgnoreError();
    });
    absl::SleepFor(absl::Milliseconds(30));
    (*cluster)->StopCoordinator(SIGKILL);
    creator.join();
  }
  ASSERT_OK((*cluster)->RestartCoordinator());
  auto client = Connect(**cluster);
  ASSERT_NE(client, nullptr);
  EXPECT_THAT(client->Describe("half_made").status(),
              StatusIs(absl::StatusCode::kNotFound));
  auto list = client->List();
  ASSERT_OK(list);
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].name, "kept");
  // Shards the workers allocated for it are freed (reported within a heartbeat
  // or two).
  int64_t after = -1;
  for (int i = 0; i < 100 && after != before; ++i) {
    absl::SleepFor(absl::Milliseconds(100));
    after = TotalBytesUsed(*client);
  }
  EXPECT_EQ(after, before);
}

TEST(FailureTest, CorruptedLastLogRecordRecoversUpToTheRecordBefore) {
  auto cluster = TestCluster::Start(FaultOptions());
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  HostArray a = Iota(DType::kInt16, {12, 5}, 8);
  {
    auto client = Connect(**cluster);
    ASSERT_NE(client, nullptr);
    ASSERT_OK(client->Put("first", a, LayoutSpec::Chunk(0, Ranks({0, 1}))));
    ASSERT_OK(client->Put("second", a, LayoutSpec::Chunk(1, Ranks({2, 3}))));
  }
  (*cluster)->StopCoordinator(SIGKILL);
  const std::string log = (*cluster)->data_dir() + "/log";
  struct stat st;
  ASSERT_EQ(stat(log.c_str(), &st), 0);
  {
    std::fstream f(log, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(st.st_size - 4);
    f.put('\x55');
  }
  ASSERT_OK((*cluster)->RestartCoordinator());
  auto client = Connect(**cluster);
  ASSERT_NE(client, nullptr);
  auto list = client->List();
  ASSERT_OK(list);
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].name, "first");
  auto got = client->Get("first");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(SameBytes(*got, a));
}

TEST(FailureTest, DeadCoordinatorIsOneClearError) {
  TestClusterOptions options = FaultOptions();
  options.num_workers = 1;
  auto cluster = TestCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto client = Connect(**cluster);
  ASSERT_NE(client, nullptr);
  EXPECT_EQ((*cluster)->StopCoordinator(SIGTERM), 0)
      << "SIGTERM is a clean stop";
  EXPECT_THAT(client->List().status(),
              StatusIs(absl::StatusCode::kUnavailable,
                       AllOf(HasSubstr("coordinator"),
                             HasSubstr((*cluster)->coordinator_address()))));
}

TEST(FailureTest, WorkerCapacityIsEnforcedBeforeAllocatingAndChangesNothing) {
  TestClusterOptions options = FaultOptions();
  options.num_workers = 2;
  options.worker_flags = {"--capacity_bytes=1048576"};
  auto cluster = TestCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto client = Connect(**cluster);
  ASSERT_NE(client, nullptr);
  ASSERT_OK(
      client->Create("fits", {256, 1024}, DType::kFloat32,
                     LayoutSpec::Chunk(0, Ranks({0}))));  // exactly 1 MiB on w0
  const int64_t before = TotalBytesUsed(*client);
  EXPECT_THAT(client
                  ->Create("too_big", {512, 1024}, DType::kFloat32,
                           LayoutSpec::Chunk(0, Ranks({0, 1})))
                  .status(),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("w0")));
  EXPECT_THAT(client->Describe("too_big").status(),
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(TotalBytesUsedBecomes(*client, before), before);
  // w1 still has room.
  ASSERT_OK(client->Create("other", {256, 1024}, DType::kFloat32,
                           LayoutSpec::Chunk(0, Ranks({1}))));
}

}  // namespace
}  // namespace tessera
