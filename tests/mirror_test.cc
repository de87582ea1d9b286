// Mirrors (CLI.md "Mirrors (v4)") on real daemons: a tensor created, put,
// updated or resharded with --mirror keeps a whole copy of every shard on
// every ready worker whose --labels match; the copies hold its bytes (read
// with every replica's worker killed), count in bytes_used and in the
// owner's quota, follow the group as workers come and go (cordon,
// uncordon, death, a restart), are never repaired elsewhere, and go with
// `reshard --mirror=none`.
#include <signal.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/npy_file.h"
#include "client/tessera_client.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/cluster.h"

namespace tessera {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

// How long a test waits for what the cluster does by itself.
constexpr absl::Duration kWait = absl::Seconds(20);

// w0 and w1 unlabelled; w2 and w3 serve inference.
class MirrorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TestClusterOptions options;
    options.num_workers = 4;
    // Quotas the tests may lower (the file is followed).
    quotas_ = absl::StrCat(std::getenv("TEST_TMPDIR"), "/quotas");
    WriteQuotas("* 1G\n");
    options.coordinator_flags = {"--heartbeat_ms=200", "--lease_ms=1500",
                                 "--quotas=" + quotas_,
                                 "--reload_interval=200ms"};
    options.per_worker_flags = [](int i) {
      return i >= 2 ? std::vector<std::string>{"--labels=role=inference"}
                    : std::vector<std::string>{};
    };
    ASSERT_OK_AND_ASSIGN(cluster_, TestCluster::Start(options));
    ASSERT_OK_AND_ASSIGN(client_,
                         Client::Connect(cluster_->coordinator_address()));
  }

  struct Cli {
    int code = -1;
    std::string out, err;
  };
  Cli Tessera(std::vector<std::string> args) {
    args.insert(args.begin(),
                {TestCluster::BinaryPath("client/tessera"),
                 "--coordinator=" + cluster_->coordinator_address()});
    Cli r;
    r.code = TestCluster::Run(args, &r.out, &r.err);
    return r;
  }

  // `tessera create` of "m": 8x4 float32 arange, its shards on w0 and w1,
  // a mirror of each on every worker of role=inference.
  void CreateMirrored() {
    Cli made = Tessera({"create", "m", "--shape=8,4", "--dtype=float32",
                        "--chunk_dim=0", "--placements=w0,w1", "--init=arange",
                        "--mirror=role=inference"});
    ASSERT_EQ(made.code, 0) << made.err;
  }

  // Per shard: the workers of its copies, "+" marking a mirror.
  std::vector<std::vector<std::string>> Copies(const std::string& name) {
    std::vector<std::vector<std::string>> out;
    absl::StatusOr<TensorMetadata> meta = client_->Describe(name);
    if (!meta.ok()) return out;
    for (const ShardInfo& s : meta->shards) {
      std::vector<std::string>& copies = out.emplace_back();
      for (const Replica& r : s.replicas)
        copies.push_back(r.mirror ? "+" + r.worker : r.worker);
    }
    return out;
  }
  // bytes_used of each live worker.
  std::map<std::string, int64_t> Used() {
    std::map<std::string, int64_t> out;
    absl::StatusOr<std::vector<WorkerInfo>> workers = client_->Workers();
    if (!workers.ok()) return out;
    for (const WorkerInfo& w : *workers) {
      if (w.alive) out[w.name] = w.bytes_used;
    }
    return out;
  }
  // The tensor's bytes as a get reads them now (from any copy).
  std::string Read(const std::string& name) {
    absl::StatusOr<std::unique_ptr<Client>> fresh =
        Client::Connect(cluster_->coordinator_address());
    if (!fresh.ok()) return "";
    absl::StatusOr<HostArray> got = (*fresh)->Get(name);
    if (!got.ok()) return got.status().ToString();
    return std::string(got->data(), static_cast<size_t>(got->num_bytes));
  }

  static HostArray Floats(int64_t rows, int64_t cols, float base) {
    HostArray a = HostArray::Allocate(DType::kFloat32, {rows, cols});
    auto* f = reinterpret_cast<float*>(a.data());
    for (int64_t i = 0; i < rows * cols; ++i)
      f[i] = base + static_cast<float>(i);
    return a;
  }

  void WriteQuotas(const std::string& text) {
    const std::string temp = quotas_ + ".tmp";
    std::ofstream(temp) << text;
    ASSERT_EQ(std::rename(temp.c_str(), quotas_.c_str()), 0);
  }
  int64_t QuotaUse() {
    absl::StatusOr<std::vector<QuotaInfo>> q = client_->Quotas();
    return q.ok() && q->size() == 1 ? (*q)[0].bytes : -1;
  }

  std::string quotas_;
  std::unique_ptr<TestCluster> cluster_;
  std::unique_ptr<Client> client_;
};

