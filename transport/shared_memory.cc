#include "transport/shared_memory.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/checked_math.h"
#include "core/limits.h"
#include "core/status_macros.h"
#include "core/strided_copy.h"
#include "proto/worker.grpc.pb.h"
#include "rpc/call.h"
#include "rpc/security.h"
#include "rpc/status.h"
#include "transport/grpc_transport.h"
#include "transport/staged_read.h"

namespace tessera {

// A whole segment mapped read-only, with its object held open so that its
// inode names it (and nothing else) for as long as this lives.
struct KeptSegment {
  KeptSegment(void* map, size_t bytes, int fd, uint64_t dev, uint64_t ino)
      : map(map), bytes(bytes), fd(fd), dev(dev), ino(ino) {}
  ~KeptSegment() {
    munmap(map, bytes);
    close(fd);
  }
  KeptSegment(const KeptSegment&) = delete;
  KeptSegment& operator=(const KeptSegment&) = delete;

  void* const map;
  const size_t bytes;
  const int fd;
  const uint64_t dev;
  const uint64_t ino;
};

ShardMapping::ShardMapping(std::shared_ptr<const KeptSegment> kept,
                           int64_t valid_end, Shape shape, std::string segment)
    : ShardMapping(kept->map, kept->bytes, 0, valid_end, std::move(shape),
                   std::move(segment), kept->dev, kept->ino) {
  kept_ = std::move(kept);
}

ShardMapping::~ShardMapping() {
  if (map_ != nullptr && kept_ == nullptr) munmap(map_, map_bytes_);
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

// How much of a new mapping one MADV_POPULATE_READ call sets up.
constexpr int64_t kPopulateStep = int64_t{4} << 20;

// INTERNAL: a MapShard reply that cannot be true.
absl::Status InconsistentReply(absl::string_view what) {
  return absl::InternalError(
      absl::StrCat("worker's MapShard reply is inconsistent: ", what));
}

// Asks the worker behind `channel` where shard `shard_id` lives, and checks
// its answer. FAILED_PRECONDITION: not reachable through shared memory from
// here.
absl::StatusOr<SharedSegment> FindSegment(
    const std::shared_ptr<grpc::Channel>& channel, uint64_t shard_id,
    int64_t item_bytes, absl::Duration timeout, absl::string_view capability) {
  if (LocalHostId().empty())
    return absl::FailedPreconditionError("no /dev/shm here");
  v1::MapShardRequest request;
  request.set_shard_id(shard_id);
  v1::MapShardResponse response;
  const absl::Status rpc =
      DataCall(timeout, capability, [&](grpc::ClientContext* context) {
        return v1::Worker::NewStub(channel)->MapShard(context, request,
                                                      &response);
      });
  if (absl::IsUnimplemented(rpc)) {
    return absl::FailedPreconditionError("worker does not offer shared memory");
  }
  if (!rpc.ok()) return rpc;
  absl::StatusOr<SharedSegment> segment =
      ValidateMapShardReply(response, LocalHostId(), item_bytes);
  if (!segment.ok()) {
    return Annotate(segment.status(), absl::StrCat("mapping shard ", shard_id));
  }
  return segment;
}

// Opens the file of shard `shard_id` that a worker named: only where such a
// file belongs (DIR/shards/<the shard's id in hex>.data), with no symlink
// on the way, never blocking (a FIFO), and only when it is a regular file.
// A worker, even a hostile one, can make this process read no other file.
absl::StatusOr<int> OpenShardFile(const std::string& path, uint64_t shard_id) {
  char expected[32];
  snprintf(expected, sizeof(expected), "/shards/%016llx.data",
           static_cast<unsigned long long>(shard_id));
  if (!absl::EndsWith(path, expected)) {
    return InconsistentReply(absl::StrCat("the file of shard ", shard_id,
                                          " is not named ", expected + 1));
  }
  open_how how{};
  how.flags = O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC;
  how.resolve = RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
  long fd = syscall(SYS_openat2, AT_FDCWD, path.c_str(), &how, sizeof(how));
  if (fd < 0 && errno == ENOSYS) {  // before Linux 5.6: the last part only
    fd = open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  }
  if (fd < 0) {
    if (errno == ENOENT) {
      return absl::NotFoundError(absl::StrCat(
          "shard ", shard_id, " is not held by this worker (freed)"));
    }
    return absl::FailedPreconditionError(
        absl::StrCat("open ", path, ": ", std::strerror(errno)));
  }
  struct stat st {};
  if (fstat(static_cast<int>(fd), &st) != 0 || !S_ISREG(st.st_mode)) {
    close(static_cast<int>(fd));
    return InconsistentReply(
        absl::StrCat("the file of shard ", shard_id, " is not a regular file"));
  }
  return static_cast<int>(fd);
}

// Opens the segment's object. NOT_FOUND when it is gone (the shard freed
// between the RPC and the open).
absl::StatusOr<int> OpenSegment(const SharedSegment& segment, uint64_t shard_id,
                                bool writable) {
  if (segment.file && writable) {
    // Its record and CRC are the worker's to keep: written over gRPC.
    return absl::FailedPreconditionError(absl::StrCat(
        "shard ", shard_id, " is in a file of the worker's --store_dir"));
  }
  if (segment.file) return OpenShardFile(segment.name, shard_id);
  const int fd = shm_open(segment.name.c_str(),
                          (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC, 0);
  if (fd >= 0) return fd;
  if (errno == ENOENT) {
    return absl::NotFoundError(absl::StrCat(
        "shard ", shard_id, " is not held by this worker (freed)"));
  }
  return absl::FailedPreconditionError(
      absl::StrCat(segment.file ? "open " : "shm_open ", segment.name, ": ",
                   std::strerror(errno)));
}

// Maps bytes [begin, end) of `segment`.
absl::StatusOr<std::unique_ptr<ShardMapping>> MapRange(
    const SharedSegment& segment, uint64_t shard_id, int64_t begin, int64_t end,
    bool writable = false) {
  TESSERA_ASSIGN_OR_RETURN(const int fd,
                           OpenSegment(segment, shard_id, writable));
  absl::StatusOr<std::unique_ptr<ShardMapping>> mapping =
      MapSegmentRange(fd, segment, begin, end, writable);
  close(fd);  // the mapping keeps the object; Current() watches its name
  return mapping;
}

// FAILED_PRECONDITION unless `box` lies in a shard of `shape` (the worker's
// own answer comes from gRPC then).
absl::Status CheckInside(const Shape& shape, const Box& box) {
  if (shape.size() != box.rank() || box.offsets.size() != box.sizes.size()) {
    return absl::FailedPreconditionError(
        "segment does not match the shard's metadata");
  }
  for (size_t d = 0; d < shape.size(); ++d) {
    if (box.offsets[d] < 0 || box.sizes[d] < 0 ||
        box.offsets[d] > shape[d] - box.sizes[d]) {
      return absl::FailedPreconditionError(
          "region is outside the mapped shard");
    }
  }
  return absl::OkStatus();
}

// Copies `box` of a shard of `shape`, whose byte 0 is at `base`, to
// `target`: one strided copy into a host array, or bounded chunks to a sink.
absl::Status CopyOut(const char* base, const Shape& shape, const Box& box,
                     const ReadTarget& target, size_t item) {
  const int64_t total = box.NumElements();
  if (total == 0) return absl::OkStatus();
  if (target.is_host_array()) {
    CopyBox(base, shape, box.offsets, target.data(), target.shape(),
            target.offsets(), box.sizes, item);
    target.Landed(total * static_cast<int64_t>(item));
    return absl::OkStatus();
  }
  const int64_t per_chunk =
      std::max<int64_t>(1, kChunkBytes / static_cast<int64_t>(item));
  std::vector<char> chunk(static_cast<size_t>(std::min(total, per_chunk)) *
                          item);
  for (int64_t first = 0; first < total;) {
    const int64_t n = std::min(per_chunk, total - first);
    CopyBoxToFlatRange(base, shape, box.offsets, box.sizes, first, n,
                       chunk.data(), item);
    TESSERA_RETURN_IF_ERROR(
        target.Deliver(box.sizes, first, n, chunk.data(), item));
    first += n;
  }
  return absl::OkStatus();
}

absl::Status CheckShape(const Shape& found, const Shape& expected) {
  if (!expected.empty() && !SameDims(found, expected)) {
    return absl::FailedPreconditionError(
        "segment's shape differs from the metadata");
  }
  return absl::OkStatus();
}

// True when the worker that held an exclusive flock on `liveness_fd` is gone
// (the kernel released its lock when it died).
bool WorkerGone(int liveness_fd) {
  if (flock(liveness_fd, LOCK_SH | LOCK_NB) != 0)
    return false;  // still held: alive
  flock(liveness_fd, LOCK_UN);
  return true;
}

// Checks that shard bytes [begin, end) lie in `segment` and that its
// object, open on `fd`, is as long as the worker said: touching a mapping
// past the file's end raises SIGBUS. The object's stat when it is.
absl::StatusOr<struct stat> CheckMappable(int fd, const SharedSegment& segment,
                                          int64_t begin, int64_t end) {
  if (begin < 0 || begin > end || end > segment.bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("bytes [", begin, ", ", end, ") are not inside the ",
                     segment.bytes, "-byte segment ", segment.name));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("fstat ", segment.name, ": ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("segment ", segment.name, " is not a regular file"));
  }
  if (st.st_size < segment.bytes) {
    return absl::FailedPreconditionError(absl::StrCat(
        "segment ", segment.name, " is smaller than the shard it names (",
        static_cast<int64_t>(st.st_size), " of ", segment.bytes, " bytes)"));
  }
  return st;
}

// Maps the bytes of `box` of shard `shard_id` held by the worker behind
// `channel`: from `pool` when given, else a mapping of the box's span alone.
absl::StatusOr<std::unique_ptr<ShardMapping>> MapBox(
    SegmentMappingPool* pool, const std::shared_ptr<grpc::Channel>& channel,
    uint64_t shard_id, const Box& box, int64_t item_bytes,
    absl::Duration timeout, absl::string_view capability) {
  TESSERA_ASSIGN_OR_RETURN(
      SharedSegment segment,
      FindSegment(channel, shard_id, item_bytes, timeout, capability));
  TESSERA_RETURN_IF_ERROR(CheckInside(segment.shape, box));
  TESSERA_ASSIGN_OR_RETURN(const int fd,
                           OpenSegment(segment, shard_id, /*writable=*/false));
  absl::StatusOr<std::unique_ptr<ShardMapping>> mapping;
  if (pool != nullptr) {
    const auto [begin, end] = BoxByteSpan(segment.shape, box, item_bytes);
    mapping = pool->Map(fd, segment, begin, end);
  } else {
    mapping = MapSegmentBox(fd, segment, box, item_bytes);
  }
  close(fd);
  return mapping;
}

}  // namespace

bool IsShmName(absl::string_view name) {
  return name.size() >= 2 && name.size() <= 255 && name[0] == '/' &&
         name.find('/', 1) == absl::string_view::npos &&
         name.find('\0') == absl::string_view::npos;
}

bool IsShardFilePath(absl::string_view path) {
  if (path.size() < 2 || path.size() >= PATH_MAX || path[0] != '/' ||
      !absl::EndsWith(path, ".data") ||
      path.find('\0') != absl::string_view::npos) {
    return false;
  }
  for (absl::string_view part : absl::StrSplit(path.substr(1), '/')) {
    if (part.empty() || part == "." || part == "..") return false;
  }
  return true;
}

std::string SegmentPath(const SharedSegment& segment) {
  return segment.file ? segment.name : "/dev/shm" + segment.name;
}

bool ShardMapping::Current() const {
  if (segment_.empty()) return true;
  struct stat st {};
  return stat(segment_.c_str(), &st) == 0 &&
         static_cast<uint64_t>(st.st_dev) == dev_ &&
         static_cast<uint64_t>(st.st_ino) == ino_ && st.st_nlink > 0;
}

absl::Status CheckStillHeld(const ShardMapping& mapping, uint64_t shard_id) {
  if (mapping.Current()) return absl::OkStatus();
  return absl::NotFoundError(
      absl::StrCat("shard ", shard_id,
                   " is not held by this worker (freed during the read)"));
}

bool Unlinked(int fd) {
  struct stat st {};
  return fstat(fd, &st) != 0 || st.st_nlink == 0;
}

absl::StatusOr<SharedSegment> ValidateMapShardReply(
    const v1::MapShardResponse& reply, absl::string_view local_host_id,
    int64_t item_bytes) {
  if (item_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("element size ", item_bytes, " is not positive"));
  }
  if (local_host_id.empty() || reply.host_id() != local_host_id) {
    return absl::FailedPreconditionError("worker is on another host");
  }
  if (reply.item_bytes() != item_bytes) {
    return absl::FailedPreconditionError(absl::StrCat(
        "segment does not match the shard's metadata (elements of ",
        reply.item_bytes(), " bytes, expected ", item_bytes, ")"));
  }
  if (!reply.device().empty()) return StagedShardError(reply.device());
  if (reply.staged()) return StagedShardError("host");
  if (reply.file() ? !IsShardFilePath(reply.segment())
                   : !IsShmName(reply.segment())) {
    return InconsistentReply(
        reply.file() ? "the segment is not the path of a shard file"
                     : "the segment name is not one shared-memory object");
  }
  if (!reply.liveness().empty() && !IsShmName(reply.liveness())) {
    return InconsistentReply(
        "the liveness name is not one shared-memory object");
  }
  SharedSegment segment;
  segment.shape.assign(reply.shape().begin(), reply.shape().end());
  if (segment.shape.empty()) return InconsistentReply("the shard has no dims");
  int64_t bytes = item_bytes;
  for (int64_t d : segment.shape) {
    if (d < 0) {
      return InconsistentReply(absl::StrCat(
          "shape ", ShapeToString(segment.shape), " has a negative size"));
    }
    absl::StatusOr<int64_t> product = CheckedMul(bytes, d);
    if (!product.ok()) {
      return InconsistentReply(absl::StrCat(
          "shape ", ShapeToString(segment.shape), " overflows a byte size"));
    }
    bytes = *product;
  }
  if (reply.bytes() != bytes) {
    return InconsistentReply(
        absl::StrCat("a segment of ", reply.bytes(), " bytes for shape ",
                     ShapeToString(segment.shape), " of ", item_bytes,
                     "-byte elements, which needs ", bytes));
  }
  segment.name = reply.segment();
  segment.file = reply.file();
  segment.bytes = bytes;
  segment.liveness = reply.liveness();
  return segment;
}

absl::StatusOr<std::unique_ptr<ShardMapping>> MapSegmentRange(
    int fd, const SharedSegment& segment, int64_t begin, int64_t end,
    bool writable) {
  TESSERA_ASSIGN_OR_RETURN(const struct stat st,
                           CheckMappable(fd, segment, begin, end));
  const int64_t page = sysconf(_SC_PAGESIZE);
  const int64_t map_offset = begin / page * page;
  const size_t map_bytes =
      static_cast<size_t>(std::max<int64_t>(end - map_offset, 1));
  // Prefault the page tables in one go for spans of a chunk or more; small
  // ones fault lazily.
  const int populate =
      static_cast<int64_t>(map_bytes) >= kChunkBytes ? MAP_POPULATE : 0;
  void* map =
      mmap(nullptr, map_bytes, writable ? PROT_READ | PROT_WRITE : PROT_READ,
           MAP_SHARED | populate, fd, map_offset);
  if (map == MAP_FAILED) {
    return absl::FailedPreconditionError(
        absl::StrCat("mmap ", segment.name, ": ", std::strerror(errno)));
  }
  return std::make_unique<ShardMapping>(
      map, map_bytes, map_offset, end, segment.shape, SegmentPath(segment),
      static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino));
}

