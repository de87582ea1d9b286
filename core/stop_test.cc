#include "core/stop.h"

#include <atomic>
#include <optional>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "core/testing/status_matchers.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;

TEST(StopConditionTest, SaysWhichLimitStoppedWhat) {
  EXPECT_THAT(StopCondition{}.Check(), IsOk());
  StopCondition late;
  late.deadline = absl::Now() - absl::Seconds(1);
  EXPECT_THAT(late.Check("an exchange"),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       "deadline exceeded while an exchange"));
  StopCondition given_up;
  given_up.cancelled = [] { return true; };
  EXPECT_THAT(
      given_up.Check("an exchange"),
      StatusIs(absl::StatusCode::kCancelled, "cancelled while an exchange"));
}

TEST(CancellationTest, StopsWhatIsRegisteredNowAndLater) {
  Cancellation cancellation;
  int first = 0;
  int second = 0;
  {
    Cancellation::Registration a = cancellation.OnCancel([&] { ++first; });
    EXPECT_FALSE(cancellation.cancelled());
    cancellation.Cancel();
    cancellation.Cancel();  // once only
    EXPECT_TRUE(cancellation.cancelled());
    EXPECT_EQ(first, 1);
    // A call that starts after the others gave up stops at once.
    Cancellation::Registration b = cancellation.OnCancel([&] { ++second; });
    EXPECT_EQ(second, 1);
  }
  EXPECT_EQ(first, 1);
}

TEST(CancellationTest, AFinishedCallIsNotStopped) {
  Cancellation cancellation;
  int stopped = 0;
  {
    Cancellation::Registration done = cancellation.OnCancel([&] { ++stopped; });
  }
  std::optional<Cancellation::Registration> moved;
  {
    Cancellation::Registration running =
        cancellation.OnCancel([&] { stopped += 10; });
    moved.emplace(std::move(running));
  }  // the moved-from registration undoes nothing
  cancellation.Cancel();
  EXPECT_EQ(stopped, 10);
}

TEST(CancellationTest, OneThreadGivesUpCallsBlockedInOthers) {
  Cancellation cancellation;
  std::atomic<int> returned{0};
  std::vector<std::thread> calls;
  for (int i = 0; i < 4; ++i) {
    calls.emplace_back([&] {
      absl::Notification stop;
      Cancellation::Registration registered =
          cancellation.OnCancel([&] { stop.Notify(); });
      // A blocked call, as a gRPC call waits for its reply.
      if (stop.WaitForNotificationWithTimeout(absl::Seconds(30))) ++returned;
    });
  }
  absl::SleepFor(absl::Milliseconds(50));
  cancellation.Cancel();
  for (std::thread& t : calls) t.join();
  EXPECT_EQ(returned.load(), 4);
}

TEST(CancelWhenTest, APolledCancellationStopsACallBlockedElsewhere) {
  Cancellation cancellation;
  std::atomic<bool> caller_gone{false};
  CancelWhen watch([&] { return caller_gone.load(); }, &cancellation,
                   absl::Milliseconds(5));
  absl::Notification stop;
  Cancellation::Registration registered =
      cancellation.OnCancel([&] { stop.Notify(); });
  EXPECT_FALSE(stop.WaitForNotificationWithTimeout(absl::Milliseconds(50)));
  caller_gone = true;
  EXPECT_TRUE(stop.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_TRUE(cancellation.cancelled());
}

TEST(CancelWhenTest, EndingTheWatchNeverCancels) {
  Cancellation cancellation;
  std::atomic<int> polls{0};
  {
    CancelWhen watch(
        [&] {
          ++polls;
          return false;
        },
        &cancellation, absl::Milliseconds(1));
    // Its poller has run (a loaded machine may take a while to start it).
    const absl::Time give_up = absl::Now() + absl::Seconds(10);
    while (polls.load() == 0 && absl::Now() < give_up) {
      absl::SleepFor(absl::Milliseconds(1));
    }
  }
  const int after = polls.load();
  EXPECT_GT(after, 0);
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(polls.load(), after);  // the poller is gone
  EXPECT_FALSE(cancellation.cancelled());
  CancelWhen none({}, &cancellation);  // nothing to poll: no thread
  EXPECT_FALSE(cancellation.cancelled());
}

TEST(OneAtATimeTest, AWaiterGetsItsTurnWhenTheHolderLetsGo) {
  OneAtATime gpu;
  std::optional<OneAtATime::Held> first;
  {
    absl::StatusOr<OneAtATime::Held> taken = gpu.Take({}, "an exchange");
    ASSERT_THAT(taken, IsOk());
    first.emplace(*std::move(taken));
  }
  std::atomic<bool> second_held{false};
  std::thread second([&] {
    absl::StatusOr<OneAtATime::Held> taken = gpu.Take({}, "an exchange");
    EXPECT_THAT(taken, IsOk());
    second_held = true;
  });
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(second_held) << "two holders at once";
  first.reset();
  second.join();
  EXPECT_TRUE(second_held);
  // Let go again when the second holder's result was destroyed.
  EXPECT_THAT(gpu.Take({}, "an exchange"), IsOk());
}

TEST(OneAtATimeTest, AWaiterGivesUpByItsOwnStopCondition) {
  OneAtATime gpu;
  absl::StatusOr<OneAtATime::Held> held = gpu.Take({}, "an exchange");
  ASSERT_THAT(held, IsOk());
  StopCondition late;
  late.deadline = absl::Now() + absl::Milliseconds(30);
  EXPECT_THAT(gpu.Take(late, "waiting for the GPU"),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       "deadline exceeded while waiting for the GPU"));
  std::atomic<bool> give_up{false};
  StopCondition cancelled;
  cancelled.cancelled = [&] { return give_up.load(); };
  std::thread waiter([&] {
    EXPECT_THAT(gpu.Take(cancelled, "waiting for the GPU"),
                StatusIs(absl::StatusCode::kCancelled));
  });
  absl::SleepFor(absl::Milliseconds(30));
  give_up = true;
  waiter.join();
  // Moving a turn keeps it held; destroying the moved-to one lets go.
  { OneAtATime::Held moved = *std::move(held); }
  EXPECT_THAT(gpu.Take(late, "waiting for the GPU"), IsOk());
}

}  // namespace
}  // namespace tessera