TEST_F(MirrorTest, EveryMatchingWorkerHoldsEveryShardAndServesIt) {
  // A create: the shards on w0 and w1, a mirror of each on w2 and w3.
  ASSERT_NO_FATAL_FAILURE(CreateMirrored());
  EXPECT_THAT(Copies("m"), ElementsAre(ElementsAre("w0", "+w2", "+w3"),
                                       ElementsAre("w1", "+w2", "+w3")));
  // 128 bytes: each mirror worker holds all of it (as reported with the
  // workers' heartbeats).
  const std::map<std::string, int64_t> held = {
      {"w0", 64}, {"w1", 64}, {"w2", 128}, {"w3", 128}};
  EXPECT_TRUE(Eventually([&] { return Used() == held; }, kWait));
  Cli listed = Tessera({"ls", "--json"});
  ASSERT_EQ(listed.code, 0) << listed.err;
  const nlohmann::json ls = nlohmann::json::parse(listed.out);
  ASSERT_EQ(ls.size(), 1u);
  EXPECT_EQ(ls[0]["replicas"], 1);
  EXPECT_EQ(ls[0]["mirror"], "role=inference");
  Cli described = Tessera({"describe", "m", "--json"});
  ASSERT_EQ(described.code, 0) << described.err;
  const nlohmann::json d = nlohmann::json::parse(described.out);
  EXPECT_EQ(d["mirror"], "role=inference");
  EXPECT_FALSE(d["shards"][0]["replicas"][0].contains("mirror"));
  EXPECT_EQ(d["shards"][0]["replicas"][1]["mirror"], true);
  EXPECT_EQ(d["shards"][0]["replicas"][2]["worker"], "w3");
  // Mirrors are the owner's bytes: quota use is every copy.
  absl::StatusOr<std::vector<QuotaInfo>> quota = client_->Quotas();
  ASSERT_OK(quota.status());
  ASSERT_EQ(quota->size(), 1u);
  EXPECT_EQ((*quota)[0].bytes, 384);

  // A put: a shard placed on a member needs no mirror there.
  const HostArray p = Floats(8, 4, 1000);
  ASSERT_OK(client_
                ->Put("p", p,
                      [] {
                        LayoutSpec spec = LayoutSpec::Chunk(
                            0, {*ParsePlacement("w0"), *ParsePlacement("w2")});
                        spec.mirror = "role=inference";
                        return spec;
                      }())
                .status());
  EXPECT_THAT(Copies("p"), ElementsAre(ElementsAre("w0", "+w2", "+w3"),
                                       ElementsAre("w2", "+w3")));
  // An update reaches every mirror: read with the replicas' workers gone.
  const HostArray next = Floats(8, 4, 5000);
  ASSERT_OK(client_->Update("p", next).status());
  const std::string arange = Read("m");
  cluster_->StopWorker(0, SIGKILL);
  cluster_->StopWorker(1, SIGKILL);
  EXPECT_EQ(Read("p"),
            std::string(next.data(), static_cast<size_t>(next.num_bytes)));
  EXPECT_EQ(Read("m"), arange);
  // Mirrors are not repaired elsewhere: w0's and w1's replicas stay lost
  // (no other worker takes a mirror's place), the mirrors serve.
  absl::SleepFor(absl::Seconds(3));
  EXPECT_TRUE(Eventually([&] { return Used()["w2"] == 256; }, kWait));
}

