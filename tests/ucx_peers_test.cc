// Many short-lived readers over UCX leave nothing behind in the worker:
// each says goodbye as it exits, the worker closes its endpoint and unmaps
// what it mapped of the reader's memory, so its shared-memory mappings and
// `tessera_ucx_peers` stay bounded however many processes came and went.
// Readers killed in the middle of a read leave the worker idle (no core
// spinning on sends to them) and serving. And a CLI whose UCX cannot start
// falls back to the next transport and says so in `get --json`.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/tessera_client.h"
#include "gtest/gtest.h"
#include "tests/cluster.h"
#include "tests/test_arrays.h"

namespace tessera {
namespace {

// Lines of /proc/PID/maps naming shared memory that UCX maps (its own and
// its peers' segments), and SysV segments.
struct Mappings {
  int ucx = 0;
  int sysv = 0;
};
Mappings CountMappings(pid_t pid) {
  Mappings out;
  std::ifstream maps(absl::StrCat("/proc/", pid, "/maps"));
  for (std::string line; std::getline(maps, line);) {
    if (absl::StrContains(line, "ucx_shm")) ++out.ucx;
    if (absl::StrContains(line, "SYSV")) ++out.sysv;
  }
  return out;
}

// CPU seconds (user and system) process `pid` has used.
double CpuSeconds(pid_t pid) {
  std::ifstream file(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(file)),
                   std::istreambuf_iterator<char>());
  // Fields after the command name (which may hold spaces) in parentheses.
  std::istringstream rest(stat.substr(stat.rfind(')') + 2));
  std::string field;
  double ticks = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i >= 14) ticks += std::stod(field);  // utime, stime
  }
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

class UcxPeersTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    metrics_port_ = PickFreePort();
    TestClusterOptions options;
    options.num_workers = 1;
    options.worker_flags = {
        absl::StrCat("--metrics_listen=127.0.0.1:", metrics_port_)};
    auto cluster = TestCluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = cluster->release();
    auto client = Client::Connect(cluster_->coordinator_address());
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = client->release();
    InitSpec arange;
    arange.kind = InitSpec::Kind::kArange;
    // 256 KiB: below the size from which "auto" takes shared memory.
    ASSERT_TRUE(client_
                    ->Create("t", {64, 1024}, DType::kFloat32,
                             LayoutSpec::Chunk(0, Ranks({0})), arange)
                    .ok());
  }
  static void TearDownTestSuite() {
    delete client_;
    delete cluster_;
  }

  static double Peers() {
    return MetricSum(FetchMetrics(metrics_port_), "tessera_ucx_peers");
  }

  static int metrics_port_;
  static TestCluster* cluster_;
  static Client* client_;
};
int UcxPeersTest::metrics_port_ = 0;
TestCluster* UcxPeersTest::cluster_ = nullptr;
Client* UcxPeersTest::client_ = nullptr;

