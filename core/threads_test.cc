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

}  // namespace
}  // namespace tessera
