// Replicas on real daemons (CLI.md "Replicas (v3)"): a dead or hung worker's
// shards are copied from survivors until every shard has R replicas again,
// reads keep working meanwhile, a worker that comes back gives up its
// surplus, and the admin verbs drain, cordon, uncordon and forget workers.
#include <signal.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/tessera_client.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cluster.h"
#include "tests/test_arrays.h"

namespace tessera {
namespace {

using ::tessera::testing::StatusIs;
using ::testing::HasSubstr;

constexpr int kLeaseMs = 2500;

TestClusterOptions ZonedCluster(int workers) {
  TestClusterOptions options;
  options.num_workers = workers;
  options.durable = true;
  options.coordinator_flags = {"--lease_ms=" + std::to_string(kLeaseMs),
                               "--heartbeat_ms=200", "--retire_grace_ms=200"};
  // Zones z0, z1, z2, z0, ...: a shard's replicas go to distinct zones.
  options.per_worker_flags = [](int i) -> std::vector<std::string> {
    return {"--zone=z" + std::to_string(i % 3)};
  };
  return options;
}

std::map<std::string, WorkerInfo> WorkersByName(Client& client) {
  std::map<std::string, WorkerInfo> out;
  auto workers = client.Workers();
  EXPECT_TRUE(workers.ok()) << workers.status();
  if (workers.ok()) {
    for (WorkerInfo& w : *workers) out[w.name] = std::move(w);
  }
  return out;
}

// True once every shard of `name` has `replicas` available replicas, none
// on a worker in `gone`.
bool FullyReplicated(Client& client, const std::string& name, size_t replicas,
                     const std::set<std::string>& gone) {
  auto meta = client.Describe(name);
  if (!meta.ok()) return false;
  for (const ShardInfo& shard : meta->shards) {
    if (shard.replicas.size() != replicas) return false;
    std::set<std::string> holders;
    for (const Replica& r : shard.replicas) {
      if (!r.available || gone.count(r.worker) > 0) return false;
      holders.insert(r.worker);
    }
    if (holders.size() != replicas) return false;  // distinct workers
  }
  return true;
}

// How long a test waits for what the cluster does by itself.
constexpr absl::Duration kWait = absl::Seconds(40);

// Where every replica is and what each worker holds, for failure messages.
std::string Layout(Client& client) {
  std::string out;
  for (const auto& [name, w] : WorkersByName(client))
    absl::StrAppend(&out, name, (w.alive ? " alive " : " dead "), w.bytes_used,
                    "\n");
  auto tensors = client.List();
  if (!tensors.ok()) return out;
  for (const TensorInfo& t : *tensors) {
    auto meta = client.Describe(t.name);
    if (!meta.ok()) continue;
    for (size_t i = 0; i < meta->shards.size(); ++i) {
      absl::StrAppend(&out, t.name, "#", i, ":");
      for (const Replica& r : meta->shards[i].replicas)
        absl::StrAppend(&out, " ", r.worker, r.available ? "" : "(x)");
      absl::StrAppend(&out, "\n");
    }
  }
  return out;
}

// The value of `metric` (a gauge or counter without labels) in a scrape of
// the coordinator's --metrics_listen port; -1 when absent.
double Metric(int port, const std::string& metric) {
  const std::string scrape = FetchMetrics(port);
  const size_t at = scrape.find("\n" + metric + " ");
  if (at == std::string::npos) return -1;
  return std::strtod(scrape.c_str() + at + metric.size() + 2, nullptr);
}

int64_t BytesOf(Client& client, const std::string& worker) {
  auto workers = WorkersByName(client);
  auto it = workers.find(worker);
  return it == workers.end() ? -1 : it->second.bytes_used;
}

int64_t AliveBytes(Client& client) {
  int64_t total = 0;
  for (const auto& [name, w] : WorkersByName(client))
    total += w.alive ? w.bytes_used : 0;
  return total;
}

// Readers looping whole-region and row reads of `name` while a test kills
// workers: each read must return `want`'s bytes.
class Readers {
 public:
  Readers(const std::string& coordinator, const std::string& name,
          const HostArray& want, int threads) {
    for (int t = 0; t < threads; ++t) {
      threads_.emplace_back([=, &want] {
        // Half the readers over gRPC: every read asks the worker itself
        // (shared memory keeps serving a hung worker's mapped shards).
        ClientOptions options;
        if (t % 2 == 1) options.transport = "grpc";
        auto client = Client::Connect(coordinator, options);
        if (!client.ok()) {
          ++failed_;
          return;
        }
        const int64_t rows = want.shape[0];
        for (int i = 0; !stop_.load(); ++i) {
          const int64_t row = (i * 7 + t) % rows;
          bool ok = false;
          if (i % 2 == 0) {
            auto got = (*client)->Get(name, Box{{row, 0}, {1, want.shape[1]}});
            ok = got.ok() &&
                 std::memcmp(got->data(), want.data() + row * RowBytes(want),
                             RowBytes(want)) == 0;
            if (!got.ok()) last_error_ = got.status().ToString();
          } else {
            auto got = (*client)->GatherRows(name, {row, (row + 1) % rows});
            ok = got.ok() &&
                 std::memcmp(got->data(), want.data() + row * RowBytes(want),
                             RowBytes(want)) == 0;
            if (!got.ok()) last_error_ = got.status().ToString();
          }
          ++reads_;
          if (!ok) ++failed_;
        }
      });
    }
  }
  ~Readers() { Stop(); }
  void Stop() {
    stop_ = true;
    for (std::thread& t : threads_) {
      if (t.joinable()) t.join();
    }
  }
  int64_t reads() const { return reads_.load(); }
  int64_t failed() const { return failed_.load(); }
  std::string last_error() const { return last_error_; }

