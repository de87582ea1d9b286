#include "transport/shared_memory_arena.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tessera {

const std::string& LocalHostId() {
  static const std::string* id = [] {
    std::ifstream in("/proc/sys/kernel/random/boot_id");
    std::string boot;
    std::getline(in, boot);
    struct stat st {};
    if (boot.empty() || stat("/dev/shm", &st) != 0)
      return new std::string();  // never matches
    return new std::string(absl::StrCat(boot, "/", st.st_dev, ":", st.st_ino));
  }();
  return *id;
}

// A block's pages, mapped here: unmapped when the last of the block, its
// parked successor or a KeepMapped() holder lets go.
struct MappedPages {
  MappedPages(char* data, int64_t bytes) : data(data), bytes(bytes) {}
  ~MappedPages() { munmap(data, static_cast<size_t>(bytes)); }
  MappedPages(const MappedPages&) = delete;
  MappedPages& operator=(const MappedPages&) = delete;
  char* const data;
  const int64_t bytes;
};

// A dropped reusable block: its pages, mapped here, under a parked name.
struct ParkedBlock {
  std::string name;
  std::shared_ptr<MappedPages> pages;
  absl::Time since;

  int64_t bytes() const { return pages->bytes; }
  // Someone still holds the pages mapped (KeepMapped): releasing them now
  // would not give the memory back, so they stay parked, reusable.
  bool held_mapped() const { return pages.use_count() > 1; }
};

// Warm blocks: none smaller (their faults cost little), sizes remembered,
// and how much of one is populated between checks for the arena's end.
constexpr int64_t kMinWarmBytes = int64_t{1} << 20;
constexpr size_t kWantedSizes = 16;
constexpr int64_t kWarmStep = int64_t{2} << 20;
// Warm blocks are made only once no block was asked for this long: making
// pages competes with a transfer's copies for memory bandwidth and the
// kernel's page lists, even at the lowest priority.
constexpr absl::Duration kWarmQuiet = absl::Seconds(1);

// The names of the blocks still linked, by their first byte, and the parked
// blocks.
struct SharedBlock::Index {
  mutable absl::Mutex mu;
  // Invariant: one entry per block whose segment is linked.
  absl::flat_hash_map<const void*, SegmentInfo> blocks ABSL_GUARDED_BY(mu);
  std::string liveness;  // set before any block exists
  SharedMemoryArenaOptions options;
  std::vector<ParkedBlock> parked ABSL_GUARDED_BY(mu);  // oldest first
  int64_t parked_bytes ABSL_GUARDED_BY(mu) = 0;
  bool closed ABSL_GUARDED_BY(mu) = false;  // the arena is gone: park nothing
  // Warm blocks (zeroed, never handed out yet) and the sizes of the latest
  // blocks no parked block served, oldest first: what to keep warm.
  std::vector<ParkedBlock> warm ABSL_GUARDED_BY(mu);
  int64_t warm_bytes ABSL_GUARDED_BY(mu) = 0;
  std::deque<int64_t> wanted ABSL_GUARDED_BY(mu);
  // When a block was last asked for, or the last move of bytes ended; the
  // moves under way (SharedMemoryArena::Moving).
  absl::Time last_busy ABSL_GUARDED_BY(mu) = absl::InfinitePast();
  int moving ABSL_GUARDED_BY(mu) = 0;
  // Bumped when `wanted` or `warm` change other than by the warmer: the
  // warmer, idle at `warm_seen`, plans again only then (not at every
  // release of `mu`, which Allocate and Find take on the serving path).
  uint64_t warm_changes ABSL_GUARDED_BY(mu) = 0;
  uint64_t warm_seen ABSL_GUARDED_BY(mu) = 0;
  ArenaCounts counts ABSL_GUARDED_BY(mu);

  // Waits until no bytes move and no block was asked for in kWarmQuiet;
  // false: the arena closed meanwhile.
  bool AwaitQuiet() ABSL_LOCKS_EXCLUDED(mu) {
    absl::MutexLock lock(&mu);
    while (!closed) {
      if (moving > 0) {
        mu.Await(absl::Condition(
            +[](Index* i) ABSL_NO_THREAD_SAFETY_ANALYSIS {
              return i->closed || i->moving == 0;
            },
            this));
      } else if (absl::Now() < last_busy + kWarmQuiet) {
        mu.AwaitWithDeadline(absl::Condition(
                                 +[](Index* i) ABSL_NO_THREAD_SAFETY_ANALYSIS {
                                   return i->closed || i->moving > 0;
                                 },
                                 this),
                             last_busy + kWarmQuiet);
      } else {
        return true;
      }
    }
    return false;
  }

