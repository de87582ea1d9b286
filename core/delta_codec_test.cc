#include "core/delta_codec.h"

#include <random>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

std::string RandomBytes(size_t size, std::mt19937_64& rng) {
  std::string bytes(size, '\0');
  for (char& c : bytes) c = static_cast<char>(rng());
  return bytes;
}

// `base` with `fraction` of its `item`-byte elements changed, at random.
std::string Changed(const std::string& base, int64_t item, double fraction,
                    std::mt19937_64& rng, int64_t* changed) {
  std::string next = base;
  std::bernoulli_distribution pick(fraction);
  *changed = 0;
  for (size_t e = 0; e < base.size() / item; ++e) {
    if (!pick(rng)) continue;
    // Flip one byte of it, so that the element surely differs.
    next[e * item + rng() % item] ^= static_cast<char>(1 + rng() % 255);
    ++*changed;
  }
  return next;
}

std::string Applied(const std::string& base, const std::string& encoding,
                    int64_t item) {
  std::string data = base;
  EXPECT_TRUE(ApplyDelta(encoding, item, absl::MakeSpan(data)).ok());
  return data;
}

TEST(DeltaCodecTest, NoChangeIsEmpty) {
  std::mt19937_64 rng(1);
  const std::string base = RandomBytes(4096, rng);
  std::optional<std::string> encoding = EncodeDelta(base, base, 2, 0);
  ASSERT_TRUE(encoding.has_value());
  EXPECT_EQ(*encoding, "");
  EXPECT_EQ(Applied(base, "", 2), base);
}

TEST(DeltaCodecTest, EveryItemSizeRoundTrips) {
  std::mt19937_64 rng(2);
  for (int64_t item : {1, 2, 4, 8, 16}) {
    for (double fraction : {0.001, 0.02, 0.3, 1.0}) {
      // Sizes that are not a whole number of words too.
      for (size_t elements : {1, 3, 17, 1000, 4099}) {
        const std::string base = RandomBytes(elements * item, rng);
        int64_t changed = 0;
        const std::string next = Changed(base, item, fraction, rng, &changed);
        std::optional<std::string> encoding =
            EncodeDelta(base, next, item, INT64_MAX);
        ASSERT_TRUE(encoding.has_value());
        EXPECT_EQ(Applied(base, *encoding, item), next)
            << "item " << item << ", fraction " << fraction << ", " << elements
            << " elements";
      }
    }
  }
}

TEST(DeltaCodecTest, AScatteredChangeCostsItsBytesAndAboutTwoMore) {
  std::mt19937_64 rng(3);
  const int64_t item = 2;  // bf16
  const std::string base = RandomBytes(size_t{1} << 21, rng);
  int64_t changed = 0;
  const std::string next = Changed(base, item, 0.02, rng, &changed);
  std::optional<std::string> encoding =
      EncodeDelta(base, next, item, INT64_MAX);
  ASSERT_TRUE(encoding.has_value());
  // The changed bytes and a 4-byte offset each would be 6 bytes an
  // element; runs of one element with one-byte varints are 4.
  EXPECT_LE(static_cast<int64_t>(encoding->size()), changed * (item + 4));
  EXPECT_GE(static_cast<int64_t>(encoding->size()), changed * item);
  EXPECT_EQ(Applied(base, *encoding, item), next);
}

TEST(DeltaCodecTest, NearbyChangesAreOneRun) {
  const std::string base(64, '\0');
  std::string next = base;
  next[10] = 1;  // element 5 of 2-byte elements
  next[14] = 1;  // element 7: one unchanged element between
  std::optional<std::string> encoding = EncodeDelta(base, next, 2, 100);
  ASSERT_TRUE(encoding.has_value());
  // gap 5, count 3, then 3 elements' bytes.
  EXPECT_EQ(*encoding, std::string("\x05\x03", 2) + next.substr(10, 6));
  EXPECT_EQ(Applied(base, *encoding, 2), next);
}