 private:
  static size_t RowBytes(const HostArray& a) {
    return static_cast<size_t>(a.num_bytes / a.shape[0]);
  }
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> reads_{0};
  std::atomic<int64_t> failed_{0};
  std::string last_error_;  // racy by design: only printed
  std::vector<std::thread> threads_;
};

// Each test starts its own cluster (Start) and holds a client of it.
class ReplicaRepairTest : public ::testing::Test {
 protected:
  void Start(const TestClusterOptions& options) {
    auto cluster = TestCluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = *std::move(cluster);
    client_ = Connect(*cluster_);
    ASSERT_NE(client_, nullptr);
  }

  // Gives the coordinator a --metrics_listen port, returned.
  static int WithMetrics(TestClusterOptions& options) {
    const int port = PickFreePort();
    options.coordinator_flags.push_back(
        absl::StrCat("--metrics_listen=127.0.0.1:", port));
    return port;
  }

  std::unique_ptr<TestCluster> cluster_;
  std::unique_ptr<Client> client_;
};

TEST_F(ReplicaRepairTest, AKilledWorkersShardsAreCopiedUntilRHoldsAgain) {
  TestClusterOptions options = ZonedCluster(5);
  const int metrics = WithMetrics(options);
  ASSERT_NO_FATAL_FAILURE(Start(options));
  const HostArray data = Iota(DType::kFloat32, {500, 1000});  // 2 MB
  ASSERT_OK(
      client_->Put("weights", data, ReplicatedChunks({0, 1, 2, 3, 4}, 2)));
  // A tensor of one replica away from the workers that die is untouched.
  const HostArray lone = Iota(DType::kInt32, {30, 10}, 3);
  ASSERT_OK(client_->Put("lone", lone, LayoutSpec::Chunk(0, Ranks({2, 3}))));
  // Every replica of both tensors (a heartbeat may lag an allocation, so
  // this is computed, not read).
  const int64_t before = 2 * data.num_bytes + lone.num_bytes;
  ASSERT_TRUE(
      Eventually([&] { return AliveBytes(*client_) == before; }, kWait));
  const int64_t w0_bytes = BytesOf(*client_, "w0");
  ASSERT_GT(w0_bytes, 0);

  Readers readers(cluster_->coordinator_address(), "weights", data, 4);
  absl::SleepFor(absl::Milliseconds(300));
  cluster_->StopWorker(0, SIGKILL);
  ASSERT_TRUE(Eventually(
      [&] { return FullyReplicated(*client_, "weights", 2, {"w0"}); }, kWait))
      << cluster_->coordinator_log();
  // The metrics say so: w0's bytes copied, nothing short any more.
  EXPECT_TRUE(Eventually(
      [&] {
        return Metric(metrics, "tessera_repair_bytes_total") ==
                   static_cast<double>(w0_bytes) &&
               Metric(metrics, "tessera_under_replicated_shards") == 0;
      },
      kWait))
      << FetchMetrics(metrics);
  // The survivors hold what they held plus exactly w0's bytes: the repair
  // copied those and nothing else.
  EXPECT_TRUE(Eventually([&] { return AliveBytes(*client_) == before; }, kWait))
      << AliveBytes(*client_) << " vs " << before << " (w0 held " << w0_bytes
      << ")\n"
      << Layout(*client_) << cluster_->coordinator_log();

  // A second worker dies after the repair: R holds again.
  cluster_->StopWorker(1, SIGKILL);
  ASSERT_TRUE(Eventually(
      [&] {
        return FullyReplicated(*client_, "weights", 2, {"w0", "w1"});
      },
      kWait))
      << cluster_->coordinator_log();
  readers.Stop();
  EXPECT_GT(readers.reads(), 0);
  EXPECT_EQ(readers.failed(), 0) << readers.last_error();
  ASSERT_OK_AND_ASSIGN(HostArray got, client_->Get("weights"));
  EXPECT_TRUE(SameBytes(got, data));
  ASSERT_OK_AND_ASSIGN(HostArray got_lone, client_->Get("lone"));
  EXPECT_TRUE(SameBytes(got_lone, lone));
  ASSERT_OK_AND_ASSIGN(TensorMetadata meta, client_->Describe("weights"));
  EXPECT_EQ(meta.version, 1u);  // a repair is not a new version
}

TEST_F(ReplicaRepairTest,
       AHungWorkerIsRepairedAndGivesUpItsSurplusWhenItWakes) {
  ASSERT_NO_FATAL_FAILURE(Start(ZonedCluster(4)));
  const HostArray data = Iota(DType::kFloat32, {400, 256}, 7);
  ASSERT_OK(client_->Put("hung", data, ReplicatedChunks({0, 1, 2, 3}, 2)));

  // Hung, not dead: its lease runs on, and reads go to the other replica
  // after ClientOptions::replica_timeout instead of waiting for it.
  Readers readers(cluster_->coordinator_address(), "hung", data, 4);
  absl::SleepFor(absl::Milliseconds(300));
  ASSERT_EQ(kill(cluster_->worker_pid(0), SIGSTOP), 0);
  const bool repaired = Eventually(
      [&] { return FullyReplicated(*client_, "hung", 2, {"w0"}); }, kWait);
  readers.Stop();
  ASSERT_EQ(kill(cluster_->worker_pid(0), SIGCONT), 0);
  ASSERT_TRUE(repaired) << cluster_->coordinator_log();
  EXPECT_GT(readers.reads(), 0);
  EXPECT_EQ(readers.failed(), 0) << readers.last_error();
  // Awake again, w0 holds replicas nothing references any more: freed.
  EXPECT_TRUE(Eventually(
      [&] {
        auto w = WorkersByName(*client_)["w0"];
        return w.alive && w.bytes_used == 0;
      },
      kWait))
      << BytesOf(*client_, "w0");
  ASSERT_OK_AND_ASSIGN(HostArray got, client_->Get("hung"));
  EXPECT_TRUE(SameBytes(got, data));
}

TEST_F(ReplicaRepairTest, RepairAfterACoordinatorRestartFindsWhatIsLeftToDo) {
  ASSERT_NO_FATAL_FAILURE(Start(ZonedCluster(4)));
  const HostArray data = Iota(DType::kInt64, {300, 64}, 2);
  ASSERT_OK(client_->Put("triple", data, ReplicatedChunks({0, 1, 2, 3}, 3)));
  // The worker dies while the coordinator is down: the restarted one finds
  // the shards short (recomputed from its metadata) and repairs them.
  cluster_->StopCoordinator(SIGKILL);
  cluster_->StopWorker(3, SIGKILL);
  ASSERT_OK(cluster_->RestartCoordinator());
  client_ = Connect(*cluster_);
  ASSERT_NE(client_, nullptr);
  ASSERT_TRUE(Eventually(
      [&] { return FullyReplicated(*client_, "triple", 3, {"w3"}); }, kWait))
      << cluster_->coordinator_log();
  ASSERT_OK_AND_ASSIGN(HostArray got, client_->Get("triple"));
  EXPECT_TRUE(SameBytes(got, data));
}

TEST_F(ReplicaRepairTest, AClientWritesOnceAndEveryReplicaHoldsTheBytes) {
  // Without repair, so that each read below is served by a replica the
  // commit filled (not one a repair made).
  TestClusterOptions options = ZonedCluster(4);
  options.coordinator_flags.push_back("--repair=false");
  const int metrics = WithMetrics(options);
  ASSERT_NO_FATAL_FAILURE(Start(options));
  HostArray data = Iota(DType::kInt32, {64, 32}, 5);
  ASSERT_OK(client_->Put("written", data, ReplicatedChunks({0}, 3)));
  // An update of a region, then of the whole tensor: version 3.
  const HostArray patch = Iota(DType::kInt32, {8, 32}, 6);
  ASSERT_OK(client_->Update("written", patch, Box{{10, 0}, {8, 32}}).status());
  std::memcpy(data.data() + 10 * 32 * 4, patch.data(), patch.num_bytes);
  ASSERT_OK_AND_ASSIGN(HostArray got, client_->Get("written"));
  ASSERT_TRUE(SameBytes(got, data));
  ASSERT_OK_AND_ASSIGN(TensorMetadata meta, client_->Describe("written"));
  ASSERT_EQ(meta.shards[0].replicas.size(), 3u);
  EXPECT_EQ(meta.shards[0].replicas[0].worker, "w0");
  // The client wrote w0 alone; each other replica answers with the bytes
  // once the ones before it are gone.
  cluster_->StopWorker(0, SIGKILL);
  ASSERT_OK_AND_ASSIGN(got, client_->Get("written"));
  EXPECT_TRUE(SameBytes(got, data));
  const std::string second = meta.shards[0].replicas[1].worker;
  cluster_->StopWorker(second[1] - '0', SIGKILL);
  ASSERT_OK_AND_ASSIGN(got, client_->Get("written"));
  EXPECT_TRUE(SameBytes(got, data));
  // Without repair, the one shard stays short once the leases end.
  EXPECT_TRUE(Eventually(
      [&] { return Metric(metrics, "tessera_under_replicated_shards") == 1; },
      kWait))
      << FetchMetrics(metrics);
  EXPECT_EQ(Metric(metrics, "tessera_repair_bytes_total"), 0);
}

TEST_F(ReplicaRepairTest, AReshardGoesOnFromAnotherReplicaWhenASourceDies) {
  TestClusterOptions options = ZonedCluster(4);
  options.coordinator_flags.push_back("--repair=false");
  ASSERT_NO_FATAL_FAILURE(Start(options));
  const HostArray data = Iota(DType::kFloat32, {256, 64}, 8);
  ASSERT_OK(client_->Put("moving", data, ReplicatedChunks({0, 1}, 2)));
  // w0 dies; its lease has not run out, so it still looks available and
  // the reshard's pulls from it fail, then go on from the other replicas.
  cluster_->StopWorker(0, SIGKILL);
  LayoutSpec columns = LayoutSpec::Chunk(1, Ranks({2, 3}));
  columns.replicas = 1;
  ASSERT_OK(client_->Reshard("moving", columns).status());
  ASSERT_OK_AND_ASSIGN(HostArray got, client_->Get("moving"));
  EXPECT_TRUE(SameBytes(got, data));
}

struct CliResult {
  int code = 0;
  std::string out, err;
};

CliResult Cli(const TestCluster& cluster, std::vector<std::string> args) {
  std::vector<std::string> argv = {
      TestCluster::BinaryPath("client/tessera"),
      "--coordinator=" + cluster.coordinator_address()};
  argv.insert(argv.end(), args.begin(), args.end());
  CliResult r;
  r.code = TestCluster::Run(argv, &r.out, &r.err);
  return r;
}

TEST_F(ReplicaRepairTest, DrainMovesEveryShardAndRmForgetsTheWorker) {
  ASSERT_NO_FATAL_FAILURE(Start(ZonedCluster(4)));
  const HostArray one = Iota(DType::kFloat32, {400, 100}, 1);
  ASSERT_OK(
      client_->Put("one", one, LayoutSpec::Chunk(0, Ranks({0, 1, 2, 3}))));
  const HostArray two = Iota(DType::kFloat32, {400, 100}, 2);
  ASSERT_OK(client_->Put("two", two, ReplicatedChunks({1, 2, 3, 0}, 2)));

  // Bad input first: nothing changes.
  EXPECT_EQ(Cli(*cluster_, {"worker", "evict", "w1"}).code, 2);
  EXPECT_EQ(Cli(*cluster_, {"worker", "drain", "bad name!"}).code, 2);
  CliResult unknown = Cli(*cluster_, {"worker", "drain", "w9"});
  EXPECT_EQ(unknown.code, 1);
  EXPECT_THAT(unknown.err, HasSubstr("not found"));
  CliResult alive_rm = Cli(*cluster_, {"worker", "rm", "w2"});
  EXPECT_EQ(alive_rm.code, 1);
  EXPECT_THAT(alive_rm.err, HasSubstr("holds"));  // w2 holds "one"'s shard 2

  Readers readers_one(cluster_->coordinator_address(), "one", one, 2);
  Readers readers_two(cluster_->coordinator_address(), "two", two, 2);
  CliResult drain = Cli(*cluster_, {"worker", "drain", "w1"});
  ASSERT_EQ(drain.code, 0) << drain.err << cluster_->coordinator_log();
  EXPECT_THAT(drain.out, HasSubstr("drained"));
  readers_one.Stop();
  readers_two.Stop();
  EXPECT_EQ(readers_one.failed(), 0) << readers_one.last_error();
  EXPECT_EQ(readers_two.failed(), 0) << readers_two.last_error();
  EXPECT_TRUE(FullyReplicated(*client_, "one", 1, {"w1"}));
  EXPECT_TRUE(FullyReplicated(*client_, "two", 2, {"w1"}));
  auto workers = WorkersByName(*client_);
  EXPECT_EQ(workers["w1"].state, WorkerState::kDraining);
  EXPECT_EQ(workers["w1"].bytes_used, 0);
  ASSERT_OK_AND_ASSIGN(HostArray got_one, client_->Get("one"));
  EXPECT_TRUE(SameBytes(got_one, one));
  ASSERT_OK_AND_ASSIGN(HostArray got_two, client_->Get("two"));
  EXPECT_TRUE(SameBytes(got_two, two));
  // A draining worker takes no new replicas: R=3 needs w0, w2 and w3.
  const LayoutSpec three = ReplicatedChunks({0}, 3);
  ASSERT_OK(client_->Put("three", one, three));
  ASSERT_OK_AND_ASSIGN(TensorMetadata meta3, client_->Describe("three"));
  for (const Replica& r : meta3.shards[0].replicas) EXPECT_NE(r.worker, "w1");
  // Nor one placed on it by rank or by name: the drain stays done.
  EXPECT_THAT(
      client_->Put("on-w1", one, LayoutSpec::Chunk(0, Ranks({0, 1}))),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("draining")));
  CliResult by_name =
      Cli(*cluster_, {"create", "on-w1", "--shape=8,8", "--dtype=float32",
                      "--chunk_dim=0", "--placements=w1"});
  EXPECT_EQ(by_name.code, 1);
  EXPECT_THAT(by_name.err, HasSubstr("'w1' (rank 1) for shard 0 is draining"));
  EXPECT_EQ(WorkersByName(*client_)["w1"].bytes_used, 0);
  EXPECT_THAT(client_->Describe("on-w1").status(),
              StatusIs(absl::StatusCode::kNotFound));

