// Same-host shared memory for the data plane. A worker keeps large shards in
// POSIX shared-memory segments (transport/shared_memory_arena.h) and names
// them through Worker.MapShard; a client on the same host maps the bytes it
// needs and copies straight from (or into) them, instead of streaming them
// over loopback TCP. Across hosts (or containers with separate /dev/shm) the
// host ids differ and SharedMemoryTransport answers FAILED_PRECONDITION, so
// TransportChain goes on to gRPC.
//
// Safety across versions and frees: segment names are never reused (pid,
// shard id and a random suffix), a freed shard's segment name goes at once,
// and a worker may reuse its pages for another shard once its own readers
// are done (shared_memory_arena.h), so every copy out of (or into) a mapping
// is checked afterwards: ShardMapping::Current, else NOT_FOUND. Mappings
// kept across reads (ShardMappingCache) are checked before every use too.
//
// A worker's MapShard reply is outside input: every field is checked before
// anything is opened, mapped or copied (ValidateMapShardReply), the mapped
// object's size is checked with fstat, and every copy checks that the bytes
// it touches lie inside the mapping. Errors, per shard_transport.h:
//   FAILED_PRECONDITION  a true reply that says "not from here": another
//                        host, no segment, an element size or shape other
//                        than the caller's metadata, a box outside the shard,
//                        a segment file shorter than the reply says (cut by
//                        something else): TransportChain falls back to gRPC,
//                        which gives the worker's own answer.
//   INTERNAL             a reply that contradicts itself (byte size not
//                        shape x element size, negative or overflowing sizes,
//                        no dims, a segment name that is not one shared-
//                        memory object), or a copy whose bytes would leave
//                        the mapping. A worker that says this is broken or
//                        hostile; reading on through another transport could
//                        hide corruption, so the read fails, naming it.
#ifndef TESSERA_TRANSPORT_SHARED_MEMORY_H_
#define TESSERA_TRANSPORT_SHARED_MEMORY_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "core/box.h"
#include "proto/worker.pb.h"
#include "rpc/channel.h"
#include "transport/shard_transport.h"
#include "transport/shared_memory_arena.h"
#include "transport/staged_read.h"

namespace tessera {

struct KeptSegment;  // a whole segment mapped by SegmentMappingPool

// Bytes of one shard mapped read-only; unmapped on destruction (or, when
// borrowed from a SegmentMappingPool, left to the pool).
class ShardMapping {
 public:
  // `map` holds `map_bytes` bytes mapped from shard byte `map_offset` on;
  // shard bytes [map_offset, valid_end) lie inside the segment's file.
  // `segment` is the path of the object mapped (SegmentPath), whose device
  // and inode are `dev` and `ino` (empty: not watched, Current() is always
  // true).
  ShardMapping(void* map, size_t map_bytes, int64_t map_offset,
               int64_t valid_end, Shape shape, std::string segment = {},
               uint64_t dev = 0, uint64_t ino = 0)
      : map_(map),
        map_bytes_(map_bytes),
        map_offset_(map_offset),
        valid_end_(valid_end),
        shape_(std::move(shape)),
        segment_(std::move(segment)),
        dev_(dev),
        ino_(ino) {}
  // Borrows the whole of `kept`, which holds shard bytes [0, valid_end).
  ShardMapping(std::shared_ptr<const KeptSegment> kept, int64_t valid_end,
               Shape shape, std::string segment);
  ~ShardMapping();
  ShardMapping(const ShardMapping&) = delete;
  ShardMapping& operator=(const ShardMapping&) = delete;

  // The byte at shard offset `byte_offset`; valid inside the mapped range.
  const char* At(int64_t byte_offset) const {
    return static_cast<const char*>(map_) + (byte_offset - map_offset_);
  }
  // The same byte, for a mapping made writable (MapShardForWrite).
  char* MutableAt(int64_t byte_offset) const {
    return const_cast<char*>(At(byte_offset));
  }
  // The shard's box sizes, as the worker reported them.
  const Shape& shape() const { return shape_; }
  // True when shard bytes [begin, end) are mapped and inside the file, so
  // touching them can neither fault nor read another object.
  bool Covers(int64_t begin, int64_t end) const {
    return map_offset_ <= begin && begin <= end && end <= valid_end_;
  }
  // True while the segment's name still names the object mapped: the shard
  // is held. A worker renames a freed shard's pages away before it reuses
  // them for another shard (transport/shared_memory_arena.h), so a copy out
  // of the mapping is the shard's only if this holds after it.
  bool Current() const;

