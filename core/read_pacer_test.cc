#include "core/read_pacer.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

namespace tessera {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

class ReadPacerTest : public ::testing::Test {
 protected:
  std::unique_ptr<ReadPacer> Make(int64_t rate, int64_t burst) {
    ReadPacer::Options options;
    options.rate = rate;
    options.burst = burst;
    options.clock = [this] { return now_; };
    return std::make_unique<ReadPacer>(options);
  }
  absl::Time now_ = absl::FromUnixSeconds(1000);
};

TEST_F(ReadPacerTest, ABurstIsFreeThenReadsWaitAtTheRate) {
  std::unique_ptr<ReadPacer> pacer = Make(4 * kMiB, kMiB);
  EXPECT_EQ(pacer->Reserve("ann", kMiB), absl::ZeroDuration());
  // The bucket is empty: 2 MiB more takes half a second at 4 MiB/s.
  EXPECT_EQ(pacer->Reserve("ann", 2 * kMiB), absl::Milliseconds(500));
  // A reader queued behind it waits for both.
  EXPECT_EQ(pacer->Reserve("ann", kMiB), absl::Milliseconds(750));
  // Time pays the debt back: after 0.75 s the bucket is at 0.
  now_ += absl::Milliseconds(750);
  EXPECT_EQ(pacer->Reserve("ann", kMiB), absl::Milliseconds(250));
  EXPECT_DOUBLE_EQ(pacer->Delays().at("ann"), 0.5 + 0.75 + 0.25);
}

TEST_F(ReadPacerTest, EachPrincipalHasItsOwnBucket) {
  std::unique_ptr<ReadPacer> pacer = Make(kMiB, kMiB);
  EXPECT_EQ(pacer->Reserve("ann", 10 * kMiB), absl::Seconds(9));
  // Bob's small reads do not queue behind ann's gather.
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(pacer->Reserve("bob", 4096), absl::ZeroDuration());
  }
  EXPECT_EQ(pacer->Delays().count("bob"), 0u);
}

TEST_F(ReadPacerTest, TheClustersOwnMovesAndAnUnlimitedWorkerAreNeverPaced) {
  std::unique_ptr<ReadPacer> pacer = Make(kMiB, kMiB);
  EXPECT_EQ(pacer->Reserve("", 100 * kMiB), absl::ZeroDuration());
  std::unique_ptr<ReadPacer> unlimited = Make(0, 0);
  EXPECT_FALSE(unlimited->enabled());
  EXPECT_EQ(unlimited->Reserve("ann", 100 * kMiB), absl::ZeroDuration());
}

TEST_F(ReadPacerTest, AnIdleBucketRefillsOnlyToItsBurst) {
  std::unique_ptr<ReadPacer> pacer = Make(kMiB, 2 * kMiB);
  EXPECT_EQ(pacer->Reserve("ann", 2 * kMiB), absl::ZeroDuration());
  now_ += absl::Hours(1);  // idle: full again, not an hour's worth
  EXPECT_EQ(pacer->Reserve("ann", 3 * kMiB), absl::Seconds(1));
}

TEST_F(ReadPacerTest, TheDefaultBurstIsATenthOfASecondAtLeastOneMiB) {
  EXPECT_EQ(Make(100 * kMiB, 0)->burst(), 10 * kMiB);
  EXPECT_EQ(Make(kMiB, 0)->burst(), kMiB);
}

TEST_F(ReadPacerTest, ManyPrincipalsComeAndGoWithoutTheMapGrowing) {
  std::unique_ptr<ReadPacer> pacer = Make(kMiB, kMiB);
  for (int i = 0; i < 20000; ++i) {
    pacer->Reserve("p" + std::to_string(i), 4096);
    now_ += absl::Milliseconds(10);  // each is full again soon after
  }
  // Nothing to assert on the map's size directly: the idle ones were
  // forgotten, and a principal reading again starts from a full bucket.
  EXPECT_EQ(pacer->Reserve("p0", kMiB), absl::ZeroDuration());
}

}  // namespace
}  // namespace tessera