absl::StatusOr<std::unique_ptr<ShardMapping>> MapSegmentBox(
    int fd, const SharedSegment& segment, const Box& box, int64_t item_bytes) {
  TESSERA_RETURN_IF_ERROR(CheckInside(segment.shape, box));
  const auto [begin, end] = BoxByteSpan(segment.shape, box, item_bytes);
  return MapSegmentRange(fd, segment, begin, end, /*writable=*/false);
}

absl::Status CopyBoxFromMapping(const ShardMapping& mapping,
                                const Shape& expected_shape, const Box& box,
                                const ReadTarget& target, int64_t item_bytes) {
  TESSERA_RETURN_IF_ERROR(CheckShape(mapping.shape(), expected_shape));
  TESSERA_RETURN_IF_ERROR(CheckInside(mapping.shape(), box));
  if (box.NumElements() == 0) return absl::OkStatus();
  const auto [begin, end] = BoxByteSpan(mapping.shape(), box, item_bytes);
  if (!mapping.Covers(begin, end)) {
    return absl::InternalError(
        absl::StrCat("bytes [", begin, ", ", end, ") of box ", box.ToString(),
                     " are not all in the mapped segment"));
  }
  // At(0) is the shard's byte 0; only the box's mapped span is touched.
  return CopyOut(mapping.At(0), mapping.shape(), box, target,
                 static_cast<size_t>(item_bytes));
}

