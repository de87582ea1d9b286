// The worker side of same-host reads: POSIX shared-memory segments
// (/dev/shm) that hold shard bytes, so that a process on the same host can
// map them (SharedMemoryTransport) instead of streaming them over TCP.
//
// A worker's host store allocates its large shards here. Segment names carry
// the worker's pid namespace, pid and a random suffix and are never reused;
// a block's name is gone the moment it is dropped, and segments of dead
// workers are removed when an arena starts.
//
// Reuse: first-touch of new memory costs far more than a copy into memory
// already touched (about 1 s per GiB on some VMs, where freed pages go back
// to the hypervisor). So a dropped block made `reusable` keeps its pages: it
// is renamed to a parked name and handed out again, under a new name, to the
// next Allocate of exactly its size (zeroed unless the caller overwrites it).
// A mapping made before the drop then shows the new block's bytes: readers
// check after every copy that the name they mapped still names the object
// they mapped (transport/shared_memory.h, ShardMapping::Current). Blocks
// that other processes write into (a put's shards) or that they map across
// reads by descriptor (staging) are not reusable. Parked bytes are bounded
// (`reuse_bytes`) and released after `reuse_for` unused.
//
// Warm blocks: reuse cannot help the first shards of a new size (a tensor's
// first reshard, a repair). There the page faults, not the bytes, are the
// cost: on a 2-core VM a new 4 KiB page takes about 3 us (allocation and
// zeroing 1.1 us, mapping it on first touch 1.8 us), 0.8 s of CPU per GiB
// against 0.03 s to copy into it. So, with `warm_bytes` > 0, a low-priority
// thread keeps blocks of the sizes recently allocated anew populated ahead
// of need (allocated, zeroed and mapped here), while the process has CPU to
// spare (no allocation and no move of bytes for a second); the next
// Allocate of such a size takes one instead of faulting.
//
// While the arena lives, the worker holds an exclusive flock on a "liveness"
// segment, so that readers holding a mapping can tell that the
// worker has exited (the kernel drops the lock however the process dies).
//
// One arena per process: a second one in the same process cannot take the
// liveness lock and reports none. SharedMemoryArena and SharedBlock are
// thread-safe.
#ifndef TESSERA_TRANSPORT_SHARED_MEMORY_ARENA_H_
#define TESSERA_TRANSPORT_SHARED_MEMORY_ARENA_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace tessera {

// Names this host's shared memory: equal in two processes exactly when they
// see the same /dev/shm. Empty when there is none (never matches).
const std::string& LocalHostId();

// A segment as a same-host reader opens it.
struct SegmentInfo {
  std::string name;      // POSIX shared-memory name ("/tessera-...")
  int64_t bytes = 0;     // the block's size
  std::string liveness;  // the arena's liveness lock; empty: none
};

struct MappedPages;  // shared_memory_arena.cc

// Zeroed bytes in their own segment, mapped read-write into this process.
// Destroying the block unlinks its segment and unmaps it, or, for a
// reusable block, parks its pages (see the top of this file).
class SharedBlock {
 public:
  ~SharedBlock();
  SharedBlock(const SharedBlock&) = delete;
  SharedBlock& operator=(const SharedBlock&) = delete;

  char* data() const { return data_; }
  int64_t bytes() const { return bytes_; }
  bool reusable() const { return reusable_; }

  // Keeps the block's pages mapped at data() while held, but not its bytes:
  // once the block is dropped, a reusable block's pages may serve another
  // block. For a registration (UCX) that must never see the address
  // unmapped, yet must not keep a freed shard's pages from being reused;
  // readers through it check afterwards that the shard is still held.
  // Parked pages someone holds mapped are not released (they stay
  // reusable, past `reuse_bytes`) until the holder lets go.
  std::shared_ptr<const void> KeepMapped() const;

  // Removes the segment's name: no new mapping from now on, and the arena
  // no longer names it; existing mappings (this one included) keep the bytes
  // until the block is dropped (then a reusable block's pages are parked).
  // Idempotent.
  void Unlink();

