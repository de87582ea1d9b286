#include "core/quota.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace tessera {
namespace {

using ::testing::HasSubstr;

TEST(QuotaBytes, TakesSuffixesAndUnlimited) {
  EXPECT_EQ(*ParseQuotaBytes("0"), 0);
  EXPECT_EQ(*ParseQuotaBytes("1048576"), 1048576);
  EXPECT_EQ(*ParseQuotaBytes("64K"), 64 << 10);
  EXPECT_EQ(*ParseQuotaBytes("10m"), 10 << 20);
  EXPECT_EQ(*ParseQuotaBytes("2G"), int64_t{2} << 30);
  EXPECT_EQ(*ParseQuotaBytes("3T"), int64_t{3} << 40);
  EXPECT_EQ(*ParseQuotaBytes("unlimited"), QuotaLimit::kUnlimited);
  for (const char* bad : {"", "K", "-1", "+5", "1.5G", "12X", "1 G",
                          "99999999999999999999", "9000000T"}) {
    EXPECT_FALSE(ParseQuotaBytes(bad).ok()) << bad;
  }
}

TEST(QuotaTable, ParsesLinesCommentsAndTheDefault) {
  absl::StatusOr<QuotaTable> table = QuotaTable::Parse(
      "# teams\n"
      "trainer   10G  100   # weights\n"
      "inference unlimited 5\n"
      "\n"
      "*  1M\n");
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->For("trainer").bytes, int64_t{10} << 30);
  EXPECT_EQ(table->For("trainer").names, 100);
  EXPECT_EQ(table->For("inference").bytes, QuotaLimit::kUnlimited);
  EXPECT_EQ(table->For("inference").names, 5);
  EXPECT_EQ(table->For("someone").bytes, 1 << 20);
  EXPECT_EQ(table->For("someone").names, QuotaLimit::kUnlimited);
  EXPECT_THAT(table->Listed(), ::testing::ElementsAre("inference", "trainer"));
  EXPECT_TRUE(table->HasDefault());
}

TEST(QuotaTable, WithoutADefaultOthersAreUnlimited) {
  absl::StatusOr<QuotaTable> table = QuotaTable::Parse("ann 1K\n");
  ASSERT_TRUE(table.ok());
  EXPECT_TRUE(table->For("bob").unlimited());
  EXPECT_FALSE(table->HasDefault());
  EXPECT_TRUE(QuotaTable::Parse("").ok());  // nothing limited
}

TEST(QuotaTable, RefusesMalformedLinesNamingThem) {
  struct Case {
    const char* text;
    const char* says;
  } cases[] = {
      {"ann\n", "line 1: expected PRINCIPAL BYTES [NAMES], got 1"},
      {"ann 1K 2 3\n", "got 4 fields"},
      {"\nann lots\n", "line 2: 'lots' is not a byte count"},
      {"ann 1K -3\n", "'-3' is not a count of names"},
      {"ann 1K\nann 2K\n", "line 2: principal 'ann' is listed twice"},
      {"* 1K\n* 2K\n", "principal '*' is listed twice"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<QuotaTable> table = QuotaTable::Parse(c.text);
    ASSERT_FALSE(table.ok()) << c.text;
    EXPECT_EQ(table.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(table.status().message(), HasSubstr(c.says)) << c.text;
  }
}

TEST(QuotaTable, LoadNamesAMissingFile) {
  absl::StatusOr<QuotaTable> table = QuotaTable::Load("/nonexistent/quotas");
  ASSERT_FALSE(table.ok());
  EXPECT_THAT(table.status().message(), HasSubstr("/nonexistent/quotas"));
}

TEST(CheckQuota, AllowsUpToTheLimitAndNamesEverythingPastIt) {
  const QuotaLimit limit{10 << 20, 3};
  EXPECT_TRUE(CheckQuota("ann", {9 << 20, 2}, {1 << 20, 1}, limit, "x").ok());
  absl::Status over =
      CheckQuota("ann", {10 << 20, 2}, {1, 1}, limit, "creating 'w'");
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(over.message(),
            "quota: principal 'ann' uses 10485760 of its 10485760 bytes; "
            "creating 'w' needs 1 more");
  absl::Status names = CheckQuota("", {0, 3}, {0, 1}, limit, "creating 'w'");
  EXPECT_THAT(names.message(),
              HasSubstr("principal 'anonymous' holds 3 of its 3 tensor names"));
  // What frees or keeps room is never refused, even over the limit.
  EXPECT_TRUE(CheckQuota("ann", {20 << 20, 9}, {0, 0}, limit, "x").ok());
  EXPECT_TRUE(
      CheckQuota("ann", {INT64_MAX, 0}, {1, 0}, QuotaLimit{}, "x").ok());
  EXPECT_FALSE(CheckQuota("ann", {INT64_MAX - 1, 0}, {5, 0}, limit, "x").ok());
}

}  // namespace
}  // namespace tessera