 private:
  void* map_;
  size_t map_bytes_;
  int64_t map_offset_;  // shard byte offset of map_ (page-aligned)
  int64_t valid_end_;   // shard byte offset just past the usable bytes
  Shape shape_;
  std::string segment_;
  uint64_t dev_;
  uint64_t ino_;
  std::shared_ptr<const KeptSegment> kept_;  // set: map_ is borrowed
};

// NOT_FOUND, as a gRPC read of a freed shard says, unless `mapping` is still
// Current() (checked after each copy out of it).
absl::Status CheckStillHeld(const ShardMapping& mapping, uint64_t shard_id);

// What a MapShard reply says, once ValidateMapShardReply has checked it.
struct SharedSegment {
  // "/name": one POSIX shared-memory object; or, when `file`, the absolute
  // path of a regular file of the worker's --store_dir, mapped read-only.
  std::string name;
  bool file = false;
  int64_t bytes = 0;     // exactly NumElements(shape) * item_bytes
  Shape shape;           // the shard's box sizes: at least one dim, all >= 0
  std::string liveness;  // empty, or a name like `name`
};

// One POSIX shared-memory object: "/name", no other '/', no NUL, within
// NAME_MAX. Anything else could name a path shm_open does not mean. Every
// segment name a worker sends is checked with it before it is opened.
bool IsShmName(absl::string_view name);

// An absolute path of a --store_dir shard file: "/", no empty, "." or ".."
// components, no NUL, within PATH_MAX, ending in ".data". Opened with
// O_NOFOLLOW and only ever read: a worker can name no other kind of file.
bool IsShardFilePath(absl::string_view path);

// Where `segment`'s object is in the file system (what ShardMapping
// watches): /dev/shm/NAME, or the file's path.
std::string SegmentPath(const SharedSegment& segment);

// True when the segment open on `fd` has been unlinked (its worker dropped
// it: a freed shard, a staging block given up).
bool Unlinked(int fd);

// Checks every field of a worker's MapShard `reply` for a caller on host
// `local_host_id` that expects elements of `item_bytes`, before anything is
// opened or mapped. FAILED_PRECONDITION: another host or element size (use
// gRPC). INTERNAL: the reply contradicts itself (see the file comment).
absl::StatusOr<SharedSegment> ValidateMapShardReply(
    const v1::MapShardResponse& reply, absl::string_view local_host_id,
    int64_t item_bytes);

// Maps shard bytes [begin, end) of `segment`, whose object is open on `fd`
// (not taken over), read-only or read-write. The object's size is checked
// with fstat against the whole segment first: touching a mapping past the
// end of its file raises SIGBUS. FAILED_PRECONDITION when it is shorter;
// INVALID_ARGUMENT when [begin, end) is not inside the segment.
absl::StatusOr<std::unique_ptr<ShardMapping>> MapSegmentRange(
    int fd, const SharedSegment& segment, int64_t begin, int64_t end,
    bool writable);

// Maps just the bytes that `box` (shard coordinates) of `segment` touches:
// FAILED_PRECONDITION when the box is not inside the segment's shape.
absl::StatusOr<std::unique_ptr<ShardMapping>> MapSegmentBox(
    int fd, const SharedSegment& segment, const Box& box, int64_t item_bytes);

// Copies `box` of the mapped shard into `target`, after checking it:
// FAILED_PRECONDITION when the mapping's shape differs from
// `expected_shape` (unless that is empty: not known) or the box is not
// inside it; INTERNAL when the box's bytes are not all mapped.
absl::Status CopyBoxFromMapping(const ShardMapping& mapping,
                                const Shape& expected_shape, const Box& box,
                                const ReadTarget& target, int64_t item_bytes);

// Copies the whole shard of `shard_shape` (the metadata's, required) from
// `source` into a writable mapping: FAILED_PRECONDITION when the mapping's
// shape differs, INTERNAL when the shard's bytes are not all mapped.
absl::Status CopyShardToMapping(const ShardMapping& mapping,
                                const Shape& shard_shape,
                                const WriteSource& source, int64_t item_bytes);

// Maps the bytes of `box` (shard coordinates) of shard `shard_id` held by
// the worker behind `channel`. FAILED_PRECONDITION means "use gRPC instead"
// (another host, no segment, an old worker); NOT_FOUND means the shard is
// not held (freed), exactly as a gRPC read would report it.
absl::StatusOr<std::unique_ptr<ShardMapping>> MapShardBox(
    const std::shared_ptr<grpc::Channel>& channel, uint64_t shard_id,
    const Box& box, int64_t item_bytes, absl::Duration timeout,
    absl::string_view capability = {});

// Maps the whole of shard `shard_id` read-write, so that a put on the same
// host fills a shard that is not committed yet straight from its source
// array (one copy) instead of streaming it. FAILED_PRECONDITION: use gRPC.
absl::StatusOr<std::unique_ptr<ShardMapping>> MapShardForWrite(
    const std::shared_ptr<grpc::Channel>& channel, uint64_t shard_id,
    int64_t item_bytes, absl::Duration timeout,
    absl::string_view capability = {});

// Whole-shard mappings kept across reads, so repeated fetches of the same
// shards skip the MapShard call and the page-table set-up. Safe because a
// shard's bytes never change once its tensor is committed, and a freed
// shard's segment name goes at once: before each use (and by the callers,
// after each copy) ShardMapping::Current turns a freed shard into NOT_FOUND,
// exactly as a gRPC read reports it, and a worker that has exited (its flock on
// the liveness segment released) turns into UNAVAILABLE, as a refused
// connection would. A sweeper drops such mappings within a second so their
// memory goes back to the system. Thread-safe.
class ShardMappingCache {
 public:
  explicit ShardMappingCache(size_t max_mappings = 256);
  ~ShardMappingCache();

