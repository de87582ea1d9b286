// CredentialWatch on real certificate files (a CA from deploy/make-certs.sh,
// leaf certificates made here with chosen validity) and a fake clock.
#include "ops/credential_watch.h"

#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/metrics.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rpc/testing/certificates.h"
#include "spdlog/sinks/ostream_sink.h"
#include "spdlog/spdlog.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string Dir() { return absl::StrCat(std::getenv("TEST_TMPDIR"), "/pki"); }

double ExpirySeconds(MetricsRegistry& registry) {
  const std::string text = registry.Render();
  const std::string name = "\ntessera_tls_certificate_expiry_seconds ";
  const size_t at = text.find(name);
  if (at == std::string::npos) return -1e18;
  return std::stod(text.substr(at + name.size()));
}

class CredentialWatchTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const absl::Status made = MakeTestCertificates(Dir(), 1);
    ASSERT_TRUE(made.ok()) << made;
  }

  void SetUp() override {
    logger_ = std::make_shared<spdlog::logger>(
        "test", std::make_shared<spdlog::sinks::ostream_sink_mt>(log_));
    previous_ = spdlog::default_logger();
    spdlog::set_default_logger(logger_);
    now_ = absl::FromUnixSeconds(2000000000);
    cert_ = absl::StrCat(
        Dir(), "/",
        testing::UnitTest::GetInstance()->current_test_info()->name(), ".crt");
  }
  void TearDown() override { spdlog::set_default_logger(previous_); }

  // Writes a certificate for w0's key valid until `not_after`.
  void WriteCertificate(absl::Time not_after) {
    CertificateRequest request;
    request.ca_cert = Dir() + "/ca.crt";
    request.ca_key = Dir() + "/ca.key";
    request.key = Dir() + "/w0.key";
    request.name = "w0";
    request.not_before = now_ - absl::Hours(1);
    request.not_after = not_after;
    absl::StatusOr<std::string> pem = IssueCertificate(request);
    ASSERT_TRUE(pem.ok()) << pem.status();
    ASSERT_TRUE(ReplaceFile(cert_, *pem, 0644).ok());
  }

  CredentialWatchOptions Options() {
    CredentialWatchOptions options;
    options.interval = absl::ZeroDuration();  // rounds by CheckNow only
    options.clock = [this] { return now_; };
    return options;
  }
  std::string TakeLog() {
    logger_->flush();
    std::string text = log_.str();
    log_.str("");
    return text;
  }

  std::ostringstream log_;
  std::shared_ptr<spdlog::logger> logger_;
  std::shared_ptr<spdlog::logger> previous_;
  absl::Time now_;
  std::string cert_;
};

TEST_F(CredentialWatchTest, ExportsTheExpiryAndWarnsWithinAWeek) {
  WriteCertificate(now_ + absl::Hours(24 * 30));
  CredentialWatch watch(Options());
  watch.WatchCertificate(cert_, {}, nullptr);
  MetricsRegistry registry;
  watch.AddMetrics(&registry);
  watch.Start();
  EXPECT_NEAR(ExpirySeconds(registry), 30 * 86400, 5);
  EXPECT_THAT(TakeLog(), AllOf(HasSubstr("CN=w0"), HasSubstr("30.0 days left"),
                               Not(HasSubstr("expires in"))));
  // Three days before: a warning, then no more until a day later.
  now_ += absl::Hours(24 * 27);
  watch.CheckNow();
  EXPECT_NEAR(ExpirySeconds(registry), 3 * 86400, 5);
  EXPECT_THAT(TakeLog(),
              AllOf(HasSubstr("[warning]"), HasSubstr("expires in 3.0 days"),
                    HasSubstr("write a renewed certificate")));
  now_ += absl::Hours(1);
  watch.CheckNow();
  EXPECT_EQ(TakeLog(), "");
  now_ += absl::Hours(24);
  watch.CheckNow();
  EXPECT_THAT(TakeLog(), HasSubstr("expires in 47h"));
  // Expired: an error, and the metric goes negative.
  now_ += absl::Hours(48);
  watch.CheckNow();
  EXPECT_LT(ExpirySeconds(registry), 0);
  EXPECT_THAT(TakeLog(), AllOf(HasSubstr("[error]"), HasSubstr("expired at")));
}

TEST_F(CredentialWatchTest, ARenewedCertificateOnDiskIsReadAgain) {
  WriteCertificate(now_ + absl::Hours(2));
  CredentialWatch watch(Options());
  int changes = 0;
  watch.WatchCertificate(cert_, {}, [&] { ++changes; });
  MetricsRegistry registry;
  watch.AddMetrics(&registry);
  watch.Start();
  EXPECT_NEAR(ExpirySeconds(registry), 7200, 5);
  EXPECT_THAT(TakeLog(), HasSubstr("expires in 2h"));
  WriteCertificate(now_ + absl::Hours(24 * 90));
  watch.CheckNow();
  EXPECT_EQ(changes, 1);
  EXPECT_NEAR(ExpirySeconds(registry), 90 * 86400, 5);
  EXPECT_THAT(TakeLog(),
              AllOf(HasSubstr("changed on disk"), HasSubstr("90.0 days left"),
                    Not(HasSubstr("expires in"))));
  watch.CheckNow();  // nothing changed since
  EXPECT_EQ(changes, 1);
  // A file that is no certificate: said once, the last expiry stays.
  ASSERT_TRUE(ReplaceFile(cert_, "not a certificate\n").ok());
  watch.CheckNow();
  EXPECT_THAT(TakeLog(), HasSubstr("cannot be read"));
  EXPECT_NEAR(ExpirySeconds(registry), 90 * 86400, 5);
}

TEST_F(CredentialWatchTest, CallsBackOnceForEachChangeOfAWatchedFile) {
  const std::string token = Dir() + "/token-under-watch";
  ASSERT_TRUE(ReplaceFile(token, "first-secret-0123456789\n").ok());
  CredentialWatch watch(Options());
  int calls = 0;
  watch.WatchFile(token, [&] { ++calls; });
  watch.Start();
  watch.CheckNow();
  EXPECT_EQ(calls, 0);
  ASSERT_TRUE(ReplaceFile(token, "second-secret-0123456789\n").ok());
  watch.CheckNow();
  watch.CheckNow();
  EXPECT_EQ(calls, 1);
  // Rewritten in place with the same size: still a change (after a pause,
  // so that the file's time can differ from the last write's).
  absl::SleepFor(absl::Milliseconds(50));
  {
    std::ofstream out(token, std::ios::trunc);
    out << "third--secret-0123456789\n";
  }
  watch.CheckNow();
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(watch.certificate_not_after(), std::nullopt);
}

}  // namespace
}  // namespace tessera
