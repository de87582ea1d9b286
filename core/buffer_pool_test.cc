#include "core/buffer_pool.h"

#include <cstring>
#include <memory>
#include <utility>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

TEST(BufferPoolTest, GivenBackBuffersServeTheNextTakeOfTheirSize) {
  BufferPool pool(64 << 20, absl::Minutes(1));
  char* first = nullptr;
  {
    BufferPool::Lease lease = pool.Take(4 << 20);
    ASSERT_NE(lease.data(), nullptr);
    EXPECT_EQ(lease.size(), size_t{4} << 20);
    std::memset(lease.data(), 7, lease.size());  // all of it is ours
    first = lease.data();
    EXPECT_EQ(pool.idle_bytes(), 0);
  }
  EXPECT_EQ(pool.idle_bytes(), 4 << 20);
  {
    // Smaller, but not below half: the same buffer.
    BufferPool::Lease again = pool.Take(3 << 20);
    EXPECT_EQ(again.data(), first);
    EXPECT_EQ(again.size(), size_t{4} << 20);
    EXPECT_EQ(pool.idle_bytes(), 0);
    // Taken while the other is lent: a new one.
    BufferPool::Lease other = pool.Take(3 << 20);
    EXPECT_NE(other.data(), first);
  }
  EXPECT_EQ(pool.idle_bytes(), (4 << 20) + (3 << 20));
  // Far smaller, or larger than any: new buffers, the idle ones untouched.
  BufferPool::Lease small = pool.Take(1 << 20);
  EXPECT_EQ(small.size(), size_t{1} << 20);
  BufferPool::Lease large = pool.Take(9 << 20);
  EXPECT_EQ(large.size(), size_t{9} << 20);
  EXPECT_EQ(pool.idle_bytes(), (4 << 20) + (3 << 20));
}

TEST(BufferPoolTest, IdleBuffersAreBoundedByBytesAndByAge) {
  BufferPool pool(2 << 20, absl::Milliseconds(50));
  {
    BufferPool::Lease a = pool.Take(1 << 20);
    BufferPool::Lease b = pool.Take(1 << 20);
    BufferPool::Lease c = pool.Take(1 << 20);
  }
  EXPECT_EQ(pool.idle_bytes(), 2 << 20) << "kept past max_idle_bytes";
  // One larger than the bound is not kept at all.
  { BufferPool::Lease huge = pool.Take(3 << 20); }
  EXPECT_LE(pool.idle_bytes(), 2 << 20);
  absl::SleepFor(absl::Milliseconds(120));
  BufferPool::Lease fresh = pool.Take(512);
  EXPECT_EQ(pool.idle_bytes(), 0) << "idle buffers outlived max_idle";
}

TEST(BufferPoolTest, LeasesMoveAndOutliveThePool) {
  auto pool = std::make_unique<BufferPool>(1 << 20, absl::Minutes(1));
  BufferPool::Lease lease = pool->Take(1000);
  char* data = lease.data();
  BufferPool::Lease moved = std::move(lease);
  EXPECT_EQ(moved.data(), data);
  EXPECT_EQ(lease.data(), nullptr);  // NOLINT: checking the moved-from state
  lease = pool->Take(1000);
  EXPECT_NE(lease.data(), nullptr);
  pool.reset();
  // Given back to a pool that is gone: freed, no fault.
  moved = BufferPool::Lease();
  lease = BufferPool::Lease();
  EXPECT_EQ(moved.data(), nullptr);
}

}  // namespace
}  // namespace tessera
