#include "core/status_macros.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::IsOkAndHolds;
using ::tessera::testing::StatusIs;
using ::testing::HasSubstr;

absl::Status FailIf(bool fail) {
  if (fail) return absl::NotFoundError("missing thing");
  return absl::OkStatus();
}

absl::StatusOr<int> Twice(absl::StatusOr<int> in) {
  TESSERA_ASSIGN_OR_RETURN(int v, in);
  return 2 * v;
}

absl::Status Chain(bool fail, int* calls) {
  TESSERA_RETURN_IF_ERROR(FailIf(fail));
  ++*calls;
  return absl::OkStatus();
}

TEST(StatusMacrosTest, ReturnIfErrorStopsOnFailureAndContinuesOnOk) {
  int calls = 0;
  EXPECT_THAT(Chain(true, &calls), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(calls, 0);
  EXPECT_THAT(Chain(false, &calls), IsOk());
  EXPECT_EQ(calls, 1);
}

TEST(StatusMacrosTest, AssignOrReturnDeclaresOrPropagates) {
  EXPECT_THAT(Twice(21), IsOkAndHolds(42));
  EXPECT_THAT(Twice(absl::InvalidArgumentError("bad")),
              StatusIs(absl::StatusCode::kInvalidArgument, "bad"));
}

absl::StatusOr<int> AssignTwiceOnSeparateLines() {
  int a = 0;
  TESSERA_ASSIGN_OR_RETURN(a, absl::StatusOr<int>(1));
  TESSERA_ASSIGN_OR_RETURN(const int b, absl::StatusOr<int>(2));
  return a + b;
}

TEST(StatusMacrosTest, AssignOrReturnWorksForExistingVariablesAndRepeats) {
  EXPECT_THAT(AssignTwiceOnSeparateLines(), IsOkAndHolds(3));
}

TEST(StatusMacrosTest, AnnotateKeepsCodeAndPrefixesMessage) {
  const absl::Status s = Annotate(absl::UnavailableError("connection refused"),
                                  "while fetching shard 3 from w1");
  EXPECT_THAT(s,
              StatusIs(absl::StatusCode::kUnavailable,
                       "while fetching shard 3 from w1: connection refused"));
  EXPECT_THAT(Annotate(absl::OkStatus(), "context"), IsOk());
}

TEST(StatusMatchersTest, MatchersDescribeMismatches) {
  EXPECT_THAT(absl::StatusOr<int>(absl::NotFoundError("x")),
              ::testing::Not(IsOk()));
  EXPECT_THAT(absl::StatusOr<int>(3), ::testing::Not(IsOkAndHolds(4)));
  EXPECT_THAT(absl::NotFoundError("tensor 'a' not found"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("not found")));
  EXPECT_THAT(absl::NotFoundError("x"),
              ::testing::Not(StatusIs(absl::StatusCode::kInternal)));
}

}  // namespace
}  // namespace tessera
