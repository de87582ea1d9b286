#include "worker/communicator_cache.h"

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::tessera::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

// Stands for a joined communicator; says when it is destroyed.
struct Joined {
  int serial = 0;
  std::function<void()> on_destroy;
  ~Joined() {
    if (on_destroy) on_destroy();
  }
};

using Cache = CommunicatorCache<Joined>;

class CommunicatorCacheTest : public ::testing::Test {
 protected:
  // A join that succeeds at once, counted.
  Cache::Join Joins() {
    return [this]() -> absl::StatusOr<std::shared_ptr<Joined>> {
      auto joined = std::make_shared<Joined>();
      joined->serial = ++joins_;
      joined->on_destroy = [this] { ++destroyed_; };
      return joined;
    };
  }
  // A join of `id` on its own thread that waits for its members until
  // Finish, then returns `outcome` (a communicator when OK).
  class SlowJoin {
   public:
    SlowJoin(CommunicatorCacheTest* test, Cache* cache, const std::string& id,
             absl::Status outcome = absl::OkStatus()) {
      thread_ = std::thread([=] {
        result_ = cache->Get(id, {},
                             [=]() -> absl::StatusOr<std::shared_ptr<Joined>> {
                               started_.Notify();
                               release_.WaitForNotification();
                               ++test->joins_;
                               if (!outcome.ok()) return outcome;
                               return std::make_shared<Joined>();
                             });
      });
      started_.WaitForNotification();
    }
    ~SlowJoin() {
      if (thread_.joinable()) static_cast<void>(Finish());  // a test failed
    }
    // Lets the members come; the join's outcome.
    absl::StatusOr<std::shared_ptr<Joined>> Finish() {
      release_.Notify();
      thread_.join();
      return std::move(result_);
    }

   private:
    absl::Notification started_, release_;
    std::thread thread_;
    absl::StatusOr<std::shared_ptr<Joined>> result_;
  };

  std::atomic<int> joins_{0};
  std::atomic<int> destroyed_{0};
};

TEST_F(CommunicatorCacheTest, AKeptCommunicatorIsReused) {
  Cache cache(4);
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Joined> first,
                       cache.Get("a", {}, Joins()));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Joined> again,
                       cache.Get("a", {}, Joins()));
  EXPECT_EQ(first, again);
  EXPECT_EQ(joins_, 1);
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Joined> other,
                       cache.Get("b", {}, Joins()));
  EXPECT_NE(other, first);
  EXPECT_EQ(cache.size(), 2u);
}

TEST_F(CommunicatorCacheTest, JoinsUnderDifferentIdsDoNotWaitForEachOther) {
  Cache cache(4);
  SlowJoin slow(this, &cache, "never-formed");
  absl::Notification other_joined;
  std::thread other([&] {
    EXPECT_OK(cache.Get("b", {}, Joins()).status());
    other_joined.Notify();
  });
  // The first join is still waiting for its members.
  EXPECT_TRUE(other_joined.WaitForNotificationWithTimeout(absl::Seconds(30)))
      << "a join under another id waited for the first";
  EXPECT_OK(slow.Finish().status());
  other.join();
  EXPECT_EQ(cache.size(), 2u);
}

TEST_F(CommunicatorCacheTest, ASecondCallerForAnIdBeingJoinedSharesTheJoin) {
  Cache cache(4);
  SlowJoin joiner(this, &cache, "a");
  std::shared_ptr<Joined> second;
  std::thread waiter(
      [&] { ASSERT_OK_AND_ASSIGN(second, cache.Get("a", {}, Joins())); });
  absl::SleepFor(absl::Milliseconds(50));  // let the waiter wait
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Joined> first, joiner.Finish());
  waiter.join();
  EXPECT_EQ(first, second);
  EXPECT_EQ(joins_, 1) << "joined twice";
}

