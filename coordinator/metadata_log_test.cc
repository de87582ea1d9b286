#include "coordinator/metadata_log.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "coordinator/coordinator_testutil.h"
#include "coordinator/file_metadata_store.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::tessera::testing::ControlledStore;
using ::tessera::testing::StatusIs;
using ::tessera::testing::TempDir;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

MetadataChange TensorChange(const std::string& name, uint64_t version = 1) {
  auto tensor = std::make_shared<TensorMetadata>();
  tensor->name = name;
  tensor->shape = {4};
  tensor->version = version;
  ShardInfo shard;
  shard.box = Box{{0}, {4}};
  Replica& replica = shard.replicas.emplace_back();
  replica.worker = "w0";
  replica.shard_id = version;
  tensor->shards.push_back(shard);
  return MetadataChange::Tensor(std::move(tensor));
}

std::vector<std::string> Names(const MetadataState& state) {
  std::vector<std::string> out;
  for (const auto& [name, tensor] : state.tensors) out.push_back(name);
  return out;
}

TEST(MetadataLogTest, ConcurrentAppendsAreAllDurable) {
  ControlledStore store(std::make_unique<MemoryMetadataStore>());
  MetadataLog log(&store, MetadataLog::Options());
  constexpr int kThreads = 16;
  constexpr int kEach = 40;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        if (!log.Append(TensorChange(absl::StrCat("t", t, "_", i))).ok())
          ++failures;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(log.DurableState().tensors.size(), size_t{kThreads * kEach});
  auto stored = store.Load();
  ASSERT_OK(stored);
  EXPECT_EQ(stored->tensors.size(), size_t{kThreads * kEach});
  EXPECT_EQ(log.stats().records, kThreads * kEach);
  EXPECT_EQ(store.records(), kThreads * kEach);
  EXPECT_LE(store.appends(), kThreads * kEach);
}

TEST(MetadataLogTest, RecordsQueuedBehindASlowAppendGoOutInOneBatch) {
  ControlledStore store(std::make_unique<MemoryMetadataStore>());
  MetadataLog log(&store, MetadataLog::Options());
  store.Hold();
  const MetadataLog::Ticket first = log.Enqueue(TensorChange("first"));
  store.WaitUntilBlocked();  // the writer is "fsyncing" the first record
  std::vector<MetadataLog::Ticket> queued;
  for (int i = 0; i < 10; ++i)
    queued.push_back(log.Enqueue(TensorChange(absl::StrCat("q", i))));
  EXPECT_EQ(log.DurableState().tensors.size(), 0u);
  store.Release();
  ASSERT_OK(log.Wait(first));
  for (MetadataLog::Ticket t : queued) ASSERT_OK(log.Wait(t));
  EXPECT_EQ(store.appends(), 2);  // one for "first", one for the ten others
  EXPECT_EQ(log.stats().batches, 2);
  EXPECT_EQ(log.DurableState().tensors.size(), 11u);
}

TEST(MetadataLogTest, RecordsReachTheStoreInEnqueueOrder) {
  ControlledStore store(std::make_unique<MemoryMetadataStore>());
  MetadataLog log(&store, MetadataLog::Options());
  store.Hold();
  log.Enqueue(TensorChange("a", 1));
  store.WaitUntilBlocked();
  log.Enqueue(MetadataChange::DeletedTensor("a"));
  log.Enqueue(TensorChange("b", 1));
  log.Enqueue(TensorChange("a", 2));
  const MetadataLog::Ticket last =
      log.Enqueue(MetadataChange::DeletedTensor("b"));
  store.Release();
  ASSERT_OK(log.Wait(last));
  const MetadataState state = log.DurableState();
  EXPECT_THAT(Names(state), ElementsAre("a"));
  EXPECT_EQ(state.tensors.at("a")->version, 2u);
}