  // What the warmer should do next. The target: the newest wanted sizes,
  // one block per entry, that fit the bound together. Warm blocks beyond
  // it (`excess`, indexes into `warm`) go; `next` is a target size no warm
  // block matches (0: none).
  struct WarmPlan {
    int64_t next = 0;
    std::vector<size_t> excess;
  };
  WarmPlan PlanWarm() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    WarmPlan plan;
    if (closed) return plan;
    std::vector<int64_t> target;
    int64_t total = 0;
    for (auto it = wanted.rbegin(); it != wanted.rend(); ++it) {
      if (total + *it > options.warm_bytes) continue;
      total += *it;
      target.push_back(*it);
    }
    for (size_t i = 0; i < warm.size(); ++i) {
      auto match = std::find(target.begin(), target.end(), warm[i].bytes());
      if (match == target.end()) {
        plan.excess.push_back(i);
      } else {
        target.erase(match);
      }
    }
    // Made only once the excess is gone, so that the bound holds.
    if (plan.excess.empty() && !target.empty()) plan.next = target.front();
    return plan;
  }
};

namespace {

constexpr char kSegmentPrefix[] = "tessera-";

// "tessera-<pid namespace inode>-": pids are only comparable within one pid
// namespace, and /dev/shm is often shared across them (sandboxes, containers
// on one host).
const std::string& SegmentOwnerPrefix() {
  static const std::string* prefix = [] {
    struct stat st {};
    const unsigned long long ns =
        stat("/proc/self/ns/pid", &st) == 0 ? st.st_ino : 0;
    return new std::string(absl::StrCat(kSegmentPrefix, ns, "-"));
  }();
  return *prefix;
}

// Removes segments left by workers of this pid namespace that died without
// freeing them (their pid no longer runs).
void RemoveStaleSegments() {
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return;
  const std::string& mine = SegmentOwnerPrefix();
  while (dirent* entry = readdir(dir)) {
    const std::string name = entry->d_name;
    if (name.rfind(mine, 0) != 0) continue;
    const pid_t pid = static_cast<pid_t>(std::atol(name.c_str() + mine.size()));
    if (pid > 0 && kill(pid, 0) != 0 && errno == ESRCH)
      shm_unlink(("/" + name).c_str());
  }
  closedir(dir);
}

// A new segment name of this process: "/tessera-<ns>-<pid>-<what>-<nonce>".
std::string NewSegmentName(const std::string& what) {
  static std::mt19937_64 rng{std::random_device{}()};
  static absl::Mutex rng_mu;
  uint64_t nonce;
  {
    absl::MutexLock lock(&rng_mu);
    nonce = rng();
  }
  return absl::StrCat("/", SegmentOwnerPrefix(), getpid(), "-", what, "-",
                      absl::Hex(nonce));
}

// Renames segment `from` to `to` (both "/name"): the object, its pages and
// every mapping of it stay; only the name moves, atomically.
bool RenameSegment(const std::string& from, const std::string& to) {
  return rename(("/dev/shm" + from).c_str(), ("/dev/shm" + to).c_str()) == 0;
}

// Unlinks the block's file; its pages go once no one holds them mapped.
void Release(ParkedBlock& block) {
  if (!block.name.empty()) shm_unlink(block.name.c_str());
  block.pages.reset();
}

// A new block of `bytes`, allocated, zeroed and mapped writable here in
// steps, each page touched: a later first write costs no fault. Each step
// waits for `quiet` first. Gives up (nullopt) when /dev/shm is full or
// `quiet` returns false.
template <typename Quiet>
std::optional<ParkedBlock> MakeWarmBlock(int64_t bytes, Quiet quiet) {
  std::string name = NewSegmentName("warm");
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) return std::nullopt;
  void* map = MAP_FAILED;
  if (ftruncate(fd, bytes) == 0) {
    map = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE,
               MAP_SHARED, fd, 0);
  }
  bool ok = map != MAP_FAILED;
  const int64_t page = sysconf(_SC_PAGESIZE);
  for (int64_t at = 0; ok && at < bytes; at += kWarmStep) {
    const int64_t step = std::min(kWarmStep, bytes - at);
    // Reserved first, so that a full /dev/shm fails here, not as SIGBUS.
    ok = quiet() && posix_fallocate(fd, at, step) == 0;
    // Plain writes, not MADV_POPULATE_WRITE: a page fault takes only this
    // mapping's lock, never the process's, so this thread's low priority
    // cannot hold up another thread's mmap.
    for (int64_t p = at; ok && p < at + step; p += page)
      static_cast<volatile char*>(map)[p] = 0;
  }
  close(fd);
  if (!ok) {
    if (map != MAP_FAILED) munmap(map, static_cast<size_t>(bytes));
    shm_unlink(name.c_str());
    return std::nullopt;
  }
  return ParkedBlock{
      std::move(name),
      std::make_shared<MappedPages>(static_cast<char*>(map), bytes),
      absl::Now()};
}

}  // namespace

