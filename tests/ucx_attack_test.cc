// A `read` principal against a worker's UCX data plane, on a cluster with
// tokens and no TLS (UCX on, as by default): it takes the key its read
// grant allows (UcxData.Describe) and tries, with a UCX process of its own
// (tests/ucx_attacker.cc), to read past its shard, write into the shard
// and read an unmapped address — from another uid over TCP and over shared
// memory, and from the worker's own uid over shared memory without CMA.
// Every attempt must fail, the worker must live on, and the tensor must
// keep its bytes and version.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/tessera_client.h"
#include "core/auth.h"
#include "core/dtype.h"
#include "gtest/gtest.h"
#include "proto/coordinator.grpc.pb.h"
#include "rpc/channel.h"
#include "rpc/convert.h"
#include "rpc/security.h"
#include "tests/cluster.h"
#include "tests/test_arrays.h"

namespace tessera {
namespace {

std::string Dir() { return absl::StrCat(std::getenv("TEST_TMPDIR"), "/ucx"); }
std::string File(const std::string& name) {
  return absl::StrCat(Dir(), "/", name);
}

class UcxAttackTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string script = absl::StrCat(std::getenv("TEST_SRCDIR"),
                                            "/tessera/deploy/make-certs.sh");
    std::string out;
    ASSERT_EQ(TestCluster::Run({"/bin/bash", script, Dir(), "--workers", "1"},
                               &out, &out),
              0)
        << out;
    TestClusterOptions options;
    options.num_workers = 1;
    options.coordinator_flags = {absl::StrCat("--tokens=", File("tokens"))};
    options.worker_flags = {
        absl::StrCat("--token_file=", Dir(), "/{name}.token")};
    options.client.token = *ReadTokenFile(File("admin.token"));
    auto cluster = TestCluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = cluster->release();
    auto admin =
        Client::Connect(cluster_->coordinator_address(), options.client);
    ASSERT_TRUE(admin.ok()) << admin.status();
    admin_ = admin->release();
    InitSpec arange;
    arange.kind = InitSpec::Kind::kArange;
    ASSERT_TRUE(admin_
                    ->Create("victim", {256, 256}, DType::kInt32,
                             LayoutSpec::Chunk(0, Ranks({0})), arange)
                    .ok());
    InitSpec sevens;
    sevens.kind = InitSpec::Kind::kFull;
    sevens.value = "7";
    ASSERT_TRUE(admin_
                    ->Create("secret", {256, 256}, DType::kInt32,
                             LayoutSpec::Chunk(0, Ranks({0})), sevens)
                    .ok());
    // What the reader's grant gives: the shard's id and its capability.
    ChannelOptions channel;
    channel.interceptors =
        BearerTokenInterceptors(*ReadTokenFile(File("reader.token")));
    auto coordinator = v1::Coordinator::NewStub(
        MakeChannel(cluster_->coordinator_address(), channel));
    grpc::ClientContext context;
    v1::GetTensorRequest request;
    request.set_name("victim");
    v1::GetTensorResponse reply;
    ASSERT_TRUE(coordinator->GetTensor(&context, request, &reply).ok());
    absl::StatusOr<TensorMetadata> meta =
        TensorMetadataFromProto(reply.tensor());
    ASSERT_TRUE(meta.ok()) << meta.status();
    ASSERT_EQ(meta->shards.size(), 1u);
    shard_id_ = meta->shards[0].replicas[0].shard_id;
    ASSERT_EQ(reply.capabilities_size(), 1);
    capability_ = reply.capabilities(0).token();
    // The attacker runs as another uid too: a copy it may execute.
    attacker_dir_ = "/tmp/tessera-ucx-attacker-XXXXXX";
    ASSERT_NE(mkdtemp(attacker_dir_.data()), nullptr);
    chmod(attacker_dir_.c_str(), 0755);
    attacker_ = attacker_dir_ + "/ucx_attacker";
    std::filesystem::copy_file(TestCluster::BinaryPath("tests/ucx_attacker"),
                               attacker_);
    chmod(attacker_.c_str(), 0755);
  }
  static void TearDownTestSuite() {
    delete admin_;
    delete cluster_;
    std::filesystem::remove_all(attacker_dir_);
  }