TEST_F(MirrorTest, TheRelayFillsAReplicaAndEveryMirrorWithTheWrittenBytes) {
  ASSERT_OK(cluster_->RestartCoordinator({"--replica_forward=relay"}));
  ASSERT_OK_AND_ASSIGN(client_,
                       Client::Connect(cluster_->coordinator_address()));
  // 4 MiB in one shard: 4 relay chunks, through a replica and two mirrors.
  LayoutSpec spec = LayoutSpec::Chunk(0, {*ParsePlacement("w0")});
  spec.replicas = 2;
  spec.mirror = "role=inference";
  const HostArray first = Floats(1024, 1024, 1);
  ASSERT_OK(client_->Put("r", first, spec).status());
  EXPECT_THAT(Copies("r"), ElementsAre(ElementsAre("w0", "w1", "+w2", "+w3")));
  const HostArray next = Floats(1024, 1024, 7);
  const SentBytes before = client_->TransferStats().workers_sent;
  ASSERT_OK(client_->Update("r", next).status());
  // Each of the three copies received the shard once, and no worker sent
  // it more than twice (CLI.md "Relay").
  SentBytes sent = client_->TransferStats().workers_sent;
  int64_t total = 0;
  for (auto& [worker, bytes] : sent) {
    auto it = before.find(worker);
    if (it != before.end()) bytes -= it->second;
    EXPECT_LE(bytes, 2 * next.num_bytes) << worker;
    total += bytes;
  }
  EXPECT_EQ(total, 3 * next.num_bytes);
  // Every copy holds the update: read with all but one gone, each in turn.
  const std::string want(next.data(), static_cast<size_t>(next.num_bytes));
  cluster_->StopWorker(0, SIGKILL);
  EXPECT_EQ(Read("r"), want);  // the replica on w1, or a mirror
  cluster_->StopWorker(1, SIGKILL);
  EXPECT_EQ(Read("r"), want);  // a mirror
  cluster_->StopWorker(2, SIGKILL);
  EXPECT_EQ(Read("r"), want);  // w3's mirror
}

TEST_F(MirrorTest, AnUpdateRelaysOnlyWhatChanged) {
  // 4 MiB in one shard, on w0 and w1, mirrored on w2 and w3.
  LayoutSpec spec = LayoutSpec::Chunk(0, {*ParsePlacement("w0")});
  spec.replicas = 2;
  spec.mirror = "role=inference";
  const HostArray first = Floats(1024, 1024, 1);
  ASSERT_OK(client_->Put("d", first, spec).status());
  // 2 % of the elements changed, scattered.
  HostArray next = Floats(1024, 1024, 1);
  auto* f = reinterpret_cast<float*>(next.data());
  int64_t changed = 0;
  uint64_t state = 12345;
  for (int64_t i = 0; i < 1024 * 1024; ++i) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    if ((state >> 33) % 50 == 0) {
      f[i] = -f[i];
      ++changed;
    }
  }
  const std::string in = absl::StrCat(std::getenv("TEST_TMPDIR"), "/d.npy");
  ASSERT_OK(WriteNpyFile(in, next));
  Cli update = Tessera({"put", "d", "--input=" + in, "--update", "--json"});
  ASSERT_EQ(update.code, 0) << update.err;
  const nlohmann::json out = nlohmann::json::parse(update.out);
  // Three copies each took the changes: about 6 bytes a changed element
  // (a varint gap and count, 4 bytes), under the 8 of its bytes and a
  // 4-byte offset, and far under a whole copy.
  const int64_t relayed = out["relayed_bytes"].get<int64_t>();
  int64_t total = 0;
  for (const auto& [worker, bytes] : out["sent"].items()) {
    total += bytes.get<int64_t>();
  }
  EXPECT_EQ(relayed, total);
  EXPECT_GT(relayed, 3 * changed * 4);
  EXPECT_LE(relayed, 3 * changed * 8);
  // Every copy holds the update exactly: read with all but one gone.
  const std::string want(next.data(), static_cast<size_t>(next.num_bytes));
  EXPECT_EQ(Read("d"), want);
  cluster_->StopWorker(0, SIGKILL);
  EXPECT_EQ(Read("d"), want);
  cluster_->StopWorker(1, SIGKILL);
  EXPECT_EQ(Read("d"), want);
  cluster_->StopWorker(2, SIGKILL);
  EXPECT_EQ(Read("d"), want);  // w3's mirror
}