TEST_F(CommunicatorCacheTest, AFailedJoinFailsItsWaitersAndTheNextCallerJoins) {
  Cache cache(4);
  SlowJoin joiner(this, &cache, "a",
                  absl::DeadlineExceededError("a peer never joined"));
  absl::StatusOr<std::shared_ptr<Joined>> waited;
  std::thread waiter([&] { waited = cache.Get("a", {}, Joins()); });
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_THAT(joiner.Finish().status(),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  waiter.join();
  // The waiter either shared the failure or came after it and joined.
  if (!waited.ok()) {
    EXPECT_THAT(waited.status(),
                StatusIs(absl::StatusCode::kDeadlineExceeded,
                         AllOf(HasSubstr("another exchange's join"),
                               HasSubstr("a peer never joined"))));
    EXPECT_EQ(cache.size(), 0u) << "a failed join is not kept";
  }
  ASSERT_OK(cache.Get("a", {}, Joins()).status());
  EXPECT_EQ(cache.size(), 1u);
}

TEST_F(CommunicatorCacheTest, AWaiterStopsByItsOwnConditionNotTheJoiners) {
  Cache cache(4);
  SlowJoin joiner(this, &cache, "a");
  std::atomic<bool> give_up{false};
  StopCondition stop;
  stop.cancelled = [&] { return give_up.load(); };
  absl::StatusOr<std::shared_ptr<Joined>> waited;
  std::thread waiter([&] { waited = cache.Get("a", stop, Joins()); });
  absl::SleepFor(absl::Milliseconds(30));
  give_up = true;
  waiter.join();
  EXPECT_THAT(waited.status(),
              StatusIs(absl::StatusCode::kCancelled,
                       HasSubstr("another exchange is joining")));
  StopCondition past;
  past.deadline = absl::Now() - absl::Seconds(1);
  EXPECT_THAT(cache.Get("a", past, Joins()).status(),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_OK(joiner.Finish().status());
  EXPECT_EQ(joins_, 1);
  EXPECT_OK(cache.Get("a", past, Joins()).status()) << "kept: no wait";
}

TEST_F(CommunicatorCacheTest, BeyondCapacityTheLeastRecentlyUsedIdleOneGoes) {
  Cache cache(2);
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Joined> a, cache.Get("a", {}, Joins()));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Joined> b, cache.Get("b", {}, Joins()));
  // Both held by exchanges: nothing may go.
  EXPECT_THAT(cache.Get("c", {}, Joins()).status(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("2 communicators are in use")));
  a.reset();
  b.reset();
  ASSERT_OK(cache.Get("a", {}, Joins()).status());  // a is now the newer
  // b goes, destroyed outside the cache's lock (its destructor asks the
  // cache its size, which would deadlock under the lock).
  int size_when_destroyed = -1;
  cache.Get("b", {}, Joins()).value()->on_destroy = [&] {
    size_when_destroyed = static_cast<int>(cache.size());
  };
  ASSERT_OK(cache.Get("a", {}, Joins()).status());
  ASSERT_OK(cache.Get("c", {}, Joins()).status());
  EXPECT_GE(size_when_destroyed, 1) << "b was not let go";
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(joins_, 3);
  ASSERT_OK(cache.Get("a", {}, Joins()).status());
  EXPECT_EQ(joins_, 3) << "a was let go instead of b";
}

TEST_F(CommunicatorCacheTest, JoinsInProgressCountTowardCapacity) {
  Cache cache(1);
  SlowJoin joiner(this, &cache, "a");
  EXPECT_THAT(cache.Get("b", {}, Joins()).status(),
              StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_OK(joiner.Finish().status());
  ASSERT_OK(cache.Get("b", {}, Joins()).status());  // a was idle: let go
  EXPECT_EQ(cache.size(), 1u);
}

TEST_F(CommunicatorCacheTest, DropForgetsOnlyTheCommunicatorNamed) {
  Cache cache(4);
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Joined> a, cache.Get("a", {}, Joins()));
  Joined stranger;
  cache.Drop("a", &stranger);
  cache.Drop("nobody", a.get());
  EXPECT_EQ(cache.size(), 1u);
  cache.Drop("a", a.get());
  EXPECT_EQ(cache.size(), 0u);
  EXPECT_EQ(destroyed_, 0) << "its holder still has it";
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Joined> fresh,
                       cache.Get("a", {}, Joins()));
  EXPECT_NE(fresh, a);
  a.reset();
  EXPECT_EQ(destroyed_, 1);
  fresh.reset();
  cache.Clear();
  EXPECT_EQ(destroyed_, 2);
  EXPECT_EQ(cache.size(), 0u);
}

TEST_F(CommunicatorCacheTest, AJoinThatMakesNothingIsAnError) {
  Cache cache(4);
  EXPECT_THAT(cache
                  .Get("a", {},
                       []() -> absl::StatusOr<std::shared_ptr<Joined>> {
                         return std::shared_ptr<Joined>();
                       })
                  .status(),
              StatusIs(absl::StatusCode::kInternal));
  EXPECT_EQ(cache.size(), 0u);
}

}  // namespace
}  // namespace tessera
