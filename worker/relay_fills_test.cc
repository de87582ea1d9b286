#include "worker/relay_fills.h"

#include <thread>

#include "absl/time/clock.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;
using ::testing::HasSubstr;

TEST(RelayFills, AWaiterLearnsEachAdvanceAndTheEnd) {
  RelayFills fills;
  ASSERT_THAT(fills.Begin(1, 10), IsOk());
  std::thread filler([&] {
    absl::SleepFor(absl::Milliseconds(20));
    fills.Advance(1, 10, 3);
    absl::SleepFor(absl::Milliseconds(20));
    fills.Finish(1, 10, /*done=*/true);
  });
  absl::StatusOr<RelayFillProgress> p =
      fills.Await(1, 10, 0, absl::Now() + absl::Seconds(10));
  ASSERT_THAT(p.status(), IsOk());
  EXPECT_TRUE(p->started);
  EXPECT_EQ(p->chunks_done, 3);
  p = fills.Await(1, 10, 3, absl::Now() + absl::Seconds(10));
  ASSERT_THAT(p.status(), IsOk());
  EXPECT_TRUE(p->done);
  filler.join();
  EXPECT_EQ(fills.running(), 0u);
}

TEST(RelayFills, NotStartedAtTheDeadlineSaysSo) {
  RelayFills fills;
  absl::StatusOr<RelayFillProgress> p =
      fills.Await(1, 10, 0, absl::Now() + absl::Milliseconds(10));
  ASSERT_THAT(p.status(), IsOk());
  EXPECT_FALSE(p->started);
}

TEST(RelayFills, AFailedFillIsUnavailableToItsWaiters) {
  RelayFills fills;
  ASSERT_THAT(fills.Begin(1, 10), IsOk());
  fills.Advance(1, 10, 2);
  fills.Finish(1, 10, /*done=*/false);
  EXPECT_THAT(fills.Await(1, 10, 0, absl::Now()).status(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("failed")));
  // A retried hop starts afresh.
  ASSERT_THAT(fills.Begin(1, 10), IsOk());
  EXPECT_THAT(fills.Await(1, 10, 0, absl::Now()).status(), IsOk());
}

TEST(RelayFills, OneFillPerShardAndRelayAtATime) {
  RelayFills fills;
  ASSERT_THAT(fills.Begin(1, 10), IsOk());
  EXPECT_THAT(fills.Begin(1, 10), StatusIs(absl::StatusCode::kAlreadyExists));
  EXPECT_THAT(fills.Begin(2, 10), IsOk());  // another relay
}

TEST(RelayFills, RunningFillsAreBoundedAndFinishedOnesForgottenInTime) {
  RelayFills fills;
  for (size_t i = 0; i < kMaxRunningRelayFills; ++i) {
    ASSERT_THAT(fills.Begin(1, i), IsOk());
  }
  EXPECT_THAT(fills.Begin(1, kMaxRunningRelayFills),
              StatusIs(absl::StatusCode::kResourceExhausted));
  for (size_t i = 0; i < kMaxRunningRelayFills; ++i) fills.Finish(1, i, true);
  for (size_t i = 0; i < kMaxFinishedRelayFills; ++i) {
    ASSERT_THAT(fills.Begin(2, i), IsOk());
    fills.Finish(2, i, true);
  }
  // The oldest finished records went: a late waiter sees no fill.
  absl::StatusOr<RelayFillProgress> p = fills.Await(1, 0, 0, absl::Now());
  ASSERT_THAT(p.status(), IsOk());
  EXPECT_FALSE(p->started);
}

}  // namespace
}  // namespace tessera