  // Runs the attacker with UCX_TLS=`tls`, as uid `uid` (-1: ours), and
  // returns its lines.
  static std::vector<std::string> Attack(const std::string& tls, int uid) {
    std::vector<std::string> argv;
    if (uid >= 0) {
      argv = {"/usr/bin/setpriv", absl::StrCat("--reuid=", uid),
              absl::StrCat("--regid=", uid), "--clear-groups", "--"};
    }
    argv.insert(argv.end(),
                {"/usr/bin/env", absl::StrCat("UCX_TLS=", tls),
                 "UCX_WARN_UNUSED_ENV_VARS=n", attacker_,
                 absl::StrCat("--worker=", cluster_->worker_address(0)),
                 absl::StrCat("--capability=", capability_),
                 absl::StrCat("--shard=", shard_id_)});
    std::string out, err;
    const int status = TestCluster::Run(argv, &out, &err);
    EXPECT_EQ(status, 0) << out << err;
    // Its own lines; UCX's log lines go by.
    std::vector<std::string> lines;
    for (absl::string_view line : absl::StrSplit(out, '\n')) {
      for (const char* what :
           {"connect:", "read-beyond:", "write-shard:", "wild-read:"}) {
        if (absl::StartsWith(line, what)) lines.emplace_back(line);
      }
    }
    for (const std::string& line : lines) {
      std::printf("  attacker (%s): %s\n", tls.c_str(), line.c_str());
    }
    return lines;
  }

  // Nothing the attacker tried reached the worker's memory, and the worker
  // serves the tensor as it was.
  static void ExpectRefusedAndIntact(const std::vector<std::string>& lines) {
    EXPECT_FALSE(lines.empty()) << "the attacker printed nothing";
    for (const std::string& line : lines) {
      if (absl::StartsWith(line, "connect:")) continue;
      EXPECT_FALSE(absl::EndsWith(line, ": ok"))
          << "the attack worked: " << line;
    }
    ASSERT_EQ(kill(cluster_->worker_pid(0), 0), 0) << "the worker died";
    ClientOptions over_grpc;
    over_grpc.token = *ReadTokenFile(File("admin.token"));
    over_grpc.transport = "grpc";
    auto client = Client::Connect(cluster_->coordinator_address(), over_grpc);
    ASSERT_TRUE(client.ok()) << client.status();
    absl::StatusOr<HostArray> got = (*client)->Get("victim", std::nullopt);
    ASSERT_TRUE(got.ok()) << "the worker no longer serves: " << got.status();
    for (int i = 0; i < 256 * 256; ++i) {
      ASSERT_EQ(got->As<int32_t>()[i], i) << "element " << i << " changed";
    }
    absl::StatusOr<TensorMetadata> meta = (*client)->Describe("victim");
    ASSERT_TRUE(meta.ok());
    EXPECT_EQ(meta->version, 1u);
  }

  static bool Root() { return geteuid() == 0; }

  static TestCluster* cluster_;
  static Client* admin_;
  static uint64_t shard_id_;
  static std::string capability_;
  static std::string attacker_dir_;
  static std::string attacker_;
};
TestCluster* UcxAttackTest::cluster_ = nullptr;
Client* UcxAttackTest::admin_ = nullptr;
uint64_t UcxAttackTest::shard_id_ = 0;
std::string UcxAttackTest::capability_;
std::string UcxAttackTest::attacker_dir_;
std::string UcxAttackTest::attacker_;

constexpr int kNobody = 65534;

TEST_F(UcxAttackTest, AnotherUserOverTcpReachesNothing) {
  if (!Root()) GTEST_SKIP() << "running as another uid needs root";
  const std::vector<std::string> lines = Attack("tcp", kNobody);
  ExpectRefusedAndIntact(lines);
  // The worker's UCX does not even listen where another user can reach it.
  ASSERT_FALSE(lines.empty());
  EXPECT_TRUE(absl::StartsWith(lines[0], "connect: refused")) << lines[0];
}

TEST_F(UcxAttackTest, AnotherUserOverSharedMemoryReachesNothing) {
  if (!Root()) GTEST_SKIP() << "running as another uid needs root";
  const std::vector<std::string> lines = Attack("posix,sysv,cma", kNobody);
  ExpectRefusedAndIntact(lines);
}

// The worker's own user may read its memory anyway (ptrace, CMA); what it
// must not get is the worker doing gets and puts on its behalf.
TEST_F(UcxAttackTest, SameUserWithoutCmaGetsNoEmulatedGetsOrPuts) {
  const std::vector<std::string> lines = Attack("posix,self", -1);
  ExpectRefusedAndIntact(lines);
}

// The grant reads the tensor it names, and only through the worker's own
// sends: the same key serves a normal UCX read.
TEST_F(UcxAttackTest, TheGrantStillReadsItsTensorOverUcx) {
  ClientOptions reader;
  reader.token = *ReadTokenFile(File("reader.token"));
  reader.transport = "ucx";
  auto client = Client::Connect(cluster_->coordinator_address(), reader);
  ASSERT_TRUE(client.ok()) << client.status();
  absl::StatusOr<HostArray> got = (*client)->Get("victim", std::nullopt);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->As<int32_t>()[1000], 1000);
  EXPECT_EQ((*client)->TransferStats().bytes.at("ucx"), 256 * 256 * 4);
}

}  // namespace
}  // namespace tessera
