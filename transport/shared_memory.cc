#include "transport/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "proto/worker.grpc.pb.h"
#include "rpc/status.h"

namespace tessera {

const std::string& LocalHostId() {
  static const std::string* id = [] {
    std::ifstream in("/proc/sys/kernel/random/boot_id");
    std::string boot;
    std::getline(in, boot);
    struct stat st {};
    if (boot.empty() || stat("/dev/shm", &st) != 0) return new std::string();  // never matches
    return new std::string(absl::StrCat(boot, "/", st.st_dev, ":", st.st_ino));
  }();
  return *id;
}

ShardMapping::~ShardMapping() {
  if (map_ != nullptr) munmap(map_, map_bytes_);
}

std::pair<int64_t, int64_t> BoxByteSpan(const Shape& shape, const Box& box, int64_t item_bytes) {
  if (box.NumElements() == 0) return {0, 0};
  int64_t first = 0, last = 0, stride = item_bytes;
  for (size_t d = shape.size(); d-- > 0;) {
    first += box.offsets[d] * stride;
    last += (box.offsets[d] + box.sizes[d] - 1) * stride;
    stride *= shape[d];
  }
  return {first, last + item_bytes};
}

absl::StatusOr<std::unique_ptr<ShardMapping>> MapShardBox(
    const std::shared_ptr<grpc::Channel>& channel, uint64_t shard_id, const Box& box,
    int64_t item_bytes, absl::Duration timeout) {
  if (LocalHostId().empty()) return absl::FailedPreconditionError("no /dev/shm here");
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout)));
  v1::MapShardRequest request;
  request.set_shard_id(shard_id);
  v1::MapShardResponse response;
  grpc::Status rpc = v1::Worker::NewStub(channel)->MapShard(&context, request, &response);
  if (rpc.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
    return absl::FailedPreconditionError("worker does not offer shared memory");
  }
  if (!rpc.ok()) return FromGrpcStatus(rpc);
  if (response.host_id() != LocalHostId()) {
    return absl::FailedPreconditionError("worker is on another host");
  }
  Shape shape(response.shape().begin(), response.shape().end());
  if (response.item_bytes() != item_bytes || shape.size() != box.rank()) {
    return absl::FailedPreconditionError("segment does not match the shard's metadata");
  }
  for (size_t d = 0; d < shape.size(); ++d) {
    if (box.offsets[d] < 0 || box.sizes[d] < 0 || box.offsets[d] + box.sizes[d] > shape[d]) {
      return absl::FailedPreconditionError("region is outside the mapped shard");
    }
  }
  const auto [begin, end] = BoxByteSpan(shape, box, item_bytes);
  if (end > response.bytes()) return absl::FailedPreconditionError("segment is too small");
  const int fd = shm_open(response.segment().c_str(), O_RDONLY, 0);
  if (fd < 0) {
    // Unlinked between the RPC and the open: the shard was freed.
    if (errno == ENOENT) {
      return absl::NotFoundError(
          absl::StrCat("shard ", shard_id, " is not held by this worker (freed)"));
    }
    return absl::FailedPreconditionError(
        absl::StrCat("shm_open ", response.segment(), ": ", std::strerror(errno)));
  }
  const int64_t page = sysconf(_SC_PAGESIZE);
  const int64_t map_offset = begin / page * page;
  const size_t map_bytes = static_cast<size_t>(std::max<int64_t>(end - map_offset, 1));
  // Prefault the page tables in one go for large spans; small ones fault lazily.
  const int populate = map_bytes >= (1 << 20) ? MAP_POPULATE : 0;
  void* map = mmap(nullptr, map_bytes, PROT_READ, MAP_SHARED | populate, fd, map_offset);
  const int map_errno = errno;
  close(fd);
  if (map == MAP_FAILED) {
    return absl::FailedPreconditionError(
        absl::StrCat("mmap ", response.segment(), ": ", std::strerror(map_errno)));
  }
  return std::make_unique<ShardMapping>(map, map_bytes, map_offset, std::move(shape));
}

}  // namespace tessera
