#include "core/errors.h"

#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::tessera::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(ErrorsTest, EachErrorCarriesItsCodeAndCliWords) {
  EXPECT_THAT(
      OutOfBoundsError("--shard=7"),
      StatusIs(absl::StatusCode::kOutOfRange, "--shard=7 is out of bounds"));
  EXPECT_THAT(OutOfBoundsError("region 0:11", "dim 0 ..."),
              StatusIs(absl::StatusCode::kOutOfRange,
                       "region 0:11 is out of bounds: dim 0 ..."));
  EXPECT_THAT(
      OverlapError("shard 0 and shard 1"),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("overlap")));
  EXPECT_THAT(NotCoveredError("5 elements"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "shards do not cover the tensor: 5 elements"));
  EXPECT_THAT(NotFoundError("tensor", "emb"),
              StatusIs(absl::StatusCode::kNotFound, "tensor 'emb' not found"));
  EXPECT_THAT(AlreadyExistsError("tensor", "emb"),
              StatusIs(absl::StatusCode::kAlreadyExists,
                       "tensor 'emb' already exists"));
  EXPECT_THAT(DoesNotExistError("placement rank:7: worker rank 7"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "placement rank:7: worker rank 7 does not exist"));
  EXPECT_THAT(InvalidShardingDimError(3, 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "invalid sharding dim 3 for a tensor with 2 dims"));
  EXPECT_THAT(UnknownDTypeError("x"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("unknown dtype 'x'"),
                             HasSubstr("float32"), HasSubstr("bool"))));
  EXPECT_THAT(DimsMismatchError("region 0:5,0:5,0:1", 3, 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "region 0:5,0:5,0:1 has 3 dims but the tensor has 2 "
                       "dims"));
  EXPECT_THAT(UnavailableError("shard 2 on worker w1"),
              StatusIs(absl::StatusCode::kUnavailable,
                       "shard 2 on worker w1 is unavailable"));
}

}  // namespace
}  // namespace tessera
