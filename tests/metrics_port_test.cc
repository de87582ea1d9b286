// The metrics port of a real worker under the attacks of issue #27 item 6:
// slow clients (slowloris) must not stall a scrape, and a header flood must
// be cut off without the worker growing. cpp-httplib, which served the
// port before, gave eight slow clients its whole thread pool and buffered
// a 200 MiB header line (the worker grew by about 300 MiB).
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "rpc/testing/loopback.h"
#include "tests/cluster.h"
#include "tests/test_arrays.h"

namespace tessera {
namespace {

using ::tessera::testing::ConnectToLoopback;

class MetricsPortTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    metrics_port_ = PickFreePort();
    coordinator_metrics_port_ = PickFreePort();
    TestClusterOptions options;
    options.num_workers = 1;
    options.worker_flags = {
        absl::StrCat("--metrics_listen=127.0.0.1:", metrics_port_)};
    options.coordinator_flags = {
        absl::StrCat("--metrics_listen=127.0.0.1:", coordinator_metrics_port_)};
    auto cluster = TestCluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = cluster->release();
  }
  static void TearDownTestSuite() { delete cluster_; }

  static inline TestCluster* cluster_ = nullptr;
  static inline int metrics_port_ = 0;
  static inline int coordinator_metrics_port_ = 0;
};

// Family name -> type, from the "# TYPE" lines of a scrape.
std::map<std::string, std::string> Families(const std::string& scrape) {
  std::map<std::string, std::string> families;
  for (absl::string_view line : absl::StrSplit(scrape, '\n')) {
    std::vector<std::string> words = absl::StrSplit(line, ' ');
    if (words.size() == 4 && words[0] == "#" && words[1] == "TYPE")
      families[words[2]] = words[3];
  }
  return families;
}

// Every daemon says which build it runs and exports the process series
// Prometheus' client libraries do, with plausible values.
TEST_F(MetricsPortTest, EveryDaemonExportsBuildInfoAndProcessMetrics) {
  for (const auto& [port, daemon] :
       {std::pair<int, std::string>{metrics_port_, "worker"},
        {coordinator_metrics_port_, "coordinator"}}) {
    const std::string scrape = FetchMetrics(port);
    EXPECT_EQ(MetricSum(scrape, "tessera_build_info",
                        absl::StrCat("daemon=\"", daemon, "\",version=\"")),
              1)
        << scrape;
    EXPECT_GT(MetricSum(scrape, "process_resident_memory_bytes"), 1 << 20);
    EXPECT_GT(MetricSum(scrape, "process_virtual_memory_bytes"), 1 << 20);
    EXPECT_GT(MetricSum(scrape, "process_open_fds"), 2);
    EXPECT_GE(MetricSum(scrape, "process_max_fds"),
              MetricSum(scrape, "process_open_fds"));
    EXPECT_GT(MetricSum(scrape, "process_threads"), 1);
    EXPECT_GT(MetricSum(scrape, "process_cpu_seconds_total"), 0);
    const double started = MetricSum(scrape, "process_start_time_seconds");
    const double now = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
    EXPECT_LT(started, now + 5);
    EXPECT_GT(started, now - 3600) << "started an hour ago?";
  }
}

// deploy/grafana/tessera.json: every query of every panel names at least
// one metric, and each metric it names is one the daemons export (a
// histogram's _bucket, _sum and _count included); promtool parses each.
TEST_F(MetricsPortTest, EveryDashboardQueryNamesAnExportedMetric) {
  std::map<std::string, std::string> exported =
      Families(FetchMetrics(metrics_port_));
  for (const auto& family : Families(FetchMetrics(coordinator_metrics_port_)))
    exported.insert(family);
  ASSERT_GT(exported.size(), 20u);
  std::ifstream in(absl::StrCat(std::getenv("TEST_SRCDIR"),
                                "/tessera/deploy/grafana/tessera.json"));
  ASSERT_TRUE(in.good());
  const nlohmann::json dashboard = nlohmann::json::parse(in);
  const std::regex metric("\\b(tessera|process)_[a-z0-9_]+");
  std::vector<std::string> exprs;
  for (const auto& panel : dashboard.at("panels")) {
    for (const auto& target : panel.at("targets")) {
      const std::string expr = target.at("expr").get<std::string>();
      exprs.push_back(expr);
      int named = 0;
      for (std::sregex_iterator it(expr.begin(), expr.end(), metric), end;
           it != end; ++it) {
        std::string name = it->str();
        for (const char* suffix : {"_bucket", "_sum", "_count"}) {
          const std::string base =
              absl::EndsWith(name, suffix)
                  ? name.substr(0, name.size() - std::strlen(suffix))
                  : "";
          if (!base.empty() && exported.count(base) &&
              exported[base] == "histogram") {
            name = base;
          }
        }
        EXPECT_EQ(exported.count(name), 1u)
            << "panel '" << panel.at("title").get<std::string>() << "' queries "
            << name << ", which no daemon exports";
        ++named;
      }
      EXPECT_GT(named, 0) << expr;
    }
  }
  EXPECT_GE(exprs.size(), 15u);
  if (access("/usr/bin/promtool", X_OK) != 0) return;
  const std::string rules =
      absl::StrCat(std::getenv("TEST_TMPDIR"), "/dashboard_rules.yml");
  {
    std::ofstream out(rules);
    out << "groups:\n- name: dashboard\n  rules:\n";
    for (size_t i = 0; i < exprs.size(); ++i) {
      out << "  - record: dashboard:query" << i << "\n    expr: '"
          << absl::StrReplaceAll(exprs[i], {{"'", "''"}}) << "'\n";
    }
  }
  std::string out, err;
  EXPECT_EQ(TestCluster::Run({"/usr/bin/promtool", "check", "rules", rules},
                             &out, &err),
            0)
      << out << err;
}