  // The whole of shard `shard_id` of the worker at `address` (reached
  // through `channel`), mapped read-only. FAILED_PRECONDITION: use gRPC.
  // `capability` lets the worker name the segment (core/capability.h).
  absl::StatusOr<std::shared_ptr<const ShardMapping>> Map(
      const std::string& address, const std::shared_ptr<grpc::Channel>& channel,
      uint64_t shard_id, int64_t item_bytes, absl::Duration timeout,
      absl::string_view capability = {}) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Entry {
    int liveness_fd = -1;  // the worker's liveness lock, to see its exit
    std::shared_ptr<const ShardMapping> mapping;
  };
  static void Close(const Entry& entry);
  void DropFreed() ABSL_LOCKS_EXCLUDED(mu_);

  const size_t max_mappings_;
  absl::Mutex mu_;
  std::map<std::pair<std::string, uint64_t>, Entry> entries_
      ABSL_GUARDED_BY(mu_);
  absl::Notification stop_;
  std::thread sweeper_;
};

// Whole-segment read-only mappings kept by the object's identity (device
// and inode) rather than by name or shard. A worker pulling reshard pieces
// maps every peer shard it reads from; when the peer later reuses those
// pages for another shard (the same object under a new name,
// shared_memory_arena.h), the next pull finds the mapping made and skips
// the page-table set-up and tear-down, about half the cost of a 1 KiB-run
// piece (bench/, figure 3). An entry keeps its object open, so its inode
// cannot be recycled for another object while it is kept; the name is
// checked against it at every use (ShardMapping::Current, after the copy
// too). A sweeper drops, each second, entries whose object has no name left
// (the peer let its pages go: they return to the system then) or that went
// unused for `idle`. Bounded by the bytes mapped and by entries (each
// holds a descriptor): least recently used dropped first. Thread-safe.
class SegmentMappingPool {
 public:
  SegmentMappingPool(int64_t max_bytes, absl::Duration idle,
                     size_t max_entries = 256);
  ~SegmentMappingPool();

