// The metrics port against what reaches it: scrapes, other paths and
// methods, oversized requests, slow clients and more clients than it
// holds. Raw sockets, so that the tests send exactly what they say.
#include "ops/metrics_http.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/metrics.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rpc/testing/loopback.h"

namespace tessera {
namespace {

using ::tessera::testing::ConnectToLoopback;
using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// Everything the server sends until it closes, or until `timeout`.
std::string ReadAll(int fd, absl::Duration timeout = absl::Seconds(10)) {
  std::string out;
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left <= 0 || poll(&p, 1, static_cast<int>(left)) <= 0) break;
    char buf[16384];
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

std::string Ask(int port, const std::string& request) {
  const int fd = ConnectToLoopback(port);
  if (fd < 0) return "";
  send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string response = ReadAll(fd);
  close(fd);
  return response;
}

// True when the server closed `fd` (EOF or reset) within `timeout`.
bool ClosedByServer(int fd, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left <= 0 || poll(&p, 1, static_cast<int>(left)) <= 0) return false;
    char buf[4096];
    const ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n <= 0) return n == 0 || errno == ECONNRESET;
  }
}

class MetricsHttpTest : public ::testing::Test {
 protected:
  void Start(MetricsHttpOptions options = {}) {
    registry_.Counter("tessera_test_total", "A test counter.")->Add(5);
    auto server = MetricsHttpServer::Start("127.0.0.1:0", &registry_, options);
    ASSERT_THAT(server.status(), IsOk());
    server_ = *std::move(server);
  }
  int port() const { return server_->port(); }

  MetricsRegistry registry_;
  std::unique_ptr<MetricsHttpServer> server_;
};

