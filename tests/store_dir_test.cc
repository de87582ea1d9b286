// Workers with --store_dir (CLI.md "Restart-safe workers (v3)") against
// real daemons: a worker killed with SIGKILL and started again on its
// directory serves the shards it held (a put's, a create's, a reshard's),
// under the same handles, with nothing copied from anywhere, same-host
// readers still through shared memory, UCX readers from the mapping; a shard
// whose file was damaged meanwhile is dropped and repaired from its replica,
// and a file no committed change wrote is removed; shards of another cluster
// than the coordinator's are kept until their own returns.
#include <dirent.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
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
#include "transport/shared_memory_arena.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

// Worker i's store, one per test (each test starts a cluster of its own).
std::string StoreDir(int i) {
  return absl::StrCat(
      std::getenv("TEST_TMPDIR"), "/",
      ::testing::UnitTest::GetInstance()->current_test_info()->name(),
      "/store-w", i);
}

// The value of an unlabeled metric in a scrape of `port`; -1 when absent.
double Metric(int port, const std::string& metric) {
  const std::string scrape = FetchMetrics(port);
  const size_t at = scrape.find("\n" + metric + " ");
  if (at == std::string::npos) return -1;
  return std::strtod(scrape.c_str() + at + metric.size() + 2, nullptr);
}

// How long a test waits for what the cluster does by itself.
constexpr absl::Duration kWait = absl::Seconds(30);

std::vector<std::string> DataFiles(int worker) {
  std::vector<std::string> out;
  const std::string dir = StoreDir(worker) + "/shards";
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      if (absl::EndsWith(e->d_name, ".data"))
        out.push_back(dir + "/" + e->d_name);
    }
    closedir(d);
  }
  return out;
}

class StoreDirTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // A mount namespace of this test's own, which its workers share: a
    // small tmpfs mounted in it is a store that fills, gone with the test.
    ASSERT_EQ(unshare(CLONE_NEWNS), 0)
        << "a mount namespace for the full-store test: "
        << std::strerror(errno);
    ASSERT_EQ(mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr), 0)
        << std::strerror(errno);
  }

  void SetUp() override {
    TestClusterOptions options;
    options.num_workers = 3;
    options.durable = true;
    options.coordinator_flags = {
        "--lease_ms=2500", "--heartbeat_ms=200", "--retire_grace_ms=200",
        absl::StrCat("--metrics_listen=127.0.0.1:", coordinator_metrics_)};
    for (int i = 0; i < 3; ++i) worker_metrics_.push_back(PickFreePort());
    const std::vector<int> ports = worker_metrics_;
    std::vector<std::string> stores;
    for (int i = 0; i < 3; ++i) stores.push_back(StoreDir(i));
    options.per_worker_flags = [ports,
                                stores](int i) -> std::vector<std::string> {
      return {"--store_dir=" + stores[i],
              absl::StrCat("--metrics_listen=127.0.0.1:", ports[i]),
              absl::StrCat("--zone=z", i)};
    };
    absl::StatusOr<std::unique_ptr<TestCluster>> cluster =
        TestCluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = *std::move(cluster);
    absl::StatusOr<std::unique_ptr<Client>> client =
        Client::Connect(cluster_->coordinator_address());
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
  }

  int64_t BytesOf(const std::string& worker) {
    absl::StatusOr<std::vector<WorkerInfo>> workers = client_->Workers();
    if (!workers.ok()) return -1;
    for (const WorkerInfo& w : *workers) {
      if (w.name == worker && w.alive) return w.bytes_used;
    }
    return -1;
  }

  // Every shard of `name` has its two replicas, all available, and the
  // coordinator has copied bytes for a repair.
  bool Repaired(const std::string& name) {
    absl::StatusOr<TensorMetadata> meta = client_->Describe(name);
    if (!meta.ok()) return false;
    for (const ShardInfo& s : meta->shards) {
      if (s.replicas.size() != 2) return false;
      for (const Replica& r : s.replicas)
        if (!r.available) return false;
    }
    return Metric(coordinator_metrics_, "tessera_repair_bytes_total") > 0;
  }

  const int coordinator_metrics_ = PickFreePort();
  std::vector<int> worker_metrics_;
  std::unique_ptr<TestCluster> cluster_;
  std::unique_ptr<Client> client_;
};