 private:
  friend class SharedMemoryArena;
  struct Index;
  SharedBlock(std::shared_ptr<Index> index, std::string name,
              std::shared_ptr<MappedPages> pages, bool reusable);

  const std::shared_ptr<Index> index_;
  const std::string name_;
  const std::shared_ptr<MappedPages> pages_;
  char* const data_;
  const int64_t bytes_;
  const bool reusable_;
  // Once unlinked, a reusable block's name while it waits to be dropped and
  // parked (guarded by the arena's lock).
  std::string parked_name_;
};

struct SharedMemoryArenaOptions {
  // Most bytes of dropped reusable blocks kept for reuse; 0: none kept.
  int64_t reuse_bytes = int64_t{1} << 30;
  // A parked block unused this long is released (by a sweeper, each
  // second).
  absl::Duration reuse_for = absl::Seconds(30);
  // Most bytes of warm blocks (see the top of this file); 0: none.
  int64_t warm_bytes = 0;
};

// Where the arena's blocks came from, since it started.
struct ArenaCounts {
  int64_t fresh = 0;       // new pages, faulted in by their first writer
  int64_t reused = 0;      // a dropped block's pages (parked)
  int64_t warm = 0;        // a warm block, populated ahead of need
  int64_t warm_bytes = 0;  // bytes of warm blocks waiting now
};

// How a block will be used.
struct BlockUse {
  // Its pages may serve a later block once this one is dropped: only for
  // blocks no other process writes into or keeps a descriptor of.
  bool reusable = false;
  // The caller writes every byte before anyone else can read the block, so
  // reused pages need not be cleared first (fresh ones are always zero).
  bool overwritten = false;
};

class SharedMemoryArena {
 public:
  // Removes stale segments of dead workers of this pid namespace and takes
  // the liveness lock.
  explicit SharedMemoryArena(SharedMemoryArenaOptions options = {});
  ~SharedMemoryArena();
  SharedMemoryArena(const SharedMemoryArena&) = delete;
  SharedMemoryArena& operator=(const SharedMemoryArena&) = delete;

  // A block of `bytes` (> 0) under a new name, zeroed unless
  // `use.overwritten`: a parked block of exactly that size if there is one,
  // else a warm one, else fresh pages. `tag` goes into the segment's name (a
  // shard id). Null when there is no room or no /dev/shm: the caller then uses
  // private memory.
  std::unique_ptr<SharedBlock> Allocate(int64_t bytes, uint64_t tag,
                                        BlockUse use = {});

  // Releases parked blocks unused for `reuse_for` (all of them, and the warm
  // blocks, with `everything`): unmapped and unlinked.
  void ReleaseIdle(bool everything = false);

  // Bytes of parked blocks now.
  int64_t ParkedBytes() const;

  ArenaCounts Counts() const;

  // The segment whose block starts at `data`, if one of this arena's blocks
  // does and is not unlinked (a pinned shard's bytes -> what to map).
  std::optional<SegmentInfo> Find(const void* data) const;

  // While the returned token lives, the process moves bytes (serves a
  // read, pulls a piece): the warmer makes no pages then, nor until a
  // second after the last such move ends, as after an allocation. Its page
  // faults would take the cores the copies run on.
  std::shared_ptr<void> Moving();

  // See SegmentInfo::liveness.
  const std::string& liveness() const { return liveness_; }

 private:
  std::unique_ptr<SharedBlock> Create(const std::string& name, int64_t bytes,
                                      bool reusable);
  // The warmer thread: makes warm blocks while there is room and demand.
  void KeepWarm();

  const std::shared_ptr<SharedBlock::Index> index_;
  std::string liveness_;
  int liveness_fd_ = -1;
  absl::Notification stop_;
  std::thread sweeper_;  // only when blocks are reused
  std::thread warmer_;   // only with warm_bytes
};

}  // namespace tessera

#endif  // TESSERA_TRANSPORT_SHARED_MEMORY_ARENA_H_