SharedBlock::SharedBlock(std::shared_ptr<Index> index, std::string name,
                         std::shared_ptr<MappedPages> pages, bool reusable)
    : index_(std::move(index)),
      name_(std::move(name)),
      pages_(std::move(pages)),
      data_(pages_->data),
      bytes_(pages_->bytes),
      reusable_(reusable) {}

std::shared_ptr<const void> SharedBlock::KeepMapped() const { return pages_; }

SharedBlock::~SharedBlock() {
  Unlink();
  std::vector<ParkedBlock> released;
  {
    absl::MutexLock lock(&index_->mu);
    if (!parked_name_.empty() && !index_->closed) {
      index_->parked.push_back(
          ParkedBlock{std::move(parked_name_), pages_, absl::Now()});
      index_->parked_bytes += bytes_;
      // Oldest first; pages someone holds mapped stay (see ParkedBlock).
      // This block's own reference to its pages goes as it returns.
      const MappedPages* mine = pages_.get();
      for (auto it = index_->parked.begin();
           it != index_->parked.end() &&
           index_->parked_bytes > index_->options.reuse_bytes;) {
        if (it->pages.use_count() > (it->pages.get() == mine ? 2 : 1)) {
          ++it;
          continue;
        }
        index_->parked_bytes -= it->bytes();
        released.push_back(std::move(*it));
        it = index_->parked.erase(it);
      }
    } else {
      released.push_back(
          ParkedBlock{std::move(parked_name_), pages_, absl::Now()});
    }
  }
  for (ParkedBlock& block : released) Release(block);  // outside the lock
}

void SharedBlock::Unlink() {
  bool park = false;
  {
    absl::MutexLock lock(&index_->mu);
    if (index_->blocks.erase(data_) == 0) return;  // already unlinked
    park =
        reusable_ && !index_->closed && bytes_ <= index_->options.reuse_bytes;
  }
  // The file calls run outside the lock. A reusable block keeps its pages
  // under a parked name no reader knows, for the next block of its size
  // once this one is dropped (the owner drops it after this returns).
  if (park) {
    std::string parked = NewSegmentName("parked");
    if (RenameSegment(name_, parked)) {
      absl::MutexLock lock(&index_->mu);
      parked_name_ = std::move(parked);
      return;
    }
  }
  shm_unlink(name_.c_str());
}

SharedMemoryArena::SharedMemoryArena(SharedMemoryArenaOptions options)
    : index_(std::make_shared<SharedBlock::Index>()) {
  index_->options = options;
  RemoveStaleSegments();
  // Held locked for the life of the arena: the kernel drops the lock when
  // the process dies, however it dies.
  liveness_ = absl::StrCat("/", SegmentOwnerPrefix(), getpid(), "-alive");
  liveness_fd_ = shm_open(liveness_.c_str(), O_RDWR | O_CREAT, 0600);
  if (liveness_fd_ < 0 || flock(liveness_fd_, LOCK_EX | LOCK_NB) != 0) {
    // Not ours to unlink: another arena of this process may hold it.
    if (liveness_fd_ >= 0) close(liveness_fd_);
    liveness_fd_ = -1;
    liveness_.clear();
  }
  index_->liveness = liveness_;
  if (options.reuse_bytes > 0) {
    sweeper_ = std::thread([this] {
      while (!stop_.WaitForNotificationWithTimeout(absl::Seconds(1)))
        ReleaseIdle();
    });
  }
  if (options.warm_bytes > 0) warmer_ = std::thread([this] { KeepWarm(); });
}