TEST_F(MetricsHttpTest, ServesTheRegistryAtMetrics) {
  Start();
  const std::string got =
      Ask(port(), "GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n");
  EXPECT_THAT(got, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(got, HasSubstr("Content-Type: text/plain; version=0.0.4"));
  EXPECT_THAT(got, HasSubstr("\r\n\r\n# HELP tessera_test_total"));
  EXPECT_THAT(got, HasSubstr("tessera_test_total 5\n"));
  // HTTP/1.0, a query, bare newlines: still served.
  EXPECT_THAT(Ask(port(), "GET /metrics?x=1 HTTP/1.0\n\n"),
              HasSubstr("tessera_test_total 5\n"));
}

TEST_F(MetricsHttpTest, OtherPathsMethodsAndGarbageGetErrors) {
  Start();
  EXPECT_THAT(Ask(port(), "GET /other HTTP/1.1\r\n\r\n"),
              StartsWith("HTTP/1.1 404"));
  EXPECT_THAT(Ask(port(), "POST /metrics HTTP/1.1\r\n\r\n"),
              StartsWith("HTTP/1.1 405"));
  EXPECT_THAT(Ask(port(), "hello\r\n\r\n"), StartsWith("HTTP/1.1 400"));
  const std::string head = Ask(port(), "HEAD /metrics HTTP/1.1\r\n\r\n");
  EXPECT_THAT(head, StartsWith("HTTP/1.1 200"));
  EXPECT_EQ(head.find("tessera_test_total 5"), std::string::npos);
}

TEST_F(MetricsHttpTest, AnOversizedRequestIsRefusedBeforeItIsRead) {
  MetricsHttpOptions options;
  options.max_request_bytes = 1024;
  Start(options);
  const int fd = ConnectToLoopback(port());
  ASSERT_GE(fd, 0);
  const std::string start = "GET /metrics HTTP/1.1\r\nX-Flood: ";
  send(fd, start.data(), start.size(), MSG_NOSIGNAL);
  // Far more than the bound, as fast as the socket takes it: the server
  // answers and closes, and sending fails long before the end.
  const std::string chunk(64 << 10, 'a');
  int64_t sent = 0;
  while (sent < (int64_t{64} << 20)) {
    const ssize_t n = send(fd, chunk.data(), chunk.size(), MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += n;
  }
  EXPECT_LT(sent, int64_t{64} << 20) << "the server read the whole flood";
  close(fd);
  // A request just under the bound is served.
  const std::string big = absl::StrCat(
      "GET /metrics HTTP/1.1\r\nX-A: ", std::string(900, 'b'), "\r\n\r\n");
  EXPECT_THAT(Ask(port(), big), StartsWith("HTTP/1.1 200"));
  const std::string too_big = absl::StrCat(
      "GET /metrics HTTP/1.1\r\nX-A: ", std::string(2000, 'b'), "\r\n\r\n");
  EXPECT_THAT(Ask(port(), too_big), StartsWith("HTTP/1.1 431"));
}

TEST_F(MetricsHttpTest, SlowClientsNeitherStallAScrapeNorStayForever) {
  MetricsHttpOptions options;
  options.request_timeout = absl::Milliseconds(500);
  Start(options);
  // Slowloris: headers begun and never finished.
  std::vector<int> slow;
  for (int i = 0; i < 16; ++i) {
    const int fd = ConnectToLoopback(port());
    ASSERT_GE(fd, 0);
    send(fd, "GET /metrics HTTP/1.1\r\nX: a", 27, MSG_NOSIGNAL);
    slow.push_back(fd);
  }
  EXPECT_THAT(Ask(port(), "GET /metrics HTTP/1.1\r\n\r\n"),
              HasSubstr("tessera_test_total 5"));
  // Trickling does not extend a connection's time.
  for (int round = 0; round < 3; ++round) {
    for (int fd : slow) send(fd, "a", 1, MSG_NOSIGNAL);
    absl::SleepFor(absl::Milliseconds(100));
  }
  for (int fd : slow) {
    EXPECT_TRUE(ClosedByServer(fd, absl::Seconds(10)));
    close(fd);
  }
}

TEST_F(MetricsHttpTest, MoreClientsThanItHoldsCloseTheOldest) {
  MetricsHttpOptions options;
  options.max_connections = 4;
  Start(options);
  std::vector<int> idle;
  for (int i = 0; i < 10; ++i) {
    const int fd = ConnectToLoopback(port());
    ASSERT_GE(fd, 0);
    idle.push_back(fd);
  }
  EXPECT_THAT(Ask(port(), "GET /metrics HTTP/1.1\r\n\r\n"),
              HasSubstr("tessera_test_total 5"));
  // The first ones gave way.
  for (int i = 0; i < 6; ++i) {
    EXPECT_TRUE(ClosedByServer(idle[i], absl::Seconds(5))) << i;
  }
  for (int fd : idle) close(fd);
}

TEST(MetricsListenTest, APortAloneIsLoopback) {
  EXPECT_EQ(*ParseMetricsListen("9090"),
            std::make_pair(std::string("127.0.0.1"), 9090));
  EXPECT_EQ(*ParseMetricsListen(":9090"),
            std::make_pair(std::string("127.0.0.1"), 9090));
  EXPECT_EQ(*ParseMetricsListen("0.0.0.0:9091"),
            std::make_pair(std::string("0.0.0.0"), 9091));
  EXPECT_EQ(*ParseMetricsListen("[::1]:9091"),
            std::make_pair(std::string("::1"), 9091));
  EXPECT_THAT(ParseMetricsListen("::1:9091").status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  MetricsRegistry registry;
  auto server = MetricsHttpServer::Start(":0", &registry);
  ASSERT_THAT(server.status(), IsOk());
  EXPECT_EQ((*server)->host(), "127.0.0.1");
  EXPECT_GT((*server)->port(), 0);
}

TEST(MetricsListenTest, BadOrTakenAddressIsAClearError) {
  MetricsRegistry registry;
  EXPECT_THAT(
      MetricsHttpServer::Start("nonsense", &registry).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not HOST:PORT")));
  EXPECT_THAT(MetricsHttpServer::Start("127.0.0.1:70000", &registry).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> first =
      MetricsHttpServer::Start("127.0.0.1:0", &registry);
  ASSERT_THAT(first.status(), IsOk());
  EXPECT_THAT(
      MetricsHttpServer::Start("127.0.0.1:" + std::to_string((*first)->port()),
                               &registry)
          .status(),
      StatusIs(absl::StatusCode::kUnavailable, HasSubstr("cannot serve")));
}

}  // namespace
}  // namespace tessera
