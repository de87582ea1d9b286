// SmallReadCoalescer with a send function that records each call and can
// hold the first one, so that reads pile up behind it deterministically.
#include "transport/small_read_coalescer.h"

#include <algorithm>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "core/limits.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::UnorderedElementsAre;

struct TestRead : SmallRead {
  int id = 0;
  bool missing = false;  // its own answer, alone, is NOT_FOUND
};

// Records every call's reads; holds calls while `hold` is set.
class Worker {
 public:
  absl::Status Send(absl::Span<SmallRead* const> reads) {
    {
      absl::MutexLock lock(&mu_);
      std::vector<int> ids;
      for (SmallRead* read : reads) ids.push_back(Of(read).id);
      calls_.push_back(ids);
    }
    if (hold_ != nullptr) hold_->WaitForNotification();
    if (reads.size() > 1 && batch_status_ != nullptr) return *batch_status_;
    for (SmallRead* read : reads) {
      read->status = Of(read).missing ? absl::NotFoundError("shard not held")
                                      : absl::OkStatus();
    }
    return reads.size() == 1 ? reads[0]->status : absl::OkStatus();
  }
  std::vector<std::vector<int>> calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }

  absl::Notification* hold_ = nullptr;
  const absl::Status* batch_status_ = nullptr;

 private:
  static TestRead& Of(SmallRead* read) { return *static_cast<TestRead*>(read); }
  absl::Mutex mu_;
  std::vector<std::vector<int>> calls_;
};

class SmallReadCoalescerTest : public ::testing::Test {
 protected:
  SmallReadCoalescer coalescer_{1, [this](absl::Span<SmallRead* const> reads) {
                                  return worker_.Send(reads);
                                }};
  Worker worker_;

  // Starts read `id` (key `key`, `bytes`) on a thread of its own.
  void Start(int id, const std::string& key = "k", int64_t bytes = 4096,
             bool missing = false) {
    auto read = std::make_unique<TestRead>();
    read->id = id;
    read->key = key;
    read->bytes = bytes;
    read->missing = missing;
    TestRead* raw = read.get();
    reads_.push_back(std::move(read));
    statuses_.push_back(std::make_unique<absl::Status>());
    absl::Status* status = statuses_.back().get();
    threads_.emplace_back(
        [this, raw, status] { *status = coalescer_.Read(*raw); });
  }
  // Holds the worker, starts read 0 and waits until its call is made.
  void HoldFirstCall(absl::Notification* release) {
    worker_.hold_ = release;
    Start(0);
    while (worker_.calls().empty()) absl::SleepFor(absl::Milliseconds(1));
  }
  void WaitUntilWaiting(int n) {
    while (coalescer_.waiting() != n) absl::SleepFor(absl::Milliseconds(1));
  }
  void JoinAll() {
    for (std::thread& t : threads_) t.join();
    threads_.clear();
  }

  std::vector<std::unique_ptr<TestRead>> reads_;
  std::vector<std::unique_ptr<absl::Status>> statuses_;
  std::vector<std::thread> threads_;
};

TEST_F(SmallReadCoalescerTest, OneCallerAtATimeNeverWaits) {
  for (int i = 0; i < 5; ++i) {
    TestRead read;
    read.id = i;
    read.key = "k";
    EXPECT_THAT(coalescer_.Read(read), IsOk());
  }
  EXPECT_EQ(coalescer_.calls(), 5);
  EXPECT_EQ(coalescer_.coalesced_calls(), 0);
}

TEST_F(SmallReadCoalescerTest, ReadsWaitingForAPlaceGoOutInOneCall) {
  absl::Notification release;
  HoldFirstCall(&release);
  for (int id = 1; id <= 5; ++id) Start(id);
  WaitUntilWaiting(5);
  release.Notify();
  JoinAll();
  for (const auto& status : statuses_) EXPECT_THAT(*status, IsOk());
  EXPECT_THAT(worker_.calls(),
              ElementsAre(ElementsAre(0), UnorderedElementsAre(1, 2, 3, 4, 5)));
  EXPECT_EQ(coalescer_.coalesced_calls(), 1);
}

