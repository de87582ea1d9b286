#include "core/shard_record.h"

#include <string>

#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

ShardRecord Sample() {
  ShardRecord r;
  r.shard_id = 0xfedcba9876543210ull;
  r.cluster_id = "c-1";
  r.tensor = "layers.0/w";
  r.version = 3;
  r.incarnation = 77;
  r.dtype = DType::kBFloat16;
  r.tensor_shape = {8, 6};
  r.box = Box({4, 0}, {4, 6});
  r.bytes = 48;
  r.crc32 = 0xdeadbeef;
  return r;
}

TEST(ShardRecord, RoundTrips) {
  absl::StatusOr<ShardRecord> back =
      ParseShardRecord(ShardRecordJson(Sample()));
  ASSERT_TRUE(back.ok()) << back.status();
  const ShardRecord want = Sample();
  EXPECT_EQ(back->shard_id, want.shard_id);
  EXPECT_EQ(back->cluster_id, want.cluster_id);
  EXPECT_EQ(back->tensor, want.tensor);
  EXPECT_EQ(back->version, want.version);
  EXPECT_EQ(back->incarnation, want.incarnation);
  EXPECT_EQ(back->dtype, want.dtype);
  EXPECT_EQ(back->tensor_shape, want.tensor_shape);
  EXPECT_EQ(back->box, want.box);
  EXPECT_EQ(back->bytes, want.bytes);
  EXPECT_EQ(back->crc32, want.crc32);
}

TEST(ShardRecord, RefusesWhatDoesNotAddUp) {
  const std::string good = ShardRecordJson(Sample());
  const struct {
    std::string from, to;
  } kCases[] = {
      {"\"bytes\":48", "\"bytes\":40"},
      {"\"offsets\":[4,0]", "\"offsets\":[5,0]"},
      {"\"offsets\":[4,0]", "\"offsets\":[4]"},
      {"\"dtype\":\"bfloat16\"", "\"dtype\":\"bf17\""},
      {"\"crc32\":3735928559", "\"crc32\":4294967296"},
      {"\"version\":3", "\"version\":-3"},
      {"\"tensor\":\"layers.0/w\"", "\"tensor\":\"\""},
      {"\"tensor_shape\":[8,6]", "\"tensor_shape\":[]"},
  };
  for (const auto& c : kCases) {
    const std::string text = absl::StrReplaceAll(good, {{c.from, c.to}});
    ASSERT_NE(text, good) << c.from;
    absl::StatusOr<ShardRecord> parsed = ParseShardRecord(text);
    ASSERT_FALSE(parsed.ok()) << c.to;
    EXPECT_THAT(parsed.status().message(), HasSubstr("store: ")) << c.to;
  }
  EXPECT_FALSE(ParseShardRecord("").ok());
  EXPECT_FALSE(
      ParseShardRecord(std::string(kMaxShardRecordBytes + 1, ' ')).ok());
}

// The identity tells apart every field a capability names, and is the
// same in every process (a worker and its coordinator compute it apart).
TEST(ShardIdentityTest, DiffersOnTensorIncarnationAndBoxOnly) {
  const Box box{{0, 8}, {4, 8}};
  const uint64_t base = ShardIdentity("w", 7, box);
  EXPECT_EQ(ShardIdentity("w", 7, Box{{0, 8}, {4, 8}}), base);
  EXPECT_EQ(base, 0x60ce9b047a9625c8ull) << std::hex << base;
  EXPECT_NE(ShardIdentity("v", 7, box), base);
  EXPECT_NE(ShardIdentity("w", 8, box), base);
  EXPECT_NE(ShardIdentity("w", 7, Box{{0, 9}, {4, 8}}), base);
  EXPECT_NE(ShardIdentity("w", 7, Box{{0, 8}, {4, 7}}), base);
  EXPECT_NE(ShardIdentity("w", 7, Box{{0}, {4}}), base);
  // Names and numbers do not run into each other.
  EXPECT_NE(ShardIdentity("w\x07", 0, box), ShardIdentity("w", 7, box));
}

}  // namespace
}  // namespace tessera
