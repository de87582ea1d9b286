// The listener guard on a real gRPC server in this process: connections
// beyond the bound are closed at once, and a port that met "too many open
// files" accepts again once descriptors are free -- where gRPC 1.51 alone
// stops accepting for good, which the listener probe then notices.
#include "rpc/listener_guard.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "core/testing/status_matchers.h"
#include "gtest/gtest.h"
#include "proto/health.grpc.pb.h"
#include "rpc/listener_probe.h"
#include "rpc/server.h"
#include "rpc/testing/loopback.h"

namespace tessera {
namespace {

using ::tessera::testing::ConnectToLoopback;
using ::tessera::testing::IsOk;

// True when the peer closed `fd` (EOF or reset) within `timeout`.
bool ClosedByPeer(int fd, absl::Duration timeout) {
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout))) <= 0) {
    return false;
  }
  char byte;
  const ssize_t n = recv(fd, &byte, 1, MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno == ECONNRESET);
}

bool WaitFor(const std::function<bool()>& done, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return true;
}

// Fills this process's descriptor table (after lowering its soft limit to
// what is open now plus a few), and undoes it all when destroyed.
class DescriptorsExhausted {
 public:
  DescriptorsExhausted() {
    getrlimit(RLIMIT_NOFILE, &saved_);
    const int source = open("/dev/null", O_RDONLY | O_CLOEXEC);
    filler_.push_back(source);
    struct rlimit low = saved_;
    low.rlim_cur = static_cast<rlim_t>(source + 16);
    setrlimit(RLIMIT_NOFILE, &low);
    for (int fd; (fd = dup(source)) >= 0;) filler_.push_back(fd);
    full_errno_ = errno;
  }
  ~DescriptorsExhausted() {
    for (int fd : filler_) close(fd);
    setrlimit(RLIMIT_NOFILE, &saved_);
  }
  int full_errno() const { return full_errno_; }
  // Frees one descriptor for the caller's next socket.
  void FreeOne() {
    close(filler_.back());
    filler_.pop_back();
  }

 private:
  struct rlimit saved_ {};
  std::vector<int> filler_;
  int full_errno_ = 0;
};

grpc::Status CheckOnNewConnection(int port) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  auto stub = grpc::health::v1::Health::NewStub(
      grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port),
                                grpc::InsecureChannelCredentials(), args));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(5));
  grpc::health::v1::HealthCheckResponse response;
  return stub->Check(&context, {}, &response);
}

TEST(ListenerGuardTest, IsThisProcessesAccept4) {
  EXPECT_TRUE(ListenerGuardActive());
}

TEST(ListenerGuardTest, ConnectionBudgetLeavesAQuarterOfTheDescriptors) {
  EXPECT_EQ(ConnectionBudget(16384, 1024), 768);
  EXPECT_EQ(ConnectionBudget(0, 1024), 768);
  EXPECT_EQ(ConnectionBudget(100, uint64_t{1} << 20), 100);
  EXPECT_EQ(ConnectionBudget(0, RLIM_INFINITY),
            std::numeric_limits<int>::max());
  EXPECT_EQ(ConnectionBudget(5, 1), 1);
}

TEST(ListenerGuardTest, RaisingTheOpenFileLimitReachesTheHardLimit) {
  absl::StatusOr<OpenFileLimit> limit = RaiseOpenFileLimit();
  ASSERT_THAT(limit.status(), IsOk());
  EXPECT_EQ(limit->now, limit->hard);
  EXPECT_GE(limit->now, limit->before);
}

TEST(ListenerGuardTest, ConnectionsBeyondTheBoundAreClosedAtOnce) {
  ServerOptions options;
  options.max_connections = 5;
  absl::StatusOr<RunningServer> server =
      StartServer("127.0.0.1:0", {}, options);
  ASSERT_THAT(server.status(), IsOk());
  const int port = server->port;
  std::vector<int> clients;
  for (int i = 0; i < 20; ++i) {
    const int fd = ConnectToLoopback(port);
    ASSERT_GE(fd, 0);
    clients.push_back(fd);
  }
  ASSERT_TRUE(WaitFor(
      [&] {
        ListenerStats s = GuardedListenerStats(port);
        return s.accepted + s.refused_over_limit >= 20;
      },
      absl::Seconds(10)));
  const ListenerStats stats = GuardedListenerStats(port);
  EXPECT_EQ(stats.accepted, 5);
  EXPECT_EQ(stats.refused_over_limit, 15);
  EXPECT_EQ(stats.open, 5);
  // The refused were closed at once, not left to time out.
  int closed = 0;
  for (int fd : clients) closed += ClosedByPeer(fd, absl::Seconds(1)) ? 1 : 0;
  EXPECT_EQ(closed, 15);
  // Once the first ones go, a new client is served.
  for (int fd : clients) close(fd);
  ASSERT_TRUE(WaitFor([&] { return GuardedListenerStats(port).open == 0; },
                      absl::Seconds(10)));
  grpc::Status status = CheckOnNewConnection(port);
  EXPECT_TRUE(status.ok()) << status.error_message();
  server->Stop(absl::ZeroDuration());
  EXPECT_EQ(GuardedListenerStats(port).accepted, 0) << "released at Stop";
}

