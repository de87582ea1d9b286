// WatchTlsFiles on a real server and client (certificates from
// deploy/make-certs.sh): new connections present the certificate on disk
// now, the channel credentials check the host name and the self-probe's do
// not.
#include <grpc/grpc_security_constants.h>

#include <chrono>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/testing/status_matchers.h"
#include "core/testing/temp_files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/health.grpc.pb.h"
#include "rpc/security.h"
#include "rpc/server.h"
#include "rpc/testing/certificates.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::ReadFileToString;

std::string Dir() { return absl::StrCat(std::getenv("TEST_TMPDIR"), "/pki"); }
std::string File(const std::string& name) {
  return absl::StrCat(Dir(), "/", name);
}

// Health/Check on a new connection to `port`, as `target_name` (empty:
// the address); returns the certificate the server presented ("" when the
// call failed).
std::string ServerCertificate(
    int port, const std::shared_ptr<grpc::ChannelCredentials>& credentials,
    const std::string& target_name = "") {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  if (!target_name.empty()) {
    args.SetString(GRPC_SSL_TARGET_NAME_OVERRIDE_ARG, target_name);
  }
  auto stub = grpc::health::v1::Health::NewStub(grpc::CreateCustomChannel(
      absl::StrCat("127.0.0.1:", port), credentials, args));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(5));
  grpc::health::v1::HealthCheckResponse response;
  if (!stub->Check(&context, {}, &response).ok()) return "";
  std::vector<grpc::string_ref> pem =
      context.auth_context()->FindPropertyValues(
          GRPC_X509_PEM_CERT_PROPERTY_NAME);
  return pem.empty() ? "" : std::string(pem[0].data(), pem[0].size());
}

class WatchedTlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ASSERT_THAT(MakeTestCertificates(Dir(), 1), IsOk());
  }
};

TEST_F(WatchedTlsTest, NewConnectionsPresentTheCertificateOnDiskNow) {
  const TlsFiles w0{File("ca.crt"), File("w0.crt"), File("w0.key")};
  ASSERT_THAT(LoadTls(w0, true).status(), IsOk());
  WatchedTls server_tls =
      WatchTlsFiles(w0, ClientCertPolicy::kRequire, absl::Seconds(1));
  ServerOptions options;
  options.credentials = server_tls.server;
  absl::StatusOr<RunningServer> server =
      StartServer("127.0.0.1:0", {}, options);
  ASSERT_THAT(server.status(), IsOk());
  const TlsFiles coordinator{File("ca.crt"), File("coordinator.crt"),
                             File("coordinator.key")};
  WatchedTls client =
      WatchTlsFiles(coordinator, ClientCertPolicy::kRequire, absl::Seconds(1));
  const std::string before = ReadFileToString(File("w0.crt"));
  EXPECT_EQ(ServerCertificate(server->port, client.channel), before);
  // The host dialled must be named by the certificate; the self-probe does
  // not ask.
  EXPECT_EQ(ServerCertificate(server->port, client.channel, "elsewhere.test"),
            "");
  EXPECT_EQ(
      ServerCertificate(server->port, client.self_probe, "elsewhere.test"),
      before);

  // A renewed certificate (same key, same CA) written over the file.
  CertificateRequest request;
  request.ca_cert = File("ca.crt");
  request.ca_key = File("ca.key");
  request.key = File("w0.key");
  request.name = "w0";
  request.not_before = absl::Now() - absl::Minutes(1);
  request.not_after = absl::Now() + absl::Hours(24 * 3);
  absl::StatusOr<std::string> renewed = IssueCertificate(request);
  ASSERT_THAT(renewed.status(), IsOk());
  ASSERT_THAT(ReplaceFile(File("w0.crt"), *renewed, 0644), IsOk());
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  std::string now;
  while (absl::Now() < deadline &&
         (now = ServerCertificate(server->port, client.channel)) != *renewed) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ(now, *renewed);
  absl::StatusOr<CertificateInfo> info = ReadCertificateInfo(File("w0.crt"));
  ASSERT_THAT(info.status(), IsOk());
  EXPECT_EQ(info->subject, "/CN=w0");
  EXPECT_EQ(info->not_after, absl::FromTimeT(absl::ToTimeT(request.not_after)));
  server->Stop(absl::ZeroDuration());
}

TEST(BearerSecretTest, PresentsTheSecretAsItIsNow) {
  BearerSecret secret("first-0123456789");
  EXPECT_EQ(secret.Header(), "Bearer first-0123456789");
  EXPECT_EQ(secret.token(), "first-0123456789");
  secret.Set("second-0123456789");
  EXPECT_EQ(secret.Header(), "Bearer second-0123456789");
}

}  // namespace
}  // namespace tessera