absl::Status CopyShardToMapping(const ShardMapping& mapping,
                                const Shape& shard_shape,
                                const WriteSource& source, int64_t item_bytes) {
  if (shard_shape.empty()) {
    return absl::FailedPreconditionError(
        "writing through shared memory needs the shard's shape");
  }
  TESSERA_RETURN_IF_ERROR(CheckShape(mapping.shape(), shard_shape));
  const int64_t bytes = WholeBox(shard_shape).NumElements() * item_bytes;
  if (bytes == 0) return absl::OkStatus();
  if (!mapping.Covers(0, bytes)) {
    return absl::InternalError(absl::StrCat(
        "the ", bytes, "-byte shard is not all in the mapped segment"));
  }
  CopyBox(source.data, source.shape, source.offsets, mapping.MutableAt(0),
          shard_shape, std::vector<int64_t>(shard_shape.size(), 0), shard_shape,
          static_cast<size_t>(item_bytes));
  source.Sent(bytes);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ShardMapping>> MapShardBox(
    const std::shared_ptr<grpc::Channel>& channel, uint64_t shard_id,
    const Box& box, int64_t item_bytes, absl::Duration timeout,
    absl::string_view capability) {
  return MapBox(/*pool=*/nullptr, channel, shard_id, box, item_bytes, timeout,
                capability);
}

absl::StatusOr<std::unique_ptr<ShardMapping>> MapShardForWrite(
    const std::shared_ptr<grpc::Channel>& channel, uint64_t shard_id,
    int64_t item_bytes, absl::Duration timeout, absl::string_view capability) {
  TESSERA_ASSIGN_OR_RETURN(
      SharedSegment segment,
      FindSegment(channel, shard_id, item_bytes, timeout, capability));
  return MapRange(segment, shard_id, 0, segment.bytes, /*writable=*/true);
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

void ShardMappingCache::Close(const Entry& entry) { close(entry.liveness_fd); }

void ShardMappingCache::DropFreed() {
  absl::MutexLock lock(&mu_);
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (!it->second.mapping->Current() || WorkerGone(it->second.liveness_fd)) {
      Close(it->second);
      entries_.erase(it++);
    } else {
      ++it;
    }
  }
}

absl::StatusOr<std::shared_ptr<const ShardMapping>> ShardMappingCache::Map(
    const std::string& address, const std::shared_ptr<grpc::Channel>& channel,
    uint64_t shard_id, int64_t item_bytes, absl::Duration timeout,
    absl::string_view capability) {
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
      if (it->second.mapping->Current()) return it->second.mapping;
      Close(it->second);
      entries_.erase(it);
      return absl::NotFoundError(absl::StrCat(
          "shard ", shard_id, " is not held by this worker (freed)"));
    }
  }
  TESSERA_ASSIGN_OR_RETURN(
      SharedSegment segment,
      FindSegment(channel, shard_id, item_bytes, timeout, capability));
  if (segment.liveness.empty()) {
    // No way to watch this worker: map for this read only.
    TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<ShardMapping> once,
                             MapRange(segment, shard_id, 0, segment.bytes));
    return std::shared_ptr<const ShardMapping>(std::move(once));
  }
  const int liveness_fd =
      shm_open(segment.liveness.c_str(), O_RDONLY | O_CLOEXEC, 0);
  if (liveness_fd < 0)
    return absl::FailedPreconditionError("worker's liveness lock is missing");
  absl::StatusOr<std::unique_ptr<ShardMapping>> mapping =
      MapRange(segment, shard_id, 0, segment.bytes);
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
  auto [it, inserted] = entries_.emplace(key, Entry{liveness_fd, shared});
  if (!inserted)
    Close(Entry{liveness_fd, nullptr});  // another thread mapped it meanwhile
  return it->second.mapping;
}

