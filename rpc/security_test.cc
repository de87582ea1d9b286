#include "rpc/security.h"

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "core/testing/status_matchers.h"
#include "core/testing/temp_files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;
using ::tessera::testing::TempPath;
using ::testing::HasSubstr;

// A self-signed certificate valid from now + `from` to now + `to`, and its
// key, written as PEM files NAME.crt and NAME.key.
void MakeCert(const std::string& name, long from, long to) {
  EVP_PKEY* key = EVP_EC_gen("P-256");
  ASSERT_NE(key, nullptr);
  X509* cert = X509_new();
  ASSERT_EQ(ASN1_INTEGER_set(X509_get_serialNumber(cert), 1), 1);
  X509_gmtime_adj(X509_getm_notBefore(cert), from);
  X509_gmtime_adj(X509_getm_notAfter(cert), to);
  X509_set_pubkey(cert, key);
  X509_NAME* subject = X509_get_subject_name(cert);
  X509_NAME_add_entry_by_txt(subject, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>("test"), -1,
                             -1, 0);
  X509_set_issuer_name(cert, subject);
  ASSERT_GT(X509_sign(cert, key, EVP_sha256()), 0);
  FILE* f = fopen(TempPath(name + ".crt").c_str(), "w");
  PEM_write_X509(f, cert);
  fclose(f);
  f = fopen(TempPath(name + ".key").c_str(), "w");
  PEM_write_PrivateKey(f, key, nullptr, nullptr, 0, nullptr, nullptr);
  fclose(f);
  X509_free(cert);
  EVP_PKEY_free(key);
}

TlsFiles Files(const std::string& name, const std::string& key_of = "") {
  return TlsFiles{TempPath(name + ".crt"), TempPath(name + ".crt"),
                  TempPath((key_of.empty() ? name : key_of) + ".key")};
}

TEST(LoadTlsTest, AcceptsAValidCertificateAndKey) {
  MakeCert("good", -60, 3600);
  EXPECT_THAT(LoadTls(Files("good"), /*need_cert=*/true).status(), IsOk());
  // A client may come with the CA alone.
  TlsFiles ca_only{TempPath("good.crt"), "", ""};
  EXPECT_THAT(LoadTls(ca_only, /*need_cert=*/false).status(), IsOk());
  EXPECT_THAT(LoadTls(ca_only, /*need_cert=*/true).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(LoadTlsTest, ExpiredAndNotYetValidCertificatesAreUnauthenticated) {
  MakeCert("expired", -7200, -3600);
  EXPECT_THAT(
      LoadTls(Files("expired"), true).status(),
      StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("has expired")));
  MakeCert("future", 3600, 7200);
  EXPECT_THAT(
      LoadTls(Files("future"), true).status(),
      StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("not valid yet")));
}

TEST(LoadTlsTest, MismatchedMissingOrGarbledFilesAreRefused) {
  MakeCert("a", -60, 3600);
  MakeCert("b", -60, 3600);
  EXPECT_THAT(LoadTls(Files("a", "b"), true).status(),
              StatusIs(absl::StatusCode::kUnauthenticated,
                       HasSubstr("does not match")));
  EXPECT_THAT(
      LoadTls(Files("missing"), true).status(),
      StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("cannot read")));
  std::ofstream(TempPath("junk.crt")) << "not a certificate";
  EXPECT_THAT(LoadTls(Files("junk", "a"), true).status(),
              StatusIs(absl::StatusCode::kUnauthenticated,
                       HasSubstr("no PEM certificate")));
  TlsFiles half{TempPath("a.crt"), TempPath("a.crt"), ""};
  EXPECT_THAT(LoadTls(half, true).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(ProtectedModeTest, OnlyLoopbackWithoutTlsOrTokens) {
  for (const char* listen :
       {"127.0.0.1:7070", "127.1.2.3:1", "localhost:7", "[::1]:7070"}) {
    EXPECT_THAT(CheckProtectedMode(listen, false, false), IsOk()) << listen;
  }
  for (const char* listen :
       {"0.0.0.0:7070", "10.0.0.5:7070", "[::]:7070", "node-3.example:7070"}) {
    EXPECT_THAT(
        CheckProtectedMode(listen, false, false),
        StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("insecure")))
        << listen;
    EXPECT_THAT(CheckProtectedMode(listen, /*secured=*/true, false), IsOk());
    EXPECT_THAT(CheckProtectedMode(listen, false, /*insecure=*/true), IsOk());
  }
}

}  // namespace
}  // namespace tessera
