#include "coordinator/worker_registry.h"

#include <atomic>
#include <thread>

#include "absl/time/clock.h"
#include "coordinator/coordinator_testutil.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::tessera::testing::FakeClock;
using ::tessera::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

WorkerRegistration Worker(const std::string& name, std::optional<int32_t> rank,
                          const std::string& address) {
  WorkerRegistration r;
  r.worker.name = name;
  r.rank = rank;
  r.worker.address = address;
  return r;
}

// A worker's durable record, as Restore reads it back.
WorkerInfo Record(const std::string& name, int32_t rank,
                  const std::string& address) {
  WorkerInfo w;
  w.name = name;
  w.rank = rank;
  w.address = address;
  return w;
}

TEST(WorkerRegistryTest, RanksDefaultToTheLowestFree) {
  FakeClock clock;
  WorkerRegistry registry(absl::Seconds(5), clock.AsClock());
  EXPECT_EQ(*registry.Register(Worker("a", 1, "h:1")), 1);
  EXPECT_EQ(*registry.Register(Worker("b", std::nullopt, "h:2")), 0);
  EXPECT_EQ(*registry.Register(Worker("c", std::nullopt, "h:3")), 2);
  auto list = registry.List();
  ASSERT_EQ(list.size(), 3u);
  EXPECT_EQ(list[0].name, "b");
  EXPECT_EQ(list[1].name, "a");
}

TEST(WorkerRegistryTest, AMalformedGpuUuidIsRefusedAndChangesNothing) {
  FakeClock clock;
  WorkerRegistry registry(absl::Seconds(5), clock.AsClock());
  WorkerRegistration gpu = Worker("g", 0, "h:1");
  gpu.worker.gpu_uuid = std::string("GPU-") + std::string(4096, '1');
  EXPECT_THAT(registry.Register(gpu).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("invalid GPU UUID")));
  EXPECT_TRUE(registry.List().empty());
  gpu.worker.gpu_uuid = "GPU-5e1f009a-b23c-4d0e-ff01-23456789abcd";
  ASSERT_OK(registry.Register(gpu));
  EXPECT_EQ(registry.Find("g")->gpu_uuid, gpu.worker.gpu_uuid);
}

TEST(WorkerRegistryTest, TakenRankIsRefused) {
  FakeClock clock;
  WorkerRegistry registry(absl::Seconds(5), clock.AsClock());
  ASSERT_OK(registry.Register(Worker("a", 0, "h:1")));
  EXPECT_THAT(registry.Register(Worker("b", 0, "h:2")).status(),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("rank 0")));
}