SegmentMappingPool::SegmentMappingPool(int64_t max_bytes, absl::Duration idle,
                                       size_t max_entries)
    : max_bytes_(max_bytes), idle_(idle), max_entries_(max_entries) {
  sweeper_ = std::thread([this] {
    while (!stop_.WaitForNotificationWithTimeout(absl::Seconds(1))) {
      DropReleased();
    }
  });
}

SegmentMappingPool::~SegmentMappingPool() {
  stop_.Notify();
  sweeper_.join();
}

void SegmentMappingPool::DropReleased() {
  const absl::Time now = absl::Now();
  std::vector<std::shared_ptr<const KeptSegment>> dropped;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = entries_.begin(); it != entries_.end();) {
      struct stat st {};
      const bool named =
          fstat(it->second.kept->fd, &st) == 0 && st.st_nlink > 0;
      if (!named || now - it->second.last_used >= idle_) {
        bytes_ -= static_cast<int64_t>(it->second.kept->bytes);
        dropped.push_back(std::move(it->second.kept));
        entries_.erase(it++);
      } else {
        ++it;
      }
    }
  }
  // `dropped` unmaps here, outside the lock.
}

std::shared_ptr<const KeptSegment> SegmentMappingPool::TakeOldest() {
  auto oldest = entries_.begin();
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->second.last_used < oldest->second.last_used) oldest = it;
  }
  bytes_ -= static_cast<int64_t>(oldest->second.kept->bytes);
  std::shared_ptr<const KeptSegment> taken = std::move(oldest->second.kept);
  entries_.erase(oldest);
  return taken;
}