TEST_F(StoreDirTest, AKilledWorkerServesItsShardsAgainWithoutACopy) {
  const HostArray data = Iota(DType::kFloat32, {300, 1024});
  ASSERT_OK(client_->Put("w", data, LayoutSpec::Chunk(0, Ranks({0, 1, 2}))));
  // A reshard's shards are kept too (filled by copies, sealed at commit).
  const HostArray moved = Iota(DType::kInt64, {64, 96}, 5);
  ASSERT_OK(client_->Put("m", moved, LayoutSpec::Chunk(0, Ranks({1, 2}))));
  ASSERT_OK(
      client_->Reshard("m", LayoutSpec::Chunk(1, Ranks({0, 1}))).status());
  // A create's shards (filled by their worker) too.
  ASSERT_OK(client_
                ->Create("c", {32, 16}, DType::kFloat32,
                         LayoutSpec::Chunk(0, Ranks({0})),
                         InitSpec{InitSpec::Kind::kRand, "", 3})
                .status());
  ASSERT_OK_AND_ASSIGN(HostArray created, client_->Get("c"));
  const HostArray big = Iota(DType::kFloat32, {1024, 1024}, 8);
  ASSERT_OK(client_->Put("big", big, LayoutSpec::Chunk(0, Ranks({0}))));
  ASSERT_OK_AND_ASSIGN(TensorMetadata before_w, client_->Describe("w"));
  ASSERT_OK_AND_ASSIGN(TensorMetadata before_m, client_->Describe("m"));
  ASSERT_TRUE(Eventually([&] { return BytesOf("w0") > 0; }, kWait));
  const int64_t held = BytesOf("w0");

  cluster_->StopWorker(0, SIGKILL);
  ASSERT_OK(cluster_->RestartWorker(0));
  // Its shards serve again: the same bytes under the same handles.
  ASSERT_TRUE(Eventually(
      [&] {
        absl::StatusOr<HostArray> got = client_->Get("w");
        return got.ok() && SameBytes(*got, data);
      },
      kWait))
      << cluster_->worker_log(0);
  ASSERT_OK_AND_ASSIGN(HostArray got_m, client_->Get("m"));
  EXPECT_TRUE(SameBytes(got_m, moved));
  // A reader on this host maps the shard's file read-only and copies out
  // of it, as out of a shared-memory segment: no gRPC bytes, no staging
  // (small reads go by one gRPC call whatever the shard: this one is 4 MiB).
  auto worker_calls = [&](const std::string& method) {
    return MetricSum(FetchMetrics(worker_metrics_[0]),
                     "tessera_rpc_requests_total",
                     "method=\"/tessera.v1.Worker/" + method + "\"");
  };
  const double staged_before = worker_calls("StageRead");
  const double mapped_before = worker_calls("MapShard");
  ASSERT_OK_AND_ASSIGN(HostArray got_big, client_->Get("big"));
  EXPECT_TRUE(SameBytes(got_big, big));
  if (!LocalHostId().empty()) {
    EXPECT_EQ(worker_calls("StageRead"), staged_before);
    EXPECT_GT(worker_calls("MapShard"), mapped_before);
    const DataPlaneStats moved_by = client_->TransferStats();
    auto bytes = [&](const char* t) {
      auto it = moved_by.bytes.find(t);
      return it == moved_by.bytes.end() ? int64_t{0} : it->second;
    };
    EXPECT_GE(bytes("shm"), big.num_bytes);
  }
  // UCX reads them from the mapping too.
  ClientOptions ucx_options;
  ucx_options.transport = "ucx";
  absl::StatusOr<std::unique_ptr<Client>> over_ucx =
      Client::Connect(cluster_->coordinator_address(), ucx_options);
  ASSERT_OK(over_ucx.status());
  ASSERT_OK_AND_ASSIGN(HostArray got_ucx, (*over_ucx)->Get("big"));
  EXPECT_TRUE(SameBytes(got_ucx, big));
  EXPECT_GE((*over_ucx)->TransferStats().bytes["ucx"], big.num_bytes);
  ASSERT_OK_AND_ASSIGN(HostArray got_c, client_->Get("c"));
  EXPECT_TRUE(SameBytes(got_c, created));
  ASSERT_OK_AND_ASSIGN(TensorMetadata after_w, client_->Describe("w"));
  ASSERT_OK_AND_ASSIGN(TensorMetadata after_m, client_->Describe("m"));
  EXPECT_EQ(after_w.version, before_w.version);
  for (size_t i = 0; i < before_w.shards.size(); ++i) {
    EXPECT_EQ(after_w.HandleString(i), before_w.HandleString(i));
    EXPECT_TRUE(after_w.shards[i].replicas.front().available);
  }
  for (size_t i = 0; i < before_m.shards.size(); ++i)
    EXPECT_EQ(after_m.HandleString(i), before_m.HandleString(i));
  // Nothing copied: the worker says what it re-attached, `workers` counts
  // it, and no repair moved a byte.
  EXPECT_EQ(Metric(worker_metrics_[0], "tessera_worker_reattached_shards"), 4)
      << FetchMetrics(worker_metrics_[0]);
  EXPECT_EQ(Metric(worker_metrics_[0], "tessera_worker_reattached_bytes"),
            static_cast<double>(held));
  EXPECT_EQ(Metric(worker_metrics_[0], "tessera_worker_store_damaged_shards"),
            0);
  EXPECT_TRUE(Eventually([&] { return BytesOf("w0") == held; }, kWait));
  EXPECT_THAT(cluster_->worker_log(0), HasSubstr("nothing copied"));
  const double repaired =
      Metric(coordinator_metrics_, "tessera_repair_bytes_total");
  EXPECT_TRUE(repaired <= 0) << repaired;

  // Freed shards leave the directory: after deletes, no file is left.
  ASSERT_OK(client_->Delete("w"));
  ASSERT_OK(client_->Delete("m"));
  ASSERT_OK(client_->Delete("c"));
  ASSERT_OK(client_->Delete("big"));
  EXPECT_TRUE(Eventually([&] { return DataFiles(0).empty(); }, kWait));
}