TEST(DeltaCodecTest, LongerThanTheLimitIsRefused) {
  std::mt19937_64 rng(4);
  const std::string base = RandomBytes(1000, rng);
  const std::string next = RandomBytes(1000, rng);
  EXPECT_FALSE(EncodeDelta(base, next, 4, 999).has_value());
  std::string one = base;
  one[0] ^= 1;
  // gap 0, count 1, 4 bytes: exactly 6.
  EXPECT_TRUE(EncodeDelta(base, one, 4, 6).has_value());
  EXPECT_FALSE(EncodeDelta(base, one, 4, 5).has_value());
}

TEST(DeltaCodecTest, ALimitCutsARunThatMergesGaps) {
  // Every other 2-byte element changed: one run of merged gaps.
  const std::string base(2000, '\0');
  std::string next = base;
  for (size_t i = 0; i < next.size(); i += 4) next[i] = 1;
  for (int64_t limit : {0, 1, 100, 1000, 2000}) {
    EXPECT_FALSE(EncodeDelta(base, next, 2, limit).has_value()) << limit;
  }
  std::optional<std::string> whole = EncodeDelta(base, next, 2, 2004);
  ASSERT_TRUE(whole.has_value());
  EXPECT_EQ(Applied(base, *whole, 2), next);
  EXPECT_EQ(EncodeDelta(base, next, 2, static_cast<int64_t>(whole->size())),
            whole);
  EXPECT_FALSE(
      EncodeDelta(base, next, 2, static_cast<int64_t>(whole->size()) - 1)
          .has_value());
}

TEST(DeltaCodecTest, NoLimitIsTheLargestOne) {
  // INT64_MAX as the limit: no sum past it (a fuzzer's find).
  const std::string base(100, 'a');
  const std::string next(100, 'b');
  for (int64_t item : {1, 2, 4}) {
    std::optional<std::string> encoding =
        EncodeDelta(base, next, item, INT64_MAX);
    ASSERT_TRUE(encoding.has_value());
    EXPECT_EQ(Applied(base, *encoding, item), next);
  }
}

TEST(DeltaCodecTest, MismatchedInputsAreRefused) {
  EXPECT_FALSE(EncodeDelta("abcd", "abc", 1, 100).has_value());
  EXPECT_FALSE(EncodeDelta("abc", "abd", 2, 100).has_value());
  EXPECT_FALSE(EncodeDelta("ab", "ab", 0, 100).has_value());
}

TEST(DeltaCodecTest, MalformedChangesAreDataLoss) {
  std::string data(16, 'x');
  const auto apply = [&](const std::string& encoding) {
    return ApplyDelta(encoding, 4, absl::MakeSpan(data)).code();
  };
  const auto kLoss = absl::StatusCode::kDataLoss;
  EXPECT_EQ(apply(std::string("\x01", 1)), kLoss);  // no count
  EXPECT_EQ(apply(std::string("\x80", 1)), kLoss);  // truncated varint
  EXPECT_EQ(apply(std::string("\x00\x05", 2) + std::string(20, 'y')),
            kLoss);  // 5 elements of 4
  EXPECT_EQ(apply(std::string("\x03\x02", 2) + std::string(8, 'y')),
            kLoss);  // from element 3, 2 elements
  EXPECT_EQ(apply(std::string("\x00\x02", 2) + "yyyy"), kLoss);  // truncated
  // A gap near 2^64 must not wrap around.
  EXPECT_EQ(
      apply(std::string("\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01\x01", 11) +
            "yyyy"),
      kLoss);
  EXPECT_EQ(apply(std::string(11, '\xff')), kLoss);  // varint too long
  EXPECT_EQ(ApplyDelta("", 3, absl::MakeSpan(data)).code(),
            absl::StatusCode::kInvalidArgument);
  // Valid: element 3 only.
  EXPECT_EQ(apply(std::string("\x03\x01", 2) + "yyyy"), absl::StatusCode::kOk);
  EXPECT_EQ(data, std::string(12, 'x') + "yyyy");
}

}  // namespace
}  // namespace tessera