  // Shard bytes [begin, end) of `segment`, whose object is open on `fd`
  // (not taken over): from a kept mapping of the same object, or a new one
  // of the whole segment (only [begin, end) populated now). Errors as
  // MapSegmentRange.
  absl::StatusOr<std::unique_ptr<ShardMapping>> Map(
      int fd, const SharedSegment& segment, int64_t begin, int64_t end)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Entries kept now, and their bytes mapped (for tests and reports).
  size_t size() const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t bytes() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Entry {
    std::shared_ptr<const KeptSegment> kept;
    absl::Time last_used;
  };
  void DropReleased() ABSL_LOCKS_EXCLUDED(mu_);
  // Takes the least recently used entry out; the caller drops it outside
  // the lock (the last holder unmaps it).
  std::shared_ptr<const KeptSegment> TakeOldest()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int64_t max_bytes_;
  const absl::Duration idle_;
  const size_t max_entries_;
  mutable absl::Mutex mu_;
  std::map<std::pair<uint64_t, uint64_t>, Entry> entries_ ABSL_GUARDED_BY(mu_);
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Notification stop_;
  std::thread sweeper_;
};

// Byte range [begin, end) of the shard that `box` touches (row-major over
// `shape`); {0, 0} for an empty box.
std::pair<int64_t, int64_t> BoxByteSpan(absl::Span<const int64_t> shape,
                                        const Box& box, int64_t item_bytes);

struct SharedMemoryTransportOptions {
  // Deadline of the MapShard call that names a shard's segment.
  absl::Duration timeout = absl::Minutes(30);
  // Keep whole-shard mappings across reads (ShardMappingCache): a client
  // reads the same shards again and again. Off: map each read's byte span
  // and unmap it after (a worker pulling reshard pieces once).
  bool cache_mappings = true;
  // Without cache_mappings: keep up to this many bytes of peers' whole
  // segments mapped by identity (SegmentMappingPool), so a peer's reused
  // pages are not mapped again. 0: map each read's span and unmap it after.
  int64_t keep_segment_bytes = 0;
};

// ShardTransport over same-host shared memory: reads are one strided copy
// out of the worker's segment, writes one copy into it (MapShardForWrite).
// Shards a same-host worker holds in GPU memory are read through staging
// slots in shared memory (transport/staged_read.h); the transport remembers
// which shards those are.
// FAILED_PRECONDITION whenever the shard cannot be mapped from here: another
// host, a shard in private or device memory, a shape or element size that
// differs from the caller's metadata, or a box outside the mapped shard
// (gRPC then reports the worker's own error). INTERNAL, with no fallback,
// when the worker's reply contradicts itself (see the top of this file).
// Thread-safe.
class SharedMemoryTransport : public ShardTransport {
 public:
  // `channels` (not owned, outlives this) reaches the workers' MapShard.
  SharedMemoryTransport(ChannelCache* channels,
                        SharedMemoryTransportOptions options);

  const std::string& name() const override;
  absl::Status Read(const RemoteShard& shard, const Box& box,
                    const ReadTarget& target) override;
  absl::Status Write(const RemoteShard& shard,
                     const WriteSource& source) override;
  // Rows straight out of kept whole-shard mappings (cache_mappings only; a
  // lookup service reads the same shards again and again); a small shard
  // kept out of shared memory is staged whole and its rows taken from
  // there.
  absl::Status ReadRows(absl::Span<const ShardRows> entries,
                        const RowSink& sink) override;

 private:
  // A read out of the shard's segment (or the worker's word that it has
  // none: a device or private shard is FAILED_PRECONDITION marked
  // IsStagedShard).
  absl::Status ReadMapped(const RemoteShard& shard, const Box& box,
                          const ReadTarget& target);
  // The rows of entry `e`, a shard without a segment, read staged whole.
  absl::Status ReadStagedRows(size_t e, const ShardRows& entry,
                              const RowSink& sink);

  static constexpr size_t kMaxStagedShards = 4096;
  // Largest shard without a segment whose rows are staged whole.
  static constexpr int64_t kMaxStagedRowsShardBytes = int64_t{16} << 20;

  ChannelCache* const channels_;
  const SharedMemoryTransportOptions options_;
  std::unique_ptr<ShardMappingCache> cache_;  // null unless cache_mappings
  std::unique_ptr<SegmentMappingPool> pool_;  // null unless keep_segment_bytes
  StagingMappings staging_mappings_;
  absl::Mutex device_mu_;
  // Shards (address, id) found in GPU memory: read staged, without asking.
  std::set<std::pair<std::string, uint64_t>> staged_shards_
      ABSL_GUARDED_BY(device_mu_);
};

}  // namespace tessera

#endif  // TESSERA_TRANSPORT_SHARED_MEMORY_H_
