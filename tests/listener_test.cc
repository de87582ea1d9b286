// A stranger runs a worker out of file descriptors (issue: "running out of
// descriptors kills a daemon's gRPC listener"). The worker runs with a
// small descriptor limit (256, soft and hard, so raising it changes
// nothing); the attacker opens far more TCP connections to its gRPC port
// than that, sends nothing, and closes them. The worker must then serve a
// new client, without a restart: gRPC 1.51's listener alone stops accepting
// for good at the first EMFILE, while the heartbeats on the worker's open
// connection keep it "alive".
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/tessera_client.h"
#include "gtest/gtest.h"
#include "rpc/testing/loopback.h"
#include "tests/cluster.h"
#include "tests/test_arrays.h"

namespace tessera {
namespace {

using ::tessera::testing::ConnectToLoopback;

// A connection from `source` (an address of the loopback range: another
// host, as far as the worker can tell) to `address` that sends the HTTP/2
// preface and then nothing; -1 when it could not connect.
int HoldFrom(const char* source, const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (!absl::SimpleAtoi(address.substr(colon + 1), &port)) return -1;
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in from{};
  from.sin_family = AF_INET;
  inet_pton(AF_INET, source, &from.sin_addr);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  static constexpr char kPreface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
  if (bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof(from)) != 0 ||
      connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0 ||
      send(fd, kPreface, sizeof(kPreface) - 1, MSG_NOSIGNAL) < 0) {
    close(fd);
    return -1;
  }
  return fd;
}

int ConnectTo(const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (!absl::SimpleAtoi(address.substr(colon + 1), &port)) return -1;
  // A listener that accepts nothing fills its backlog; then connect waits.
  return ConnectToLoopback(port, absl::Seconds(2));
}

// Tensor "t", [64, 16] int32 holding 0, 1, 2, ..., on the worker of rank 0.
absl::Status CreateArange(const TestCluster& cluster,
                          const ClientOptions& options) {
  auto client = Client::Connect(cluster.coordinator_address(), options);
  if (!client.ok()) return client.status();
  return ::tessera::CreateArange(**client, "t", {64, 16}, {0});
}

// Reads "t" back on a new client: OK when every byte is as made.
absl::Status ReadArange(const TestCluster& cluster,
                        const ClientOptions& options) {
  auto client = Client::Connect(cluster.coordinator_address(), options);
  if (!client.ok()) return client.status();
  absl::StatusOr<HostArray> got = (*client)->Get("t", std::nullopt);
  if (!got.ok()) return got.status();
  for (int i = 0; i < 64 * 16; ++i) {
    if (got->As<int32_t>()[i] != i) return absl::DataLossError("bytes");
  }
  return absl::OkStatus();
}

TEST(ListenerTest, AWorkerRunOutOfDescriptorsServesNewClientsAfterwards) {
  // This process holds the attacker's connections: it needs the room.
  struct rlimit limit {};
  getrlimit(RLIMIT_NOFILE, &limit);
  limit.rlim_cur = limit.rlim_max;
  setrlimit(RLIMIT_NOFILE, &limit);
  ASSERT_GE(limit.rlim_cur, 1024u) << "the test needs 1024 descriptors";

  TestClusterOptions options;
  options.num_workers = 1;
  options.worker_open_files = 256;
  const int metrics_port = PickFreePort();
  options.worker_flags = {
      "--ucx=false", absl::StrCat("--metrics_listen=127.0.0.1:", metrics_port)};
  auto cluster = TestCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ClientOptions client_options;
  client_options.transport = "grpc";  // reads go through the worker's port
  client_options.data_timeout = absl::Seconds(20);
  ASSERT_TRUE(CreateArange(**cluster, client_options).ok());
  const pid_t worker = (*cluster)->worker_pid(0);

  // The attack: 800 connections that say nothing, held a moment, closed.
  std::vector<int> connections;
  for (int i = 0; i < 800; ++i) {
    const int fd = ConnectTo((*cluster)->worker_address(0));
    if (fd >= 0) connections.push_back(fd);
  }
  EXPECT_GT(connections.size(), 256u) << "the attack exceeded the limit";
  absl::SleepFor(absl::Seconds(2));  // the worker accepts what it can
  for (int fd : connections) close(fd);

  // A new client reads the worker's shard (once the worker has seen the
  // attacker's connections close).
  absl::StatusOr<HostArray> got = absl::UnavailableError("not read");
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (!got.ok() && absl::Now() < deadline) {
    auto client =
        Client::Connect((*cluster)->coordinator_address(), client_options);
    ASSERT_TRUE(client.ok()) << client.status();
    got = (*client)->Get("t", std::nullopt);
    if (!got.ok()) absl::SleepFor(absl::Milliseconds(500));
  }
  ASSERT_TRUE(got.ok()) << got.status() << "\nworker log:\n"
                        << (*cluster)->worker_log(0);
  for (int i = 0; i < 64 * 16; ++i) ASSERT_EQ(got->As<int32_t>()[i], i);
  // The same process, which said what it refused.
  EXPECT_EQ((*cluster)->worker_pid(0), worker);
  EXPECT_EQ(kill(worker, 0), 0);
  const std::string metrics = FetchMetrics(metrics_port);
  EXPECT_GT(MetricSum(metrics, "tessera_grpc_connections_refused_total",
                      "port=\"grpc\""),
            0)
      << metrics;
  EXPECT_NE((*cluster)->worker_log(0).find("refused"), std::string::npos);
}

// A stranger holds a worker's gRPC port at its connection bound (no
// certificate needed: connections that send only the HTTP/2 preface). One
// host gets no more than its share, so other hosts keep being served; and
// when several fill the port, the worker's own listener probe, closed at
// the bound like everyone's, still counts the listener alive: the worker
// keeps its shards and serves again once the flood ends.
TEST(ListenerTest,
     AFloodAtTheConnectionBoundNeitherStarvesOtherHostsNorKillsTheWorker) {
  TestClusterOptions options;
  options.num_workers = 1;
  const int metrics_port = PickFreePort();
  options.worker_flags = {
      "--ucx=false", "--max_connections=24", "--max_connections_per_peer=12",
      "--listener_probe_interval=1s",
      absl::StrCat("--metrics_listen=127.0.0.1:", metrics_port)};
  auto cluster = TestCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ClientOptions client_options;
  client_options.transport = "grpc";  // reads go through the worker's port
  client_options.data_timeout = absl::Seconds(20);
  auto read_back = [&] { return ReadArange(**cluster, client_options); };
  ASSERT_TRUE(CreateArange(**cluster, client_options).ok());
  const pid_t worker = (*cluster)->worker_pid(0);
  const std::string address = (*cluster)->worker_address(0);

  // One host floods: it holds its share (12), no more.
  std::vector<int> held;
  for (int i = 0; i < 40; ++i) {
    if (int fd = HoldFrom("127.0.0.2", address); fd >= 0) held.push_back(fd);
  }
  absl::SleepFor(absl::Seconds(1));  // the worker accepts what it will
  {
    const std::string metrics = FetchMetrics(metrics_port);
    EXPECT_EQ(MetricSum(metrics, "tessera_grpc_connections_refused_total",
                        "reason=\"peer\""),
              static_cast<double>(held.size()) - 12)
        << metrics;
    EXPECT_LT(MetricSum(metrics, "tessera_grpc_connections", "port=\"grpc\""),
              24)
        << metrics;
  }
  // ... and a client on this host is served meanwhile.
  EXPECT_TRUE(read_back().ok()) << (*cluster)->worker_log(0);

  // Two more hosts: now the port is full, the worker's own probe is closed
  // at the bound too, for several probe intervals.
  for (const char* source : {"127.0.0.3", "127.0.0.4"}) {
    for (int i = 0; i < 20; ++i) {
      if (int fd = HoldFrom(source, address); fd >= 0) held.push_back(fd);
    }
  }
  absl::SleepFor(absl::Seconds(6));
  EXPECT_EQ(kill(worker, 0), 0) << (*cluster)->worker_log(0);
  EXPECT_EQ((*cluster)->worker_pid(0), worker);
  EXPECT_EQ((*cluster)->worker_log(0).find("accepts no new connections"),
            std::string::npos)
      << (*cluster)->worker_log(0);
  const std::string metrics = FetchMetrics(metrics_port);
  EXPECT_GT(MetricSum(metrics, "tessera_grpc_connections_refused_total",
                      "reason=\"peer\""),
            0)
      << metrics;
  EXPECT_GT(MetricSum(metrics, "tessera_grpc_connections_refused_total",
                      "reason=\"limit\""),
            0)
      << metrics;

  // The flood ends: the same worker serves its shards, whole.
  for (int fd : held) close(fd);
  absl::Status read = absl::UnavailableError("not read");
  for (const absl::Time deadline = absl::Now() + absl::Seconds(30);
       !read.ok() && absl::Now() < deadline;) {
    read = read_back();
    if (!read.ok()) absl::SleepFor(absl::Milliseconds(500));
  }
  EXPECT_TRUE(read.ok()) << read << (*cluster)->worker_log(0);
  EXPECT_EQ((*cluster)->worker_pid(0), worker);
}

}  // namespace
}  // namespace tessera
