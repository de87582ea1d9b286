// A stranger runs a worker out of file descriptors (issue: "running out of
// descriptors kills a daemon's gRPC listener"). The worker runs with a
// small descriptor limit (256, soft and hard, so raising it changes
// nothing); the attacker opens far more TCP connections to its gRPC port
// than that, sends nothing, and closes them. The worker must then serve a
// new client, without a restart: gRPC 1.51's listener alone stops accepting
// for good at the first EMFILE, while the heartbeats on the worker's open
// connection keep it "alive".
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
#include "tests/cluster.h"
#include "tests/test_arrays.h"

namespace tessera {
namespace {

int ConnectTo(const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (!absl::SimpleAtoi(address.substr(colon + 1), &port)) return -1;
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  // A listener that accepts nothing fills its backlog; then connect waits.
  const timeval timeout{2, 0};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
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
  {
    auto client =
        Client::Connect((*cluster)->coordinator_address(), client_options);
    ASSERT_TRUE(client.ok()) << client.status();
    InitSpec init;
    init.kind = InitSpec::Kind::kArange;
    ASSERT_TRUE((*client)
                    ->Create("t", {64, 16}, DType::kInt32,
                             LayoutSpec::Chunk(0, Ranks({0})), init)
                    .ok());
  }
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

}  // namespace
}  // namespace tessera