TEST(MetadataLogTest, AFailedBatchFailsItsRecordsOnlyAndLeavesTheMirror) {
  ControlledStore store(std::make_unique<MemoryMetadataStore>());
  MetadataLog log(&store, MetadataLog::Options());
  store.FailAppends(2, absl::InternalError("disk on fire"));
  store.Hold();
  const MetadataLog::Ticket x = log.Enqueue(TensorChange("x"));
  store.WaitUntilBlocked();
  const MetadataLog::Ticket a = log.Enqueue(TensorChange("a"));
  const MetadataLog::Ticket b = log.Enqueue(TensorChange("b"));
  store.Release();
  EXPECT_THAT(log.Wait(x),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("disk on fire")));
  EXPECT_THAT(log.Wait(a), StatusIs(absl::StatusCode::kInternal,
                                    HasSubstr("recording metadata")));
  EXPECT_THAT(log.Wait(b), StatusIs(absl::StatusCode::kInternal));
  EXPECT_TRUE(log.Failed(a));
  // Later records are written as usual.
  const MetadataLog::Ticket c = log.Enqueue(TensorChange("c"));
  ASSERT_OK(log.Wait(c));
  EXPECT_FALSE(log.Failed(c));
  EXPECT_FALSE(log.Failed(0));
  EXPECT_THAT(Names(log.DurableState()), ElementsAre("c"));
  EXPECT_EQ(log.stats().failed_batches, 2);
  EXPECT_EQ(log.stats().records, 1);
}