TEST_F(MetricsPortTest, SlowClientsDoNotStallAScrape) {
  // 64 clients that begin a request and send one more header byte every
  // half second, for as long as the test runs.
  std::vector<int> slow;
  for (int i = 0; i < 64; ++i) {
    const int fd = ConnectToLoopback(metrics_port_);
    ASSERT_GE(fd, 0);
    const std::string start = "GET /metrics HTTP/1.1\r\nX-Slow: ";
    send(fd, start.data(), start.size(), MSG_NOSIGNAL);
    slow.push_back(fd);
  }
  std::atomic<bool> stop{false};
  std::thread trickle([&] {
    while (!stop) {
      for (int fd : slow) send(fd, "a", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
      absl::SleepFor(absl::Milliseconds(500));
    }
  });
  absl::SleepFor(absl::Seconds(1));  // the worker has taken them all in
  const std::string scrape = FetchMetrics(metrics_port_);
  EXPECT_NE(scrape.find("HTTP/1.1 200"), std::string::npos) << scrape;
  EXPECT_NE(scrape.find("tessera_worker_bytes_held"), std::string::npos);
  // Trickling buys no time: each slow client is cut off.
  int closed = 0;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  std::vector<bool> done(slow.size(), false);
  while (closed < static_cast<int>(slow.size()) && absl::Now() < deadline) {
    for (size_t i = 0; i < slow.size(); ++i) {
      if (done[i]) continue;
      pollfd p{slow[i], POLLIN, 0};
      if (poll(&p, 1, 0) <= 0) continue;
      char buf[1024];
      const ssize_t n = recv(slow[i], buf, sizeof(buf), MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno == ECONNRESET)) {
        done[i] = true;
        ++closed;
      }
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  stop = true;
  trickle.join();
  for (int fd : slow) close(fd);
  EXPECT_EQ(closed, 64);
}

// --shard_warm_bytes at work, as an operator sees it: after a shard of a new
// size, the worker makes memory of that size ahead (once it idled 1 s), and
// the next shard of the size takes it, its bytes right.
TEST_F(MetricsPortTest, WarmMemoryIsMadeAheadAndTakenByTheNextShardOfItsSize) {
  auto client = Client::Connect(cluster_->coordinator_address());
  ASSERT_TRUE(client.ok()) << client.status();
  const std::vector<int64_t> shape = {2048, 1024};  // 8 MiB of float32
  constexpr double kShardBytes = 8 << 20;
  const LayoutSpec layout = LayoutSpec::Chunk(0, Ranks({0}));
  ASSERT_TRUE((*client)
                  ->Create("warm_a", shape, DType::kFloat32, layout,
                           InitSpec{InitSpec::Kind::kOnes})
                  .ok());
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  std::string scrape;
  while (absl::Now() < deadline) {
    scrape = FetchMetrics(metrics_port_);
    if (MetricSum(scrape, "tessera_worker_warm_bytes") == kShardBytes) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_EQ(MetricSum(scrape, "tessera_worker_warm_bytes"), kShardBytes)
      << scrape;
  const double warm_before =
      MetricSum(scrape, "tessera_worker_shm_blocks_total", "source=\"warm\"");
  ASSERT_TRUE((*client)
                  ->Create("warm_b", shape, DType::kFloat32, layout,
                           InitSpec{InitSpec::Kind::kOnes})
                  .ok());
  scrape = FetchMetrics(metrics_port_);
  EXPECT_EQ(
      MetricSum(scrape, "tessera_worker_shm_blocks_total", "source=\"warm\""),
      warm_before + 1)
      << scrape;
  absl::StatusOr<HostArray> got = (*client)->Get("warm_b");
  ASSERT_TRUE(got.ok()) << got.status();
  const float* values = reinterpret_cast<const float*>(got->data());
  for (int64_t i = 0; i < 2048 * 1024; i += 997) ASSERT_EQ(values[i], 1.0f);
  EXPECT_TRUE((*client)->Delete("warm_a").ok());
  EXPECT_TRUE((*client)->Delete("warm_b").ok());
}

TEST_F(MetricsPortTest, AHeaderFloodIsCutOffWithoutGrowingTheWorker) {
  const pid_t worker = cluster_->worker_pid(0);
  ASSERT_FALSE(FetchMetrics(metrics_port_).empty());
  // Its heap: the warm blocks of the test before may appear meanwhile.
  const int64_t before = TestCluster::AnonymousResidentBytes(worker);
  const int fd = ConnectToLoopback(metrics_port_);
  ASSERT_GE(fd, 0);
  const timeval timeout{20, 0};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  const std::string start = "GET /metrics HTTP/1.1\r\nX-Flood: ";
  send(fd, start.data(), start.size(), MSG_NOSIGNAL);
  const std::string chunk(1 << 20, 'a');
  int64_t sent = 0;
  constexpr int64_t kFlood = int64_t{200} << 20;
  while (sent < kFlood) {
    const ssize_t n = send(fd, chunk.data(), chunk.size(), MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += n;
  }
  const int64_t after = TestCluster::AnonymousResidentBytes(worker);
  close(fd);
  EXPECT_LT(sent, kFlood) << "the worker took in the whole 200 MiB";
  EXPECT_LT(after - before, int64_t{16} << 20)
      << "resident " << before << " -> " << after << " bytes";
  // And it still serves.
  EXPECT_NE(FetchMetrics(metrics_port_).find("tessera_worker_bytes_held"),
            std::string::npos);
}

// What an operator asks first: which coordinator leads, what state each
// worker is in (a draining worker is not a ready one), and how many bytes
// each worker served over which transport.
TEST_F(MetricsPortTest, OperatorsSeeTheLeaderWorkerStatesAndServedBytes) {
  std::string scrape = FetchMetrics(coordinator_metrics_port_);
  EXPECT_EQ(MetricSum(scrape, "tessera_coordinator_leader"), 1) << scrape;
  const std::map<std::string, double> ready = {
      {"ready", 1}, {"cordoned", 0}, {"draining", 0}, {"dead", 0}};
  for (const auto& [state, count] : ready) {
    // Present even at 0, so that an alert sees the 0.
    EXPECT_NE(scrape.find(
                  absl::StrCat("tessera_worker_state{state=\"", state, "\"}")),
              std::string::npos)
        << state;
    EXPECT_EQ(MetricSum(scrape, "tessera_worker_state",
                        absl::StrCat("state=\"", state, "\"")),
              count)
        << state;
  }
  auto client = Client::Connect(cluster_->coordinator_address());
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->SetWorkerState("w0", WorkerState::kCordoned).ok());
  scrape = FetchMetrics(coordinator_metrics_port_);
  EXPECT_EQ(MetricSum(scrape, "tessera_worker_state", "state=\"cordoned\""), 1);
  EXPECT_EQ(MetricSum(scrape, "tessera_worker_state", "state=\"ready\""), 0);
  ASSERT_TRUE((*client)->SetWorkerState("w0", WorkerState::kReady).ok());
  EXPECT_EQ(MetricSum(FetchMetrics(coordinator_metrics_port_),
                      "tessera_worker_state", "state=\"ready\""),
            1);

  // 64 KiB read over gRPC, then over the data port.
  InitSpec ones;
  ones.kind = InitSpec::Kind::kOnes;
  ASSERT_TRUE((*client)
                  ->Create("served_t", {64, 256}, DType::kFloat32,
                           LayoutSpec::Chunk(0, Ranks({0})), ones)
                  .ok());
  const std::string before = FetchMetrics(metrics_port_);
  for (const char* transport : {"grpc", "tcp"}) {
    ClientOptions options;
    options.transport = transport;
    auto reader = Client::Connect(cluster_->coordinator_address(), options);
    ASSERT_TRUE(reader.ok()) << reader.status();
    ASSERT_TRUE((*reader)->Get("served_t", std::nullopt).ok()) << transport;
  }
  const std::string after = FetchMetrics(metrics_port_);
  for (const char* transport : {"grpc", "tcp"}) {
    const std::string label = absl::StrCat("transport=\"", transport, "\"");
    EXPECT_EQ(MetricSum(after, "tessera_served_bytes_total", label) -
                  MetricSum(before, "tessera_served_bytes_total", label),
              64 * 256 * 4)
        << transport;
  }
  for (const char* transport : {"shm", "ucx"}) {
    EXPECT_NE(after.find(absl::StrCat("tessera_served_bytes_total{transport=\"",
                                      transport, "\"}")),
              std::string::npos)
        << transport;
  }
  ASSERT_TRUE((*client)->Delete("served_t").ok());
}

}  // namespace
}  // namespace tessera