TEST_F(MirrorTest, MirrorsFollowTheGroupAsWorkersComeAndGo) {
  ASSERT_NO_FATAL_FAILURE(CreateMirrored());
  const std::string bytes = Read("m");
  ASSERT_EQ(bytes.size(), 128u);
  // Cordoned: w3 leaves the group and drops its mirrors.
  ASSERT_OK(client_->SetWorkerState("w3", WorkerState::kCordoned));
  EXPECT_TRUE(Eventually([&] { return Used()["w3"] == 0; }, kWait))
      << Used()["w3"];
  EXPECT_THAT(Copies("m"),
              ElementsAre(ElementsAre("w0", "+w2"), ElementsAre("w1", "+w2")));
  // Uncordoned: it comes back and is filled again, from a copy.
  ASSERT_OK(client_->SetWorkerState("w3", WorkerState::kReady));
  // (A worker reports its bytes as soon as they are allocated; the copies
  // are listed once filled and recorded.)
  const std::vector<std::vector<std::string>> all_in = {{"w0", "+w2", "+w3"},
                                                        {"w1", "+w2", "+w3"}};
  EXPECT_TRUE(Eventually([&] { return Copies("m") == all_in; }, kWait));
  EXPECT_TRUE(Eventually([&] { return Used()["w3"] == 128; }, kWait));
  // Dead: its mirrors go; restarted (its memory lost), filled again; the
  // restarted copy holds the tensor's bytes.
  cluster_->StopWorker(2, SIGKILL);
  EXPECT_TRUE(Eventually(
      [&] {
        const auto copies = Copies("m");
        return copies.size() == 2 && copies[0].size() == 2;
      },
      kWait));
  ASSERT_OK(cluster_->RestartWorker(2));
  EXPECT_TRUE(Eventually(
      [&] {
        const auto copies = Copies("m");
        return copies.size() == 2 && copies[0].size() == 3 &&
               copies[1].size() == 3;
      },
      kWait));
  EXPECT_TRUE(Eventually([&] { return Used()["w2"] == 128; }, kWait));
  cluster_->StopWorker(0, SIGKILL);
  cluster_->StopWorker(1, SIGKILL);
  cluster_->StopWorker(3, SIGKILL);
  EXPECT_EQ(Read("m"), bytes);
}

// A drained worker's replica is taken over by a mirror on a worker that
// stays: it becomes the replica where it is, nothing is copied, and the
// drain ends.
TEST_F(MirrorTest, ADrainHandsAReplicaToAMirrorInPlace) {
  Cli made =
      Tessera({"create", "d", "--shape=8,4", "--dtype=float32", "--chunk_dim=0",
               "--placements=w2", "--init=arange", "--mirror=role=inference"});
  ASSERT_EQ(made.code, 0) << made.err;
  const std::string bytes = Read("d");
  EXPECT_THAT(Copies("d"), ElementsAre(ElementsAre("w2", "+w3")));
  ASSERT_OK(client_->SetWorkerState("w2", WorkerState::kDraining));
  EXPECT_TRUE(Eventually([&] { return Used()["w2"] == 0; }, kWait))
      << Used()["w2"];
  EXPECT_THAT(Copies("d"), ElementsAre(ElementsAre("w3")));
  // No copy went to a worker outside the group.
  EXPECT_EQ(Used()["w0"], 0);
  EXPECT_EQ(Used()["w1"], 0);
  EXPECT_EQ(Used()["w3"], 128);
  EXPECT_EQ(Read("d"), bytes);
}

