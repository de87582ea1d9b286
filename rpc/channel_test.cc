// rpc/channel: the bounded channel cache, the watchdog, and the idle
// timeout and scoped deadline of calls, against a real server on
// 127.0.0.1:0 whose handler never answers.
#include "rpc/channel.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <utility>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/worker.grpc.pb.h"
#include "rpc/server.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;

TEST(ChannelTargetTest, SeveralAddressesBecomeOneResolvedList) {
  for (const char* ok : {"127.0.0.1:7070", "localhost:1", "[::1]:65535",
                         "coordinator-0.ns.svc:7070"}) {
    EXPECT_TRUE(IsHostPort(ok)) << ok;
  }
  for (const char* bad : {"", "7070", ":7070", "host:", "host:0", "host:65536",
                          "host:7x", "a b:1", "a/b:1"}) {
    EXPECT_FALSE(IsHostPort(bad)) << bad;
  }
  EXPECT_THAT(ChannelTarget("127.0.0.1:7070"),
              ::tessera::testing::IsOkAndHolds("127.0.0.1:7070"));
  EXPECT_THAT(ChannelTarget("127.0.0.1:1,localhost:2"),
              ::tessera::testing::IsOkAndHolds("ipv4:127.0.0.1:1,127.0.0.1:2"));
  EXPECT_THAT(ChannelTarget("[::1]:1,[::1]:2"),
              ::tessera::testing::IsOkAndHolds("ipv6:[::1]:1,[::1]:2"));
  EXPECT_THAT(ChannelTarget("127.0.0.1:1,[::1]:2"),
              ::tessera::testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                           ::testing::HasSubstr("mix")));
  EXPECT_THAT(ChannelTarget("127.0.0.1:1,nope"),
              ::tessera::testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                           ::testing::HasSubstr("'nope'")));
  EXPECT_THAT(ChannelTarget("127.0.0.1:1,no-such-host.invalid:2"),
              ::tessera::testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                           ::testing::HasSubstr("resolve")));
}

TEST(ChannelCacheTest, KeepsAtMostMaxChannelsDroppingTheLeastRecentlyUsed) {
  ChannelCache cache(ChannelOptions{}, /*max_channels=*/2);
  auto a = cache.Get("127.0.0.1:1");
  auto b = cache.Get("127.0.0.1:2");
  EXPECT_EQ(cache.Get("127.0.0.1:1"), a);  // a is now the most recent
  auto c = cache.Get("127.0.0.1:3");       // drops b
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(cache.Get("127.0.0.1:1"), a);
  EXPECT_EQ(cache.Get("127.0.0.1:3"), c);
  EXPECT_NE(cache.Get("127.0.0.1:2"), b);  // made afresh, dropping a
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_NE(cache.Get("127.0.0.1:1"), a);
  cache.Forget("127.0.0.1:1");
  EXPECT_EQ(cache.size(), 1u);
}

TEST(ChannelCacheTest, ManyAddressesKeepOnlyTheBound) {
  ChannelCache bounded(ChannelOptions{}, /*max_channels=*/16);
  ChannelCache unbounded;
  for (int port = 1; port <= 300; ++port) {
    bounded.Get("127.0.0.1:" + std::to_string(port));
    unbounded.Get("127.0.0.1:" + std::to_string(port));
  }
  EXPECT_EQ(bounded.size(), 16u);
  EXPECT_EQ(unbounded.size(), 300u);
}

TEST(WatchdogTest, FiresAtTheDeadlineUnlessDisarmed) {
  Watchdog watchdog;
  absl::Notification fired;
  std::atomic<bool> disarmed_fired{false};
  const uint64_t kept = watchdog.Arm(absl::Now() + absl::Milliseconds(50),
                                     [&] { fired.Notify(); });
  const uint64_t dropped = watchdog.Arm(absl::Now() + absl::Milliseconds(20),
                                        [&] { disarmed_fired = true; });
  EXPECT_TRUE(watchdog.Disarm(dropped));
  EXPECT_TRUE(fired.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_FALSE(watchdog.Disarm(kept));  // already fired
  // An earlier alarm armed later is not delayed by a later one.
  absl::Notification early;
  watchdog.Arm(absl::Now() + absl::Hours(1), [] {});
  const absl::Time start = absl::Now();
  watchdog.Arm(absl::Now() + absl::Milliseconds(20), [&] { early.Notify(); });
  EXPECT_TRUE(early.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  EXPECT_FALSE(disarmed_fired);
}

// Answers FreeShards only when released or cancelled.
class Silent final : public v1::Worker::Service {
 public:
  grpc::Status FreeShards(grpc::ServerContext* context,
                          const v1::FreeShardsRequest*,
                          v1::FreeShardsResponse*) override {
    while (!context->IsCancelled() &&
           !release_.WaitForNotificationWithTimeout(absl::Milliseconds(10))) {
    }
    return grpc::Status::OK;
  }
  void Release() { release_.Notify(); }

 private:
  absl::Notification release_;
};

class StalledCallTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<RunningServer> server =
        StartServer("127.0.0.1:0", {&silent_});
    ASSERT_THAT(server.status(), IsOk());
    server_ = std::move(*server);
  }
  void TearDown() override {
    silent_.Release();
    server_.server->Shutdown();
  }

  // A FreeShards call with a 10 s deadline through a channel made with
  // `options`: its code, and how long it took.
  std::pair<grpc::StatusCode, absl::Duration> Call(
      const ChannelOptions& options) {
    auto stub = v1::Worker::NewStub(
        MakeChannel(WithPort("127.0.0.1:0", server_.port), options));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(10));
    v1::FreeShardsRequest request;
    v1::FreeShardsResponse response;
    const absl::Time start = absl::Now();
    const grpc::Status status = stub->FreeShards(&context, request, &response);
    return {status.error_code(), absl::Now() - start};
  }

  Silent silent_;
  RunningServer server_;
};

TEST_F(StalledCallTest, CallThatReceivesNothingIsCancelledAfterTheIdleTimeout) {
  ChannelOptions options;
  options.idle_timeout = absl::Milliseconds(200);
  const auto [code, took] = Call(options);
  EXPECT_EQ(code, grpc::StatusCode::CANCELLED);
  EXPECT_LT(took, absl::Seconds(5));
}

TEST_F(StalledCallTest, CallsEndAtTheScopedDeadline) {
  ChannelOptions options;
  options.idle_timeout = absl::Seconds(30);
  const ScopedCallDeadline scope(absl::Now() + absl::Milliseconds(200));
  {
    const ScopedCallDeadline later(absl::Now() + absl::Hours(1));
    EXPECT_LT(ScopedCallDeadline::Current(), absl::Now() + absl::Seconds(1));
  }
  const auto [code, took] = Call(options);
  EXPECT_EQ(code, grpc::StatusCode::CANCELLED);
  EXPECT_LT(took, absl::Seconds(5));
}

}  // namespace
}  // namespace tessera
