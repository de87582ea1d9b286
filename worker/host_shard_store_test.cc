#include "worker/host_shard_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "transport/shared_memory_arena.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;
using ::testing::HasSubstr;

ShardDesc Desc(Shape tensor_shape, Box box, DType dtype = DType::kFloat32) {
  ShardDesc desc;
  desc.tensor = "t";
  desc.dtype = dtype;
  desc.tensor_shape = std::move(tensor_shape);
  desc.box = std::move(box);
  return desc;
}

// Options of a store keeping its shards in files under `dir`
// (--store_dir); failing to open the directory fails the test.
HostShardStoreOptions OnDir(const std::string& dir) {
  HostShardStoreOptions options;
  absl::StatusOr<std::shared_ptr<ShardFiles>> files = ShardFiles::Open(dir);
  EXPECT_TRUE(files.ok()) << files.status();
  if (files.ok()) options.files = *std::move(files);
  return options;
}

TEST(HostShardStoreTest, AllocateCountsBytesAndFreeReturnsThem) {
  HostShardStore store;
  ASSERT_THAT(store.Allocate(1, Desc({4, 4}, {{0, 0}, {2, 4}}), InitSpec{}),
              IsOk());
  ASSERT_THAT(store.Allocate(2, Desc({4, 4}, {{2, 0}, {2, 4}}), InitSpec{}),
              IsOk());
  EXPECT_EQ(store.BytesUsed(), 64);
  EXPECT_THAT(store.Free(1), IsOk());
  EXPECT_EQ(store.BytesUsed(), 32);
  EXPECT_THAT(store.Free(1), IsOk());  // idempotent
  EXPECT_EQ(store.BytesUsed(), 32);
}

TEST(HostShardStoreTest, DuplicateIdIsRejected) {
  HostShardStore store;
  ASSERT_THAT(store.Allocate(1, Desc({4}, {{0}, {4}}), InitSpec{}), IsOk());
  EXPECT_THAT(store.Allocate(1, Desc({4}, {{0}, {4}}), InitSpec{}),
              StatusIs(absl::StatusCode::kAlreadyExists));
  EXPECT_EQ(store.BytesUsed(), 16);
}

TEST(HostShardStoreTest, CapacityIsEnforcedBeforeAllocating) {
  HostShardStoreOptions options;
  options.capacity_bytes = 100;
  options.shard_charge_bytes = 0;  // element bytes only
  HostShardStore store(options);
  ASSERT_THAT(store.Allocate(1, Desc({20}, {{0}, {20}}), InitSpec{}), IsOk());
  EXPECT_THAT(store.Allocate(2, Desc({20}, {{0}, {20}}), InitSpec{}),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("does not fit")));
  EXPECT_EQ(store.BytesUsed(), 80);
}

TEST(HostShardStoreTest, EmptyShardsAreChargedTheirBookkeeping) {
  // 5000 empty shards on a 1 MiB worker: each costs kShardChargeBytes, so
  // the worker fills up instead of holding any number of them for free.
  HostShardStore store(/*capacity_bytes=*/1 << 20);
  const ShardDesc empty = Desc({4, 4}, {{4, 0}, {0, 4}});
  int held = 0;
  absl::Status status;
  for (uint64_t id = 1; id <= 5000 && status.ok(); ++id) {
    status = store.Allocate(id, empty, InitSpec{});
    if (status.ok()) ++held;
  }
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kResourceExhausted,
                               HasSubstr("does not fit")));
  EXPECT_EQ(held, (1 << 20) / kShardChargeBytes);
  EXPECT_EQ(store.BytesUsed(), 0);  // element bytes
  EXPECT_EQ(store.ChargedBytes(), held * kShardChargeBytes);
  // A large shard is charged its bytes, not more.
  HostShardStore other(/*capacity_bytes=*/4096);
  EXPECT_THAT(other.Allocate(1, Desc({1024}, {{0}, {1024}}), InitSpec{}),
              IsOk());
  EXPECT_EQ(other.ChargedBytes(), 4096);
  for (uint64_t id : store.ShardIds()) ASSERT_THAT(store.Free(id), IsOk());
  EXPECT_EQ(store.ChargedBytes(), 0);
}