// A worker joining the group is charged to the owner's quota before it is
// filled: over the limit, it is not filled (nothing allocated), until the
// limit allows it.
TEST_F(MirrorTest, AWorkerJoiningTheGroupIsChargedToTheQuota) {
  ASSERT_OK(client_->SetWorkerState("w3", WorkerState::kCordoned));
  WriteQuotas("* 320\n");
  absl::SleepFor(absl::Milliseconds(600));  // the file is read again
  ASSERT_NO_FATAL_FAILURE(CreateMirrored());
  EXPECT_EQ(QuotaUse(), 256);  // 128 in replicas, 128 on w2
  // w3 would take 128 more: refused while the quota is 320.
  ASSERT_OK(client_->SetWorkerState("w3", WorkerState::kReady));
  absl::SleepFor(absl::Seconds(2));
  EXPECT_EQ(QuotaUse(), 256);
  EXPECT_THAT(Copies("m"),
              ElementsAre(ElementsAre("w0", "+w2"), ElementsAre("w1", "+w2")));
  EXPECT_EQ(Used()["w3"], 0);
  EXPECT_THAT(cluster_->coordinator_log(), HasSubstr("quota: principal"));
  // A reshard to a larger group is admitted the same way: refused whole.
  Cli wider = Tessera({"reshard", "m", "--mirror=all"});
  EXPECT_EQ(wider.code, 1);
  EXPECT_THAT(wider.err, HasSubstr("quota: principal 'anonymous' uses 256"));
  EXPECT_THAT(Copies("m"),
              ElementsAre(ElementsAre("w0", "+w2"), ElementsAre("w1", "+w2")));
  EXPECT_EQ(QuotaUse(), 256);
  // Room again: filled.
  WriteQuotas("* 1G\n");
  EXPECT_TRUE(Eventually([&] { return QuotaUse() == 384; }, kWait));
  EXPECT_TRUE(Eventually([&] { return Used()["w3"] == 128; }, kWait));
}

TEST_F(MirrorTest, AReshardChangesOrDropsTheGroup) {
  ASSERT_NO_FATAL_FAILURE(CreateMirrored());
  const std::string bytes = Read("m");
  // The same layout, no mirrors.
  Cli r = Tessera({"reshard", "m", "--mirror=none"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(Copies("m"), ElementsAre(ElementsAre("w0"), ElementsAre("w1")));
  EXPECT_TRUE(Eventually(
      [&] {
        return Used() == std::map<std::string, int64_t>{
                             {"w0", 64}, {"w1", 64}, {"w2", 0}, {"w3", 0}};
      },
      kWait));
  Cli listed = Tessera({"ls", "--json"});
  EXPECT_FALSE(nlohmann::json::parse(listed.out)[0].contains("mirror"));
  // A new layout on every worker.
  r = Tessera(
      {"reshard", "m", "--chunk_dim=1", "--placements=w2,w3", "--mirror=all"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(Copies("m"), ElementsAre(ElementsAre("w2", "+w0", "+w1", "+w3"),
                                       ElementsAre("w3", "+w0", "+w1", "+w2")));
  EXPECT_EQ(Read("m"), bytes);
  // Without --mirror, a reshard keeps the group.
  r = Tessera({"reshard", "m", "--chunk_dim=0", "--placements=w0"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(Copies("m"), ElementsAre(ElementsAre("w0", "+w1", "+w2", "+w3")));
  EXPECT_EQ(Read("m"), bytes);
}

TEST_F(MirrorTest, AMalformedSelectorIsAUsageErrorAndMakesNothing) {
  for (const char* bad : {"--mirror=role", "--mirror=", "--mirror=a=b,a=c",
                          "--mirror=none,x=y"}) {
    Cli r = Tessera({"create", "x", "--shape=4", "--dtype=float32",
                     "--chunk_dim=0", "--placements=w0", bad});
    EXPECT_EQ(r.code, 2) << bad << r.err;
    EXPECT_THAT(r.err, HasSubstr("--mirror")) << bad;
  }
  EXPECT_TRUE(client_->List()->empty());
  // A group no worker matches: no mirrors, until one comes.
  Cli r = Tessera({"create", "x", "--shape=4", "--dtype=float32",
                   "--chunk_dim=0", "--placements=w0", "--mirror=role=none"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(Copies("x"), ElementsAre(ElementsAre("w0")));
}

}  // namespace
}  // namespace tessera