size_t SegmentMappingPool::size() const {
  absl::MutexLock lock(&mu_);
  return entries_.size();
}

int64_t SegmentMappingPool::bytes() const {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

absl::StatusOr<std::unique_ptr<ShardMapping>> SegmentMappingPool::Map(
    int fd, const SharedSegment& segment, int64_t begin, int64_t end) {
  TESSERA_ASSIGN_OR_RETURN(const struct stat st,
                           CheckMappable(fd, segment, begin, end));
  const std::pair<uint64_t, uint64_t> key(static_cast<uint64_t>(st.st_dev),
                                          static_cast<uint64_t>(st.st_ino));
  const size_t whole = static_cast<size_t>(std::max<int64_t>(segment.bytes, 1));
  std::shared_ptr<const KeptSegment> kept;
  {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(key);
    if (it != entries_.end() && it->second.kept->bytes >= whole) {
      it->second.last_used = absl::Now();
      kept = it->second.kept;
    }
  }
  const bool fresh = kept == nullptr;
  if (fresh) {
    const int own_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (own_fd < 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("dup ", segment.name, ": ", std::strerror(errno)));
    }
    void* map = mmap(nullptr, whole, PROT_READ, MAP_SHARED, own_fd, 0);
    if (map == MAP_FAILED) {
      const int error = errno;
      close(own_fd);
      return absl::FailedPreconditionError(
          absl::StrCat("mmap ", segment.name, ": ", std::strerror(error)));
    }
    kept = std::make_shared<const KeptSegment>(map, whole, own_fd, key.first,
                                               key.second);
    // Entries pushed out are unmapped outside the lock, as this returns.
    std::vector<std::shared_ptr<const KeptSegment>> dropped;
    if (static_cast<int64_t>(whole) <= max_bytes_) {
      absl::MutexLock lock(&mu_);
      auto [it, inserted] = entries_.try_emplace(key);
      if (!inserted) {
        bytes_ -= static_cast<int64_t>(it->second.kept->bytes);
        dropped.push_back(std::move(it->second.kept));
      }
      it->second = Entry{kept, absl::Now()};
      bytes_ += static_cast<int64_t>(whole);
      while (bytes_ > max_bytes_ || entries_.size() > max_entries_) {
        dropped.push_back(TakeOldest());
      }
    }
  }
#ifdef MADV_POPULATE_READ
  // A new mapping sets up the page tables of the span in one go (as
  // MAP_POPULATE does for a span mapping). Not a kept one: it mostly has
  // them already (workers reuse freed shard pages), and walking every page
  // again cost a fifth of a reshard's copy time; pages it lacks fault in
  // a few dozen at a time.
  // In steps: the call holds the process's mapping lock, and one call over
  // a whole shard held up the other pulls' mmaps for its full length (a
  // reshard's three pulls per worker then ran one after another).
  const int64_t page = sysconf(_SC_PAGESIZE);
  const int64_t first = begin / page * page;
  if (fresh && end - first >= kChunkBytes) {
    for (int64_t at = first; at < end; at += kPopulateStep) {
      madvise(static_cast<char*>(kept->map) + at,
              static_cast<size_t>(std::min(kPopulateStep, end - at)),
              MADV_POPULATE_READ);
    }
  }
#endif
  return std::make_unique<ShardMapping>(std::move(kept), segment.bytes,
                                        segment.shape, SegmentPath(segment));
}

