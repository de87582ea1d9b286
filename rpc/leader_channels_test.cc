// LeaderChannels and Call against real gRPC servers on 127.0.0.1: a call
// given several addresses reaches the one that serves, follows a standby's
// word (rpc/standby_service.h) without running anything there, passes over
// dead addresses, finds a coordinator that came back while no call was
// waiting, and does not hammer a standby while no one leads.
#include "rpc/leader_channels.h"

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/worker.grpc.pb.h"
#include "rpc/call.h"
#include "rpc/server.h"
#include "rpc/standby_service.h"
#include "rpc/status.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;
using ::testing::HasSubstr;

// Stands for the leader: counts the calls it runs.
class CountingWorker final : public v1::Worker::Service {
 public:
  grpc::Status FreeShards(grpc::ServerContext*, const v1::FreeShardsRequest*,
                          v1::FreeShardsResponse* response) override {
    ++calls;
    response->set_bytes_used(7);
    return grpc::Status::OK;
  }
  std::atomic<int> calls{0};
};

// Counts the calls a standby answers.
class CountingStandby final : public StandbyService {
 public:
  using StandbyService::StandbyService;
  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext* context) override {
    ++calls;
    return StandbyService::CreateReactor(context);
  }
  std::atomic<int> calls{0};
};

std::string Local(int port) { return absl::StrCat("127.0.0.1:", port); }
// The list of two coordinators, `first` and `second` on 127.0.0.1.
std::string Listed(int first, int second) {
  return absl::StrCat(Local(first), ",", Local(second));
}

// A port nothing listens on (bound once, then released).
int DeadPort() {
  absl::StatusOr<RunningServer> server = StartServer("127.0.0.1:0", {});
  EXPECT_THAT(server.status(), IsOk());
  const int port = server->port;
  server->Stop(absl::ZeroDuration());
  return port;
}

class LeaderChannelsTest : public ::testing::Test {
 protected:
  RunningServer StartLeader(const std::string& listen = "127.0.0.1:0") {
    absl::StatusOr<RunningServer> server = StartServer(listen, {&leader_});
    EXPECT_THAT(server.status(), IsOk());
    return *std::move(server);
  }
  RunningServer StartStandby(CountingStandby* standby) {
    ServerOptions options;
    options.fallback = standby;
    absl::StatusOr<RunningServer> server =
        StartServer("127.0.0.1:0", {}, options);
    EXPECT_THAT(server.status(), IsOk());
    return *std::move(server);
  }
  // One FreeShards through Call, as the SDK makes a non-idempotent call.
  absl::Status FreeShards(LeaderChannels* leaders,
                          LeaderStubs<v1::Worker>* stubs,
                          absl::Duration timeout) {
    CallOptions options;
    options.timeout = timeout;
    options.leaders = leaders;
    v1::FreeShardsRequest request;
    v1::FreeShardsResponse response;
    return Call(options, [&](grpc::ClientContext* context) {
      return stubs->Current()->FreeShards(context, request, &response);
    });
  }

  CountingWorker leader_;
};

TEST_F(LeaderChannelsTest, AStandbysAnswerSendsTheCallToTheLeaderItNames) {
  RunningServer leader = StartLeader();
  CountingStandby standby("standby");
  RunningServer standing = StartStandby(&standby);
  standby.SetLeader(Local(leader.port));
  ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<LeaderChannels> leaders,
      LeaderChannels::Make(Listed(standing.port, leader.port), {}));
  LeaderStubs<v1::Worker> stubs(leaders.get());
  EXPECT_THAT(FreeShards(leaders.get(), &stubs, absl::Seconds(5)), IsOk());
  EXPECT_EQ(standby.calls.load(), 1);
  EXPECT_EQ(leader_.calls.load(), 1);
  // Later calls go straight to the leader.
  EXPECT_EQ(leaders->current(), 1u);
  EXPECT_THAT(FreeShards(leaders.get(), &stubs, absl::Seconds(5)), IsOk());
  EXPECT_EQ(standby.calls.load(), 1);
  EXPECT_EQ(leader_.calls.load(), 2);
}

TEST_F(LeaderChannelsTest, ADeadAddressIsPassedOver) {
  RunningServer leader = StartLeader();
  ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<LeaderChannels> leaders,
      LeaderChannels::Make(Listed(DeadPort(), leader.port), {}));
  LeaderStubs<v1::Worker> stubs(leaders.get());
  EXPECT_THAT(FreeShards(leaders.get(), &stubs, absl::Seconds(5)), IsOk());
  EXPECT_EQ(leader_.calls.load(), 1);
}

TEST_F(LeaderChannelsTest, WhileNoOneLeadsAStandbyIsAskedCalmly) {
  CountingStandby standby("standby");
  RunningServer standing = StartStandby(&standby);
  ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<LeaderChannels> leaders,
      LeaderChannels::Make(Listed(standing.port, DeadPort()), {}));
  LeaderStubs<v1::Worker> stubs(leaders.get());
  // Neither serves: the call fails within its timeout with the standby's
  // words, having asked it every 50 ms or so (not thousands of times).
  const absl::Status status =
      FreeShards(leaders.get(), &stubs, absl::Seconds(1));
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kUnavailable,
                               HasSubstr("no coordinator leads yet")));
  EXPECT_GE(standby.calls.load(), 2);
  EXPECT_LE(standby.calls.load(), 40);
  EXPECT_EQ(leader_.calls.load(), 0);
}

