#include "coordinator/worker_registry.h"

#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::tessera::testing::StatusIs;
using ::testing::HasSubstr;

// A clock the test advances by hand.
struct FakeClock {
  absl::Time now = absl::FromUnixSeconds(1000);
  Clock AsClock() {
    return [this] { return now; };
  }
};

WorkerRegistration Worker(const std::string& name, std::optional<int32_t> rank,
                          const std::string& address) {
  WorkerRegistration r;
  r.name = name;
  r.rank = rank;
  r.address = address;
  return r;
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

TEST(WorkerRegistryTest, TakenRankIsRefused) {
  FakeClock clock;
  WorkerRegistry registry(absl::Seconds(5), clock.AsClock());
  ASSERT_OK(registry.Register(Worker("a", 0, "h:1")));
  EXPECT_THAT(registry.Register(Worker("b", 0, "h:2")).status(),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("rank 0")));
}

TEST(WorkerRegistryTest, LeaseExpiresWithoutHeartbeats) {
  FakeClock clock;
  WorkerRegistry registry(absl::Seconds(5), clock.AsClock());
  ASSERT_OK(registry.Register(Worker("a", 0, "h:1")));
  EXPECT_TRUE(registry.Find("a")->alive);
  clock.now += absl::Seconds(4);
  EXPECT_TRUE(registry.Heartbeat("a", 10));
  clock.now += absl::Seconds(5);
  EXPECT_TRUE(registry.Find("a")->alive);
  clock.now += absl::Seconds(1) + absl::Milliseconds(1);
  EXPECT_FALSE(registry.Find("a")->alive);
  EXPECT_EQ(registry.Find("a")->bytes_used, 10);
  EXPECT_FALSE(registry.Heartbeat("unknown", 0));
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
  clock.now += absl::Seconds(10);
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

}  // namespace
}  // namespace tessera