TEST(WorkerRegistryTest, AMalformedZoneIsRefusedAndChangesNothing) {
  FakeClock clock;
  WorkerRegistry registry(absl::Seconds(5), clock.AsClock());
  WorkerRegistration w = Worker("z", 0, "h:1");
  for (const std::string& bad :
       {std::string("a b"), std::string(65, 'z'), std::string("x\ny")}) {
    w.worker.zone = bad;
    EXPECT_THAT(
        registry.Register(w).status(),
        StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--zone=")));
  }
  EXPECT_TRUE(registry.List().empty());
  // A worker from before zones registers with none.
  w.worker.zone = "";
  ASSERT_OK(registry.Register(w));
  EXPECT_EQ(registry.Find("z")->zone, "");
  w.worker.zone = "eu-west-1a";
  ASSERT_OK(registry.Register(w));
  EXPECT_EQ(registry.Find("z")->zone, "eu-west-1a");
}

TEST(WorkerRegistryTest, StateIsReadyWhileTheLeaseHoldsThenDead) {
  FakeClock clock;
  WorkerRegistry registry(absl::Seconds(5), clock.AsClock());
  ASSERT_OK(registry.Register(Worker("a", 0, "h:1")));
  EXPECT_EQ(registry.Find("a")->state, WorkerState::kReady);
  EXPECT_EQ(registry.List()[0].state, WorkerState::kReady);
  clock.Advance(absl::Seconds(6));
  EXPECT_EQ(registry.Find("a")->state, WorkerState::kDead);
  EXPECT_EQ(registry.List()[0].state, WorkerState::kDead);
}

TEST(WorkerRegistryTest, LeaseExpiresWithoutHeartbeats) {
  FakeClock clock;
  WorkerRegistry registry(absl::Seconds(5), clock.AsClock());
  ASSERT_OK(registry.Register(Worker("a", 0, "h:1")));
  EXPECT_TRUE(registry.Find("a")->alive);
  clock.Advance(absl::Seconds(4));
  EXPECT_TRUE(registry.Heartbeat("a", {10}));
  clock.Advance(absl::Seconds(5));
  EXPECT_TRUE(registry.Find("a")->alive);
  clock.Advance(absl::Seconds(1) + absl::Milliseconds(1));
  EXPECT_FALSE(registry.Find("a")->alive);
  EXPECT_EQ(registry.Find("a")->bytes_used, 10);
  EXPECT_FALSE(registry.Heartbeat("unknown", {0}));
}

// Heartbeats and the answers to allocations and frees arrive in any order:
// a heartbeat read before a free must not bring back the freed bytes.
TEST(WorkerRegistryTest, AnOlderBytesUsedReadingNeverReplacesANewerOne) {
  FakeClock clock;
  WorkerRegistry registry(absl::Seconds(5), clock.AsClock());
  ASSERT_OK(registry.Register(Worker("a", 0, "h:1")));
  registry.SetBytesUsed("a", {64, 7});             // a free's answer
  EXPECT_TRUE(registry.Heartbeat("a", {128, 6}));  // read before the free
  EXPECT_EQ(registry.Find("a")->bytes_used, 64);
  EXPECT_TRUE(registry.Find("a")->alive);  // the late heartbeat still counts
  registry.SetBytesUsed("a", {0, 6});
  EXPECT_EQ(registry.Find("a")->bytes_used, 64);
  EXPECT_TRUE(registry.Heartbeat("a", {32, 8}));
  EXPECT_EQ(registry.Find("a")->bytes_used, 32);
  // A worker that does not number its readings is taken at its word.
  registry.SetBytesUsed("a", {16, 0});
  EXPECT_EQ(registry.Find("a")->bytes_used, 16);
  // A registration starts over, whatever the number (a worker from before
  // numbered readings, or a clock set back between restarts).
  WorkerRegistration again = Worker("a", 0, "h:1");
  again.worker.bytes_used = 8;
  again.worker.bytes_used_seq = 1;
  ASSERT_OK(registry.Register(again));
  EXPECT_TRUE(registry.Heartbeat("a", {24, 2}));
  EXPECT_EQ(registry.Find("a")->bytes_used, 24);
}

TEST(WorkerRegistryTest, RestartedWorkerKeepsItsRank) {
  FakeClock clock;
  WorkerRegistry registry(absl::Seconds(5), clock.AsClock());
  ASSERT_EQ(*registry.Register(Worker("a", std::nullopt, "h:1")), 0);
  ASSERT_EQ(*registry.Register(Worker("b", std::nullopt, "h:2")), 1);
  // Same address while alive: a restart in place.
  EXPECT_EQ(*registry.Register(Worker("b", std::nullopt, "h:2")), 1);
  // Another address while the first is alive: a name clash.
  EXPECT_THAT(registry.Register(Worker("b", std::nullopt, "h:9")).status(),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("alive")));
  clock.Advance(absl::Seconds(10));
  EXPECT_EQ(*registry.Register(Worker("b", std::nullopt, "h:9")), 1);
  EXPECT_EQ(registry.Find("b")->address, "h:9");
}

TEST(WorkerRegistryTest, ResolveChecksWorkerAndDevice) {
  FakeClock clock;
  WorkerRegistry registry(absl::Seconds(5), clock.AsClock());
  ASSERT_OK(registry.Register(Worker("w0", 0, "h:1")));
  Placement by_rank;
  by_rank.rank = 0;
  EXPECT_EQ(registry.Resolve(by_rank)->name, "w0");
  Placement missing;
  missing.rank = 3;
  EXPECT_THAT(registry.Resolve(missing).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("does not exist")));
  Placement by_name;
  by_name.worker = "w0";
  by_name.device = Device{Device::Kind::kCuda, 0};
  EXPECT_THAT(registry.Resolve(by_name).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("does not exist")));
}

