// Credentials that change while the daemons run (issue #27 item 7). A
// worker's certificate expires: new connections to it fail and its shards
// cannot be read, and the restart that would have renewed it dropped them.
// Now the renewed certificate written over the file takes effect in the
// running worker, whose shards are read again; the expiry shows as a
// metric and a warning beforehand. Rotated tokens (the coordinator's
// --tokens, a worker's --token_file) likewise take effect without a
// restart: old secrets are refused, new ones accepted, and the worker
// stays registered with its new secret.
#include <signal.h>
#include <sys/stat.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "client/tessera_client.h"
#include "core/auth.h"
#include "core/testing/temp_files.h"
#include "gtest/gtest.h"
#include "proto/coordinator.grpc.pb.h"
#include "rpc/channel.h"
#include "rpc/security.h"
#include "rpc/testing/certificates.h"
#include "tests/cluster.h"
#include "tests/test_arrays.h"

namespace tessera {
namespace {

using ::tessera::testing::ReadFileToString;

// Certificates and tokens from deploy/make-certs.sh in a directory of the
// test's own.
std::string MakeSecrets(const std::string& name) {
  const std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
  const std::string script =
      absl::StrCat(std::getenv("TEST_SRCDIR"), "/tessera/deploy/make-certs.sh");
  std::string out;
  EXPECT_EQ(TestCluster::Run({"/bin/bash", script, dir, "--workers", "1"}, &out,
                             &out),
            0)
      << out;
  return dir;
}

ClientOptions As(const std::string& dir, const std::string& token) {
  ClientOptions options;
  options.tls_ca = dir + "/ca.crt";
  options.tls_cert = dir + "/user.crt";
  options.tls_key = dir + "/user.key";
  options.token = token;
  options.connect_timeout = absl::Seconds(5);
  options.control_retries = 0;
  options.transport = "grpc";  // reads dial the worker's TLS port
  options.data_timeout = absl::Seconds(20);
  return options;
}

// A TLS + tokens cluster of one worker whose daemons look at their files
// every second.
TestClusterOptions Cluster(const std::string& dir, int metrics_port) {
  TestClusterOptions options;
  options.num_workers = 1;
  options.coordinator_flags = TlsFlags(dir, "coordinator");
  options.coordinator_flags.insert(
      options.coordinator_flags.end(),
      {absl::StrCat("--tokens=", dir, "/tokens"), "--reload_interval=1s"});
  options.worker_flags = TlsFlags(dir, "w0");
  options.worker_flags.insert(
      options.worker_flags.end(),
      {absl::StrCat("--token_file=", dir, "/w0.token"), "--reload_interval=1s",
       absl::StrCat("--metrics_listen=127.0.0.1:", metrics_port)});
  options.client = As(dir, *ReadTokenFile(dir + "/admin.token"));
  return options;
}

std::string Certificate(const std::string& dir, absl::Time not_after) {
  CertificateRequest request;
  request.ca_cert = dir + "/ca.crt";
  request.ca_key = dir + "/ca.key";
  request.key = dir + "/w0.key";
  request.name = "w0";
  request.not_before = absl::Now() - absl::Minutes(5);
  request.not_after = not_after;
  absl::StatusOr<std::string> pem = IssueCertificate(request);
  EXPECT_TRUE(pem.ok()) << pem.status();
  return pem.ok() ? *pem : "";
}

double ExpirySeconds(int metrics_port) {
  const std::string text = FetchMetrics(metrics_port);
  if (text.find("tessera_tls_certificate_expiry_seconds ") ==
      std::string::npos) {
    return -1e18;  // not exported
  }
  return MetricSum(text, "tessera_tls_certificate_expiry_seconds");
}

void ExpectArange(const absl::StatusOr<HostArray>& got, int n) {
  ASSERT_TRUE(got.ok()) << got.status();
  for (int i = 0; i < n; ++i) ASSERT_EQ(got->As<int32_t>()[i], i);
}

TEST(RotationTest, AnExpiredCertificateRenewedOnDiskServesTheShardsAgain) {
  const std::string dir = MakeSecrets("expiry");
  // w0's certificate expires 45 s from now.
  const absl::Time expiry = absl::Now() + absl::Seconds(45);
  ASSERT_TRUE(ReplaceFile(dir + "/w0.crt", Certificate(dir, expiry)).ok());
  const int metrics_port = PickFreePort();
  auto cluster = TestCluster::Start(Cluster(dir, metrics_port));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const pid_t worker = (*cluster)->worker_pid(0);
  const ClientOptions admin = As(dir, *ReadTokenFile(dir + "/admin.token"));
  {
    auto client = Client::Connect((*cluster)->coordinator_address(), admin);
    ASSERT_TRUE(client.ok()) << client.status();
    ASSERT_TRUE(CreateArange(**client, "t", {32, 8}, {0}).ok());
  }
  // Told beforehand: the metric, and a warning in the log.
  const double left = ExpirySeconds(metrics_port);
  EXPECT_GT(left, 0);
  EXPECT_LE(left, 45);
  EXPECT_NE((*cluster)->worker_log(0).find("expires in"), std::string::npos)
      << (*cluster)->worker_log(0);

  // It expires: a new client cannot read the worker's shard.
  absl::SleepFor(expiry - absl::Now() + absl::Seconds(2));
  {
    auto client = Client::Connect((*cluster)->coordinator_address(), admin);
    ASSERT_TRUE(client.ok()) << client.status();
    EXPECT_FALSE((*client)->Get("t", std::nullopt).ok());
  }
  EXPECT_LT(ExpirySeconds(metrics_port), 0);

  // The operator writes a renewed certificate over the file.
  ASSERT_TRUE(ReplaceFile(dir + "/w0.crt",
                          Certificate(dir, absl::Now() + absl::Hours(24 * 30)))
                  .ok());
  absl::StatusOr<HostArray> got = absl::UnavailableError("not read");
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (!got.ok() && absl::Now() < deadline) {
    auto client = Client::Connect((*cluster)->coordinator_address(), admin);
    ASSERT_TRUE(client.ok()) << client.status();
    got = (*client)->Get("t", std::nullopt);
    if (!got.ok()) absl::SleepFor(absl::Milliseconds(500));
  }
  ExpectArange(got, 32 * 8);
  // The same process, which knows its new expiry. Its TLS contexts and its
  // metric each read the file again on their own rounds: the read above can
  // come first.
  EXPECT_EQ((*cluster)->worker_pid(0), worker);
  EXPECT_EQ(kill(worker, 0), 0);
  double renewed = ExpirySeconds(metrics_port);
  for (const absl::Time until = absl::Now() + absl::Seconds(15);
       renewed <= 29 * 86400.0 && absl::Now() < until;
       renewed = ExpirySeconds(metrics_port)) {
    absl::SleepFor(absl::Milliseconds(200));
  }
  EXPECT_GT(renewed, 29 * 86400.0);
}

TEST(RotationTest, RotatedTokensTakeEffectWithoutARestart) {
  const std::string dir = MakeSecrets("tokens");
  TestClusterOptions options = Cluster(dir, PickFreePort());
  // Leases short enough that a worker whose heartbeats are refused is
  // seen dead within the test.
  options.coordinator_flags.push_back("--lease_ms=2500");
  options.coordinator_flags.push_back("--heartbeat_ms=200");
  auto cluster = TestCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const pid_t worker = (*cluster)->worker_pid(0);
  const std::string old_reader = *ReadTokenFile(dir + "/reader.token");
  const std::string old_worker = *ReadTokenFile(dir + "/w0.token");
  {
    auto admin = Client::Connect((*cluster)->coordinator_address(),
                                 As(dir, *ReadTokenFile(dir + "/admin.token")));
    ASSERT_TRUE(admin.ok()) << admin.status();
    ASSERT_TRUE(CreateArange(**admin, "t", {16, 4}, {0}).ok());
  }
  auto reader =
      Client::Connect((*cluster)->coordinator_address(), As(dir, old_reader));
  ASSERT_TRUE(reader.ok()) << reader.status();

  // New secrets for the reader and for w0: the coordinator's tokens file
  // first, then w0's token file, as an operator would.
  const std::string new_reader = "reader-rotated-0123456789abcdef";
  const std::string new_worker = "w0-rotated-0123456789abcdef0123";
  const std::string tokens =
      absl::StrReplaceAll(ReadFileToString(dir + "/tokens"),
                          {{old_reader, new_reader}, {old_worker, new_worker}});
  ASSERT_TRUE(ReplaceFile(dir + "/tokens", tokens, 0600).ok());
  ASSERT_TRUE(ReplaceFile(dir + "/w0.token", new_worker + "\n", 0600).ok());

  // The old reader secret is refused from now on, the new one accepted.
  absl::Status old_refused = absl::OkStatus();
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (old_refused.ok() && absl::Now() < deadline) {
    auto old_client =
        Client::Connect((*cluster)->coordinator_address(), As(dir, old_reader));
    old_refused =
        old_client.ok() ? (*old_client)->List().status() : old_client.status();
    if (old_refused.ok()) absl::SleepFor(absl::Milliseconds(200));
  }
  EXPECT_EQ(old_refused.code(), absl::StatusCode::kUnauthenticated)
      << old_refused;
  auto renewed =
      Client::Connect((*cluster)->coordinator_address(), As(dir, new_reader));
  ASSERT_TRUE(renewed.ok()) << renewed.status();
  ExpectArange((*renewed)->Get("t", std::nullopt), 16 * 4);
  // A client connected before keeps its (old) secret: refused now.
  EXPECT_EQ((*reader)->List().status().code(),
            absl::StatusCode::kUnauthenticated);

  // w0 heartbeats with its new secret: still alive three leases later, the
  // same process, its shard readable. Its old secret is refused.
  absl::SleepFor(absl::Milliseconds(3 * 2500));
  auto workers = (*renewed)->Workers();
  ASSERT_TRUE(workers.ok()) << workers.status();
  ASSERT_EQ(workers->size(), 1u);
  EXPECT_TRUE((*workers)[0].alive) << (*cluster)->worker_log(0);
  EXPECT_EQ((*cluster)->worker_pid(0), worker);
  EXPECT_EQ(kill(worker, 0), 0);
  ExpectArange((*renewed)->Get("t", std::nullopt), 16 * 4);
  EXPECT_NE((*cluster)->worker_log(0).find("presenting the new secret"),
            std::string::npos);
  EXPECT_NE((*cluster)->coordinator_log().find("principal(s) now"),
            std::string::npos);
  {
    ChannelOptions channel;
    channel.credentials = ChannelCredentialsFor(*LoadTls(
        {dir + "/ca.crt", dir + "/user.crt", dir + "/user.key"}, false));
    channel.interceptors = BearerTokenInterceptors(old_worker);
    auto stub = v1::Coordinator::NewStub(
        MakeChannel((*cluster)->coordinator_address(), channel));
    grpc::ClientContext context;
    v1::HeartbeatRequest beat;
    beat.set_name("w0");
    v1::HeartbeatResponse response;
    EXPECT_EQ(stub->Heartbeat(&context, beat, &response).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
}

}  // namespace
}  // namespace tessera
