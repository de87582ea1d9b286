// Quotas on real daemons (CLI.md "Quotas (v4)"): a principal's bytes and
// names, bound to its token or its client certificate, checked before
// anything is allocated, shown by `tessera quota`, followed on disk, and
// recomputed from the metadata after a kill -9.
#include <sys/stat.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/npy_file.h"
#include "client/tessera_client.h"
#include "core/auth.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/cluster.h"
#include "tests/test_arrays.h"

namespace tessera {
namespace {

using ::tessera::testing::StatusIs;
using ::testing::HasSubstr;

constexpr int64_t kMiB = int64_t{1} << 20;

std::string Dir() { return absl::StrCat(std::getenv("TEST_TMPDIR"), "/q"); }
std::string File(const std::string& name) {
  return absl::StrCat(Dir(), "/", name);
}
void Write(const std::string& path, const std::string& text, int mode) {
  // Written aside and renamed: a reload never reads half a file.
  const std::string tmp = path + ".tmp";
  std::ofstream(tmp) << text;
  chmod(tmp.c_str(), mode);
  ASSERT_EQ(rename(tmp.c_str(), path.c_str()), 0);
}
// A principal's secret, and the file the CLI reads it from.
std::string Secret(const std::string& principal) {
  return absl::StrCat(principal, "-secret-0123456789abcdef");
}
std::string TokenFile(const std::string& principal) {
  return File(principal + ".token");
}

// Writes a --tokens file `tokens` for these principals (NAME, ROLE), each
// one's secret into its token file (the principal `w*` into "workers").
void WriteTokens(const std::string& tokens,
                 const std::vector<std::pair<std::string, std::string>>& who) {
  std::string text;
  for (const auto& [name, role] : who) {
    absl::StrAppend(&text, name, " ", role, " ", Secret(name), "\n");
    Write(TokenFile(name == "w*" ? "workers" : name), Secret(name), 0600);
  }
  Write(tokens, text, 0600);
}

ClientOptions As(const std::string& principal) {
  ClientOptions options;
  options.token = Secret(principal);
  options.connect_timeout = absl::Seconds(5);
  return options;
}

// `tessera ARGS --token_file=PRINCIPAL's`: exit status, stdout, stderr.
struct Cli {
  int code;
  std::string out;
  std::string err;
};
Cli RunAs(const std::string& principal, const std::string& coordinator,
          std::vector<std::string> args) {
  std::vector<std::string> argv = {
      TestCluster::BinaryPath("client/tessera"),
      absl::StrCat("--coordinator=", coordinator),
      absl::StrCat("--token_file=", TokenFile(principal))};
  argv.insert(argv.end(), args.begin(), args.end());
  Cli cli;
  cli.code = TestCluster::Run(argv, &cli.out, &cli.err);
  return cli;
}

// One principal's entry of `quota --json` (null json when absent).
nlohmann::json Entry(const std::string& json, const std::string& principal) {
  for (const nlohmann::json& e : nlohmann::json::parse(json)) {
    if (e["principal"] == principal) return e;
  }
  return nullptr;
}

// Two workers, durable metadata, tokens for admin, ann and bob (write),
// and quotas: ann 10 MiB, every other principal 4 MiB and 3 names.
class QuotaTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    mkdir(Dir().c_str(), 0700);
    WriteTokens(File("tokens"), {{"admin", "admin"},
                                 {"ann", "write"},
                                 {"bob", "write"},
                                 {"w*", "worker"}});
    Write(File("quotas"), "# tenants\nann 10M\n* 4M 3\n", 0644);
    TestClusterOptions options;
    options.num_workers = 2;
    options.durable = true;
    metrics_port_ = PickFreePort();
    options.coordinator_flags = {
        absl::StrCat("--tokens=", File("tokens")),
        absl::StrCat("--quotas=", File("quotas")), "--reload_interval=200ms",
        absl::StrCat("--metrics_listen=127.0.0.1:", metrics_port_)};
    options.worker_flags = {
        absl::StrCat("--token_file=", TokenFile("workers"))};
    options.client = As("admin");
    auto cluster = TestCluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = cluster->release();
  }
  static void TearDownTestSuite() { delete cluster_; }

