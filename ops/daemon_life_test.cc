#include "ops/daemon_life.h"

#include <atomic>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

TEST(DaemonLifeTest, WaitReturnsTheFirstFailureOnlyAfterOnFatalRan) {
  std::atomic<int> told{0};
  absl::Notification in_on_fatal, let_go;
  DaemonLife life([&] {
    ++told;
    in_on_fatal.Notify();
    let_go.WaitForNotification();
  });
  std::thread failing(
      [&] { life.Fail(absl::UnavailableError("the port accepts nothing")); });
  in_on_fatal.WaitForNotification();
  std::atomic<bool> returned{false};
  absl::Status waited;
  std::thread waiter([&] {
    waited = life.Wait();
    returned = true;
  });
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(returned.load());  // on_fatal still runs
  EXPECT_EQ(life.failure().code(), absl::StatusCode::kUnavailable);
  life.Fail(absl::InternalError("a second failure"));  // not told again
  let_go.Notify();
  failing.join();
  waiter.join();
  EXPECT_EQ(waited.message(), "the port accepts nothing");
  EXPECT_EQ(told.load(), 1);
  EXPECT_FALSE(life.WaitUntilServing(absl::ZeroDuration()));
  EXPECT_TRUE(life.RequestStop());  // it had failed
}

TEST(DaemonLifeTest, AStopEndsWaitsWithOk) {
  DaemonLife life({});
  std::thread serving([&] {
    absl::SleepFor(absl::Milliseconds(20));
    life.MarkServing();
  });
  EXPECT_TRUE(life.WaitUntilServing(absl::Seconds(10)));
  serving.join();
  std::thread stopper([&] {
    absl::SleepFor(absl::Milliseconds(20));
    EXPECT_FALSE(life.RequestStop());
  });
  EXPECT_TRUE(life.Wait().ok());
  stopper.join();
  EXPECT_FALSE(life.WaitUntilServing(absl::ZeroDuration()));  // stopped
}

}  // namespace
}  // namespace tessera
