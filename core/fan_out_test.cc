#include "core/fan_out.h"

#include <atomic>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "core/testing/status_matchers.h"
#include "core/testing/without_threads.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::tessera::testing::StatusIs;

TEST(FanOutTest, RunsEveryItemOnceWithinTheLimit) {
  for (size_t limit : {1, 3, 8, 100}) {
    std::vector<std::atomic<int>> ran(50);
    std::atomic<int> running{0};
    std::atomic<int> most{0};
    ASSERT_OK(FanOut(ran.size(), limit, [&](size_t i) {
      const int now = ++running;
      int seen = most.load();
      while (now > seen && !most.compare_exchange_weak(seen, now)) {
      }
      absl::SleepFor(absl::Milliseconds(1));
      ++ran[i];
      --running;
      return absl::OkStatus();
    }));
    for (size_t i = 0; i < ran.size(); ++i) EXPECT_EQ(ran[i], 1) << i;
    EXPECT_LE(most.load(), static_cast<int>(limit));
    if (limit > 1) {
      EXPECT_GT(most.load(), 1) << "limit " << limit;
    }
  }
}

TEST(FanOutTest, EveryItemRunsWhenNoThreadCanBeStarted) {
  // The calling thread alone takes them all; a std::thread that throws
  // would leave it with an exception (97).
  EXPECT_EQ(testing::RunWithoutThreads([] {
              std::vector<int> ran(200, 0);
              const absl::Status status = FanOut(ran.size(), 64, [&](size_t i) {
                ++ran[i];
                return absl::OkStatus();
              });
              if (!status.ok()) return 1;
              for (int n : ran) {
                if (n != 1) return 2;
              }
              return 0;
            }),
            0);
}

TEST(FanOutTest, NoItemStartsAfterOneFailed) {
  std::atomic<int> started{0};
  const absl::Status status = FanOut(1000, 4, [&](size_t i) {
    ++started;
    if (i == 10) return absl::DataLossError("item 10");
    absl::SleepFor(absl::Milliseconds(1));
    return absl::OkStatus();
  });
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kDataLoss));
  // Items 0..10 and at most the three other threads' next ones.
  EXPECT_LT(started.load(), 20);
}

TEST(FanOutTest, AStopLeavesTheRestUnstartedAndSaysWhy) {
  std::atomic<bool> cancelled{false};
  StopCondition stop;
  stop.cancelled = [&] { return cancelled.load(); };
  std::atomic<int> started{0};
  const absl::Status status = FanOut(
      1000, 2,
      [&](size_t i) {
        ++started;
        if (i == 5) cancelled = true;
        return absl::OkStatus();
      },
      stop);
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kCancelled));
  EXPECT_LT(started.load(), 10);
  stop = StopCondition();
  stop.deadline = absl::Now() - absl::Seconds(1);
  EXPECT_THAT(FanOut(
                  3, 2, [](size_t) { return absl::OkStatus(); }, stop),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
}

TEST(FanOutTest, NoItemsAndALimitOfZeroAreFine) {
  EXPECT_OK(FanOut(0, 4, [](size_t) { return absl::InternalError("never"); }));
  std::atomic<int> ran{0};
  EXPECT_OK(FanOut(5, 0, [&](size_t) {
    ++ran;
    return absl::OkStatus();
  }));
  EXPECT_EQ(ran.load(), 5);
}

}  // namespace
}  // namespace tessera