  static std::unique_ptr<Client> Connect(const std::string& principal) {
    auto client =
        Client::Connect(cluster_->coordinator_address(), As(principal));
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }
  static std::string Quota(const std::string& principal) {
    Cli cli =
        RunAs(principal, cluster_->coordinator_address(), {"quota", "--json"});
    EXPECT_EQ(cli.code, 0) << cli.err;
    return cli.out;
  }

  static TestCluster* cluster_;
  static int metrics_port_;
};
TestCluster* QuotaTest::cluster_ = nullptr;
int QuotaTest::metrics_port_ = 0;

// A 1 MiB float32 array (256 Ki elements) in two shards.
HostArray OneMiB() {
  HostArray array = HostArray::Allocate(DType::kFloat32, {2, 128 * 1024});
  for (int64_t i = 0; i < 2 * 128 * 1024; ++i) array.As<float>()[i] = i;
  return array;
}

TEST_F(QuotaTest, SixteenConcurrentPutsUnderTenMiBLeaveExactlyTen) {
  const HostArray array = OneMiB();
  std::vector<absl::Status> results(16);
  std::vector<std::thread> threads;
  for (int i = 0; i < 16; ++i) {
    threads.emplace_back([&, i] {
      std::unique_ptr<Client> ann = Connect("ann");
      if (ann == nullptr) return;
      results[i] = ann->Put(absl::StrCat("ann", i), array,
                            LayoutSpec::Chunk(0, Ranks({0, 1})))
                       .status();
    });
  }
  for (std::thread& t : threads) t.join();
  int ok = 0;
  for (const absl::Status& status : results) {
    if (status.ok()) {
      ++ok;
      continue;
    }
    EXPECT_THAT(status, StatusIs(absl::StatusCode::kResourceExhausted,
                                 HasSubstr("quota: principal 'ann' uses")));
  }
  EXPECT_EQ(ok, 10);

  // The refused left nothing: no tensor, pending or not, and no bytes on
  // any worker; use equals what ann's tensors hold.
  std::unique_ptr<Client> admin = Connect("admin");
  ASSERT_NE(admin, nullptr);
  absl::StatusOr<std::vector<TensorInfo>> all = admin->List(/*all=*/true);
  ASSERT_OK(all);
  int ann_tensors = 0;
  for (const TensorInfo& t : *all) ann_tensors += t.name.rfind("ann", 0) == 0;
  EXPECT_EQ(ann_tensors, 10);
  // Workers report their bytes with each allocation and heartbeat.
  int64_t used = 0;
  for (int i = 0; i < 50 && used != 10 * kMiB; ++i) {
    if (i > 0) absl::SleepFor(absl::Milliseconds(100));
    used = TotalBytesUsed(*admin);
  }
  EXPECT_EQ(used, 10 * kMiB);
  const nlohmann::json use = Entry(Quota("ann"), "ann");
  EXPECT_EQ(use["bytes"], 10 * kMiB);
  EXPECT_EQ(use["bytes_limit"], 10 * kMiB);
  EXPECT_EQ(use["names"], 10);
  EXPECT_TRUE(use["names_limit"].is_null());
  // The same on the coordinator's metrics port.
  const std::string metrics = FetchMetrics(metrics_port_);
  EXPECT_EQ(MetricSum(metrics, "tessera_quota_bytes", "principal=\"ann\""),
            10 * kMiB);
  EXPECT_EQ(
      MetricSum(metrics, "tessera_quota_limit_bytes", "principal=\"ann\""),
      10 * kMiB);

  // The CLI says who, how much and what, and exits 1.
  const std::string npy = File("one.npy");
  ASSERT_OK(WriteNpyFile(npy, array));
  Cli over = RunAs("ann", cluster_->coordinator_address(),
                   {"put", "ann-more", absl::StrCat("--input=", npy),
                    "--chunk_dim=0", "--placements=rank:0,rank:1"});
  EXPECT_EQ(over.code, 1);
  EXPECT_THAT(over.err,
              HasSubstr("quota: principal 'ann' uses 10485760 of its 10485760 "
                        "bytes; creating 'ann-more' needs 1048576 more"));
  EXPECT_TRUE(over.out.empty());

  // More replicas of a tensor count too: refused, version unchanged.
  const LayoutSpec twice = ReplicatedChunks({0, 1}, 2);
  // (A new layout of 2 replicas is 2 MiB of new shards until the old one
  // is freed.)
  std::string some;
  for (const TensorInfo& t : *all) {
    if (t.name.rfind("ann", 0) == 0) some = t.name;
  }
  EXPECT_THAT(admin->Reshard(some, twice).status(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr(absl::StrCat("resharding '", some,
                                              "' needs 2097152 more"))));
  EXPECT_EQ(admin->Describe(some)->version, 1u);
  EXPECT_EQ(TotalBytesUsedBecomes(*admin, 10 * kMiB), 10 * kMiB);

  // A delete frees room at once.
  ASSERT_OK(admin->Delete(some));
  std::unique_ptr<Client> ann = Connect("ann");
  EXPECT_OK(ann->Put("ann-more", array, LayoutSpec::Chunk(0, Ranks({0, 1})))
                .status());
}

