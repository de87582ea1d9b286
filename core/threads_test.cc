#include "core/threads.h"

#include <atomic>
#include <cerrno>
#include <optional>
#include <thread>

#include "core/testing/without_threads.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::tessera::testing::RunWithoutThreads;

TEST(TryStartThreadTest, RunsTheFunctionOnAThreadOfItsOwn) {
  std::atomic<bool> ran{false};
  std::thread::id on;
  std::optional<std::thread> started = TryStartThread([&] {
    on = std::this_thread::get_id();
    ran = true;
  });
  ASSERT_TRUE(started.has_value());
  started->join();
  EXPECT_TRUE(ran.load());
  EXPECT_NE(on, std::this_thread::get_id());
}

TEST(TryStartThreadTest, WithNoThreadToBeHadSaysSoInsteadOfEndingTheProcess) {
  // A plain std::thread here throws (97).
  EXPECT_EQ(RunWithoutThreads([] {
              bool ran = false;
              std::optional<std::thread> started =
                  TryStartThread([&] { ran = true; });
              if (started.has_value()) return 1;
              if (errno != EAGAIN) return 2;
              return ran ? 3 : 0;
            }),
            0);
}

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