SharedMemoryTransport::SharedMemoryTransport(
    ChannelCache* channels, SharedMemoryTransportOptions options)
    : channels_(channels),
      options_(options),
      cache_(options.cache_mappings ? std::make_unique<ShardMappingCache>()
                                    : nullptr),
      pool_(!options.cache_mappings && options.keep_segment_bytes > 0
                ? std::make_unique<SegmentMappingPool>(
                      options.keep_segment_bytes, absl::Seconds(30))
                : nullptr) {}

const std::string& SharedMemoryTransport::name() const {
  static const std::string* name = new std::string("shm");
  return *name;
}

absl::Status SharedMemoryTransport::Read(const RemoteShard& shard,
                                         const Box& box,
                                         const ReadTarget& target) {
  const ShardLocation& at = shard.location;
  const std::pair<std::string, uint64_t> key(at.address, at.shard_id);
  bool on_device = false;
  {
    absl::MutexLock lock(&device_mu_);
    on_device = staged_shards_.count(key) > 0;
  }
  if (!on_device) {
    absl::Status status = ReadMapped(shard, box, target);
    if (!IsStagedShard(status)) return status;
    absl::MutexLock lock(&device_mu_);
    if (staged_shards_.size() >= kMaxStagedShards) staged_shards_.clear();
    staged_shards_.insert(key);
  }
  StagedReadOptions staged;
  staged.timeout = CallTimeout(options_.timeout);
  staged.mappings = &staging_mappings_;
  // A sink takes its ranges in order, from one thread.
  if (!target.is_host_array()) staged.max_streams = 1;
  return StagedRead(channels_->Get(at.address), shard, box, target, staged);
}