TEST_F(QuotaTest, OwnersAreShownAndEachTenantSeesOnlyItself) {
  std::unique_ptr<Client> bob = Connect("bob");
  ASSERT_NE(bob, nullptr);
  ASSERT_OK(bob->Create("bobs", {4, 4}, DType::kInt8,
                        LayoutSpec::Chunk(0, Ranks({0, 1})))
                .status());
  Cli describe = RunAs("admin", cluster_->coordinator_address(),
                       {"describe", "bobs", "--json"});
  ASSERT_EQ(describe.code, 0) << describe.err;
  EXPECT_EQ(nlohmann::json::parse(describe.out)["owner"], "bob");

  // Bob sees himself only (limits from `*`); the admin sees everyone.
  const nlohmann::json mine = nlohmann::json::parse(Quota("bob"));
  ASSERT_EQ(mine.size(), 1u);
  EXPECT_EQ(mine[0]["principal"], "bob");
  EXPECT_EQ(mine[0]["bytes"], 16);
  EXPECT_EQ(mine[0]["bytes_limit"], 4 * kMiB);
  EXPECT_EQ(mine[0]["names"], 1);
  EXPECT_EQ(mine[0]["names_limit"], 3);
  const std::string everyone = Quota("admin");
  EXPECT_NE(Entry(everyone, "bob"), nullptr);
  EXPECT_NE(Entry(everyone, "ann"), nullptr);  // listed in the file

  // The text form has a header and the limits in words.
  Cli text = RunAs("bob", cluster_->coordinator_address(), {"quota"});
  ASSERT_EQ(text.code, 0) << text.err;
  EXPECT_THAT(text.out, HasSubstr("PRINCIPAL"));
  EXPECT_THAT(text.out, HasSubstr("bob"));
  EXPECT_THAT(text.out, ::testing::Not(HasSubstr("ann")));

  // Names count: bob may hold 3.
  for (const char* name : {"bobs2", "bobs3"}) {
    ASSERT_OK(
        bob->Create(name, {4}, DType::kInt8, LayoutSpec::Chunk(0, Ranks({0})))
            .status());
  }
  EXPECT_THAT(
      bob->Create("bobs4", {4}, DType::kInt8, LayoutSpec::Chunk(0, Ranks({0})))
          .status(),
      StatusIs(absl::StatusCode::kResourceExhausted,
               HasSubstr("holds 3 of its 3 tensor names")));
}

