// StagingPool with real shared memory (a host store: nothing to page-lock).
#include "worker/staging_pool.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <memory>
#include <string>

#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/host_shard_store.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;

constexpr int64_t kMiB = int64_t{1} << 20;

bool SegmentExists(const std::string& name) {
  const int fd = shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0) return false;
  close(fd);
  return true;
}

class StagingPoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (access("/dev/shm", W_OK) != 0) GTEST_SKIP() << "no writable /dev/shm";
    arena_ = std::make_shared<SharedMemoryArena>();
  }
  std::shared_ptr<SharedMemoryArena> arena_;
  HostShardStore store_;
};

TEST_F(StagingPoolTest, BlocksAreLentAgainRatherThanMadeAgain) {
  StagingPool pool(arena_, &store_, 64 * kMiB, 16 * kMiB);
  std::string first_name;
  {
    absl::StatusOr<StagingPool::Lease> lease = pool.Acquire(3 * kMiB);
    ASSERT_THAT(lease.status(), IsOk());
    EXPECT_EQ((*lease)->shared->bytes(), 4 * kMiB);  // whole 2 MiB steps
    EXPECT_EQ((*lease)->segment.bytes, 4 * kMiB);
    first_name = (*lease)->segment.name;
    EXPECT_TRUE(SegmentExists(first_name));
  }
  // Given back, the same segment serves the next read of a similar size...
  absl::StatusOr<StagingPool::Lease> again = pool.Acquire(4 * kMiB);
  ASSERT_THAT(again.status(), IsOk());
  EXPECT_EQ((*again)->segment.name, first_name);
  // ... but not one of less than half its size.
  absl::StatusOr<StagingPool::Lease> small = pool.Acquire(kMiB);
  ASSERT_THAT(small.status(), IsOk());
  EXPECT_NE((*small)->segment.name, first_name);
  EXPECT_EQ((*small)->shared->bytes(), 2 * kMiB);
  EXPECT_EQ(pool.total_bytes(), 6 * kMiB);
}

TEST_F(StagingPoolTest, NoMoreThanMaxBytesExistAtOnce) {
  StagingPool pool(arena_, &store_, 10 * kMiB, 10 * kMiB);
  absl::StatusOr<StagingPool::Lease> a = pool.Acquire(4 * kMiB);
  absl::StatusOr<StagingPool::Lease> b = pool.Acquire(4 * kMiB);
  ASSERT_THAT(a.status(), IsOk());
  ASSERT_THAT(b.status(), IsOk());
  EXPECT_THAT(pool.Acquire(4 * kMiB).status(),
              StatusIs(absl::StatusCode::kResourceExhausted));
  const std::string idle = (*a)->segment.name;
  a->reset();
  // An idle block too small for the read is dropped to make room.
  absl::StatusOr<StagingPool::Lease> c = pool.Acquire(6 * kMiB);
  ASSERT_THAT(c.status(), IsOk());
  EXPECT_FALSE(SegmentExists(idle));
  EXPECT_EQ(pool.total_bytes(), 10 * kMiB);
  EXPECT_THAT(pool.Acquire(0).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(StagingPoolTest, IdleBlocksPastTheirBudgetAreUnlinked) {
  StagingPool pool(arena_, &store_, 64 * kMiB, 4 * kMiB);
  absl::StatusOr<StagingPool::Lease> a = pool.Acquire(4 * kMiB);
  absl::StatusOr<StagingPool::Lease> b = pool.Acquire(4 * kMiB);
  ASSERT_THAT(a.status(), IsOk());
  ASSERT_THAT(b.status(), IsOk());
  const std::string kept = (*a)->segment.name;
  const std::string dropped = (*b)->segment.name;
  a->reset();  // idle: within the 4 MiB kept idle
  b->reset();  // past it: gone
  EXPECT_TRUE(SegmentExists(kept));
  EXPECT_FALSE(SegmentExists(dropped));
  EXPECT_EQ(pool.total_bytes(), 4 * kMiB);
}

TEST_F(StagingPoolTest, ALeaseMayOutliveItsPool) {
  auto pool =
      std::make_unique<StagingPool>(arena_, &store_, 8 * kMiB, 8 * kMiB);
  absl::StatusOr<StagingPool::Lease> lease = pool->Acquire(kMiB);
  ASSERT_THAT(lease.status(), IsOk());
  pool.reset();
  (*lease)->shared->data()[0] = 1;  // still mapped
  lease->reset();
}

}  // namespace
}  // namespace tessera