absl::Status SharedMemoryTransport::ReadMapped(const RemoteShard& shard,
                                               const Box& box,
                                               const ReadTarget& target) {
  const ShardLocation& at = shard.location;
  if (cache_ != nullptr) {
    TESSERA_ASSIGN_OR_RETURN(
        std::shared_ptr<const ShardMapping> mapping,
        cache_->Map(at.address, channels_->Get(at.address), at.shard_id,
                    shard.item_bytes, CallTimeout(options_.timeout),
                    at.capability));
    TESSERA_RETURN_IF_ERROR(CopyBoxFromMapping(*mapping, shard.shape, box,
                                               target, shard.item_bytes));
    return CheckStillHeld(*mapping, at.shard_id);
  }
  TESSERA_ASSIGN_OR_RETURN(
      std::unique_ptr<ShardMapping> mapping,
      MapBox(pool_.get(), channels_->Get(at.address), at.shard_id, box,
             shard.item_bytes, CallTimeout(options_.timeout), at.capability));
  TESSERA_RETURN_IF_ERROR(
      CopyBoxFromMapping(*mapping, shard.shape, box, target, shard.item_bytes));
  return CheckStillHeld(*mapping, at.shard_id);
}

absl::Status SharedMemoryTransport::ReadStagedRows(size_t e,
                                                   const ShardRows& entry,
                                                   const RowSink& sink) {
  const RemoteShard& shard = entry.shard;
  if (shard.shape.empty()) {
    return absl::FailedPreconditionError("a 0-d shard has no rows");
  }
  const int64_t row_bytes = RowBytes(shard.shape, shard.item_bytes);
  const int64_t bytes = shard.shape[0] * row_bytes;
  // Small shards are the ones kept out of shared memory: the whole shard
  // staged once, its rows handed on from there. A large (GPU) one is left
  // to the worker's own row gather.
  if (bytes > kMaxStagedRowsShardBytes) {
    return absl::FailedPreconditionError(
        absl::StrCat("shard ", shard.location.shard_id,
                     " is not in shared memory and "
                     "too large to stage whole for ",
                     entry.rows.size(), " rows"));
  }
  for (int64_t row : entry.rows) {
    // Out of range: the worker's own answer comes from gRPC.
    if (row < 0 || row >= shard.shape[0]) {
      return absl::FailedPreconditionError(absl::StrCat(
          "row ", row, " is outside shard ", shard.location.shard_id));
    }
  }
  std::string whole(static_cast<size_t>(bytes), '\0');
  TESSERA_RETURN_IF_ERROR(
      Read(shard, WholeBox(shard.shape),
           ReadTarget::HostArray(whole.data(), shard.shape,
                                 std::vector<int64_t>(shard.shape.size(), 0))));
  for (size_t k = 0; k < entry.rows.size(); ++k) {
    sink(e, k, whole.data() + entry.rows[k] * row_bytes);
  }
  return absl::OkStatus();
}

