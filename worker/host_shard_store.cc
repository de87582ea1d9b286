#include "worker/host_shard_store.h"

#include <cstdlib>
#include <cstring>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "core/errors.h"
#include "core/status_macros.h"
#include "core/strided_copy.h"

namespace tessera {

struct HostShardStore::Shard {
  ShardDesc desc;
  int64_t bytes = 0;
  char* data = nullptr;  // calloc'd: fresh pages are zero without touching them
  ~Shard() { std::free(data); }
};

HostShardStore::HostShardStore(int64_t capacity_bytes) : capacity_bytes_(capacity_bytes) {}
HostShardStore::~HostShardStore() = default;

absl::Status HostShardStore::Allocate(uint64_t id, const ShardDesc& desc, const InitSpec& init) {
  auto shard = std::make_shared<Shard>();
  shard->desc = desc;
  shard->bytes = desc.ByteSize();
  {
    absl::MutexLock lock(&mu_);
    if (shards_.contains(id)) {
      return AlreadyExistsError("shard id", absl::StrCat(id));
    }
    if (capacity_bytes_ > 0 && bytes_used_ + shard->bytes > capacity_bytes_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "shard of ", shard->bytes, " bytes does not fit: ", bytes_used_, " of ",
          capacity_bytes_, " bytes in use"));
    }
    bytes_used_ += shard->bytes;  // reserved while we allocate outside the lock
  }
  auto unreserve = absl::MakeCleanup([&] {
    absl::MutexLock lock(&mu_);
    bytes_used_ -= shard->bytes;
  });
  shard->data = static_cast<char*>(std::calloc(std::max<int64_t>(shard->bytes, 1), 1));
  if (shard->data == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("out of host memory allocating ", shard->bytes, " bytes"));
  }
  if (init.kind != InitSpec::Kind::kEmpty && init.kind != InitSpec::Kind::kZeros) {
    TESSERA_RETURN_IF_ERROR(FillBox(init, desc.dtype, desc.tensor_shape, desc.box, shard->data));
  }
  absl::MutexLock lock(&mu_);
  if (!shards_.emplace(id, shard).second) {
    return AlreadyExistsError("shard id", absl::StrCat(id));
  }
  std::move(unreserve).Cancel();
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<HostShardStore::Shard>> HostShardStore::Find(uint64_t id) const {
  absl::MutexLock lock(&mu_);
  auto it = shards_.find(id);
  if (it == shards_.end()) {
    return absl::NotFoundError(
        absl::StrCat("shard ", id, " is not held by this worker (freed or never allocated)"));
  }
  return it->second;
}

absl::Status HostShardStore::Write(uint64_t id, int64_t byte_offset, absl::string_view data) {
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<Shard> shard, Find(id));
  const int64_t size = static_cast<int64_t>(data.size());
  if (byte_offset < 0 || byte_offset > shard->bytes || size > shard->bytes - byte_offset) {
    return OutOfBoundsError(absl::StrCat("write of ", size, " bytes at byte ", byte_offset,
                                         " into a shard of ", shard->bytes, " bytes"));
  }
  if (size > 0) std::memcpy(shard->data + byte_offset, data.data(), data.size());
  return absl::OkStatus();
}

namespace {

absl::Status CheckSubBox(const ShardDesc& desc, const Box& box, int64_t flat_begin,
                         int64_t count) {
  TESSERA_RETURN_IF_ERROR(CheckWithin(box, desc.box.sizes, "region of the shard"));
  const int64_t n = box.NumElements();
  if (flat_begin < 0 || count < 0 || flat_begin > n || count > n - flat_begin) {
    return OutOfBoundsError(absl::StrCat("elements [", flat_begin, ", ", flat_begin + count,
                                         ") of a region of ", n, " elements"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status HostShardStore::WriteBox(uint64_t id, const Box& box, int64_t flat_begin,
                                      int64_t count, const char* src) {
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<Shard> shard, Find(id));
  TESSERA_RETURN_IF_ERROR(CheckSubBox(shard->desc, box, flat_begin, count));
  if (count == 0) return absl::OkStatus();
  CopyFlatRangeToBox(src, flat_begin, count, box.sizes, shard->data, shard->desc.box.sizes,
                     box.offsets, ItemSize(shard->desc.dtype));
  return absl::OkStatus();
}

absl::Status HostShardStore::ReadBox(uint64_t id, const Box& box, int64_t flat_begin,
                                     int64_t count, char* dst) {
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<Shard> shard, Find(id));
  TESSERA_RETURN_IF_ERROR(CheckSubBox(shard->desc, box, flat_begin, count));
  if (count == 0) return absl::OkStatus();
  CopyBoxToFlatRange(shard->data, shard->desc.box.sizes, box.offsets, box.sizes, flat_begin,
                     count, dst, ItemSize(shard->desc.dtype));
  return absl::OkStatus();
}

absl::Status HostShardStore::CopyLocal(uint64_t src_id, const Box& src_box, uint64_t dst_id,
                                       absl::Span<const int64_t> dst_offsets) {
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<Shard> src, Find(src_id));
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<Shard> dst, Find(dst_id));
  if (src->desc.dtype != dst->desc.dtype) {
    return absl::InvalidArgumentError(absl::StrCat("copy from a ", DTypeName(src->desc.dtype),
                                                   " shard into a ", DTypeName(dst->desc.dtype),
                                                   " shard"));
  }
  TESSERA_RETURN_IF_ERROR(CheckWithin(src_box, src->desc.box.sizes, "source region"));
  Box dst_box{std::vector<int64_t>(dst_offsets.begin(), dst_offsets.end()), src_box.sizes};
  TESSERA_RETURN_IF_ERROR(CheckWithin(dst_box, dst->desc.box.sizes, "destination region"));
  if (src_box.NumElements() == 0) return absl::OkStatus();
  CopyBox(src->data, src->desc.box.sizes, src_box.offsets, dst->data, dst->desc.box.sizes,
          dst_offsets, src_box.sizes, ItemSize(src->desc.dtype));
  return absl::OkStatus();
}

absl::StatusOr<ShardDesc> HostShardStore::Describe(uint64_t id) const {
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<Shard> shard, Find(id));
  return shard->desc;
}

absl::Status HostShardStore::Free(uint64_t id) {
  std::shared_ptr<Shard> shard;  // released after the lock: free() of GBs takes time
  {
    absl::MutexLock lock(&mu_);
    auto it = shards_.find(id);
    if (it == shards_.end()) return absl::OkStatus();
    shard = std::move(it->second);
    shards_.erase(it);
    bytes_used_ -= shard->bytes;
  }
  return absl::OkStatus();
}

int64_t HostShardStore::BytesUsed() const {
  absl::MutexLock lock(&mu_);
  return bytes_used_;
}

std::vector<uint64_t> HostShardStore::ShardIds() const {
  absl::MutexLock lock(&mu_);
  std::vector<uint64_t> ids;
  ids.reserve(shards_.size());
  for (const auto& [id, shard] : shards_) ids.push_back(id);
  return ids;
}

}  // namespace tessera