TEST(MetadataLogTest, ABatchOfUnknownOutcomeStopsInsteadOfFailing) {
  ControlledStore store(std::make_unique<MemoryMetadataStore>());
  MetadataLog::Options options;
  std::atomic<int> stops{0};
  options.on_unknown_outcome = [&](const absl::Status& status) {
    EXPECT_THAT(status, StatusIs(absl::StatusCode::kDataLoss));
    ++stops;
  };
  MetadataLog log(&store, options);
  store.FailAppends(1, absl::InternalError("no space left on device"));
  EXPECT_THAT(log.Append(TensorChange("a")),
              StatusIs(absl::StatusCode::kInternal));
  EXPECT_EQ(stops.load(), 0);  // known not written: the caller undoes it
  store.FailAppends(1, absl::DataLossError("outcome unknown"));
  EXPECT_THAT(log.Append(TensorChange("b")),
              StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_EQ(stops.load(), 1);
}

TEST(MetadataLogTest, ABatchOfUnknownOutcomeEndsTheProcessByDefault) {
  EXPECT_DEATH(
      {
        ControlledStore store(std::make_unique<MemoryMetadataStore>());
        MetadataLog log(&store, MetadataLog::Options());
        store.FailAppends(1, absl::DataLossError("outcome unknown"));
        log.Append(TensorChange("b")).IgnoreError();
      },
      "");
}

TEST(MetadataLogTest, DestroyingTheLogWritesWhatIsQueued) {
  ControlledStore store(std::make_unique<MemoryMetadataStore>());
  {
    MetadataLog log(&store, MetadataLog::Options());
    for (int i = 0; i < 20; ++i)
      log.Enqueue(TensorChange(absl::StrCat("t", i)));
  }
  auto stored = store.Load();
  ASSERT_OK(stored);
  EXPECT_EQ(stored->tensors.size(), 20u);
}

TEST(MetadataLogTest, BatchesAreBoundedInRecordsAndShards) {
  ControlledStore store(std::make_unique<MemoryMetadataStore>());
  MetadataLog::Options options;
  options.max_batch_records = 3;
  options.max_batch_shards = 2;
  MetadataLog log(&store, options);
  store.Hold();
  log.Enqueue(TensorChange("first"));
  store.WaitUntilBlocked();
  MetadataLog::Ticket last = 0;
  // Each tensor has one shard: at most two per batch, so 6 -> 3 batches.
  for (int i = 0; i < 6; ++i) last = log.Enqueue(TensorChange(absl::StrCat(i)));
  store.Release();
  ASSERT_OK(log.Wait(last));
  EXPECT_EQ(store.appends(), 4);
}

// Every snapshot interval, with changes on both sides of a restart: what
// was acknowledged is what comes back (a snapshot is written from the
// durable state, after the record that triggered it).
TEST(MetadataLogTest, EverySnapshotIntervalKeepsEveryAcknowledgedChange) {
  for (int every = 1; every <= 3; ++every) {
    SCOPED_TRACE(absl::StrCat("snapshot_every=", every));
    const std::string dir = TempDir();
    MetadataLog::Options options;
    options.snapshot_every = every;
    std::vector<std::string> expected;
    for (int start = 0; start < 3; ++start) {
      FileMetadataStore store(dir);
      MetadataLog log(&store, options);
      auto recovered = log.Recover();
      ASSERT_OK(recovered);
      EXPECT_EQ(Names(*recovered), expected) << "start " << start;
      for (int i = 0; i < 4; ++i) {
        const std::string name = absl::StrCat("s", start, "_", i);
        ASSERT_OK(log.Append(TensorChange(name)));
        expected.push_back(name);
      }
      ASSERT_OK(log.Append(MetadataChange::DeletedTensor(expected.front())));
      expected.erase(expected.begin());
      std::sort(expected.begin(), expected.end());
      EXPECT_EQ(Names(log.DurableState()), expected);
    }
  }
}

TEST(MetadataLogTest, RecoverRaisesTheHighWaterPastEveryShardId) {
  MemoryMetadataStore store;
  ASSERT_OK(store.Append(TensorChange("a", 41)));  // shard id 41
  ASSERT_OK(store.Append(MetadataChange::ShardIdHighWater(7)));
  MetadataLog log(&store, MetadataLog::Options());
  auto state = log.Recover();
  ASSERT_OK(state);
  EXPECT_EQ(state->shard_id_high_water, 42u);
  EXPECT_EQ(log.DurableState().shard_id_high_water, 42u);
}

// A tensor of `shards` shards, so that snapshots take some room.
MetadataChange BigTensorChange(const std::string& name, uint64_t version,
                               int shards) {
  auto tensor = std::make_shared<TensorMetadata>();
  tensor->name = name;
  tensor->shape = {shards};
  tensor->version = version;
  for (int i = 0; i < shards; ++i) {
    ShardInfo shard;
    shard.box = Box{{i}, {1}};
    Replica& replica = shard.replicas.emplace_back();
    replica.worker = "w0";
    replica.shard_id = (version << 32) + static_cast<uint64_t>(i);
    tensor->shards.push_back(shard);
  }
  return MetadataChange::Tensor(std::move(tensor));
}

struct FileId {
  ino_t inode = 0;
  int64_t mtime_ns = 0;
  bool operator==(const FileId& o) const {
    return inode == o.inode && mtime_ns == o.mtime_ns;
  }
};
std::optional<FileId> IdOf(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return std::nullopt;
  return FileId{st.st_ino,
                int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec};
}

// A disk that fills up, for one test: a tmpfs of `bytes` mounted on a new
// directory (as root, which tests run as here and in CI), else this
// process's file size limit (RLIMIT_FSIZE of 4 KiB, SIGXFSZ ignored),
// which fails writes the same way (EFBIG) but holds no space.
class SmallDisk {
 public:
  explicit SmallDisk(int64_t bytes) : dir_(TempDir() + "/disk") {
    EXPECT_EQ(mkdir(dir_.c_str(), 0700), 0);
    const std::string size = absl::StrCat("size=", bytes);
    if (mount("tmpfs", dir_.c_str(), "tmpfs", MS_NOSUID | MS_NODEV,
              size.c_str()) == 0) {
      mounted_ = true;
    } else {
      std::cerr << "no tmpfs for the full disk (mount: " << strerror(errno)
                << "); failing writes with RLIMIT_FSIZE instead\n";
    }
  }
  ~SmallDisk() {
    Free();
    if (mounted_) umount2(dir_.c_str(), MNT_DETACH);
  }
  const std::string& dir() const { return dir_; }

  // Leaves no room to write (a tmpfs: a filler file takes what is left).
  void Fill() {
    if (!mounted_) {
      old_sigxfsz_ = signal(SIGXFSZ, SIG_IGN);
      ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old_limit_), 0);
      struct rlimit limit = old_limit_;
      limit.rlim_cur = 4096;
      ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &limit), 0);
      limited_ = true;
      return;
    }
    const std::string filler = dir_ + "/filler";
    int fd = open(filler.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ASSERT_GE(fd, 0);
    const std::string block(4096, 'x');
    while (write(fd, block.data(), block.size()) > 0) {
    }
    EXPECT_EQ(errno, ENOSPC);
    close(fd);
  }
  void Free() {
    if (limited_) {
      setrlimit(RLIMIT_FSIZE, &old_limit_);
      signal(SIGXFSZ, old_sigxfsz_);
      limited_ = false;
    }
    if (mounted_) unlink((dir_ + "/filler").c_str());
  }

 private:
  const std::string dir_;
  bool mounted_ = false;
  bool limited_ = false;
  struct rlimit old_limit_ {};
  void (*old_sigxfsz_)(int) = SIG_DFL;
};

