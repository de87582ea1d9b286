// Same-host reads of shards a worker holds outside shared memory: in GPU
// memory, or small host shards in private memory. The worker cannot hand
// their bytes out as a shared-memory segment, so for a client on its host
// it stages them (Worker.StageRead): each stream gets two page-locked slots
// in a fresh shared-memory segment; the worker copies a chunk from the device
// (or its memory) into one slot at the link's full speed while the client
// copies the other slot out. Several streams run at once, each over its own
// part of the box. SharedMemoryTransport uses this when a MapShard reply
// names a device or says `staged` instead of a segment (IsStagedShard), so
// such reads count as "shm": every shard is readable through shared memory
// on its host.
//
// The worker's replies are outside input: the segment is checked like a
// MapShard reply's (name, host, size by fstat), and every chunk reply must
// name the slot asked for and exactly its bytes.
#ifndef TESSERA_TRANSPORT_STAGED_READ_H_
#define TESSERA_TRANSPORT_STAGED_READ_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/box.h"
#include "transport/shard_transport.h"

namespace tessera {

// Marks a FAILED_PRECONDITION of a MapShard whose shard this host's worker
// holds outside shared memory (`where`: its GPU, "cuda:N", or "host" for
// private host memory): read it with StagedRead.
absl::Status StagedShardError(absl::string_view where);
bool IsStagedShard(const absl::Status& status);
// The `where` of a StagedShardError ("host", "cuda:N"); empty for another.
std::string StagedShardWhere(const absl::Status& status);

// A worker's staging segment, mapped read-only; unmapped on destruction.
class StagingSegment {
 public:
  StagingSegment(const char* data, size_t bytes) : data_(data), bytes_(bytes) {}
  ~StagingSegment();
  StagingSegment(const StagingSegment&) = delete;
  StagingSegment& operator=(const StagingSegment&) = delete;
  const char* data() const { return data_; }
  int64_t bytes() const { return static_cast<int64_t>(bytes_); }

 private:
  const char* data_;
  size_t bytes_;
};

// Staging segments kept mapped across reads: a worker lends the same
// segments to stream after stream, so mapping one (and faulting its pages
// in) once pays. A segment its worker has dropped (unlinked) is unmapped at
// the next lookup; at most kMaxSegments are kept. Thread-safe.
class StagingMappings {
 public:
  static constexpr size_t kMaxSegments = 64;
  ~StagingMappings();

  // Segment `name`, mapped whole; its size is checked with fstat against
  // `bytes` first (touching a mapping past the end of its file faults).
  absl::StatusOr<std::shared_ptr<const StagingSegment>> Map(
      const std::string& name, int64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Entry {
    int fd = -1;  // open, to see the unlink
    std::shared_ptr<const StagingSegment> segment;
  };
  absl::Mutex mu_;
  std::map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);
};

struct StagedReadOptions {
  absl::Duration timeout = absl::Minutes(30);
  int64_t slot_bytes = int64_t{8} << 20;         // per slot; two per stream
  int max_streams = 8;                           // streams per read
  int64_t min_stream_bytes = int64_t{16} << 20;  // smaller parts share one
  StagingMappings* mappings = nullptr;  // kept mappings; null: map per read
};

// Reads `box` (shard coordinates) of `shard`, held in GPU memory by a worker
// on this host, into `target`. FAILED_PRECONDITION when staging is not
// possible (another host, a worker without staging or out of staging
// memory, an empty box): read over gRPC instead. NOT_FOUND for a freed
// shard; INTERNAL for a reply that contradicts itself.
absl::Status StagedRead(const std::shared_ptr<grpc::Channel>& channel,
                        const RemoteShard& shard, const Box& box,
                        const ReadTarget& target,
                        const StagedReadOptions& options);

}  // namespace tessera

#endif  // TESSERA_TRANSPORT_STAGED_READ_H_
