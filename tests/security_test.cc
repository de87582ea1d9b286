// A cluster with mutual TLS and tokens (certificates from
// deploy/make-certs.sh), attacked as CLI.md's "Security" says it must
// withstand: each role does exactly what the table allows, bad credentials
// are refused, and callers without the coordinator's say-so cannot read,
// write, free or allocate on a worker, claim a worker's name, or commit
// another principal's put. Every refusal changes nothing. Bulk bytes
// cross the workers' data ports in mutual TLS, never outside it.
#include "rpc/security.h"

#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/tessera_client.h"
#include "core/auth.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/coordinator.grpc.pb.h"
#include "proto/worker.grpc.pb.h"
#include "rpc/channel.h"
#include "rpc/testing/certificates.h"
#include "tests/cluster.h"
#include "tests/pending_put.h"
#include "tests/test_arrays.h"

namespace tessera {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

std::string Dir() { return absl::StrCat(std::getenv("TEST_TMPDIR"), "/sec"); }
std::string File(const std::string& name) {
  return absl::StrCat(Dir(), "/", name);
}
ClientOptions As(const std::string& principal, bool cert = true) {
  ClientOptions options;
  options.tls_ca = File("ca.crt");
  if (cert) {
    options.tls_cert = File("user.crt");
    options.tls_key = File("user.key");
  }
  if (!principal.empty()) {
    options.token = *ReadTokenFile(File(principal + ".token"));
  }
  options.connect_timeout = absl::Seconds(5);
  options.control_retries = 0;
  return options;
}

// Two workers, every daemon on mutual TLS with tokens.
TestClusterOptions TlsCluster() {
  TestClusterOptions options;
  options.num_workers = 2;
  options.coordinator_flags = TlsFlags(Dir(), "coordinator");
  options.coordinator_flags.push_back(
      absl::StrCat("--tokens=", File("tokens")));
  options.worker_flags = TlsFlags(Dir(), "{name}");
  options.worker_flags.push_back(
      absl::StrCat("--token_file=", Dir(), "/{name}.token"));
  options.client = As("admin");
  return options;
}

class SecurityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ASSERT_OK(MakeTestCertificates(Dir(), 2));
    auto cluster = TestCluster::Start(TlsCluster());
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = cluster->release();
    auto admin = Client::Connect(cluster_->coordinator_address(), As("admin"));
    ASSERT_TRUE(admin.ok()) << admin.status();
    admin_ = admin->release();
    ASSERT_TRUE(CreateArange(*admin_, "t", {8, 4}, {0, 1}).ok());
  }
  static void TearDownTestSuite() {
    delete admin_;
    delete cluster_;
  }

  static absl::StatusOr<std::unique_ptr<Client>> Connect(
      const ClientOptions& options) {
    return Client::Connect(cluster_->coordinator_address(), options);
  }
  // A raw channel with the user's certificate: what an attacker holding a
  // valid certificate (but no capability) can do.
  static std::shared_ptr<grpc::Channel> RawChannel(const std::string& address,
                                                   const std::string& token) {
    ChannelOptions options;
    options.credentials = ChannelCredentialsFor(
        *LoadTls({File("ca.crt"), File("user.crt"), File("user.key")}, false));
    if (!token.empty()) options.interceptors = BearerTokenInterceptors(token);
    return MakeChannel(address, options);
  }
  // Shard 0 of "t" still holds 0, 1, 2, ... (nothing was changed).
  static void ExpectIntact() {
    absl::StatusOr<HostArray> got = admin_->Get("t", std::nullopt);
    ASSERT_TRUE(got.ok()) << got.status();
    for (int i = 0; i < 32; ++i) ASSERT_EQ(got->As<int32_t>()[i], i);
  }

  static TestCluster* cluster_;
  static Client* admin_;
};
TestCluster* SecurityTest::cluster_ = nullptr;
Client* SecurityTest::admin_ = nullptr;