TEST(HostShardStoreTest, FreedShardStaysChargedWhileAReaderPinsIt) {
  HostShardStore store(/*capacity_bytes=*/1 << 20);
  const ShardDesc big = Desc({160 << 10}, {{0}, {160 << 10}});  // 640 KiB
  ASSERT_THAT(store.Allocate(1, big, InitSpec{}), IsOk());
  absl::StatusOr<PinnedShard> pinned = store.Pin(1);
  ASSERT_THAT(pinned.status(), IsOk());
  ASSERT_THAT(store.Free(1), IsOk());
  // Freed, but its memory is still held for the reader: it still counts.
  EXPECT_EQ(store.BytesUsed(), 0);
  EXPECT_EQ(store.PinnedBytes(), 640 << 10);
  EXPECT_EQ(store.ChargedBytes(), 640 << 10);
  EXPECT_THAT(store.Allocate(2, big, InitSpec{}),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("pinned by readers")));
  // Private memory: keep_mapped holds the whole shard too.
  pinned->keep_alive.reset();
  EXPECT_EQ(store.PinnedBytes(), 640 << 10);
  pinned->keep_mapped.reset();  // the reader lets go
  EXPECT_EQ(store.PinnedBytes(), 0);
  EXPECT_EQ(store.ChargedBytes(), 0);
  EXPECT_THAT(store.Allocate(2, big, InitSpec{}), IsOk());
}

TEST(HostShardStoreTest, InitMadeForAnotherDTypeIsRefused) {
  HostShardStore store;
  absl::StatusOr<InitFill> fill =
      InitFill::Make(InitSpec{InitSpec::Kind::kOnes}, DType::kInt8);
  ASSERT_THAT(fill.status(), IsOk());
  EXPECT_THAT(store.Allocate(1, Desc({4}, {{0}, {4}}), *fill),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("int8")));
  EXPECT_EQ(store.ChargedBytes(), 0);
}

TEST(HostShardStoreTest, InitFillUsesGlobalIndices) {
  HostShardStore store;
  InitSpec arange;
  arange.kind = InitSpec::Kind::kArange;
  ASSERT_THAT(
      store.Allocate(7, Desc({4, 3}, {{2, 0}, {2, 3}}, DType::kInt32), arange),
      IsOk());
  std::vector<int32_t> out(6);
  ASSERT_THAT(store.ReadBox(7, Box{{0, 0}, {2, 3}}, 0, 6,
                            reinterpret_cast<char*>(out.data())),
              IsOk());
  EXPECT_THAT(out, ::testing::ElementsAre(6, 7, 8, 9, 10, 11));
}

TEST(HostShardStoreTest, WriteThenReadSubBoxInChunks) {
  HostShardStore store;
  ASSERT_THAT(store.Allocate(3, Desc({3, 4}, {{0, 0}, {3, 4}}, DType::kInt32),
                             InitSpec{}),
              IsOk());
  std::vector<int32_t> values(12);
  for (int i = 0; i < 12; ++i) values[i] = i;
  ASSERT_THAT(
      store.Write(
          3, 0, absl::string_view(reinterpret_cast<char*>(values.data()), 20)),
      IsOk());
  ASSERT_THAT(store.Write(3, 20,
                          absl::string_view(
                              reinterpret_cast<char*>(values.data()) + 20, 28)),
              IsOk());
  // Sub-box rows 1..2, cols 1..2, read in two uneven chunks.
  Box box{{1, 1}, {2, 2}};
  std::vector<int32_t> out(4);
  ASSERT_THAT(store.ReadBox(3, box, 0, 3, reinterpret_cast<char*>(out.data())),
              IsOk());
  ASSERT_THAT(
      store.ReadBox(3, box, 3, 1, reinterpret_cast<char*>(out.data() + 3)),
      IsOk());
  EXPECT_THAT(out, ::testing::ElementsAre(5, 6, 9, 10));
}

TEST(HostShardStoreTest, OutOfRangeAccessIsAnErrorNotACrash) {
  HostShardStore store;
  ASSERT_THAT(store.Allocate(1, Desc({4}, {{0}, {4}}), InitSpec{}), IsOk());
  char buf[64];
  EXPECT_THAT(
      store.Write(1, 12, absl::string_view(buf, 8)),
      StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("out of bounds")));
  EXPECT_THAT(store.Write(1, -1, absl::string_view(buf, 1)),
              StatusIs(absl::StatusCode::kOutOfRange));
  EXPECT_THAT(
      store.ReadBox(1, Box{{2}, {3}}, 0, 3, buf),
      StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("out of bounds")));
  EXPECT_THAT(store.ReadBox(1, Box{{0}, {4}}, 2, 3, buf),
              StatusIs(absl::StatusCode::kOutOfRange));
  EXPECT_THAT(store.ReadBox(1, Box{{0, 0}, {1, 1}}, 0, 1, buf),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dims")));
  EXPECT_THAT(store.ReadBox(99, Box{{0}, {1}}, 0, 1, buf),
              StatusIs(absl::StatusCode::kNotFound));
}