TEST_F(UcxPeersTest, HundredsOfShortLivedReadersLeaveNothingMapped) {
  const pid_t worker = cluster_->worker_pid(0);
  const Mappings before = CountMappings(worker);
  const std::string cli = TestCluster::BinaryPath("client/tessera");
  const std::string dir = std::getenv("TEST_TMPDIR");
  constexpr int kReaders = 200;
  constexpr int kAtOnce = 4;
  std::atomic<int> failed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kAtOnce; ++t) {
    threads.emplace_back([&, t] {
      for (int i = t; i < kReaders; i += kAtOnce) {
        std::string out, err;
        const int status = TestCluster::Run(
            {cli,
             absl::StrCat("--coordinator=", cluster_->coordinator_address()),
             "--transport=ucx", "get", "t",
             absl::StrCat("--output=", dir, "/out", t, ".npy")},
            &out, &err);
        if (status != 0) {
          ++failed;
          ADD_FAILURE() << "reader " << i << ": " << err;
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  ASSERT_EQ(failed.load(), 0);
  // Every reader said goodbye: the worker keeps none of them.
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (Peers() != 0 && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ(Peers(), 0) << "the worker still keeps endpoints of gone readers";
  const Mappings after = CountMappings(worker);
  std::printf(
      "worker's UCX shared-memory mappings: %d before, %d after %d "
      "readers; SysV: %d\n",
      before.ucx, after.ucx, kReaders, after.sysv);
  // Each reader mapped two of its segments into the worker while it read.
  EXPECT_LE(after.ucx, before.ucx + 2) << "readers' segments stay mapped";
  EXPECT_EQ(after.sysv, 0);
}

TEST_F(UcxPeersTest, ACliWhoseUcxCannotStartFallsBackAndSaysSo) {
  std::string out, err;
  // An invalid FIFO size makes UCX fail to make a worker in the CLI.
  const int status = TestCluster::Run(
      {"/usr/bin/env", "UCX_MM_FIFO_SIZE=1",
       TestCluster::BinaryPath("client/tessera"),
       absl::StrCat("--coordinator=", cluster_->coordinator_address()), "get",
       "t", absl::StrCat("--output=", std::getenv("TEST_TMPDIR"), "/f.npy"),
       "--json"},
      &out, &err);
  ASSERT_EQ(status, 0) << err;
  // The next transport in line, the worker's TCP data port, carried it.
  EXPECT_TRUE(absl::StrContains(out, "\"transport\": {\"tcp\": 262144}"))
      << out;
  EXPECT_TRUE(absl::StrContains(out, "\"fallbacks\": {\"ucx\": 1}")) << out;
}

// A reader killed with bytes queued to it leaves UCX 1.13 flushing the
// closed endpoint to it for good, and the worker's progress thread used to
// spin a whole core on that from then on.
TEST_F(UcxPeersTest, ReadersKilledMidReadLeaveTheWorkerIdleAndServing) {
  InitSpec arange;
  arange.kind = InitSpec::Kind::kArange;
  ASSERT_TRUE(client_
                  ->Create("big", {4096, 4096}, DType::kFloat32,
                           LayoutSpec::Chunk(0, Ranks({0})), arange)
                  .ok());
  const pid_t worker = cluster_->worker_pid(0);
  const std::string cli = TestCluster::BinaryPath("client/tessera");
  const std::string coordinator =
      absl::StrCat("--coordinator=", cluster_->coordinator_address());
  const std::string output =
      absl::StrCat("--output=", std::getenv("TEST_TMPDIR"), "/big.npy");
  std::mt19937 random(7);
  for (int i = 0; i < 30; ++i) {
    std::vector<std::string> args = {cli,   coordinator, "--transport=ucx",
                                     "get", "big",       output};
    std::vector<char*> argv;
    for (std::string& arg : args) argv.push_back(arg.data());
    argv.push_back(nullptr);
    pid_t reader = -1;
    ASSERT_EQ(posix_spawn(&reader, cli.c_str(), nullptr, nullptr, argv.data(),
                          environ),
              0);
    absl::SleepFor(absl::Milliseconds(20 + random() % 180));
    kill(reader, SIGKILL);
    int status = 0;
    waitpid(reader, &status, 0);
  }
  // UCX notices the dead readers; their endpoints close.
  const absl::Time until = absl::Now() + absl::Seconds(60);
  while (Peers() != 0 && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(200));
  }
  EXPECT_EQ(Peers(), 0) << "the worker keeps endpoints of killed readers";
  absl::SleepFor(absl::Seconds(1));
  const double before = CpuSeconds(worker);
  absl::SleepFor(absl::Seconds(3));
  const double used = CpuSeconds(worker) - before;
  std::printf(
      "worker's CPU over 3 s idle after 30 killed readers: %.2f s; "
      "UCX shared-memory mappings: %d\n",
      used, CountMappings(worker).ucx);
  EXPECT_LT(used, 1.0) << "the idle worker spins";
  std::string out, err;
  EXPECT_EQ(TestCluster::Run(
                {cli, coordinator, "--transport=ucx", "get", "big", output},
                &out, &err),
            0)
      << err;
  ASSERT_TRUE(client_->Delete("big").ok());
}

}  // namespace
}  // namespace tessera