TEST_F(SmallReadCoalescerTest, ReadsOfAnotherKeyNeitherShareNorWait) {
  absl::Notification release;
  HoldFirstCall(&release);  // key "k"
  Start(1, "k");
  Start(2, "k");
  WaitUntilWaiting(2);
  // Another tensor's read goes out at once, though "k" has its call out.
  Start(3, "other");
  while (worker_.calls().size() < 2) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_EQ(coalescer_.waiting(), 2);
  EXPECT_EQ(coalescer_.lanes(), 2);
  release.Notify();
  JoinAll();
  for (const auto& status : statuses_) EXPECT_THAT(*status, IsOk());
  EXPECT_THAT(worker_.calls(), ElementsAre(ElementsAre(0), ElementsAre(3),
                                           UnorderedElementsAre(1, 2)));
  // Lanes go once idle: capabilities come and go, the map does not grow.
  EXPECT_EQ(coalescer_.lanes(), 0);
}

TEST_F(SmallReadCoalescerTest, OneCallStaysWithinOneMessageAndTheReadCap) {
  absl::Notification release;
  HoldFirstCall(&release);
  // Two reads of 3 MiB cannot share a 4 MiB reply.
  Start(1, "k", int64_t{3} << 20);
  Start(2, "k", int64_t{3} << 20);
  // Past kMaxRegionsPerSmallRead reads of 0 bytes.
  for (int id = 3; id < 4 + kMaxRegionsPerSmallRead; ++id) Start(id, "k", 0);
  WaitUntilWaiting(2 + 1 + kMaxRegionsPerSmallRead);
  release.Notify();
  JoinAll();
  for (const auto& status : statuses_) EXPECT_THAT(*status, IsOk());
  size_t largest = 0;
  for (const std::vector<int>& call : worker_.calls()) {
    largest = std::max(largest, call.size());
    if (std::count(call.begin(), call.end(), 1) == 1) {
      EXPECT_EQ(std::count(call.begin(), call.end(), 2), 0);
    }
  }
  EXPECT_EQ(largest, static_cast<size_t>(kMaxRegionsPerSmallRead));
}

TEST_F(SmallReadCoalescerTest, AFailedCallIsNobodysAnswer) {
  absl::Notification release;
  const absl::Status unavailable = absl::UnavailableError("connection reset");
  worker_.batch_status_ = &unavailable;
  HoldFirstCall(&release);
  Start(1);
  Start(2, "k", 4096, /*missing=*/true);
  Start(3);
  WaitUntilWaiting(3);
  release.Notify();
  JoinAll();
  // Each read of the failed call asked again alone: its own answer.
  EXPECT_THAT(*statuses_[0], IsOk());
  EXPECT_THAT(*statuses_[1], IsOk());
  EXPECT_THAT(*statuses_[2], StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(*statuses_[3], IsOk());
  EXPECT_EQ(worker_.calls().size(), 1u + 1u + 3u);
}

TEST_F(SmallReadCoalescerTest, AWorkerWithoutCoalescedReadsGetsThemOneByOne) {
  absl::Notification release;
  const absl::Status unimplemented = absl::UnimplementedError("unknown method");
  worker_.batch_status_ = &unimplemented;
  HoldFirstCall(&release);
  Start(1);
  Start(2);
  WaitUntilWaiting(2);
  release.Notify();
  JoinAll();
  for (const auto& status : statuses_) EXPECT_THAT(*status, IsOk());
  const size_t before = worker_.calls().size();
  // From now on nobody waits for a place: no call carries two reads.
  for (int id = 10; id < 20; ++id) Start(id);
  JoinAll();
  const std::vector<std::vector<int>> calls = worker_.calls();
  ASSERT_EQ(calls.size(), before + 10);
  for (size_t i = before; i < calls.size(); ++i) EXPECT_EQ(calls[i].size(), 1u);
}

TEST_F(SmallReadCoalescerTest, AReadWaitingPastItsDeadlineGivesUp) {
  absl::Notification release;
  HoldFirstCall(&release);
  TestRead late;
  late.id = 1;
  late.key = "k";
  late.deadline = absl::Now() + absl::Milliseconds(50);
  EXPECT_THAT(coalescer_.Read(late),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_EQ(coalescer_.waiting(), 0);
  release.Notify();
  JoinAll();
  EXPECT_THAT(worker_.calls(), ElementsAre(ElementsAre(0)));
  EXPECT_EQ(coalescer_.lanes(), 0);
}

}  // namespace
}  // namespace tessera