// Every shard in shared memory: a fresh arena and no size threshold.
// Skipped where /dev/shm is not writable.
class SharedMemoryStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (access("/dev/shm", W_OK) != 0) {
      GTEST_SKIP() << "no writable /dev/shm here";
    }
    options_.arena = std::make_shared<SharedMemoryArena>();
    options_.shared_memory_min_bytes = 0;
  }

  HostShardStoreOptions options_;
};

TEST_F(SharedMemoryStoreTest, LargeShardLivesInSharedMemoryUntilFreed) {
  HostShardStore store(options_);
  ASSERT_THAT(store.Allocate(7, Desc({4, 4}, {{0, 0}, {4, 4}}, DType::kInt32),
                             InitSpec{InitSpec::Kind::kArange}),
              IsOk());
  absl::StatusOr<PinnedShard> pinned = store.Pin(7);
  ASSERT_THAT(pinned.status(), IsOk());
  std::optional<SegmentInfo> segment = options_.arena->Find(pinned->data);
  ASSERT_TRUE(segment.has_value());
  EXPECT_EQ(segment->bytes, 64);
  EXPECT_EQ(pinned->bytes, 64);
  // Another mapping of the segment sees the shard's bytes.
  const int fd = shm_open(segment->name.c_str(), O_RDONLY, 0);
  ASSERT_GE(fd, 0);
  void* map = mmap(nullptr, 64, PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  ASSERT_NE(map, MAP_FAILED);
  EXPECT_EQ(static_cast<const int32_t*>(map)[5], 5);
  // Freed: the name is gone at once (the arena no longer names it either),
  // the existing mapping keeps the old bytes.
  ASSERT_THAT(store.Free(7), IsOk());
  EXPECT_FALSE(options_.arena->Find(pinned->data).has_value());
  EXPECT_LT(shm_open(segment->name.c_str(), O_RDONLY, 0), 0);
  EXPECT_EQ(errno, ENOENT);
  EXPECT_EQ(static_cast<const int32_t*>(map)[5], 5);
  EXPECT_THAT(store.Pin(7).status(), StatusIs(absl::StatusCode::kNotFound));
  munmap(map, 64);
}

// A freed shard's pages serve the next shard of its size once no reader
// holds them; an empty shard still reads as zeros. A put's shards, which
// clients write through their own mappings, are never reused.
TEST_F(SharedMemoryStoreTest,
       FreedShardMemoryServesTheNextShardClearedUnlessAPut) {
  HostShardStore store(options_);
  const ShardDesc desc = Desc({64, 64}, {{0, 0}, {64, 64}}, DType::kInt32);
  ASSERT_THAT(store.Allocate(1, desc, InitSpec{InitSpec::Kind::kArange}),
              IsOk());
  const char* first = store.Pin(1)->data;
  ASSERT_THAT(store.Free(1), IsOk());
  ASSERT_THAT(store.Allocate(2, desc, InitSpec{}), IsOk());
  absl::StatusOr<PinnedShard> second = store.Pin(2);
  ASSERT_THAT(second.status(), IsOk());
  EXPECT_EQ(second->data, first) << "the freed shard's pages were not reused";
  for (int i = 0; i < 64 * 64; ++i) {
    ASSERT_EQ(reinterpret_cast<const int32_t*>(second->data)[i], 0) << i;
  }
  second = absl::UnknownError("dropped");

  ShardDesc put = desc;
  put.writable = true;
  ASSERT_THAT(store.Allocate(3, put, InitSpec{}), IsOk());
  const char* put_pages = store.Pin(3)->data;
  ASSERT_THAT(store.Free(3), IsOk());
  ASSERT_THAT(store.Free(2), IsOk());
  EXPECT_EQ(options_.arena->ParkedBytes(), desc.ByteSize())
      << "only the non-put shard is parked";
  ASSERT_THAT(store.Allocate(4, desc, InitSpec{}), IsOk());
  EXPECT_NE(store.Pin(4)->data, put_pages);
}

// A UCX registration of a freed shard keeps only its pages mapped
// (keep_mapped): the shard is not charged as pinned, its pages serve the
// next shard of its size, and they stay mapped at the same address for as
// long as the registration holds them, released or not. A put's shard is
// held whole.
TEST_F(SharedMemoryStoreTest, PagesHeldMappedStillServeTheNextShard) {
  HostShardStore store(options_);
  const ShardDesc desc = Desc({64, 64}, {{0, 0}, {64, 64}}, DType::kInt32);
  ASSERT_THAT(store.Allocate(1, desc, InitSpec{InitSpec::Kind::kArange}),
              IsOk());
  absl::StatusOr<PinnedShard> held = store.Pin(1);
  ASSERT_THAT(held.status(), IsOk());
  std::shared_ptr<const void> mapped = held->keep_mapped;
  ASSERT_NE(mapped, nullptr);
  const char* first = held->data;
  held = absl::UnknownError("the registration turned dead");
  ASSERT_THAT(store.Free(1), IsOk());
  EXPECT_EQ(store.PinnedBytes(), 0);
  EXPECT_EQ(options_.arena->ParkedBytes(), desc.ByteSize());
  ASSERT_THAT(store.Allocate(2, desc, InitSpec{}), IsOk());
  EXPECT_EQ(store.Pin(2)->data, first);
  ASSERT_THAT(store.Free(2), IsOk());
  // Released (everything), the pages stay mapped for their holder.
  options_.arena->ReleaseIdle(/*everything=*/true);
  EXPECT_EQ(options_.arena->ParkedBytes(), 0);
  EXPECT_EQ(reinterpret_cast<const volatile int32_t*>(first)[5], 0);
  mapped.reset();

  ShardDesc put = desc;
  put.writable = true;
  ASSERT_THAT(store.Allocate(3, put, InitSpec{}), IsOk());
  held = store.Pin(3);
  ASSERT_THAT(held.status(), IsOk());
  held->keep_alive.reset();
  ASSERT_THAT(store.Free(3), IsOk());
  EXPECT_EQ(store.PinnedBytes(), desc.ByteSize()) << "a put's shard is whole";
}

TEST(HostShardStoreTest, SmallShardsStayInPrivateMemory) {
  HostShardStoreOptions options;
  options.arena = std::make_shared<SharedMemoryArena>();
  HostShardStore store(options);
  ASSERT_THAT(store.Allocate(1, Desc({4}, {{0}, {4}}), InitSpec{}), IsOk());
  absl::StatusOr<PinnedShard> pinned = store.Pin(1);
  ASSERT_THAT(pinned.status(), IsOk());
  EXPECT_FALSE(options.arena->Find(pinned->data).has_value());
}

TEST(HostShardStoreTest, WithoutAnArenaLargeShardsArePrivate) {
  HostShardStoreOptions options;
  options.shared_memory_min_bytes = 0;
  HostShardStore store(options);
  ASSERT_THAT(store.Allocate(1, Desc({4}, {{0}, {4}}), InitSpec{}), IsOk());
  absl::StatusOr<PinnedShard> pinned = store.Pin(1);
  ASSERT_THAT(pinned.status(), IsOk());
  EXPECT_EQ(pinned->bytes, 16);
}

// --store_dir: a store on a directory another one left re-attaches what was
// persisted (same bytes, same description), drops what was not persisted
// or was freed, and moves aside (never deletes) a shard whose bytes changed
// on disk.
TEST(HostShardStoreTest, FilesSurviveTheStoreAndAreCheckedWhenTakenBack) {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/store";
  {
    HostShardStore store(OnDir(dir));
    // One store per directory.
    EXPECT_THAT(ShardFiles::Open(dir).status(),
                StatusIs(absl::StatusCode::kFailedPrecondition));
    ShardDesc desc = Desc({4, 4}, {{0, 0}, {2, 4}});
    desc.version = 3;
    desc.incarnation = 9;
    for (uint64_t id : {1, 2, 3, 4}) {
      ASSERT_THAT(store.Allocate(id, desc, InitSpec{}), IsOk());
      std::vector<float> values(8, static_cast<float>(id));
      ASSERT_THAT(
          store.Write(id, 0,
                      absl::string_view(
                          reinterpret_cast<const char*>(values.data()), 32)),
          IsOk());
    }
    ASSERT_THAT(store.Persist(1, "c1"), IsOk());
    ASSERT_THAT(store.Persist(2, "c1"), IsOk());
    ASSERT_THAT(store.Persist(3, "c2"), IsOk());
    ASSERT_THAT(store.Free(2), IsOk());  // persisted, then freed
    // 4 never persisted (a put not committed).
    // The process ends here without freeing anything.
  }
  // Shard 3's bytes change on disk.
  {
    const int fd =
        open((dir + "/shards/0000000000000003.data").c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(pwrite(fd, "x", 1, 5), 1);
    close(fd);
  }
  HostShardStore store(OnDir(dir));
  absl::flat_hash_map<uint64_t, std::string> owners;
  const ShardFiles::ScanResult scan = store.Reattach(&owners);
  EXPECT_EQ(scan.intact.size(), 1u);
  EXPECT_EQ(scan.intact_bytes, 32);
  EXPECT_EQ(scan.damaged, 1);
  EXPECT_EQ(scan.unsealed, 1);
  ASSERT_EQ(scan.problems.size(), 1u);
  EXPECT_THAT(scan.problems[0], HasSubstr("checksum"));
  EXPECT_EQ(owners, (absl::flat_hash_map<uint64_t, std::string>{{1, "c1"}}));
  EXPECT_EQ(store.ShardIds(), std::vector<uint64_t>{1});
  EXPECT_EQ(store.BytesUsed(), 32);
  absl::StatusOr<ShardDesc> desc = store.Describe(1);
  ASSERT_TRUE(desc.ok());
  EXPECT_EQ(desc->tensor, "t");
  EXPECT_EQ(desc->version, 3u);
  EXPECT_EQ(desc->incarnation, 9u);
  EXPECT_EQ(desc->box, Box({0, 0}, {2, 4}));
  std::vector<float> back(8);
  ASSERT_THAT(store.ReadBox(1, Box({0, 0}, {2, 4}), 0, 8,
                            reinterpret_cast<char*>(back.data())),
              IsOk());
  EXPECT_EQ(back, std::vector<float>(8, 1.0f));
  // Only shard 1's files are left.
  EXPECT_EQ(access((dir + "/shards/0000000000000003.data").c_str(), F_OK), -1);
  EXPECT_EQ(access((dir + "/shards/0000000000000004.data").c_str(), F_OK), -1);
  // Shard 3's bytes and record are kept aside, for an operator.
  EXPECT_THAT(scan.problems[0], HasSubstr(dir + "/damaged"));
  std::vector<std::string> aside;
  if (DIR* d = opendir((dir + "/damaged").c_str())) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] != '.') aside.push_back(e->d_name);
    }
    closedir(d);
  }
  std::sort(aside.begin(), aside.end());
  ASSERT_EQ(aside.size(), 2u);
  EXPECT_THAT(aside[0], ::testing::StartsWith("0000000000000003.data."));
  EXPECT_THAT(aside[1], ::testing::StartsWith("0000000000000003.record."));
  ASSERT_THAT(store.Free(1), IsOk());
  EXPECT_EQ(access((dir + "/shards/0000000000000001.record").c_str(), F_OK),
            -1);
}