TEST_F(SecurityTest, EachRoleDoesExactlyWhatTheTableSays) {
  auto reader = Connect(As("reader"));
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_TRUE((*reader)->Workers().ok());
  // One coordinator, without etcd: it leads.
  absl::StatusOr<std::vector<CoordinatorStatus>> coordinators =
      (*reader)->Coordinators();
  ASSERT_TRUE(coordinators.ok()) << coordinators.status();
  ASSERT_EQ(coordinators->size(), 1u);
  EXPECT_EQ(coordinators->front().role, "leader");
  EXPECT_TRUE(coordinators->front().alive);
  EXPECT_TRUE((*reader)->List().ok());
  EXPECT_TRUE((*reader)->Describe("t").ok());
  EXPECT_TRUE((*reader)->Get("t", std::nullopt).ok());
  const LayoutSpec spec = LayoutSpec::Chunk(0, Ranks({0}));
  absl::Status create =
      (*reader)->Create("r", {4}, DType::kInt8, spec, InitSpec{}).status();
  EXPECT_EQ(create.code(), absl::StatusCode::kPermissionDenied) << create;
  EXPECT_NE(create.message().find("permission denied"), std::string::npos);
  EXPECT_EQ((*reader)->Delete("t").code(), absl::StatusCode::kPermissionDenied);

  auto writer = Connect(As("writer"));
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE(
      (*writer)->Create("wt", {4}, DType::kInt8, spec, InitSpec{}).ok());
  EXPECT_TRUE((*writer)->Delete("wt").ok());

  // Managing workers is the admin's alone: every verb, refused to read and
  // write, allowed to admin (cordon, uncordon; drain and rm refused by the
  // cluster's own rules, not by the role).
  for (Client* client : {reader->get(), writer->get()}) {
    for (WorkerState state : {WorkerState::kCordoned, WorkerState::kReady,
                              WorkerState::kDraining}) {
      EXPECT_EQ(client->SetWorkerState("w1", state).code(),
                absl::StatusCode::kPermissionDenied);
    }
    EXPECT_EQ(client->RemoveWorker("w1").code(),
              absl::StatusCode::kPermissionDenied);
  }
  ASSERT_OK_AND_ASSIGN(std::vector<WorkerInfo> before, admin_->Workers());
  EXPECT_EQ(before[1].state, WorkerState::kReady);
  ASSERT_TRUE(admin_->SetWorkerState("w1", WorkerState::kCordoned).ok());
  ASSERT_OK_AND_ASSIGN(std::vector<WorkerInfo> cordoned, admin_->Workers());
  EXPECT_EQ(cordoned[1].state, WorkerState::kCordoned);
  ASSERT_TRUE(admin_->SetWorkerState("w1", WorkerState::kReady).ok());
  // w1 holds the only copy of a shard of "t": it cannot be forgotten.
  absl::Status rm = admin_->RemoveWorker("w1");
  EXPECT_EQ(rm.code(), absl::StatusCode::kFailedPrecondition) << rm;
  EXPECT_NE(rm.message().find("holds"), std::string::npos) << rm;
  EXPECT_EQ(admin_->SetWorkerState("nobody", WorkerState::kDraining).code(),
            absl::StatusCode::kNotFound);

  // A worker's token is for registering, nothing a user does.
  auto worker = Connect(As("w0"));
  if (worker.ok()) {
    EXPECT_EQ((*worker)->List().status().code(),
              absl::StatusCode::kPermissionDenied);
  } else {
    EXPECT_EQ(worker.status().code(), absl::StatusCode::kPermissionDenied);
  }
  ExpectIntact();
}

