#include "transport/shared_memory.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "proto/worker.grpc.pb.h"
#include "rpc/status.h"

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

ShardMapping::~ShardMapping() {
  if (map_ != nullptr) munmap(map_, map_bytes_);
}

std::pair<int64_t, int64_t> BoxByteSpan(absl::Span<const int64_t> shape,
                                        const Box& box, int64_t item_bytes) {
  if (box.NumElements() == 0) return {0, 0};
  int64_t first = 0, last = 0, stride = item_bytes;
  for (size_t d = shape.size(); d-- > 0;) {
    first += box.offsets[d] * stride;
    last += (box.offsets[d] + box.sizes[d] - 1) * stride;
    stride *= shape[d];
  }
  return {first, last + item_bytes};
}

namespace {

// Where a worker keeps a shard: its segment, size and shape.
struct Segment {
  std::string name;
  int64_t bytes = 0;
  Shape shape;
  std::string liveness;  // flock'ed by the worker while it runs
};

// Asks the worker behind `channel` where shard `shard_id` lives.
// FAILED_PRECONDITION: not reachable through shared memory from here.
absl::StatusOr<Segment> FindSegment(
    const std::shared_ptr<grpc::Channel>& channel, uint64_t shard_id,
    int64_t item_bytes, absl::Duration timeout) {
  if (LocalHostId().empty())
    return absl::FailedPreconditionError("no /dev/shm here");
  grpc::ClientContext context;
  SetDeadline(&context, timeout);
  v1::MapShardRequest request;
  request.set_shard_id(shard_id);
  v1::MapShardResponse response;
  grpc::Status rpc =
      v1::Worker::NewStub(channel)->MapShard(&context, request, &response);
  if (rpc.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
    return absl::FailedPreconditionError("worker does not offer shared memory");
  }
  if (!rpc.ok()) return FromGrpcStatus(rpc);
  if (response.host_id() != LocalHostId()) {
    return absl::FailedPreconditionError("worker is on another host");
  }
  if (response.item_bytes() != item_bytes) {
    return absl::FailedPreconditionError(
        "segment does not match the shard's metadata");
  }
  Segment segment;
  segment.name = response.segment();
  segment.bytes = response.bytes();
  segment.shape.assign(response.shape().begin(), response.shape().end());
  segment.liveness = response.liveness();
  return segment;
}

// Maps bytes [begin, end) of `segment` read-only. With `keep_fd`, the open
// descriptor is handed back (to watch for the segment's unlink).
absl::StatusOr<std::unique_ptr<ShardMapping>> MapRange(
    const Segment& segment, uint64_t shard_id, int64_t begin, int64_t end,
    int* keep_fd, bool writable = false) {
  const int fd =
      shm_open(segment.name.c_str(), writable ? O_RDWR : O_RDONLY, 0);
  if (fd < 0) {
    // Unlinked between the RPC and the open: the shard was freed.
    if (errno == ENOENT) {
      return absl::NotFoundError(absl::StrCat(
          "shard ", shard_id, " is not held by this worker (freed)"));
    }
    return absl::FailedPreconditionError(
        absl::StrCat("shm_open ", segment.name, ": ", std::strerror(errno)));
  }
  // Touching a mapping past the file's end raises SIGBUS: check the size
  // the worker reported against the file itself.
  struct stat st {};
  if (fstat(fd, &st) != 0 || st.st_size < end) {
    close(fd);
    return absl::FailedPreconditionError(absl::StrCat(
        "segment ", segment.name, " is smaller than the shard it names"));
  }
  const int64_t page = sysconf(_SC_PAGESIZE);
  const int64_t map_offset = begin / page * page;
  const size_t map_bytes =
      static_cast<size_t>(std::max<int64_t>(end - map_offset, 1));
  // Prefault the page tables in one go for large spans; small ones fault
  // lazily.
  const int populate = map_bytes >= (1 << 20) ? MAP_POPULATE : 0;
  void* map =
      mmap(nullptr, map_bytes, writable ? PROT_READ | PROT_WRITE : PROT_READ,
           MAP_SHARED | populate, fd, map_offset);
  const int map_errno = errno;
  if (keep_fd != nullptr && map != MAP_FAILED) {
    *keep_fd = fd;
  } else {
    close(fd);
  }
  if (map == MAP_FAILED) {
    return absl::FailedPreconditionError(
        absl::StrCat("mmap ", segment.name, ": ", std::strerror(map_errno)));
  }
  return std::make_unique<ShardMapping>(map, map_bytes, map_offset,
                                        segment.shape);
}

// True when the segment behind `fd` has been unlinked (its shard freed).
bool Unlinked(int fd) {
  struct stat st {};
  return fstat(fd, &st) != 0 || st.st_nlink == 0;
}

// True when the worker that held an exclusive flock on `liveness_fd` is gone
// (the kernel released its lock when it died).
bool WorkerGone(int liveness_fd) {
  if (flock(liveness_fd, LOCK_SH | LOCK_NB) != 0)
    return false;  // still held: alive
  flock(liveness_fd, LOCK_UN);
  return true;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShardMapping>> MapShardBox(
    const std::shared_ptr<grpc::Channel>& channel, uint64_t shard_id,
    const Box& box, int64_t item_bytes, absl::Duration timeout) {
  TESSERA_ASSIGN_OR_RETURN(Segment segment,
                           FindSegment(channel, shard_id, item_bytes, timeout));
  if (segment.shape.size() != box.rank()) {
    return absl::FailedPreconditionError(
        "segment does not match the shard's metadata");
  }
  for (size_t d = 0; d < segment.shape.size(); ++d) {
    if (box.offsets[d] < 0 || box.sizes[d] < 0 ||
        box.offsets[d] + box.sizes[d] > segment.shape[d]) {
      return absl::FailedPreconditionError(
          "region is outside the mapped shard");
    }
  }
  const auto [begin, end] = BoxByteSpan(segment.shape, box, item_bytes);
  if (end > segment.bytes)
    return absl::FailedPreconditionError("segment is too small");
  return MapRange(segment, shard_id, begin, end, nullptr);
}

absl::StatusOr<std::unique_ptr<ShardMapping>> MapShardForWrite(
    const std::shared_ptr<grpc::Channel>& channel, uint64_t shard_id,
    int64_t item_bytes, absl::Duration timeout) {
  TESSERA_ASSIGN_OR_RETURN(Segment segment,
                           FindSegment(channel, shard_id, item_bytes, timeout));
  return MapRange(segment, shard_id, 0, segment.bytes, nullptr,
                  /*writable=*/true);
}

ShardMappingCache::ShardMappingCache(size_t max_mappings)
    : max_mappings_(max_mappings) {
  sweeper_ = std::thread([this] {
    while (!stop_.WaitForNotificationWithTimeout(absl::Seconds(1))) DropFreed();
  });
}

ShardMappingCache::~ShardMappingCache() {
  stop_.Notify();
  sweeper_.join();
  absl::MutexLock lock(&mu_);
  for (auto& [key, entry] : entries_) Close(entry);
}

void ShardMappingCache::Close(const Entry& entry) {
  close(entry.fd);
  close(entry.liveness_fd);
}

void ShardMappingCache::DropFreed() {
  absl::MutexLock lock(&mu_);
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (Unlinked(it->second.fd) || WorkerGone(it->second.liveness_fd)) {
      Close(it->second);
      entries_.erase(it++);
    } else {
      ++it;
    }
  }
}

absl::StatusOr<std::shared_ptr<const ShardMapping>> ShardMappingCache::Map(
    const std::string& address, const std::shared_ptr<grpc::Channel>& channel,
    uint64_t shard_id, int64_t item_bytes, absl::Duration timeout) {
  const std::pair<std::string, uint64_t> key(address, shard_id);
  {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(key);
    if (it != entries_.end()) {
      // A mapping outlives its worker: ask the worker's lock, as a gRPC read
      // would find the connection refused.
      if (WorkerGone(it->second.liveness_fd)) {
        Close(it->second);
        entries_.erase(it);
        return absl::UnavailableError(absl::StrCat(
            "worker at ", address, " has exited (its shared memory is stale)"));
      }
      if (!Unlinked(it->second.fd)) return it->second.mapping;
      Close(it->second);
      entries_.erase(it);
      return absl::NotFoundError(absl::StrCat(
          "shard ", shard_id, " is not held by this worker (freed)"));
    }
  }
  TESSERA_ASSIGN_OR_RETURN(Segment segment,
                           FindSegment(channel, shard_id, item_bytes, timeout));
  if (segment.liveness.empty()) {
    // No way to watch this worker: map for this read only.
    TESSERA_ASSIGN_OR_RETURN(
        std::unique_ptr<ShardMapping> once,
        MapRange(segment, shard_id, 0, segment.bytes, nullptr));
    return std::shared_ptr<const ShardMapping>(std::move(once));
  }
  const int liveness_fd = shm_open(segment.liveness.c_str(), O_RDONLY, 0);
  if (liveness_fd < 0)
    return absl::FailedPreconditionError("worker's liveness lock is missing");
  int fd = -1;
  absl::StatusOr<std::unique_ptr<ShardMapping>> mapping =
      MapRange(segment, shard_id, 0, segment.bytes, &fd);
  if (!mapping.ok()) {
    close(liveness_fd);
    return mapping.status();
  }
  std::shared_ptr<const ShardMapping> shared = *std::move(mapping);
  absl::MutexLock lock(&mu_);
  if (entries_.size() >= max_mappings_) {
    Close(entries_.begin()->second);
    entries_.erase(entries_.begin());
  }
  auto [it, inserted] = entries_.emplace(key, Entry{fd, liveness_fd, shared});
  if (!inserted)
    Close(
        Entry{fd, liveness_fd, nullptr});  // another thread mapped it meanwhile
  return it->second.mapping;
}

}  // namespace tessera