SharedMemoryArena::~SharedMemoryArena() {
  stop_.Notify();
  if (sweeper_.joinable()) sweeper_.join();
  {
    absl::MutexLock lock(&index_->mu);
    index_->closed = true;  // blocks still out are released when dropped
  }
  if (warmer_.joinable()) warmer_.join();
  ReleaseIdle(/*everything=*/true);
  if (liveness_fd_ >= 0) {
    shm_unlink(liveness_.c_str());
    close(liveness_fd_);
  }
}

std::unique_ptr<SharedBlock> SharedMemoryArena::Allocate(int64_t bytes,
                                                         uint64_t tag,
                                                         BlockUse use) {
  if (bytes <= 0) return nullptr;
  std::string name = NewSegmentName(absl::StrCat(tag));
  std::optional<ParkedBlock> reused;
  bool zeroed = false;  // a warm block: never written
  {
    absl::MutexLock lock(&index_->mu);
    // The newest parked block of this size: its pages are the likeliest to
    // still be in cache. Taken out of the list, it is this call's alone.
    for (auto it = index_->parked.rbegin(); it != index_->parked.rend(); ++it) {
      if (it->bytes() != bytes) continue;
      reused = std::move(*it);
      index_->parked.erase(std::next(it).base());
      index_->parked_bytes -= bytes;
      ++index_->counts.reused;
      break;
    }
    if (!reused.has_value() && index_->options.warm_bytes > 0 &&
        bytes >= kMinWarmBytes) {
      for (auto it = index_->warm.begin(); it != index_->warm.end(); ++it) {
        if (it->bytes() != bytes) continue;
        reused = std::move(*it);
        index_->warm.erase(it);
        index_->warm_bytes -= bytes;
        zeroed = true;
        ++index_->counts.warm;
        break;
      }
      // A size wanted anew: the warmer keeps blocks of it ready.
      index_->wanted.push_back(bytes);
      if (index_->wanted.size() > kWantedSizes) index_->wanted.pop_front();
      ++index_->warm_changes;
    }
    if (!reused.has_value()) ++index_->counts.fresh;
    index_->last_busy = absl::Now();
  }
  if (reused.has_value() && !RenameSegment(reused->name, name)) {
    Release(*reused);  // someone removed its file: the pages are lost
    reused.reset();
  }
  if (reused.has_value()) {
    char* data = reused->pages->data;
    {
      absl::MutexLock lock(&index_->mu);
      index_->blocks[data] = SegmentInfo{name, bytes, index_->liveness};
    }
    if (!use.overwritten && !zeroed)
      std::memset(data, 0, static_cast<size_t>(bytes));
    return std::unique_ptr<SharedBlock>(new SharedBlock(
        index_, std::move(name), std::move(reused->pages), use.reusable));
  }
  std::unique_ptr<SharedBlock> block = Create(name, bytes, use.reusable);
  if (block == nullptr && (ParkedBytes() > 0 || Counts().warm_bytes > 0)) {
    // Parked or warm pages may be what fills /dev/shm.
    ReleaseIdle(/*everything=*/true);
    block = Create(name, bytes, use.reusable);
  }
  return block;
}

std::unique_ptr<SharedBlock> SharedMemoryArena::Create(const std::string& name,
                                                       int64_t bytes,
                                                       bool reusable) {
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) return nullptr;
  // Reserve the pages now: a full /dev/shm then fails here, not later as
  // SIGBUS on first touch.
  void* map = MAP_FAILED;
  if (posix_fallocate(fd, 0, bytes) == 0) {
    map = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE,
               MAP_SHARED, fd, 0);
  }
  close(fd);
  if (map == MAP_FAILED) {
    shm_unlink(name.c_str());
    return nullptr;
  }
  char* data = static_cast<char*>(map);
  {
    absl::MutexLock lock(&index_->mu);
    index_->blocks[data] = SegmentInfo{name, bytes, index_->liveness};
  }
  return std::unique_ptr<SharedBlock>(new SharedBlock(
      index_, name, std::make_shared<MappedPages>(data, bytes), reusable));
}

void SharedMemoryArena::ReleaseIdle(bool everything) {
  std::vector<ParkedBlock> idle;
  {
    absl::MutexLock lock(&index_->mu);
    const absl::Time cutoff = absl::Now() - index_->options.reuse_for;
    auto keep = index_->parked.begin();
    for (auto it = index_->parked.begin(); it != index_->parked.end(); ++it) {
      if (everything || (it->since <= cutoff && !it->held_mapped())) {
        index_->parked_bytes -= it->bytes();
        idle.push_back(std::move(*it));
      } else {
        if (keep != it) *keep = std::move(*it);  // never a self-move
        ++keep;
      }
    }
    index_->parked.erase(keep, index_->parked.end());
    if (everything) {
      for (ParkedBlock& block : index_->warm) idle.push_back(std::move(block));
      index_->warm.clear();
      index_->warm_bytes = 0;
      ++index_->warm_changes;
    }
  }
  for (ParkedBlock& block : idle) Release(block);  // outside the lock
}

