// The worker side of same-host reads: POSIX shared-memory segments
// (/dev/shm) that hold shard bytes, so that a process on the same host can
// map them (SharedMemoryTransport) instead of streaming them over TCP.
//
// A worker's host store allocates its large shards here. Segment names carry
// the worker's pid namespace, pid and a random suffix and are never reused;
// a block's segment is unlinked when its shard is freed (mappings that exist
// keep the old bytes), and segments of dead workers are removed when an
// arena starts. While the arena lives, the worker holds an exclusive flock on
// a "liveness" segment, so that readers holding a mapping can tell that the
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

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"

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

// Zeroed bytes in their own segment, mapped read-write into this process.
// Destroying the block unmaps it and unlinks its segment.
class SharedBlock {
 public:
  ~SharedBlock();
  SharedBlock(const SharedBlock&) = delete;
  SharedBlock& operator=(const SharedBlock&) = delete;

  char* data() const { return data_; }
  int64_t bytes() const { return bytes_; }

  // Removes the segment's name: no new mapping from now on, and the arena
  // no longer names it; existing mappings (this one included) keep the bytes.
  // Idempotent.
  void Unlink();

 private:
  friend class SharedMemoryArena;
  struct Index;
  SharedBlock(std::shared_ptr<Index> index, std::string name, char* data,
              int64_t bytes);

  const std::shared_ptr<Index> index_;
  const std::string name_;
  char* const data_;
  const int64_t bytes_;
};

class SharedMemoryArena {
 public:
  // Removes stale segments of dead workers of this pid namespace and takes
  // the liveness lock.
  SharedMemoryArena();
  ~SharedMemoryArena();
  SharedMemoryArena(const SharedMemoryArena&) = delete;
  SharedMemoryArena& operator=(const SharedMemoryArena&) = delete;

  // A fresh zeroed block of `bytes` (> 0); `tag` goes into the segment's
  // name (a shard id). Null when there is no room or no /dev/shm: the caller
  // then uses private memory.
  std::unique_ptr<SharedBlock> Allocate(int64_t bytes, uint64_t tag);

  // The segment whose block starts at `data`, if one of this arena's blocks
  // does and is not unlinked (a pinned shard's bytes -> what to map).
  std::optional<SegmentInfo> Find(const void* data) const;

  // See SegmentInfo::liveness.
  const std::string& liveness() const { return liveness_; }

 private:
  const std::shared_ptr<SharedBlock::Index> index_;
  std::string liveness_;
  int liveness_fd_ = -1;
};

}  // namespace tessera

#endif  // TESSERA_TRANSPORT_SHARED_MEMORY_ARENA_H_