// On a full disk, a failed snapshot used to leave snapshot.tmp behind,
// holding the space, and every start wrote a snapshot first, so the
// coordinator could not start again until someone cleared the disk.
TEST(MetadataLogTest, AFullDiskLeavesNoTemporaryFileAndTheNextStartWorks) {
  SmallDisk disk(1 << 20);
  const std::string dir = disk.dir() + "/data";
  MetadataLog::Options options;
  options.snapshot_every = 1 << 30;  // snapshots only when the test says
  std::vector<std::string> names;
  {
    FileMetadataStore store(dir);
    MetadataLog log(&store, options);
    ASSERT_OK(log.Recover());
    // Two versions of each in the log, so a snapshot is about half of it.
    for (uint64_t version = 1; version <= 2; ++version) {
      for (int i = 0; i < 4; ++i) {
        ASSERT_OK(
            log.Append(BigTensorChange(absl::StrCat("t", i), version, 2000)));
      }
    }
    for (int i = 0; i < 4; ++i) names.push_back(absl::StrCat("t", i));
    disk.Fill();
    EXPECT_THAT(store.Snapshot(log.DurableState()),
                StatusIs(absl::StatusCode::kInternal));
    EXPECT_FALSE(IdOf(dir + "/snapshot.tmp").has_value())
        << "snapshot.tmp is left behind";
  }
  {
    // The disk is still full: the start goes on from the log.
    FileMetadataStore store(dir);
    MetadataLog log(&store, options);
    auto state = log.Recover();
    ASSERT_OK(state);
    EXPECT_EQ(Names(*state), names);
    EXPECT_EQ(state->tensors.at("t3")->version, 2u);
    EXPECT_FALSE(IdOf(dir + "/snapshot.tmp").has_value());
  }
  disk.Free();
  {
    // With room again, the start snapshots the log away.
    FileMetadataStore store(dir);
    MetadataLog log(&store, options);
    ASSERT_OK(log.Recover());
    EXPECT_TRUE(IdOf(dir + "/snapshot").has_value());
  }
  struct stat log_stat;
  ASSERT_EQ(stat((dir + "/log").c_str(), &log_stat), 0);
  EXPECT_EQ(log_stat.st_size, 0);
}

// Every start used to write the snapshot again, even with nothing to
// replay: wasted writes, and on a full disk a start that could not happen.
TEST(MetadataLogTest, AStartWithNothingToReplayLeavesTheSnapshotAsItIs) {
  const std::string dir = TempDir();
  {
    FileMetadataStore store(dir);
    MetadataLog log(&store, MetadataLog::Options());
    ASSERT_OK(log.Recover());
    ASSERT_OK(log.Append(TensorChange("a")));
  }
  {
    // A record to replay: snapshotted, and the log cut.
    FileMetadataStore store(dir);
    MetadataLog log(&store, MetadataLog::Options());
    ASSERT_OK(log.Recover());
  }
  // (A rewrite renames a new file over it: a new inode.)
  const std::optional<FileId> before = IdOf(dir + "/snapshot");
  ASSERT_TRUE(before.has_value());
  for (int start = 0; start < 2; ++start) {
    FileMetadataStore store(dir);
    MetadataLog log(&store, MetadataLog::Options());
    auto state = log.Recover();
    ASSERT_OK(state);
    EXPECT_THAT(Names(*state), ElementsAre("a"));
    EXPECT_EQ(state->shard_id_high_water, 2u);
  }
  EXPECT_TRUE(IdOf(dir + "/snapshot") == before) << "snapshot rewritten";
}

}  // namespace
}  // namespace tessera