TEST_F(LeaderChannelsTest, ACoordinatorBackIsFoundAtOnce) {
  const int port = DeadPort();
  // As the SDK sets them for several coordinators.
  ChannelOptions options;
  options.connect_timeout = absl::Seconds(1);
  options.max_reconnect_backoff = absl::Milliseconds(200);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<LeaderChannels> leaders,
                       LeaderChannels::Make(Listed(port, DeadPort()), options));
  LeaderStubs<v1::Worker> stubs(leaders.get());
  // Down for a while: gRPC's reconnect backoff has grown. (UNAVAILABLE, or
  // DEADLINE_EXCEEDED when the last try had no time left.)
  EXPECT_FALSE(FreeShards(leaders.get(), &stubs, absl::Seconds(2)).ok());
  // It comes back (a restarted coordinator, a standby now leading): the
  // next call finds it at once, not when gRPC's backoff ends.
  RunningServer leader = StartLeader(Local(port));
  EXPECT_THAT(FreeShards(leaders.get(), &stubs, absl::Milliseconds(300)),
              IsOk());
  EXPECT_EQ(leader_.calls.load(), 1);
}

// The failover itself: a standby answers on its port, stops, and serves
// as the leader on the same port a moment later while the old leader's
// address refuses.
TEST_F(LeaderChannelsTest, AStandbyThatTakesOverIsFoundOnItsPort) {
  ChannelOptions options;
  options.connect_timeout = absl::Seconds(1);
  options.max_reconnect_backoff = absl::Milliseconds(200);
  CountingStandby standby("standby");
  RunningServer standing = StartStandby(&standby);
  const int port = standing.port;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<LeaderChannels> leaders,
                       LeaderChannels::Make(Listed(DeadPort(), port), options));
  LeaderStubs<v1::Worker> stubs(leaders.get());
  std::atomic<bool> stop{false};
  std::thread takeover([&] {
    absl::SleepFor(absl::Milliseconds(500));
    standing.Stop(absl::ZeroDuration());
    absl::SleepFor(absl::Milliseconds(100));
    RunningServer leader = StartLeader(Local(port));
    while (!stop) absl::SleepFor(absl::Milliseconds(10));
    leader.Stop(absl::ZeroDuration());
  });
  // Calls made all along, as a writer retries: one lands within a second
  // of the new leader serving.
  const absl::Time start = absl::Now();
  absl::Status status;
  while (absl::Now() - start < absl::Seconds(10)) {
    status = FreeShards(leaders.get(), &stubs, absl::Milliseconds(300));
    if (status.ok()) break;
  }
  stop = true;
  takeover.join();
  EXPECT_THAT(status, IsOk());
  EXPECT_GE(standby.calls.load(), 1);
}

TEST(LeaderChannelsMakeTest, NeedsTwoOrMoreHostPorts) {
  EXPECT_THAT(LeaderChannels::Make("127.0.0.1:1", {}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("fewer than two")));
  EXPECT_THAT(LeaderChannels::Make("127.0.0.1:1,nope", {}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("'nope' is not HOST:PORT")));
}

// A standby that names itself as the leader (a stale answer, or a process
// that only pretends to stand by), or names no leader, neither holds the
// call nor spins on it: the next listed address, the leader, runs it.
TEST_F(LeaderChannelsTest, AStandbyThatNamesItselfOrNoLeaderIsPassedOver) {
  for (const bool names_itself : {true, false}) {
    SCOPED_TRACE(names_itself ? "names itself" : "names no leader");
    const int before = leader_.calls.load();
    RunningServer leader = StartLeader();
    CountingStandby standby("standby");
    RunningServer standing = StartStandby(&standby);
    if (names_itself) standby.SetLeader(Local(standing.port));
    ASSERT_OK_AND_ASSIGN(
        std::unique_ptr<LeaderChannels> leaders,
        LeaderChannels::Make(Listed(standing.port, leader.port), {}));
    LeaderStubs<v1::Worker> stubs(leaders.get());
    EXPECT_THAT(FreeShards(leaders.get(), &stubs, absl::Seconds(5)), IsOk());
    EXPECT_EQ(leader_.calls.load() - before, 1);
    EXPECT_EQ(standby.calls.load(), 1);
    EXPECT_EQ(leaders->current(), 1u);
  }
}

// Two standbys naming each other's address or themselves, and no leader:
// the call fails at its deadline having asked each a few times a second,
// not thousands. It ends with the last standby's answer (UNAVAILABLE), or,
// on a loaded machine where that last ask outlived the deadline,
// DEADLINE_EXCEEDED.
TEST_F(LeaderChannelsTest, StandbysThatNameThemselvesAreNotAHotLoop) {
  CountingStandby first("standby");
  CountingStandby second("standby");
  RunningServer a = StartStandby(&first);
  RunningServer b = StartStandby(&second);
  first.SetLeader(Local(a.port));
  second.SetLeader(Local(b.port));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<LeaderChannels> leaders,
                       LeaderChannels::Make(Listed(a.port, b.port), {}));
  LeaderStubs<v1::Worker> stubs(leaders.get());
  const absl::Status status =
      FreeShards(leaders.get(), &stubs, absl::Seconds(1));
  EXPECT_THAT(status.code(),
              ::testing::AnyOf(absl::StatusCode::kUnavailable,
                               absl::StatusCode::kDeadlineExceeded))
      << status;
  EXPECT_GE(first.calls.load(), 2);
  EXPECT_GE(second.calls.load(), 2);
  EXPECT_LE(first.calls.load() + second.calls.load(), 40);
}

}  // namespace
}  // namespace tessera