// A shard file that is a symlink (to a file anywhere) is not re-attached:
// the store maps only regular files of its own directory.
TEST(HostShardStoreTest, ASymlinkedShardFileIsNotTakenBack) {
  const std::string dir =
      std::string(std::getenv("TEST_TMPDIR")) + "/store-symlink";
  {
    HostShardStore store(OnDir(dir));
    ASSERT_THAT(store.Allocate(7, Desc({4, 4}, {{0, 0}, {2, 4}}), InitSpec{}),
                IsOk());
    ASSERT_THAT(store.Persist(7, "c1"), IsOk());
  }
  // The bytes moved elsewhere and the shard's name made a symlink to them.
  const std::string data = dir + "/shards/0000000000000007.data";
  const std::string elsewhere =
      std::string(std::getenv("TEST_TMPDIR")) + "/elsewhere.data";
  ASSERT_EQ(rename(data.c_str(), elsewhere.c_str()), 0);
  ASSERT_EQ(symlink(elsewhere.c_str(), data.c_str()), 0);
  HostShardStore store(OnDir(dir));
  absl::flat_hash_map<uint64_t, std::string> owners;
  const ShardFiles::ScanResult scan = store.Reattach(&owners);
  EXPECT_TRUE(scan.intact.empty());
  EXPECT_EQ(scan.damaged, 1);
  EXPECT_TRUE(store.ShardIds().empty());
  // The file it pointed at is untouched.
  EXPECT_EQ(access(elsewhere.c_str(), F_OK), 0);
}

}  // namespace
}  // namespace tessera
