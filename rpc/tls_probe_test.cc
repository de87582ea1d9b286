#include "rpc/tls_probe.h"

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rpc/server.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;
using ::testing::HasSubstr;

std::string Dir(const std::string& name) {
  return absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
}

// deploy/make-certs.sh into TEST_TMPDIR/`name` (a CA and certificates it
// signed for the coordinator and a user).
void MakeCerts(const std::string& name) {
  const std::string command = absl::StrCat(
      "/bin/bash ", std::getenv("TEST_SRCDIR"),
      "/tessera/deploy/make-certs.sh ", Dir(name), " --workers 0 >/dev/null");
  ASSERT_EQ(std::system(command.c_str()), 0);
}

TlsMaterial User(const std::string& ca, const std::string& user) {
  absl::StatusOr<TlsMaterial> tls = LoadTls(
      {Dir(ca) + "/ca.crt", Dir(user) + "/user.crt", Dir(user) + "/user.key"},
      /*need_cert=*/false);
  EXPECT_THAT(tls.status(), IsOk());
  return *tls;
}

// A gRPC server with mutual TLS from the "cluster" CA, one in plaintext,
// and a port where nothing listens.
class TlsProbeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    MakeCerts("cluster");
    MakeCerts("other");
  }
  void SetUp() override {
    absl::StatusOr<TlsMaterial> server_tls = LoadTls(
        {Dir("cluster") + "/ca.crt", Dir("cluster") + "/coordinator.crt",
         Dir("cluster") + "/coordinator.key"},
        /*need_cert=*/true);
    ASSERT_THAT(server_tls.status(), IsOk());
    ServerOptions options;
    options.credentials =
        ServerCredentialsFor(*server_tls, ClientCertPolicy::kRequire);
    absl::StatusOr<RunningServer> tls = StartServer("127.0.0.1:0", {}, options);
    ASSERT_THAT(tls.status(), IsOk());
    tls_ = std::move(*tls);
    absl::StatusOr<RunningServer> plain = StartServer("127.0.0.1:0", {});
    ASSERT_THAT(plain.status(), IsOk());
    plain_ = std::move(*plain);
  }
  void TearDown() override {
    tls_.Stop(absl::ZeroDuration());
    plain_.Stop(absl::ZeroDuration());
  }
  std::string Tls() const { return absl::StrCat("127.0.0.1:", tls_.port); }
  std::string Plain() const { return absl::StrCat("127.0.0.1:", plain_.port); }

  static constexpr absl::Duration kTimeout = absl::Seconds(5);
  RunningServer tls_;
  RunningServer plain_;
};

TEST_F(TlsProbeTest, AClientWithTheClustersCertificateIsAccepted) {
  const TlsMaterial user = User("cluster", "cluster");
  const TlsProbeResult probe = ProbeTls(Tls(), &user, kTimeout);
  EXPECT_TRUE(probe.speaks_tls);
  EXPECT_TRUE(probe.accepted);
  EXPECT_EQ(probe.peer_certificate_error, "");
  EXPECT_THAT(DiagnoseTlsMismatch(Tls(), &user, "it", kTimeout), IsOk());
}

TEST_F(TlsProbeTest, APlaintextClientLearnsThatThePeerSpeaksTls) {
  EXPECT_TRUE(ProbeTls(Tls(), nullptr, kTimeout).speaks_tls);
  EXPECT_THAT(
      DiagnoseTlsMismatch(Tls(), nullptr, "the coordinator at X", kTimeout),
      StatusIs(absl::StatusCode::kUnauthenticated,
               HasSubstr("the coordinator at X speaks TLS, and this client "
                         "has no TLS settings")));
}

TEST_F(TlsProbeTest, ACertificateOfAnotherCaIsRefused) {
  const TlsMaterial user = User("cluster", "other");
  const TlsProbeResult probe = ProbeTls(Tls(), &user, kTimeout);
  EXPECT_FALSE(probe.accepted);
  EXPECT_THAT(DiagnoseTlsMismatch(Tls(), &user, "it", kTimeout),
              StatusIs(absl::StatusCode::kUnauthenticated,
                       HasSubstr("refused this client's TLS certificate")));
}

TEST_F(TlsProbeTest, APeerCertificateOfAnotherCaIsNamed) {
  const TlsMaterial user = User("other", "cluster");
  EXPECT_NE(ProbeTls(Tls(), &user, kTimeout).peer_certificate_error, "");
  EXPECT_THAT(DiagnoseTlsMismatch(Tls(), &user, "it", kTimeout),
              StatusIs(absl::StatusCode::kUnauthenticated,
                       HasSubstr("does not verify against this client's "
                                 "--tls_ca")));
}

TEST_F(TlsProbeTest, NoCertificateToAPeerThatRequiresOne) {
  TlsMaterial user = User("cluster", "cluster");
  user.cert_pem.clear();
  user.key_pem.clear();
  EXPECT_THAT(DiagnoseTlsMismatch(Tls(), &user, "it", kTimeout),
              StatusIs(absl::StatusCode::kUnauthenticated,
                       HasSubstr("requires a TLS client certificate")));
}

TEST_F(TlsProbeTest, APlaintextPeerOrNoPeerIsNoMismatch) {
  const TlsProbeResult plain = ProbeTls(Plain(), nullptr, kTimeout);
  EXPECT_TRUE(plain.reached);
  EXPECT_FALSE(plain.speaks_tls);
  EXPECT_THAT(DiagnoseTlsMismatch(Plain(), nullptr, "it", kTimeout), IsOk());
  const std::string nobody = absl::StrCat("127.0.0.1:", tls_.port);
  tls_.Stop(absl::ZeroDuration());
  EXPECT_FALSE(ProbeTls(nobody, nullptr, kTimeout).reached);
  EXPECT_THAT(DiagnoseTlsMismatch("not an address", nullptr, "it", kTimeout),
              IsOk());
}

}  // namespace
}  // namespace tessera