TEST_F(SecurityTest, BadCredentialsAreUnauthenticated) {
  // No token.
  auto none = Connect(As(""));
  EXPECT_EQ(none.status().code(), absl::StatusCode::kUnauthenticated)
      << none.status();
  // A wrong token.
  ClientOptions wrong = As("");
  wrong.token = "not-a-token-of-this-cluster";
  EXPECT_EQ(Connect(wrong).status().code(), absl::StatusCode::kUnauthenticated);
  // No certificate, to daemons that require one.
  auto no_cert = Connect(As("admin", /*cert=*/false));
  EXPECT_EQ(no_cert.status().code(), absl::StatusCode::kUnauthenticated)
      << no_cert.status();
  // Another CA's certificate.
  ASSERT_OK(MakeTestCertificates(Dir() + "-other", 0));
  ClientOptions other = As("admin");
  other.tls_ca = Dir() + "-other/ca.crt";
  other.tls_cert = Dir() + "-other/user.crt";
  other.tls_key = Dir() + "-other/user.key";
  auto foreign = Connect(other);
  EXPECT_EQ(foreign.status().code(), absl::StatusCode::kUnauthenticated)
      << foreign.status();
  // Plaintext.
  ClientOptions plain;
  plain.token = *ReadTokenFile(File("admin.token"));
  plain.connect_timeout = absl::Seconds(2);
  plain.control_retries = 0;
  EXPECT_FALSE(Connect(plain).ok());
  ExpectIntact();
}

// gRPC shows a coordinator that refuses the client's TLS settings as one
// that cannot be reached: both cases below used to say "cannot reach the
// coordinator ... (is it running?)".
TEST_F(SecurityTest, TlsMismatchesSayTlsAndWhatToCheck) {
  // Another CA, for a certificate the coordinator does not trust.
  const std::string other = Dir() + "-tls-mismatch";
  ASSERT_OK(MakeTestCertificates(other, 0));
  std::string out, err;
  ClientOptions plain;
  plain.token = *ReadTokenFile(File("admin.token"));
  plain.connect_timeout = absl::Seconds(2);
  plain.control_retries = 0;
  absl::Status status = Connect(plain).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnauthenticated) << status;
  EXPECT_THAT(std::string(status.message()),
              AllOf(HasSubstr("speaks TLS"), HasSubstr("no TLS settings"),
                    HasSubstr("--tls_ca")));

  ClientOptions foreign_cert = As("admin");
  foreign_cert.tls_cert = other + "/user.crt";
  foreign_cert.tls_key = other + "/user.key";
  status = Connect(foreign_cert).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnauthenticated) << status;
  EXPECT_THAT(std::string(status.message()),
              AllOf(HasSubstr("refused this client's TLS certificate"),
                    HasSubstr("--tls_cert")));

  // The CLI says the same, and still names a coordinator that is down.
  const std::string cli = TestCluster::BinaryPath("client/tessera");
  const std::string coordinator =
      absl::StrCat("--coordinator=", cluster_->coordinator_address());
  const std::string token = absl::StrCat("--token_file=", File("admin.token"));
  EXPECT_EQ(TestCluster::Run({cli, coordinator, token, "ls"}, &out, &err), 1);
  EXPECT_THAT(
      err, AllOf(HasSubstr("error: unauthenticated"), HasSubstr("speaks TLS")));
  EXPECT_EQ(TestCluster::Run(
                {cli, coordinator, absl::StrCat("--tls_ca=", File("ca.crt")),
                 absl::StrCat("--tls_cert=", other, "/user.crt"),
                 absl::StrCat("--tls_key=", other, "/user.key"), token, "ls"},
                &out, &err),
            1);
  EXPECT_THAT(err, AllOf(HasSubstr("error: unauthenticated"),
                         HasSubstr("TLS certificate")));
  // A file that is not one (a device that never ends) is an error at once,
  // not a CLI that reads until its memory runs out.
  for (const std::string& flag : {std::string("--token_file=/dev/zero"),
                                  std::string("--tls_ca=/dev/zero")}) {
    EXPECT_EQ(TestCluster::Run({cli, coordinator, flag, "ls"}, &out, &err), 1)
        << flag;
    EXPECT_THAT(err, AllOf(HasSubstr("/dev/zero holds more than"),
                           HasSubstr("is it the right file?")))
        << flag;
  }
  const std::string down = absl::StrCat("127.0.0.1:", PickFreePort());
  EXPECT_EQ(
      TestCluster::Run({cli, absl::StrCat("--coordinator=", down), token, "ls"},
                       &out, &err),
      1);
  EXPECT_THAT(
      err, HasSubstr(absl::StrCat("cannot reach the coordinator at ", down)));
  ExpectIntact();
}

