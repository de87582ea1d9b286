#include "core/rate_limited_log.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace tessera {
namespace {

TEST(RateLimitedLogTest, OneLinePerPeriodCountingTheEventsItStandsFor) {
  RateLimitedLog log(absl::Milliseconds(200));
  int64_t events = 0;
  ASSERT_TRUE(log.Due(&events));
  EXPECT_EQ(events, 1);
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(log.Due(&events));
  absl::SleepFor(absl::Milliseconds(250));
  ASSERT_TRUE(log.Due(&events));
  EXPECT_EQ(events, 6);  // the five held back, and this one
}

}  // namespace
}  // namespace tessera