TEST(WorkerRegistryTest, ReservedWorkerIsInvisibleUntilCompleted) {
  FakeClock clock;
  WorkerRegistry registry(absl::Seconds(5), clock.AsClock());
  auto reserved = registry.Reserve(Worker("a", std::nullopt, "h:1"));
  ASSERT_OK(reserved);
  EXPECT_EQ(reserved->rank, 0);
  EXPECT_TRUE(registry.List().empty());
  EXPECT_FALSE(registry.Find("a").has_value());
  EXPECT_FALSE(registry.Heartbeat("a", {0}));
  // Its rank is set aside meanwhile.
  EXPECT_EQ(*registry.Register(Worker("b", std::nullopt, "h:2")), 1);
  EXPECT_THAT(registry.Register(Worker("c", 0, "h:3")).status(),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("'a'")));
  registry.Complete(*reserved);
  ASSERT_TRUE(registry.Find("a").has_value());
  EXPECT_TRUE(registry.Find("a")->alive);
  EXPECT_EQ(registry.Find("a")->rank, 0);
}

TEST(WorkerRegistryTest, ACordonWaitsForARegistrationInFlight) {
  // The registration's record copies the state at Reserve: a cordon made
  // meanwhile would be undone by it, so the cordon waits for Complete.
  FakeClock clock;
  WorkerRegistry registry(absl::Seconds(5), clock.AsClock());
  ASSERT_OK(registry.Register(Worker("a", std::nullopt, "h:1")));
  auto again = registry.Reserve(Worker("a", std::nullopt, "h:1"));
  ASSERT_OK(again);
  EXPECT_EQ(again->state, WorkerState::kReady);
  std::atomic<bool> cordoned{false};
  std::thread cordon([&] {
    WorkerState previous = WorkerState::kDead;
    EXPECT_OK(registry.SetAdminState("a", WorkerState::kCordoned, &previous));
    EXPECT_EQ(previous, WorkerState::kReady);
    cordoned = true;
  });
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_FALSE(cordoned.load());
  registry.Complete(*again);
  cordon.join();
  EXPECT_EQ(registry.Find("a")->state, WorkerState::kCordoned);
  // Registering again keeps what the admin set.
  auto third = registry.Reserve(Worker("a", std::nullopt, "h:1"));
  ASSERT_OK(third);
  EXPECT_EQ(third->state, WorkerState::kCordoned);
  registry.Complete(*third);
  EXPECT_EQ(registry.Find("a")->state, WorkerState::kCordoned);
}

TEST(WorkerRegistryTest, AbortedReservationLeavesTheWorkerAsItWas) {
  FakeClock clock;
  WorkerRegistry registry(absl::Seconds(5), clock.AsClock());
  ASSERT_OK(registry.Register(Worker("a", std::nullopt, "h:1")));
  clock.Advance(absl::Seconds(10));  // dead: may come back elsewhere
  auto moved = registry.Reserve(Worker("a", std::nullopt, "h:2"));
  ASSERT_OK(moved);
  registry.Abort("a");
  EXPECT_EQ(registry.Find("a")->address, "h:1");
  EXPECT_FALSE(registry.Find("a")->alive);
  // A new worker's aborted reservation frees its rank.
  auto fresh = registry.Reserve(Worker("b", 5, "h:3"));
  ASSERT_OK(fresh);
  registry.Abort("b");
  EXPECT_FALSE(registry.Find("b").has_value());
  EXPECT_EQ(*registry.Register(Worker("c", 5, "h:4")), 5);
}

TEST(WorkerRegistryTest, RestoredWorkerIsDeadUntilItRegisters) {
  FakeClock clock;
  WorkerRegistry registry(absl::Seconds(5), clock.AsClock());
  WorkerInfo known = Record("a", 3, "h:1");
  known.capacity_bytes = 100;
  EXPECT_OK(registry.Restore(known));
  EXPECT_FALSE(registry.Find("a")->alive);
  EXPECT_FALSE(registry.Heartbeat("a", {0}));
  EXPECT_EQ(*registry.Register(Worker("a", std::nullopt, "h:1")), 3);
  EXPECT_TRUE(registry.Find("a")->alive);
}