TEST_F(SecurityTest, WorkersObeyOnlyTheCluster) {
  absl::StatusOr<TensorMetadata> meta = admin_->Describe("t");
  ASSERT_TRUE(meta.ok());
  const Replica& shard = meta->shards[0].replicas[0];
  auto stub = v1::Worker::NewStub(RawChannel(shard.address, ""));
  // A read without the coordinator's capability.
  {
    grpc::ClientContext context;
    v1::ReadRegionRequest request;
    request.set_shard_id(shard.shard_id);
    request.add_offsets(0);
    request.add_offsets(0);
    request.add_sizes(1);
    request.add_sizes(4);
    v1::ReadRegionResponse response;
    EXPECT_EQ(stub->ReadSmallRegion(&context, request, &response).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
  }
  // Free and allocate orders from a client, even one holding a read grant.
  for (const std::string& grant :
       {std::string(), meta->capabilities.at(shard.worker)}) {
    grpc::ClientContext free_context;
    if (!grant.empty()) free_context.AddMetadata(kCapabilityHeader, grant);
    v1::FreeShardsRequest free;
    free.add_shard_ids(shard.shard_id);
    v1::FreeShardsResponse freed;
    EXPECT_EQ(stub->FreeShards(&free_context, free, &freed).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
    grpc::ClientContext alloc_context;
    if (!grant.empty()) alloc_context.AddMetadata(kCapabilityHeader, grant);
    v1::AllocateShardsRequest alloc;
    alloc.set_tensor("x");
    v1::AllocateShardsResponse allocated;
    EXPECT_EQ(
        stub->AllocateShards(&alloc_context, alloc, &allocated).error_code(),
        grpc::StatusCode::PERMISSION_DENIED);
  }
  // Rewriting a committed shard with the read grant the metadata carries.
  {
    grpc::ClientContext context;
    context.AddMetadata(kCapabilityHeader, meta->capabilities.at(shard.worker));
    v1::WriteShardResponse response;
    auto writer = stub->WriteShard(&context, &response);
    v1::WriteShardRequest chunk;
    chunk.set_shard_id(shard.shard_id);
    chunk.set_data(std::string(16, '\xff'));
    writer->Write(chunk);
    writer->WritesDone();
    EXPECT_EQ(writer->Finish().error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
  }
  // A transfer order from a client: its source would be whatever the
  // caller names (another worker's shared memory, a fake peer).
  {
    grpc::ClientContext context;
    context.AddMetadata(kCapabilityHeader, meta->capabilities.at(shard.worker));
    v1::TransferRequest request;
    request.set_src_worker("evil");
    request.set_src_address("127.0.0.1:1");
    v1::TransferPiece* piece = request.add_pieces();
    piece->set_src_shard_id(1);
    piece->set_dst_shard_id(shard.shard_id);
    for (int d = 0; d < 2; ++d) {
      piece->add_src_offsets(0);
      piece->add_dst_offsets(0);
      piece->add_sizes(1);
    }
    v1::TransferResponse response;
    EXPECT_EQ(stub->Transfer(&context, request, &response).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
  }
  // Shard ids are not a counter.
  EXPECT_GT(shard.shard_id, uint64_t{1} << 20);
  ExpectIntact();
}

TEST_F(SecurityTest, AWorkerNameIsBoundToItsCredential) {
  // w1's token claiming w0's name, with an empty held list.
  auto stub = v1::Coordinator::NewStub(RawChannel(
      cluster_->coordinator_address(), *ReadTokenFile(File("w1.token"))));
  grpc::ClientContext context;
  v1::RegisterWorkerRequest request;
  request.set_name("w0");
  request.set_address("127.0.0.1:1");
  request.mutable_device()->set_kind(v1::Device::CPU);
  v1::RegisterWorkerResponse response;
  grpc::Status status = stub->RegisterWorker(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED)
      << status.error_message();
  EXPECT_TRUE(response.capability_key().empty());
  // Nor can it keep w0 alive.
  grpc::ClientContext beat_context;
  v1::HeartbeatRequest beat;
  beat.set_name("w0");
  v1::HeartbeatResponse beat_response;
  EXPECT_EQ(stub->Heartbeat(&beat_context, beat, &beat_response).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  // An admin is no worker either.
  auto admin_stub = v1::Coordinator::NewStub(RawChannel(
      cluster_->coordinator_address(), *ReadTokenFile(File("admin.token"))));
  grpc::ClientContext admin_context;
  EXPECT_EQ(admin_stub->RegisterWorker(&admin_context, request, &response)
                .error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  // w0 is still the real one.
  auto workers = admin_->Workers();
  ASSERT_TRUE(workers.ok());
  for (const WorkerInfo& w : *workers) {
    EXPECT_TRUE(w.alive) << w.name;
    EXPECT_NE(w.address, "127.0.0.1:1");
  }
  ExpectIntact();
}

TEST_F(SecurityTest, OnlyThePutsCreatorCommitsIt) {
  auto writer = v1::Coordinator::NewStub(RawChannel(
      cluster_->coordinator_address(), *ReadTokenFile(File("writer.token"))));
  grpc::ClientContext context;
  v1::CreateTensorResponse created;
  grpc::Status status =
      writer->CreateTensor(&context, PendingPutRequest("pending", 4), &created);
  ASSERT_TRUE(status.ok()) << status.error_message();
  auto admin = v1::Coordinator::NewStub(RawChannel(
      cluster_->coordinator_address(), *ReadTokenFile(File("admin.token"))));
  grpc::ClientContext commit_context;
  v1::CommitTensorRequest commit;
  commit.set_name("pending");
  commit.set_version(created.tensor().version());
  commit.set_change_id(created.change_id());
  v1::CommitTensorResponse committed;
  EXPECT_EQ(
      admin->CommitTensor(&commit_context, commit, &committed).error_code(),
      grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(admin_->Describe("pending").status().code(),
            absl::StatusCode::kNotFound);
  grpc::ClientContext own_context;
  EXPECT_TRUE(writer->CommitTensor(&own_context, commit, &committed).ok());
  EXPECT_TRUE(admin_->Describe("pending").ok());
}

// UCX and NCCL do not encrypt: a TLS worker moves shard bytes over them
// only when its operator says the fabric between the hosts is trusted.
TEST_F(SecurityTest, BulkBytesLeaveTlsOnlyWhenTheOperatorSaysSo) {
  ClientOptions over_ucx = As("admin");
  over_ucx.transport = "ucx";
  {
    // The suite's workers run TLS alone: no UCX, and a client forcing it
    // is told which transport and worker.
    auto client = Connect(over_ucx);
    ASSERT_TRUE(client.ok()) << client.status();
    absl::Status refused = (*client)->Get("t", std::nullopt).status();
    EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
    EXPECT_NE(refused.message().find("ucx"), std::string::npos) << refused;
  }
  // A cluster like the suite's, its workers told the fabric is trusted, pulling
  // reshard pieces from each other over UCX.
  TestClusterOptions options = TlsCluster();
  std::vector<int> metrics = {PickFreePort(), PickFreePort()};
  options.worker_flags.push_back("--bulk_outside_tls");
  options.worker_flags.push_back("--peer_transport=ucx");
  options.per_worker_flags = [&](int i) {
    return std::vector<std::string>{
        absl::StrCat("--metrics_listen=127.0.0.1:", metrics[i])};
  };
  auto trusted = TestCluster::Start(options);
  ASSERT_TRUE(trusted.ok()) << trusted.status();
  auto client = Client::Connect((*trusted)->coordinator_address(), over_ucx);
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE(CreateArange(**client, "u", {64, 32}, {0, 1}).ok());
  absl::StatusOr<HostArray> got = (*client)->Get("u", std::nullopt);
  ASSERT_TRUE(got.ok()) << got.status();
  for (int i = 0; i < 64 * 32; ++i) ASSERT_EQ(got->As<int32_t>()[i], i);
  const DataPlaneStats moved = (*client)->TransferStats();
  ASSERT_EQ(moved.bytes.count("ucx"), 1u);
  EXPECT_EQ(moved.bytes.at("ucx"), 64 * 32 * 4);
  // Rows to columns: half of each new shard comes from the other worker.
  ASSERT_TRUE(
      (*client)->Reshard("u", LayoutSpec::Chunk(1, Ranks({0, 1}))).ok());
  got = (*client)->Get("u", std::nullopt);
  ASSERT_TRUE(got.ok()) << got.status();
  for (int i = 0; i < 64 * 32; ++i) ASSERT_EQ(got->As<int32_t>()[i], i);
  double pulled = 0;
  for (int port : metrics) {
    pulled += MetricSum(FetchMetrics(port), "tessera_transfer_bytes_total",
                        "transport=\"ucx\"");
  }
  EXPECT_EQ(pulled, 2 * 32 * 16 * 4) << "reshard pieces pulled over UCX";
}

TEST_F(SecurityTest, BulkBytesCrossTheDataPortsInMutualTls) {
  // Every worker of the suite opens its data port, in TLS.
  auto admin = Connect(As("admin"));
  ASSERT_TRUE(admin.ok()) << admin.status();
  absl::StatusOr<std::vector<WorkerInfo>> workers = (*admin)->Workers();
  ASSERT_TRUE(workers.ok()) << workers.status();
  for (const WorkerInfo& w : *workers)
    EXPECT_FALSE(w.data_address.empty()) << w.name;
  // A client forcing TCP reads them; `auto` picks TCP too (the shards are
  // too small for shared memory; UCX stays out under TLS).
  for (const char* transport : {"tcp", "auto"}) {
    ClientOptions options = As("admin");
    options.transport = transport;
    auto client = Connect(options);
    ASSERT_TRUE(client.ok()) << client.status();
    ExpectIntact();
    absl::StatusOr<HostArray> got = (*client)->Get("t", std::nullopt);
    ASSERT_TRUE(got.ok()) << transport << ": " << got.status();
    for (int i = 0; i < 32; ++i) ASSERT_EQ(got->As<int32_t>()[i], i);
    const DataPlaneStats moved = (*client)->TransferStats();
    ASSERT_EQ(moved.bytes.count("tcp"), 1u) << transport;
    EXPECT_EQ(moved.bytes.at("tcp"), 32 * 4) << transport;
  }
  // Workers pull reshard pieces from each other over their TLS data ports.
  TestClusterOptions options = TlsCluster();
  std::vector<int> metrics = {PickFreePort(), PickFreePort()};
  options.worker_flags.push_back("--peer_transport=tcp");
  options.per_worker_flags = [&](int i) {
    return std::vector<std::string>{
        absl::StrCat("--metrics_listen=127.0.0.1:", metrics[i])};
  };
  auto cluster = TestCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto client = Client::Connect((*cluster)->coordinator_address(), As("admin"));
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE(CreateArange(**client, "p", {64, 32}, {0, 1}).ok());
  ASSERT_TRUE(
      (*client)->Reshard("p", LayoutSpec::Chunk(1, Ranks({0, 1}))).ok());
  absl::StatusOr<HostArray> got = (*client)->Get("p", std::nullopt);
  ASSERT_TRUE(got.ok()) << got.status();
  for (int i = 0; i < 64 * 32; ++i) ASSERT_EQ(got->As<int32_t>()[i], i);
  double pulled = 0;
  for (int port : metrics) {
    pulled += MetricSum(FetchMetrics(port), "tessera_transfer_bytes_total",
                        "transport=\"tcp\"");
  }
  EXPECT_EQ(pulled, 2 * 32 * 16 * 4) << "reshard pieces pulled over TLS TCP";
}

}  // namespace
}  // namespace tessera