int64_t SharedMemoryArena::ParkedBytes() const {
  absl::MutexLock lock(&index_->mu);
  return index_->parked_bytes;
}

ArenaCounts SharedMemoryArena::Counts() const {
  absl::MutexLock lock(&index_->mu);
  ArenaCounts counts = index_->counts;
  counts.warm_bytes = index_->warm_bytes;
  return counts;
}

std::shared_ptr<void> SharedMemoryArena::Moving() {
  {
    absl::MutexLock lock(&index_->mu);
    ++index_->moving;
  }
  return std::shared_ptr<void>(nullptr, [index = index_](void*) {
    absl::MutexLock lock(&index->mu);
    if (--index->moving == 0) index->last_busy = absl::Now();
  });
}

void SharedMemoryArena::KeepWarm() {
  // The lowest nice value: pages are made ahead of need with CPU that
  // serving does not use. (Not SCHED_IDLE: this thread must still finish
  // a step soon once the arena closes.)
  setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 19);
  SharedBlock::Index& index = *index_;
  // After a block that did not fit, the next try waits longer (1 s,
  // doubling to 1 min): a small /dev/shm (a container's 64 MiB) must not
  // see a block allocated and released every second.
  absl::Duration backoff = absl::Seconds(1);
  while (true) {
    int64_t bytes = 0;
    std::vector<ParkedBlock> excess;
    {
      absl::MutexLock lock(&index.mu);
      SharedBlock::Index::WarmPlan plan = index.PlanWarm();
      while (!index.closed && plan.next == 0 && plan.excess.empty()) {
        index.warm_seen = index.warm_changes;
        index.mu.Await(absl::Condition(
            +[](SharedBlock::Index* i) ABSL_NO_THREAD_SAFETY_ANALYSIS {
              return i->closed || i->warm_changes != i->warm_seen;
            },
            &index));
        plan = index.PlanWarm();
      }
      if (index.closed) return;
      // Newer sizes displace older ones (highest index first: stable).
      for (auto it = plan.excess.rbegin(); it != plan.excess.rend(); ++it) {
        index.warm_bytes -= index.warm[*it].bytes();
        excess.push_back(std::move(index.warm[*it]));
        index.warm.erase(index.warm.begin() + static_cast<ptrdiff_t>(*it));
      }
      bytes = plan.next;
    }
    for (ParkedBlock& block : excess) Release(block);  // outside the lock
    if (bytes == 0) continue;
    // Shards come first: a block is made only while /dev/shm keeps twice
    // its size free.
    std::optional<ParkedBlock> block;
    struct statvfs fs {};
    if (statvfs("/dev/shm", &fs) == 0 &&
        static_cast<int64_t>(fs.f_bavail) * static_cast<int64_t>(fs.f_frsize) >=
            2 * bytes) {
      block = MakeWarmBlock(bytes, [&index] { return index.AwaitQuiet(); });
    }
    bool kept = false;
    {
      absl::MutexLock lock(&index.mu);
      if (block.has_value() && !index.closed) {
        index.warm_bytes += bytes;
        index.warm.push_back(std::move(*block));
        kept = true;
      }
    }
    if (kept) {
      backoff = absl::Seconds(1);
      continue;
    }
    if (block.has_value()) Release(*block);  // outside the lock
    // No room in /dev/shm now (or closing): try again in a while.
    absl::MutexLock lock(&index.mu);
    index.mu.AwaitWithTimeout(
        absl::Condition(
            +[](SharedBlock::Index* i)
                 ABSL_NO_THREAD_SAFETY_ANALYSIS { return i->closed; },
            &index),
        backoff);
    backoff = std::min(backoff * 2, absl::Minutes(1));
  }
}

std::optional<SegmentInfo> SharedMemoryArena::Find(const void* data) const {
  absl::MutexLock lock(&index_->mu);
  auto it = index_->blocks.find(data);
  if (it == index_->blocks.end()) return std::nullopt;
  return it->second;
}

}  // namespace tessera