  // Cordon: no new shards either; uncordon gives them back.
  ASSERT_EQ(Cli(*cluster_, {"worker", "cordon", "w2"}).code, 0);
  EXPECT_EQ(WorkersByName(*client_)["w2"].state, WorkerState::kCordoned);
  EXPECT_THAT(
      client_->Put("four", one, three),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("replicas")));
  EXPECT_THAT(
      client_->Put("four", one, LayoutSpec::Chunk(0, Ranks({2}))),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("cordoned")));
  CliResult cordoned_reshard =
      Cli(*cluster_, {"reshard", "one", "--chunk_dim=1", "--placements=w0,w2"});
  EXPECT_EQ(cordoned_reshard.code, 1);
  EXPECT_THAT(cordoned_reshard.err, HasSubstr("cordoned"));
  CliResult uncordon = Cli(*cluster_, {"worker", "uncordon", "w2"});
  ASSERT_EQ(uncordon.code, 0) << uncordon.err;
  ASSERT_OK(client_->Put("four", one, three));

  // Drained and stopped (its pod is gone): forgotten for good.
  cluster_->StopWorker(1, SIGTERM);
  CliResult rm = Cli(*cluster_, {"worker", "rm", "w1"});
  ASSERT_EQ(rm.code, 0) << rm.err;
  EXPECT_EQ(WorkersByName(*client_).count("w1"), 0u);
  CliResult workers_json = Cli(*cluster_, {"workers", "--json"});
  ASSERT_EQ(workers_json.code, 0);
  EXPECT_THAT(workers_json.out, ::testing::Not(HasSubstr("\"w1\"")));
  EXPECT_THAT(workers_json.out, HasSubstr("\"state\": \"ready\""));
}

}  // namespace
}  // namespace tessera