absl::Status SharedMemoryTransport::Write(const RemoteShard& shard,
                                          const WriteSource& source) {
  if (shard.shape.empty()) {
    return absl::FailedPreconditionError(
        "writing through shared memory needs the shard's shape");
  }
  const ShardLocation& at = shard.location;
  absl::StatusOr<std::unique_ptr<ShardMapping>> mapped = MapShardForWrite(
      channels_->Get(at.address), at.shard_id, shard.item_bytes,
      CallTimeout(options_.timeout), at.capability);
  if (IsStagedShard(mapped.status()) &&
      StagedShardWhere(mapped.status()) == "host") {
    // A small shard in the worker's private memory (under kChunkBytes: a
    // segment per tiny shard would cost a file and a mapping): its bytes go
    // to the worker on this host in one call, as a staged read's come back.
    return WriteWholeShard(channels_->Get(at.address), shard, source,
                           CallTimeout(options_.timeout));
  }
  TESSERA_RETURN_IF_ERROR(mapped.status());
  std::unique_ptr<ShardMapping> mapping = *std::move(mapped);
  TESSERA_RETURN_IF_ERROR(
      CopyShardToMapping(*mapping, shard.shape, source, shard.item_bytes));
  return CheckStillHeld(*mapping, at.shard_id);
}

absl::Status SharedMemoryTransport::ReadRows(
    absl::Span<const ShardRows> entries, const RowSink& sink) {
  if (cache_ == nullptr) {
    return absl::FailedPreconditionError(
        "rows are read through shared memory only with kept mappings");
  }
  for (size_t e = 0; e < entries.size(); ++e) {
    const RemoteShard& shard = entries[e].shard;
    const ShardLocation& at = shard.location;
    absl::StatusOr<std::shared_ptr<const ShardMapping>> mapped = cache_->Map(
        at.address, channels_->Get(at.address), at.shard_id, shard.item_bytes,
        CallTimeout(options_.timeout), at.capability);
    if (IsStagedShard(mapped.status())) {
      TESSERA_RETURN_IF_ERROR(ReadStagedRows(e, entries[e], sink));
      continue;
    }
    TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<const ShardMapping> mapping,
                             std::move(mapped));
    TESSERA_RETURN_IF_ERROR(CheckShape(mapping->shape(), shard.shape));
    if (shard.shape.empty()) {
      return absl::FailedPreconditionError("a 0-d shard has no rows");
    }
    const int64_t row_bytes = RowBytes(shard.shape, shard.item_bytes);
    const std::vector<int64_t>& rows = entries[e].rows;
    for (size_t k = 0; k < rows.size(); ++k) {
      // Out of range: the worker's own answer comes from gRPC.
      if (rows[k] < 0 || rows[k] >= shard.shape[0]) {
        return absl::FailedPreconditionError(
            absl::StrCat("row ", rows[k], " is outside shard ", at.shard_id));
      }
      const int64_t begin = rows[k] * row_bytes;
      if (!mapping->Covers(begin, begin + row_bytes)) {
        return absl::InternalError(
            absl::StrCat("row ", rows[k], " of shard ", at.shard_id,
                         " is not all in the mapped segment"));
      }
      sink(e, k, mapping->At(begin));
    }
    // The rows handed on are the shard's only if it is still held now.
    TESSERA_RETURN_IF_ERROR(CheckStillHeld(*mapping, at.shard_id));
  }
  return absl::OkStatus();
}

}  // namespace tessera