TEST_F(StoreDirTest, ADamagedShardIsDroppedAndRepairedFromItsReplica) {
  const HostArray data = Iota(DType::kFloat32, {64, 1024}, 9);
  ASSERT_OK(client_->Put("d", data, ReplicatedChunks({0, 1, 2}, 2)));
  cluster_->StopWorker(1, SIGKILL);
  // One of its shard files damaged while it was down, and a file that no
  // committed change wrote.
  const std::vector<std::string> files = DataFiles(1);
  ASSERT_FALSE(files.empty());
  {
    std::fstream f(files.front(),
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x7f');
  }
  std::ofstream(StoreDir(1) + "/shards/00000000000000aa.data") << "stray";
  ASSERT_OK(cluster_->RestartWorker(1));
  EXPECT_TRUE(Eventually(
      [&] {
        return Metric(worker_metrics_[1],
                      "tessera_worker_store_damaged_shards") == 1;
      },
      kWait))
      << cluster_->worker_log(1);
  EXPECT_THAT(cluster_->worker_log(1), HasSubstr("fail their checksum"));
  EXPECT_THAT(cluster_->worker_log(1), HasSubstr("1 never committed removed"));
  // The damaged shard is copied back from its other replica.
  EXPECT_TRUE(Eventually([&] { return Repaired("d"); }, kWait))
      << cluster_->coordinator_log();
  ASSERT_OK_AND_ASSIGN(HostArray got, client_->Get("d"));
  EXPECT_TRUE(SameBytes(got, data));
}

// A shard whose record, intact and with the right checksum, names another
// tensor than the coordinator placed under its id (records edited, files
// of two directories mixed) is not served as "available" to no reader: the
// coordinator sets it aside (its files kept in DIR/damaged), counts it
// lost and repairs it from its replica.
TEST_F(StoreDirTest, AShardWhoseRecordNamesAnotherTensorIsSetAsideAndRepaired) {
  const HostArray data = Iota(DType::kFloat32, {64, 1024}, 11);
  ASSERT_OK(client_->Put("alpha", data, ReplicatedChunks({0, 1, 2}, 2)));
  cluster_->StopWorker(1, SIGKILL);
  int edited = 0;
  for (const std::string& data_file : DataFiles(1)) {
    const std::string record =
        data_file.substr(0, data_file.size() - 5) + ".record";
    std::ifstream in(record);
    std::string text((std::istreambuf_iterator<char>(in)), {});
    const size_t at = text.find("\"alpha\"");
    if (at == std::string::npos) continue;
    text.replace(at, 7, "\"omega\"");
    std::ofstream(record, std::ios::trunc) << text;
    ++edited;
    break;
  }
  ASSERT_EQ(edited, 1);
  ASSERT_OK(cluster_->RestartWorker(1));
  EXPECT_TRUE(Eventually([&] { return Repaired("alpha"); }, kWait))
      << cluster_->coordinator_log();
  EXPECT_THAT(cluster_->coordinator_log(), HasSubstr("set aside"));
  EXPECT_THAT(cluster_->worker_log(1), HasSubstr("its files kept in"));
  EXPECT_TRUE(std::filesystem::exists(StoreDir(1) + "/damaged"));
  // Reads spread over the replicas: every one serves the right bytes.
  for (int i = 0; i < 6; ++i) {
    ASSERT_OK_AND_ASSIGN(HostArray got, client_->Get("alpha"));
    EXPECT_TRUE(SameBytes(got, data));
  }
}

// A worker restarted on its directory while a coordinator of another
// cluster (an empty --data_dir) serves keeps the shards its records name
// for its own cluster, quarantined, and serves them again when its own
// coordinator is back: nothing is lost.
TEST_F(StoreDirTest, ShardsOfAnotherClusterAreKeptUntilTheirOwnReturns) {
  const HostArray data = Iota(DType::kInt32, {90, 40}, 4);
  ASSERT_OK(client_->Put("q", data, LayoutSpec::Chunk(0, Ranks({0, 2}))));
  const std::string data_dir = cluster_->data_dir();
  ASSERT_EQ(cluster_->StopCoordinator(SIGTERM), 0);
  ASSERT_EQ(rename(data_dir.c_str(), (data_dir + ".own").c_str()), 0);
  ASSERT_OK(cluster_->RestartCoordinator());
  cluster_->StopWorker(0, SIGKILL);
  ASSERT_OK(cluster_->RestartWorker(0));
  auto other = Client::Connect(cluster_->coordinator_address());
  ASSERT_OK(other.status());
  EXPECT_TRUE(Eventually(
      [&] {
        absl::StatusOr<std::vector<WorkerInfo>> workers = (*other)->Workers();
        if (!workers.ok()) return false;
        for (const WorkerInfo& w : *workers) {
          if (w.name == "w0") return w.quarantined_shards == 1;
        }
        return false;
      },
      kWait))
      << cluster_->worker_log(0);
  EXPECT_THAT(cluster_->worker_log(0), HasSubstr("quarantined"));
  // Its own coordinator returns: the tensor is whole.
  ASSERT_EQ(cluster_->StopCoordinator(SIGTERM), 0);
  std::filesystem::remove_all(data_dir);
  ASSERT_EQ(rename((data_dir + ".own").c_str(), data_dir.c_str()), 0);
  ASSERT_OK(cluster_->RestartCoordinator());
  auto own = Client::Connect(cluster_->coordinator_address());
  ASSERT_OK(own.status());
  EXPECT_TRUE(Eventually(
      [&] {
        absl::StatusOr<HostArray> got = (*own)->Get("q");
        return got.ok() && SameBytes(*got, data);
      },
      kWait))
      << cluster_->worker_log(0);
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// Worker 0's store on a file system of 8 MiB.
class FullStoreDirTest : public StoreDirTest {
 protected:
  void SetUp() override {
    std::filesystem::create_directories(StoreDir(0));
    ASSERT_EQ(
        mount("tessera-store", StoreDir(0).c_str(), "tmpfs", 0, "size=8m"), 0)
        << std::strerror(errno);
    StoreDirTest::SetUp();
  }
  void TearDown() override {
    cluster_.reset();
    umount2(StoreDir(0).c_str(), MNT_DETACH);
  }

  int64_t FreeBytes() {
    struct statvfs s {};
    EXPECT_EQ(statvfs(StoreDir(0).c_str(), &s), 0);
    return static_cast<int64_t>(s.f_bavail) * static_cast<int64_t>(s.f_frsize);
  }
};

// A put or a create larger than the room left on a worker's --store_dir
// fails with RESOURCE_EXHAUSTED before a byte is written (the shard files
// are reserved, not sparse), gives the room back, and the worker lives on
// to take what fits.
TEST_F(FullStoreDirTest, AStoreThatFillsFailsTheWriteNotTheWorker) {
  const pid_t pid = cluster_->worker_pid(0);
  const int64_t free_before = FreeBytes();
  // 16 MiB on w0 alone: twice the room.
  const HostArray big = Iota(DType::kFloat32, {4096, 1024});
  absl::StatusOr<TensorMetadata> put =
      client_->Put("big", big, LayoutSpec::Chunk(0, Ranks({0})));
  ASSERT_FALSE(put.ok());
  EXPECT_EQ(put.status().code(), absl::StatusCode::kResourceExhausted)
      << put.status();
  EXPECT_THAT(put.status().message(), HasSubstr("store_dir"));
  // A create whose worker fills the bytes itself (ones).
  InitSpec ones;
  ones.kind = InitSpec::Kind::kOnes;
  absl::StatusOr<TensorMetadata> made =
      client_->Create("ones", {4096, 1024}, DType::kFloat32,
                      LayoutSpec::Chunk(0, Ranks({0})), ones);
  ASSERT_FALSE(made.ok());
  EXPECT_EQ(made.status().code(), absl::StatusCode::kResourceExhausted)
      << made.status();

  // Nothing stays: not the names, not the room.
  EXPECT_THAT(client_->Describe("big").status(),
              testing::StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(client_->Describe("ones").status(),
              testing::StatusIs(absl::StatusCode::kNotFound));
  EXPECT_TRUE(Eventually([&] { return FreeBytes() == free_before; }, kWait))
      << FreeBytes() << " bytes free, " << free_before << " before";
  EXPECT_TRUE(DataFiles(0).empty());

  // The same worker takes what fits, and keeps it through a restart.
  EXPECT_EQ(kill(pid, 0), 0) << cluster_->worker_log(0);
  const HostArray fits = Iota(DType::kFloat32, {1024, 1024}, 3);
  ASSERT_OK(client_->Put("fits", fits, LayoutSpec::Chunk(0, Ranks({0}))));
  ASSERT_OK(client_->Create("fits-ones", {512, 1024}, DType::kFloat32,
                            LayoutSpec::Chunk(0, Ranks({0})), ones));
  EXPECT_EQ(cluster_->worker_pid(0), pid);
  cluster_->StopWorker(0, SIGKILL);
  ASSERT_OK(cluster_->RestartWorker(0));
  absl::StatusOr<HostArray> back = client_->Get("fits");
  ASSERT_OK(back.status());
  EXPECT_TRUE(SameBytes(*back, fits));
}

}  // namespace
}  // namespace tessera
