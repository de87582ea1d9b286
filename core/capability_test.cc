#include "core/capability.h"

#include <algorithm>
#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace tessera {
namespace {

const absl::Time kNow = absl::FromUnixSeconds(1'800'000'000);

Capability ReadCap() {
  Capability c;
  c.worker = "w0";
  c.tensor = "emb";
  c.version = 3;
  c.rights = kRightRead;
  c.expires_ms = absl::ToUnixMillis(kNow + absl::Minutes(5));
  return c;
}

TEST(CapabilityTest, RoundTripsUnderTheWorkersKey) {
  const std::string key = DeriveWorkerKey("cluster-secret", "w0");
  absl::StatusOr<Capability> got =
      VerifyCapability(MintCapability(ReadCap(), key), key, "w0", kNow);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->tensor, "emb");
  EXPECT_EQ(got->version, 3u);
  EXPECT_TRUE(got->Allows(kRightRead));
  EXPECT_FALSE(got->Allows(kRightWrite));
}

TEST(CapabilityTest, RefusesForgeriesOtherWorkersAndExpiry) {
  const std::string key = DeriveWorkerKey("cluster-secret", "w0");
  const std::string token = MintCapability(ReadCap(), key);
  auto code = [](const absl::StatusOr<Capability>& c) {
    return c.status().code();
  };
  // Another worker's key (a worker cannot mint for its peers).
  const std::string w1_key = DeriveWorkerKey("cluster-secret", "w1");
  EXPECT_NE(key, w1_key);
  EXPECT_EQ(code(VerifyCapability(MintCapability(ReadCap(), w1_key), key, "w0",
                                  kNow)),
            absl::StatusCode::kPermissionDenied);
  // Presented to the wrong worker.
  EXPECT_EQ(code(VerifyCapability(token, key, "w1", kNow)),
            absl::StatusCode::kPermissionDenied);
  // Expired.
  EXPECT_EQ(code(VerifyCapability(token, key, "w0", kNow + absl::Hours(1))),
            absl::StatusCode::kPermissionDenied);
  // Tampered payload: write right added, MAC kept.
  Capability widened = ReadCap();
  widened.rights |= kRightWrite;
  const std::string forged =
      MintCapability(widened, "guess").substr(0, token.find('.')) +
      token.substr(token.find('.'));
  EXPECT_EQ(code(VerifyCapability(forged, key, "w0", kNow)),
            absl::StatusCode::kPermissionDenied);
  for (const char* junk : {"", ".", "a.b", "....", "%%%.%%%"}) {
    EXPECT_EQ(code(VerifyCapability(junk, key, "w0", kNow)),
              absl::StatusCode::kPermissionDenied)
        << junk;
  }
  // No key (the worker is not registered yet): nothing verifies.
  EXPECT_FALSE(VerifyCapability(token, "", "w0", kNow).ok());
}

TEST(CapabilityTest, NamesCannotShiftFields) {
  const std::string key = "k";
  Capability a = ReadCap();
  a.worker = "w0|3:emb";
  a.tensor = "";
  absl::StatusOr<Capability> got =
      VerifyCapability(MintCapability(a, key), key, "w0|3:emb", kNow);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->tensor, "");
}

// The verifier remembers what verified, and refuses what VerifyCapability
// refuses: an expired remembered token, a token under a replaced key, a
// tampered one; it holds at most its capacity.
TEST(CapabilityVerifierTest, RemembersOnlyWhatVerifiesAndForgetsOnRekey) {
  const std::string key = DeriveWorkerKey("cluster-secret", "w0");
  const std::string token = MintCapability(ReadCap(), key);
  CapabilityVerifier verifier(/*capacity=*/3);
  ASSERT_TRUE(verifier.Verify(token, key, "w0", kNow).ok());
  EXPECT_EQ(verifier.remembered(), 1u);
  absl::StatusOr<Capability> again = verifier.Verify(token, key, "w0", kNow);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->tensor, "emb");
  EXPECT_EQ(verifier.remembered(), 1u);
  // Expired: refused with VerifyCapability's reason, and forgotten.
  absl::StatusOr<Capability> late =
      verifier.Verify(token, key, "w0", kNow + absl::Minutes(6));
  EXPECT_EQ(late.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(late.status().message().find("expired"), std::string::npos);
  EXPECT_EQ(verifier.remembered(), 0u);
  // A new key (the worker registered again): the old token is refused.
  ASSERT_TRUE(verifier.Verify(token, key, "w0", kNow).ok());
  const std::string new_key = DeriveWorkerKey("another-secret", "w0");
  EXPECT_EQ(verifier.Verify(token, new_key, "w0", kNow).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(verifier.remembered(), 0u);
  // Another worker name with the same key: refused too.
  ASSERT_TRUE(verifier.Verify(token, key, "w0", kNow).ok());
  EXPECT_FALSE(verifier.Verify(token, key, "w1", kNow).ok());
  // A tampered token is refused and never remembered.
  std::string tampered = token;
  tampered[0] = tampered[0] == 'A' ? 'B' : 'A';
  EXPECT_FALSE(verifier.Verify(tampered, key, "w0", kNow).ok());
  EXPECT_EQ(verifier.remembered(), 0u);
  // Bounded: distinct tokens past the capacity start it afresh.
  for (int i = 0; i < 10; ++i) {
    Capability c = ReadCap();
    c.version = 100 + i;
    ASSERT_TRUE(verifier.Verify(MintCapability(c, key), key, "w0", kNow).ok());
    EXPECT_LE(verifier.remembered(), 3u);
  }
}

TEST(RandomTest, IdsAreNonZeroAndDistinct) {
  uint64_t a = RandomId();
  uint64_t b = RandomId();
  EXPECT_NE(a, 0u);
  EXPECT_NE(a, b);
  EXPECT_EQ(RandomBytes(32).size(), 32u);
  const std::vector<uint64_t> many = RandomIds(100000);
  ASSERT_EQ(many.size(), 100000u);
  EXPECT_EQ(std::set<uint64_t>(many.begin(), many.end()).size(), many.size());
  EXPECT_EQ(std::count(many.begin(), many.end(), 0u), 0);
  EXPECT_TRUE(RandomIds(0).empty());
}

}  // namespace
}  // namespace tessera