TEST(ListenerGuardTest, APortOutOfDescriptorsAcceptsAgainOnceTheyAreFree) {
  absl::StatusOr<RunningServer> server = StartServer("127.0.0.1:0", {});
  ASSERT_THAT(server.status(), IsOk());
  const int port = server->port;
  int client = -1;
  {
    DescriptorsExhausted full;
    ASSERT_EQ(full.full_errno(), EMFILE);
    full.FreeOne();
    client = ConnectToLoopback(port);  // takes the freed descriptor
    ASSERT_GE(client, 0);
    // gRPC's accept4 finds no descriptor: the guard closes the connection
    // through its reserve instead of letting the listener stop.
    ASSERT_TRUE(WaitFor(
        [&] { return GuardedListenerStats(port).refused_no_descriptors > 0; },
        absl::Seconds(10)));
  }
  EXPECT_TRUE(ClosedByPeer(client, absl::Seconds(5)));
  close(client);
  grpc::Status status = CheckOnNewConnection(port);
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_THAT(ListenerProbe::ProbeOnce(absl::StrCat("127.0.0.1:", port),
                                       nullptr, absl::Seconds(5)),
              IsOk());
  server->Stop(absl::ZeroDuration());
}

// What the guard prevents, and what the probe is for: gRPC 1.51's own
// listener after one EMFILE.
TEST(ListenerGuardTest, TheProbeNoticesAnUnguardedListenerThatStopped) {
  absl::StatusOr<RunningServer> server = StartServer("127.0.0.1:0", {});
  ASSERT_THAT(server.status(), IsOk());
  const int port = server->port;
  const std::string address = absl::StrCat("127.0.0.1:", port);
  EXPECT_THAT(ListenerProbe::ProbeOnce(address, nullptr, absl::Seconds(5)),
              IsOk());
  ReleaseListener(port);  // gRPC as it ships
  int client = -1;
  {
    DescriptorsExhausted full;
    ASSERT_EQ(full.full_errno(), EMFILE);
    full.FreeOne();
    client = ConnectToLoopback(port);
    ASSERT_GE(client, 0);
    // Setup, not an assertion: gRPC tries (and fails) to accept it.
    absl::SleepFor(absl::Milliseconds(500));
  }
  close(client);
  absl::Status probe =
      ListenerProbe::ProbeOnce(address, nullptr, absl::Seconds(2));
  EXPECT_EQ(probe.code(), absl::StatusCode::kUnavailable) << probe;

  ListenerProbeOptions options;
  options.interval = absl::Milliseconds(50);
  options.timeout = absl::Milliseconds(500);
  options.failures = 2;
  absl::Notification dead;
  std::string why;
  {
    ListenerProbe prober(address, options, [&](const std::string& reason) {
      why = reason;
      dead.Notify();
    });
    EXPECT_TRUE(dead.WaitForNotificationWithTimeout(absl::Seconds(30)));
  }
  EXPECT_NE(why.find("2 probes in a row failed"), std::string::npos) << why;
  server->Stop(absl::ZeroDuration());
}

TEST(ListenerProbeTest, AHealthyServerKeepsTheProbeQuiet) {
  absl::StatusOr<RunningServer> server = StartServer("127.0.0.1:0", {});
  ASSERT_THAT(server.status(), IsOk());
  ListenerProbeOptions options;
  options.interval = absl::Milliseconds(20);
  options.failures = 1;
  std::atomic<bool> dead{false};
  {
    ListenerProbe prober(absl::StrCat("127.0.0.1:", server->port), options,
                         [&](const std::string&) { dead = true; });
    // Some probes run (each on a new connection) and all are answered.
    ASSERT_TRUE(WaitFor(
        [&] { return GuardedListenerStats(server->port).accepted >= 3; },
        absl::Seconds(10)));
  }
  EXPECT_FALSE(dead);
  server->Stop(absl::ZeroDuration());
}

TEST(ListenerProbeTest, SelfAddressDialsLoopbackForAWildcard) {
  EXPECT_EQ(SelfAddress("0.0.0.0:0", 7071), "127.0.0.1:7071");
  EXPECT_EQ(SelfAddress("[::]:7071", 7071), "[::1]:7071");
  EXPECT_EQ(SelfAddress("10.1.2.3:7071", 7071), "10.1.2.3:7071");
  EXPECT_EQ(SelfAddress("localhost:0", 9000), "localhost:9000");
}

}  // namespace
}  // namespace tessera