TEST_F(QuotaTest, TheFileIsFollowedAndABrokenOneIsKept) {
  std::unique_ptr<Client> bob = Connect("bob");
  ASSERT_NE(bob, nullptr);
  const HostArray big = HostArray::Allocate(DType::kInt8, {5 * kMiB});
  auto put = [&](const std::string& name) {
    return bob->Put(name, big, LayoutSpec::Chunk(0, Ranks({0}))).status();
  };
  ASSERT_THAT(put("big"), StatusIs(absl::StatusCode::kResourceExhausted));
  Write(File("quotas"), "ann 10M\nbob 8M 10\n* 4M 3\n", 0644);
  absl::Status status;
  for (int i = 0; i < 100; ++i) {
    status = put("big");
    if (status.ok()) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_OK(status);
  // A malformed file is logged and the last good quotas stay.
  Write(File("quotas"), "bob lots\n", 0644);
  absl::SleepFor(absl::Seconds(1));
  EXPECT_THAT(put("big2"), StatusIs(absl::StatusCode::kResourceExhausted,
                                    HasSubstr("of its 8388608 bytes")));
  EXPECT_THAT(cluster_->coordinator_log(), HasSubstr("cannot be used ("));
  Write(File("quotas"), "ann 10M\nbob 8M 10\n* 4M 3\n", 0644);
}

TEST_F(QuotaTest, UseIsTheSameAfterAKill9) {
  const std::string before = Quota("admin");
  EXPECT_EQ(cluster_->StopCoordinator(SIGKILL), 128 + SIGKILL);
  ASSERT_OK(cluster_->RestartCoordinator());
  std::string after;
  for (int i = 0; i < 50; ++i) {
    after = Quota("admin");
    if (after == before) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ(after, before);
  EXPECT_GT(Entry(after, "ann")["bytes"].get<int64_t>(), 0);
}

TEST(QuotaFlags, AMalformedFileStopsTheCoordinatorWithExit2) {
  mkdir(Dir().c_str(), 0700);
  Write(File("bad-quotas"), "ann 10M\nbob ten\n", 0644);
  std::string out, err;
  const int code = TestCluster::Run(
      {TestCluster::BinaryPath("coordinator/tessera-coordinator"),
       "--listen=127.0.0.1:0", absl::StrCat("--quotas=", File("bad-quotas"))},
      &out, &err);
  EXPECT_EQ(code, 2) << out << err;
  // The daemon's log (stdout or stderr, as --log_format puts it).
  EXPECT_THAT(out + err, HasSubstr("--quotas:"));
  EXPECT_THAT(out + err, HasSubstr("line 2: 'ten' is not a byte count"));
}

// Mutual TLS without tokens: the principal is the client certificate's
// subject CN ("user" for deploy/make-certs.sh's user certificate).
TEST(QuotaTls, TheCertificateNamesThePrincipal) {
  const std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/qtls");
  std::string out;
  ASSERT_EQ(TestCluster::Run({"/bin/bash",
                              absl::StrCat(std::getenv("TEST_SRCDIR"),
                                           "/tessera/deploy/make-certs.sh"),
                              dir, "--workers", "1"},
                             &out, &out),
            0)
      << out;
  Write(dir + "/quotas", "user 1K\n", 0644);
  ClientOptions user;
  user.tls_ca = dir + "/ca.crt";
  user.tls_cert = dir + "/user.crt";
  user.tls_key = dir + "/user.key";
  TestClusterOptions options;
  options.num_workers = 1;
  options.coordinator_flags = TlsFlags(dir, "coordinator");
  options.coordinator_flags.push_back(
      absl::StrCat("--quotas=", dir, "/quotas"));
  options.worker_flags = TlsFlags(dir, "{name}");
  options.client = user;
  auto cluster = TestCluster::Start(options);
  ASSERT_OK(cluster);
  auto client = Client::Connect((*cluster)->coordinator_address(), user);
  ASSERT_OK(client);
  absl::StatusOr<TensorMetadata> made = (*client)->Create(
      "small", {1024}, DType::kInt8, LayoutSpec::Chunk(0, Ranks({0})));
  ASSERT_OK(made);
  EXPECT_EQ((*client)->Describe("small")->owner, "user");
  EXPECT_THAT(
      (*client)
          ->Create("more", {1}, DType::kInt8, LayoutSpec::Chunk(0, Ranks({0})))
          .status(),
      StatusIs(absl::StatusCode::kResourceExhausted,
               HasSubstr("quota: principal 'user' uses 1024 of its "
                         "1024 bytes")));
  absl::StatusOr<std::vector<QuotaInfo>> quotas = (*client)->Quotas();
  ASSERT_OK(quotas);
  ASSERT_EQ(quotas->size(), 1u);  // the user is an admin here: all, one
  EXPECT_EQ((*quotas)[0].principal, "user");
  EXPECT_EQ((*quotas)[0].bytes, 1024);
}

// Per-principal read pacing (tessera-worker --principal_read_rate): a
// tenant's gather is held to the rate on each worker, over gRPC and the
// data port, delayed and never refused; another tenant's small reads draw
// on a bucket of their own.
class ReadPacingTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    mkdir(Dir().c_str(), 0700);
    WriteTokens(File("pacing-tokens"),
                {{"ann", "write"}, {"bob", "write"}, {"w*", "worker"}});
    TestClusterOptions options;
    options.num_workers = 2;
    options.coordinator_flags = {
        absl::StrCat("--tokens=", File("pacing-tokens"))};
    options.worker_flags = {absl::StrCat("--token_file=", TokenFile("workers")),
                            "--principal_read_rate=2M"};
    metrics_port_ = PickFreePort();
    options.per_worker_flags = [](int i) {
      if (i != 0) return std::vector<std::string>();
      return std::vector<std::string>{
          absl::StrCat("--metrics_listen=127.0.0.1:", metrics_port_)};
    };
    options.client = As("ann");
    auto cluster = TestCluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = cluster->release();
  }
  static void TearDownTestSuite() { delete cluster_; }

  static std::unique_ptr<Client> Connect(const std::string& principal,
                                         const std::string& transport) {
    ClientOptions options = As(principal);
    options.transport = transport;
    auto client = Client::Connect(cluster_->coordinator_address(), options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  static TestCluster* cluster_;
  static int metrics_port_;
};
TestCluster* ReadPacingTest::cluster_ = nullptr;
int ReadPacingTest::metrics_port_ = 0;

TEST_F(ReadPacingTest, AGatherIsHeldToTheRateAndAnotherTenantIsNot) {
  // 8 MiB in two shards: each worker serves ann 4 MiB at 2 MiB/s, the
  // first 1 MiB (its burst) at once: at least 1.5 s however fast the
  // machine (a lower bound only).
  HostArray array = HostArray::Allocate(DType::kInt8, {8 * kMiB});
  for (int64_t i = 0; i < 8 * kMiB; ++i) array.data()[i] = static_cast<char>(i);
  std::unique_ptr<Client> writer = Connect("ann", "auto");
  ASSERT_NE(writer, nullptr);
  ASSERT_OK(writer->Put("paced", array, LayoutSpec::Chunk(0, Ranks({0, 1})))
                .status());
  ASSERT_OK(writer
                ->Put("small", HostArray::Allocate(DType::kInt8, {4096}),
                      LayoutSpec::Chunk(0, Ranks({0})))
                .status());
  for (const char* transport : {"tcp", "grpc"}) {
    SCOPED_TRACE(transport);
    std::unique_ptr<Client> ann = Connect("ann", transport);
    std::unique_ptr<Client> bob = Connect("bob", transport);
    ASSERT_NE(ann, nullptr);
    ASSERT_NE(bob, nullptr);
    absl::StatusOr<HostArray> got;
    const absl::Time start = absl::Now();
    std::thread gather([&] { got = ann->Get("paced"); });
    // Bob reads meanwhile, correctly (his bucket is his own).
    for (int i = 0; i < 20; ++i) {
      absl::StatusOr<HostArray> small = bob->Get("small");
      ASSERT_OK(small);
      ASSERT_EQ(small->num_bytes, 4096);
    }
    gather.join();
    const absl::Duration took = absl::Now() - start;
    ASSERT_OK(got);
    EXPECT_EQ(std::memcmp(got->data(), array.data(), 8 * kMiB), 0);
    EXPECT_GE(took, absl::Milliseconds(1400)) << "ann was not paced";
  }
  // Worker 0 says whom it held back, and for how long; bob's 4 KiB reads
  // stayed within his burst.
  const std::string metrics = FetchMetrics(metrics_port_);
  EXPECT_GT(MetricSum(metrics, "tessera_read_delay_seconds_total",
                      "principal=\"ann\""),
            1.0);
  EXPECT_EQ(MetricSum(metrics, "tessera_read_delay_seconds_total",
                      "principal=\"bob\""),
            0.0);
}

}  // namespace
}  // namespace tessera