TEST(WorkerRegistryTest, NewWorkersBeyondTheMaximumAreRefused) {
  FakeClock clock;
  WorkerRegistry registry(absl::Seconds(5), clock.AsClock(),
                          /*max_workers=*/3);
  ASSERT_OK(registry.Register(Worker("a", std::nullopt, "h:1")));
  ASSERT_OK(registry.Register(Worker("b", std::nullopt, "h:2")));
  // A reservation of a new name counts while its record is written.
  ASSERT_OK(registry.Reserve(Worker("c", std::nullopt, "h:3")));
  EXPECT_THAT(registry.Register(Worker("d", std::nullopt, "h:4")),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("'d'"), HasSubstr("3 workers"),
                             HasSubstr("max_workers"))));
  registry.Abort("c");
  ASSERT_OK(registry.Register(Worker("d", std::nullopt, "h:4")));
  // Dead workers count (their shards may come back), and known names may
  // always register again.
  clock.Advance(absl::Seconds(60));
  EXPECT_THAT(registry.Register(Worker("e", std::nullopt, "h:5")),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("3 of them dead")));
  EXPECT_OK(registry.Register(Worker("a", std::nullopt, "h:9")));
  EXPECT_EQ(registry.List().size(), 3u);
}

TEST(WorkerRegistryTest, TheMaximumIsClampedToTheCeiling) {
  FakeClock clock;
  EXPECT_EQ(WorkerRegistry(absl::Seconds(5), clock.AsClock(), 0).max_workers(),
            1u);
  EXPECT_EQ(
      WorkerRegistry(absl::Seconds(5), clock.AsClock(), 1u << 30).max_workers(),
      kMaxWorkersCeiling);
  EXPECT_EQ(WorkerRegistry(absl::Seconds(5), clock.AsClock()).max_workers(),
            kDefaultMaxWorkers);
}

TEST(WorkerRegistryTest, HugeAddressesAndBadNamesAreRefused) {
  FakeClock clock;
  WorkerRegistry registry(absl::Seconds(5), clock.AsClock());
  const std::string huge = std::string(33 << 20, 'a') + ":1";
  EXPECT_THAT(registry.Register(Worker("a", std::nullopt, huge)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("longer than 255 bytes")));
  EXPECT_THAT(
      registry.Register(Worker("a", std::nullopt, "no-port")),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("HOST:PORT")));
  EXPECT_THAT(registry.Register(Worker(std::string(65, 'n'), 0, "h:1")),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("invalid worker name")));
  EXPECT_THAT(registry.Register(Worker("a b", 0, "h:1")),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("invalid worker name")));
  EXPECT_TRUE(registry.List().empty());
}

TEST(WorkerRegistryTest, RestoreForgetsRecordsWithBadAddresses) {
  // Records written before addresses were checked must not come back: one
  // 33 MiB address alone makes every listing of the workers too large.
  FakeClock clock;
  WorkerRegistry registry(absl::Seconds(5), clock.AsClock());
  const WorkerInfo huge = Record("big", 0, std::string(33 << 20, 'a') + ":1");
  EXPECT_THAT(registry.Restore(huge),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("longer than 255 bytes")));
  WorkerInfo named = huge;
  named.name = "bad name";
  named.address = "h:1";
  EXPECT_THAT(registry.Restore(named),
              StatusIs(absl::StatusCode::kInvalidArgument));
  WorkerInfo fine = named;
  fine.name = "ok";
  EXPECT_OK(registry.Restore(fine));
  ASSERT_EQ(registry.List().size(), 1u);
  EXPECT_EQ(registry.List()[0].name, "ok");
  // The forgotten name registers again as a new worker, with a valid
  // address, at the lowest free rank.
  EXPECT_EQ(*registry.Register(Worker("big", std::nullopt, "h:2")), 1);
}

}  // namespace
}  // namespace tessera
