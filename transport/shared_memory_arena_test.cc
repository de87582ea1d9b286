// SharedMemoryArena's reuse of freed blocks: a dropped reusable block's
// pages serve the next block of its size under a new name, its old name is
// gone at once, reused pages are cleared unless the caller overwrites them,
// and parked bytes stay within their bound.
#include "transport/shared_memory_arena.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

constexpr int64_t kBytes = 1 << 20;

bool Named(const std::string& name) {
  struct stat st {};
  return stat(("/dev/shm" + name).c_str(), &st) == 0;
}

class SharedMemoryArenaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (access("/dev/shm", W_OK) != 0)
      GTEST_SKIP() << "no writable /dev/shm here";
  }
  static BlockUse Reusable(bool overwritten = false) {
    BlockUse use;
    use.reusable = true;
    use.overwritten = overwritten;
    return use;
  }
};

TEST_F(SharedMemoryArenaTest, DroppedBlockServesTheNextOfItsSizeUnderANewName) {
  SharedMemoryArena arena;
  std::unique_ptr<SharedBlock> first = arena.Allocate(kBytes, 1, Reusable());
  ASSERT_NE(first, nullptr);
  std::memset(first->data(), 0x5a, kBytes);
  char* const pages = first->data();
  const std::string old_name = arena.Find(pages)->name;
  // A reader's mapping made while the block was named.
  const int fd = shm_open(old_name.c_str(), O_RDONLY, 0);
  ASSERT_GE(fd, 0);
  void* map = mmap(nullptr, kBytes, PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  ASSERT_NE(map, MAP_FAILED);

  first.reset();
  EXPECT_FALSE(Named(old_name)) << "a dropped block's name must go at once";
  EXPECT_FALSE(arena.Find(pages).has_value());
  EXPECT_EQ(arena.ParkedBytes(), kBytes);

  std::unique_ptr<SharedBlock> second = arena.Allocate(kBytes, 2, Reusable());
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(second->data(), pages) << "the parked pages were not reused";
  EXPECT_EQ(arena.ParkedBytes(), 0);
  const std::string new_name = arena.Find(pages)->name;
  EXPECT_NE(new_name, old_name);
  EXPECT_TRUE(Named(new_name));
  // Cleared for its new owner: no byte of the old block shows.
  for (int64_t i = 0; i < kBytes; i += 4096) ASSERT_EQ(second->data()[i], 0);
  // The old mapping now shows the new block: why readers check the name
  // after every copy (ShardMapping::Current).
  std::memset(second->data(), 0x11, kBytes);
  EXPECT_EQ(static_cast<const char*>(map)[100], 0x11);
  munmap(map, kBytes);
}

TEST_F(SharedMemoryArenaTest, OverwrittenBlocksAreNotClearedFirst) {
  SharedMemoryArena arena;
  std::unique_ptr<SharedBlock> first = arena.Allocate(kBytes, 1, Reusable());
  ASSERT_NE(first, nullptr);
  std::memset(first->data(), 0x5a, kBytes);
  first.reset();
  std::unique_ptr<SharedBlock> second =
      arena.Allocate(kBytes, 2, Reusable(/*overwritten=*/true));
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(second->data()[7], 0x5a);
}

TEST_F(SharedMemoryArenaTest, OtherSizesAndNonReusableBlocksGetFreshPages) {
  SharedMemoryArena arena;
  std::unique_ptr<SharedBlock> reusable = arena.Allocate(kBytes, 1, Reusable());
  std::unique_ptr<SharedBlock> private_use = arena.Allocate(kBytes, 2);
  ASSERT_NE(reusable, nullptr);
  ASSERT_NE(private_use, nullptr);
  const std::string private_name = arena.Find(private_use->data())->name;
  private_use.reset();
  EXPECT_FALSE(Named(private_name));
  EXPECT_EQ(arena.ParkedBytes(), 0) << "a non-reusable block was parked";
  char* const pages = reusable->data();
  reusable.reset();
  std::unique_ptr<SharedBlock> bigger =
      arena.Allocate(2 * kBytes, 3, Reusable());
  ASSERT_NE(bigger, nullptr);
  EXPECT_NE(bigger->data(), pages);
  EXPECT_EQ(arena.ParkedBytes(), kBytes);
}

// A freed shard's block is unlinked at once and dropped when its last
// reader lets go: only then may its pages serve another block.
TEST_F(SharedMemoryArenaTest, UnlinkedBlockIsParkedOnlyOnceDropped) {
  SharedMemoryArena arena;
  std::unique_ptr<SharedBlock> block = arena.Allocate(kBytes, 1, Reusable());
  ASSERT_NE(block, nullptr);
  const std::string name = arena.Find(block->data())->name;
  block->data()[0] = 42;
  block->Unlink();
  EXPECT_FALSE(Named(name));
  EXPECT_FALSE(arena.Find(block->data()).has_value());
  EXPECT_EQ(arena.ParkedBytes(), 0);
  std::unique_ptr<SharedBlock> other =
      arena.Allocate(kBytes, 2, Reusable(/*overwritten=*/true));
  ASSERT_NE(other, nullptr);
  EXPECT_NE(other->data(), block->data()) << "pages reused while still held";
  EXPECT_EQ(block->data()[0], 42);
  char* const pages = block->data();
  block.reset();
  EXPECT_EQ(arena.ParkedBytes(), kBytes);
  std::unique_ptr<SharedBlock> again = arena.Allocate(kBytes, 3, Reusable());
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(again->data(), pages);
}

TEST_F(SharedMemoryArenaTest, ParkedBytesStayWithinTheirBoundOldestGoFirst) {
  SharedMemoryArenaOptions options;
  options.reuse_bytes = 2 * kBytes;
  SharedMemoryArena arena(options);
  std::unique_ptr<SharedBlock> blocks[3];
  for (int i = 0; i < 3; ++i) {
    blocks[i] = arena.Allocate(kBytes, i, Reusable());
    ASSERT_NE(blocks[i], nullptr);
    blocks[i]->data()[0] = static_cast<char>(10 + i);
  }
  for (auto& block : blocks) block.reset();
  EXPECT_EQ(arena.ParkedBytes(), 2 * kBytes);
  // The newest parked block is reused first: the last dropped.
  std::unique_ptr<SharedBlock> again =
      arena.Allocate(kBytes, 9, Reusable(/*overwritten=*/true));
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(again->data()[0], 12);
  // More than the bound is never parked.
  options.reuse_bytes = kBytes / 2;
  SharedMemoryArena small(options);
  std::unique_ptr<SharedBlock> big = small.Allocate(kBytes, 1, Reusable());
  ASSERT_NE(big, nullptr);
  big.reset();
  EXPECT_EQ(small.ParkedBytes(), 0);
}

TEST_F(SharedMemoryArenaTest, IdleParkedBlocksAreReleased) {
  SharedMemoryArenaOptions options;
  options.reuse_for = absl::ZeroDuration();
  SharedMemoryArena arena(options);
  std::unique_ptr<SharedBlock> block = arena.Allocate(kBytes, 1, Reusable());
  ASSERT_NE(block, nullptr);
  block.reset();
  arena.ReleaseIdle();
  EXPECT_EQ(arena.ParkedBytes(), 0);
  // And an arena that goes releases its parked blocks and parks no more.
  auto other = std::make_unique<SharedMemoryArena>();
  std::unique_ptr<SharedBlock> late = other->Allocate(kBytes, 1, Reusable());
  std::unique_ptr<SharedBlock> early = other->Allocate(kBytes, 2, Reusable());
  ASSERT_NE(late, nullptr);
  ASSERT_NE(early, nullptr);
  const std::string late_name = other->Find(late->data())->name;
  early.reset();
  EXPECT_EQ(other->ParkedBytes(), kBytes);
  other.reset();
  late.reset();
  EXPECT_FALSE(Named(late_name));
}

// Pages someone holds mapped (a dead UCX registration) stay mapped at their
// address whatever happens to the block, and stay parked, reusable, past the
// idle time and the byte bound until the holder lets go.
TEST_F(SharedMemoryArenaTest, PagesHeldMappedAreReusedButNotReleased) {
  SharedMemoryArenaOptions options;
  options.reuse_bytes = kBytes;
  options.reuse_for = absl::ZeroDuration();
  SharedMemoryArena arena(options);
  std::unique_ptr<SharedBlock> block = arena.Allocate(kBytes, 1, Reusable());
  ASSERT_NE(block, nullptr);
  char* const data = block->data();
  std::shared_ptr<const void> held = block->KeepMapped();
  block.reset();
  arena.ReleaseIdle();
  EXPECT_EQ(arena.ParkedBytes(), kBytes) << "released while held mapped";
  // Another block pushes parked bytes past the bound: the held one stays,
  // the other goes although it is newer.
  std::unique_ptr<SharedBlock> other =
      arena.Allocate(kBytes / 2, 2, Reusable());
  ASSERT_NE(other, nullptr);
  other.reset();
  EXPECT_EQ(arena.ParkedBytes(), kBytes);
  // Reused while held.
  std::unique_ptr<SharedBlock> again = arena.Allocate(kBytes, 3, Reusable());
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(again->data(), data);
  again->data()[7] = 42;
  again.reset();
  // Released for room: unlinked, but still mapped for the holder.
  arena.ReleaseIdle(/*everything=*/true);
  EXPECT_EQ(arena.ParkedBytes(), 0);
  EXPECT_EQ(static_cast<const volatile char*>(data)[7], 42);
  held.reset();  // now unmapped
  arena.ReleaseIdle();
  EXPECT_EQ(arena.ParkedBytes(), 0);
}

// Warm blocks (populated ahead of need by the arena's own thread).
bool WaitForWarmBytes(const SharedMemoryArena& arena, int64_t bytes) {
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (arena.Counts().warm_bytes != bytes) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

// The warm segments of this process in /dev/shm.
int WarmSegments() {
  int count = 0;
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return -1;
  const std::string mine = absl::StrCat("-", getpid(), "-warm-");
  while (dirent* entry = readdir(dir))
    if (std::string(entry->d_name).find(mine) != std::string::npos) ++count;
  closedir(dir);
  return count;
}

// Bytes of memory the warm segments of this process hold now (a segment is
// made before its pages).
int64_t WarmSegmentBytes() {
  int64_t bytes = 0;
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return -1;
  const std::string mine = absl::StrCat("-", getpid(), "-warm-");
  while (dirent* entry = readdir(dir)) {
    struct stat st {};
    if (std::string(entry->d_name).find(mine) != std::string::npos &&
        stat(absl::StrCat("/dev/shm/", entry->d_name).c_str(), &st) == 0) {
      bytes += static_cast<int64_t>(st.st_blocks) * 512;
    }
  }
  closedir(dir);
  return bytes;
}

TEST_F(SharedMemoryArenaTest,
       ARecentSizeIsKeptWarmAndServesTheNextBlockZeroed) {
  SharedMemoryArenaOptions options;
  options.warm_bytes = 4 * kBytes;
  SharedMemoryArena arena(options);
  std::unique_ptr<SharedBlock> first = arena.Allocate(kBytes, 1);
  ASSERT_NE(first, nullptr);
  std::memset(first->data(), 0x5a, kBytes);
  EXPECT_EQ(arena.Counts().fresh, 1);
  ASSERT_TRUE(WaitForWarmBytes(arena, kBytes)) << "no block of the size made";
  EXPECT_EQ(WarmSegments(), 1);

  std::unique_ptr<SharedBlock> second = arena.Allocate(kBytes, 2, Reusable());
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(arena.Counts().warm, 1);
  EXPECT_EQ(arena.Counts().fresh, 1);
  for (int64_t i = 0; i < kBytes; i += 512) ASSERT_EQ(second->data()[i], 0);
  // Under its own new name, readable by others like any block.
  const std::optional<SegmentInfo> segment = arena.Find(second->data());
  ASSERT_TRUE(segment.has_value());
  EXPECT_TRUE(Named(segment->name));
  EXPECT_EQ(segment->name.find("-warm-"), std::string::npos);
  // Another size finds none warm; it gets fresh pages.
  std::unique_ptr<SharedBlock> other = arena.Allocate(2 * kBytes, 3);
  ASSERT_NE(other, nullptr);
  EXPECT_EQ(arena.Counts().fresh, 2);
}

// Pages made ahead would take the cores a transfer's copies run on.
TEST_F(SharedMemoryArenaTest, NoWarmBlockIsMadeWhileBytesMove) {
  SharedMemoryArenaOptions options;
  options.warm_bytes = 4 * kBytes;
  SharedMemoryArena arena(options);
  std::shared_ptr<void> moving = arena.Moving();
  std::shared_ptr<void> another = arena.Moving();
  std::unique_ptr<SharedBlock> first = arena.Allocate(kBytes, 1);
  ASSERT_NE(first, nullptr);
  // Well past the second of quiet after the allocation.
  absl::SleepFor(absl::Seconds(2));
  EXPECT_EQ(arena.Counts().warm_bytes, 0);
  EXPECT_EQ(WarmSegmentBytes(), 0);
  moving.reset();  // one move ends; the other goes on
  absl::SleepFor(absl::Milliseconds(1500));
  EXPECT_EQ(arena.Counts().warm_bytes, 0);
  EXPECT_EQ(WarmSegmentBytes(), 0);
  // The last move ends: the block is made a second after.
  const absl::Time ended = absl::Now();
  another.reset();
  ASSERT_TRUE(WaitForWarmBytes(arena, kBytes)) << "no block of the size made";
  EXPECT_GE(absl::Now() - ended, absl::Milliseconds(900));
  EXPECT_EQ(WarmSegmentBytes(), kBytes);
}

TEST_F(SharedMemoryArenaTest, WarmBytesStayWithinTheirBound) {
  SharedMemoryArenaOptions options;
  options.warm_bytes = 2 * kBytes;
  SharedMemoryArena arena(options);
  std::vector<std::unique_ptr<SharedBlock>> held;
  for (int i = 0; i < 3; ++i) held.push_back(arena.Allocate(kBytes, i));
  // Too small to be worth it: never kept warm.
  held.push_back(arena.Allocate(kBytes / 2, 9));
  // Bigger than the bound: never kept warm.
  held.push_back(arena.Allocate(4 * kBytes, 10));
  ASSERT_TRUE(WaitForWarmBytes(arena, 2 * kBytes));
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_EQ(arena.Counts().warm_bytes, 2 * kBytes);
  EXPECT_EQ(WarmSegments(), 2);
}

TEST_F(SharedMemoryArenaTest, ANewerSizeDisplacesOlderWarmBlocks) {
  SharedMemoryArenaOptions options;
  options.warm_bytes = 2 * kBytes;
  SharedMemoryArena arena(options);
  std::vector<std::unique_ptr<SharedBlock>> held;
  for (int i = 0; i < 2; ++i) held.push_back(arena.Allocate(kBytes, i));
  ASSERT_TRUE(WaitForWarmBytes(arena, 2 * kBytes));
  held.push_back(arena.Allocate(2 * kBytes, 5));
  EXPECT_EQ(arena.Counts().fresh, 3);
  // The newest size wins the bound: the two 1 MiB blocks make way.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (WarmSegments() != 1 && absl::Now() < deadline)
    absl::SleepFor(absl::Milliseconds(5));
  ASSERT_TRUE(WaitForWarmBytes(arena, 2 * kBytes));
  held.push_back(arena.Allocate(2 * kBytes, 6));
  EXPECT_EQ(arena.Counts().warm, 1);
}

TEST_F(SharedMemoryArenaTest,
       NoWarmBlocksByDefaultAndNoneLeftWhenTheArenaGoes) {
  {
    SharedMemoryArena arena;
    ASSERT_NE(arena.Allocate(kBytes, 1), nullptr);
    absl::SleepFor(absl::Milliseconds(100));
    EXPECT_EQ(arena.Counts().warm_bytes, 0);
    EXPECT_EQ(WarmSegments(), 0);
  }
  {
    SharedMemoryArenaOptions options;
    options.warm_bytes = 64 * kBytes;
    SharedMemoryArena arena(options);
    ASSERT_NE(arena.Allocate(kBytes, 1), nullptr);
    ASSERT_NE(arena.Allocate(32 * kBytes, 2), nullptr);
    ASSERT_TRUE(WaitForWarmBytes(arena, kBytes + 32 * kBytes));
  }
  EXPECT_EQ(WarmSegments(), 0) << "warm segments outlived their arena";
}

}  // namespace
}  // namespace tessera
