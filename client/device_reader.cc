#include "client/device_reader.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "client/data_plane.h"
#include "core/checked_math.h"
#include "core/region_plan.h"
#include "core/status_macros.h"
#include "proto/worker.grpc.pb.h"
#include "rpc/call.h"
#include "rpc/security.h"
#include "rpc/status.h"
#include "transport/shared_memory_arena.h"

namespace tessera {
namespace {

// The longest hold a worker may claim (a day): anything longer is a reply
// that cannot be true.
constexpr int64_t kMaxHoldMs = int64_t{24} * 3600 * 1000;

absl::Status Cuda(absl::string_view what, cudaError_t error) {
  if (error == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();  // clear a sticky-free error so later calls start clean
  return absl::InternalError(
      absl::StrCat(what, ": ", cudaGetErrorString(error)));
}

absl::Status Inconsistent(absl::string_view what) {
  return absl::InternalError(absl::StrCat(
      "worker's MapShard reply for a device shard is inconsistent: ", what));
}

// Copies the box of `sizes` at `src_offsets` of the row-major array
// `src_shape` at `src` into the same box at `dst_offsets` of `dst_shape` at
// `dst`, asynchronously on `stream`: trailing dims that both arrays hold
// whole merge into one run, the next dim out becomes the rows of a 2-D copy,
// and dims further out are looped over.
absl::Status CopyBoxAsync(const char* src, const Shape& src_shape,
                          absl::Span<const int64_t> src_offsets, char* dst,
                          const Shape& dst_shape,
                          absl::Span<const int64_t> dst_offsets,
                          absl::Span<const int64_t> sizes, int64_t item,
                          cudaStream_t stream) {
  const size_t rank = sizes.size();
  for (int64_t s : sizes) {
    if (s == 0) return absl::OkStatus();
  }
  // Strides in bytes.
  std::vector<int64_t> src_stride(rank + 1, item), dst_stride(rank + 1, item);
  for (size_t d = rank; d-- > 0;) {
    src_stride[d] = src_stride[d + 1] * src_shape[d];
    dst_stride[d] = dst_stride[d + 1] * dst_shape[d];
  }
  // k: the outermost dim of the contiguous run.
  size_t k = rank;
  int64_t run = item;
  while (k > 0) {
    const size_t d = k - 1;
    run *= sizes[d];
    k = d;
    if (sizes[d] != src_shape[d] || sizes[d] != dst_shape[d]) break;
  }
  if (rank == 0) k = 0;
  const auto base_offset = [&](absl::Span<const int64_t> offsets,
                               const std::vector<int64_t>& stride) {
    int64_t at = 0;
    for (size_t d = 0; d < rank; ++d) at += offsets[d] * stride[d + 1];
    return at;
  };
  const char* src0 = src + base_offset(src_offsets, src_stride);
  char* dst0 = dst + base_offset(dst_offsets, dst_stride);
  if (k == 0) {
    return Cuda("copying a region",
                cudaMemcpyAsync(dst0, src0, static_cast<size_t>(run),
                                cudaMemcpyDefault, stream));
  }
  // Rows along dim k - 1; loop over dims [0, k - 1).
  const size_t row_dim = k - 1;
  const int64_t rows = sizes[row_dim];
  std::vector<int64_t> at(row_dim, 0);
  for (;;) {
    int64_t s_off = 0, d_off = 0;
    for (size_t d = 0; d < row_dim; ++d) {
      s_off += at[d] * src_stride[d + 1];
      d_off += at[d] * dst_stride[d + 1];
    }
    TESSERA_RETURN_IF_ERROR(
        Cuda("copying a region",
             cudaMemcpy2DAsync(
                 dst0 + d_off, static_cast<size_t>(dst_stride[row_dim + 1]),
                 src0 + s_off, static_cast<size_t>(src_stride[row_dim + 1]),
                 static_cast<size_t>(run), static_cast<size_t>(rows),
                 cudaMemcpyDefault, stream)));
    size_t d = row_dim;
    while (d > 0 && ++at[d - 1] == sizes[d - 1]) {
      at[d - 1] = 0;
      --d;
    }
    if (d == 0) break;
  }
  return absl::OkStatus();
}

// A non-blocking CUDA stream for one call, destroyed with it.
class CallStream {
 public:
  ~CallStream() {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  absl::Status Create(int device) {
    TESSERA_RETURN_IF_ERROR(
        Cuda("selecting the device", cudaSetDevice(device)));
    return Cuda("creating a stream",
                cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

// Page-locked host memory, freed with it.
class PinnedBuffer {
 public:
  ~PinnedBuffer() {
    if (data_ != nullptr) cudaFreeHost(data_);
  }
  absl::Status Allocate(int64_t bytes) {
    return Cuda(absl::StrCat("allocating ", bytes, " bytes of pinned memory"),
                cudaMallocHost(
                    &data_, static_cast<size_t>(std::max<int64_t>(bytes, 1))));
  }
  char* data() const { return static_cast<char*>(data_); }

 private:
  void* data_ = nullptr;
};

}  // namespace

absl::Status CheckCudaAvailable() {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrCat(
        "no usable GPU in this process: ", cudaGetErrorString(error)));
  }
  if (count == 0) {
    return absl::FailedPreconditionError("no usable GPU in this process");
  }
  return absl::OkStatus();
}

struct DeviceReader::Opened {
  char* data = nullptr;
  int device = 0;
  std::string handle;      // the IPC handle it was opened from
  absl::Time valid_until;  // guarded by the reader's mu_: renewals move it
  ~Opened() {
    if (data != nullptr) {
      cudaSetDevice(device);
      cudaIpcCloseMemHandle(data);
    }
  }
};

DeviceReader::DeviceReader(Connection* connection) : connection_(connection) {
  sweeper_ = std::thread([this] {
    while (!stop_.WaitForNotificationWithTimeout(absl::Seconds(1))) {
      std::vector<std::shared_ptr<Opened>> expired;  // closed outside the lock
      absl::MutexLock lock(&mu_);
      const absl::Time now = absl::Now();
      for (auto it = opened_.begin(); it != opened_.end();) {
        if (it->second->valid_until <= now && it->second.use_count() == 1) {
          expired.push_back(std::move(it->second));
          it = opened_.erase(it);
        } else {
          ++it;
        }
      }
    }
  });
}

DeviceReader::~DeviceReader() {
  stop_.Notify();
  sweeper_.join();
}

int DeviceReader::DeviceWithUuid(const std::string& uuid) {
  absl::MutexLock lock(&mu_);
  if (!uuids_read_) {
    uuids_read_ = true;
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
      cudaGetLastError();
      count = 0;
    }
    for (int i = 0; i < count; ++i) {
      cudaDeviceProp prop{};
      uuids_.push_back(
          cudaGetDeviceProperties(&prop, i) == cudaSuccess
              ? std::string(prop.uuid.bytes, sizeof(prop.uuid.bytes))
              : std::string());
    }
  }
  for (size_t i = 0; i < uuids_.size(); ++i) {
    if (uuids_[i] == uuid) return static_cast<int>(i);
  }
  return -1;
}

absl::StatusOr<std::shared_ptr<DeviceReader::Opened>> DeviceReader::Open(
    const RemoteShard& shard) {
  const std::pair<std::string, uint64_t> key(shard.location.address,
                                             shard.location.shard_id);
  const absl::Time asked = absl::Now();
  std::shared_ptr<Opened> known;
  {
    absl::MutexLock lock(&mu_);
    auto it = opened_.find(key);
    if (it != opened_.end()) {
      known = it->second;
      if (asked < known->valid_until) return known;
    }
  }

  if (LocalHostId().empty()) {
    return absl::FailedPreconditionError("no shared memory host id here");
  }
  v1::MapShardRequest request;
  request.set_shard_id(shard.location.shard_id);
  request.set_device_handle(true);
  v1::MapShardResponse reply;
  CallOptions call;
  call.timeout = connection_->options().rpc_timeout;
  const absl::Status mapped = Call(call, [&](grpc::ClientContext* context) {
    PresentCapability(context, shard.location.capability);
    return connection_->WorkerStub(shard.location.address)
        ->MapShard(context, request, &reply);
  });
  if (!mapped.ok()) {
    if (absl::IsNotFound(mapped)) {
      absl::MutexLock lock(&mu_);
      opened_.erase(key);
    }
    return mapped;
  }
  if (reply.host_id() != LocalHostId()) {
    return absl::FailedPreconditionError("the worker is on another host");
  }
  if (reply.device().empty()) {
    return absl::FailedPreconditionError("the shard is in host memory");
  }
  cudaIpcMemHandle_t handle{};
  if (reply.ipc_handle().size() != sizeof(handle.reserved)) {
    return Inconsistent(
        absl::StrCat("an IPC handle of ", reply.ipc_handle().size(), " bytes"));
  }
  if (reply.device_uuid().size() != 16) {
    return Inconsistent(absl::StrCat("a device UUID of ",
                                     reply.device_uuid().size(), " bytes"));
  }
  if (reply.hold_ms() <= 0 || reply.hold_ms() > kMaxHoldMs) {
    return Inconsistent(absl::StrCat("a hold of ", reply.hold_ms(), " ms"));
  }
  const Shape shape(reply.shape().begin(), reply.shape().end());
  if (reply.item_bytes() != shard.item_bytes || shape != shard.shape) {
    return absl::FailedPreconditionError(
        "the worker's shard does not match the metadata");
  }
  absl::StatusOr<int64_t> bytes =
      ByteSize(shape, static_cast<size_t>(shard.item_bytes));
  if (!bytes.ok() || *bytes != reply.bytes()) {
    return Inconsistent(
        absl::StrCat(reply.bytes(), " bytes for shape ", ShapeToString(shape)));
  }
  // Renew at 90 % of the hold, counted from before the call.
  const absl::Time valid_until =
      asked + absl::Milliseconds(reply.hold_ms()) * 0.9;
  if (known != nullptr && known->handle == reply.ipc_handle()) {
    absl::MutexLock lock(&mu_);
    known->valid_until = std::max(known->valid_until, valid_until);
    return known;
  }
  const int device = DeviceWithUuid(reply.device_uuid());
  if (device < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("the worker's GPU (", reply.device(), ", UUID ",
                     absl::BytesToHexString(reply.device_uuid()),
                     ") is not visible to this process"));
  }
  auto opened = std::make_shared<Opened>();
  opened->device = device;
  opened->handle = reply.ipc_handle();
  opened->valid_until = valid_until;
  std::memcpy(handle.reserved, reply.ipc_handle().data(),
              sizeof(handle.reserved));
  TESSERA_RETURN_IF_ERROR(Cuda("selecting the device", cudaSetDevice(device)));
  void* data = nullptr;
  if (cudaError_t e =
          cudaIpcOpenMemHandle(&data, handle, cudaIpcMemLazyEnablePeerAccess);
      e != cudaSuccess) {
    cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrCat(
        "opening the worker's CUDA IPC handle: ", cudaGetErrorString(e)));
  }
  opened->data = static_cast<char*>(data);
  absl::MutexLock lock(&mu_);
  if (opened_.size() >= kMaxOpened) {
    auto oldest = std::min_element(
        opened_.begin(), opened_.end(), [](const auto& a, const auto& b) {
          return a.second->valid_until < b.second->valid_until;
        });
    opened_.erase(oldest);
  }
  opened_[key] = opened;
  return opened;
}

absl::StatusOr<std::vector<DeviceShardView>> DeviceReader::Map(
    const TensorMetadata& meta) {
  std::vector<DeviceShardView> views;
  views.reserve(meta.shards.size());
  for (size_t i = 0; i < meta.shards.size(); ++i) {
    const ShardInfo& info = meta.shards[i];
    if (info.box.IsEmpty()) continue;
    // The first replica, nearest first, that opens here.
    std::shared_ptr<Opened> opened;
    std::string worker;
    const absl::Status status = ReadFromAnyReplica(
        *connection_, meta, i,
        info.box.NumElements() * static_cast<int64_t>(ItemSize(meta.dtype)),
        [&](const ShardLocation& location) -> absl::Status {
          TESSERA_ASSIGN_OR_RETURN(opened, Open(ShardAt(meta, i, location)));
          worker = location.worker;
          return absl::OkStatus();
        });
    if (!status.ok()) {
      return Annotate(status, absl::StrCat("mapping tensor '", meta.name, "'"));
    }
    DeviceShardView view;
    view.index = i;
    view.box = info.box;
    view.data = opened->data;
    view.device = opened->device;
    view.worker = worker;
    {
      absl::MutexLock lock(&mu_);
      view.valid_until = opened->valid_until;
    }
    view.mapping = std::move(opened);
    views.push_back(std::move(view));
  }
  return views;
}

absl::Status DeviceReader::GatherRegion(const TensorMetadata& meta,
                                        const BoxIndex* index,
                                        const Box& region, char* dst,
                                        int device) {
  const std::vector<RegionPiece> pieces = PlanRegion(
      index, meta.shards.size(),
      [&](size_t i) -> const Box& { return meta.shards[i].box; }, region);
  const int64_t item = static_cast<int64_t>(ItemSize(meta.dtype));
  const Shape region_shape = ToShape(region.sizes);
  CallStream stream;
  TESSERA_RETURN_IF_ERROR(stream.Create(device));
  std::vector<std::shared_ptr<Opened>> in_use;  // open until the copies end
  std::vector<PinnedBuffer> staged(pieces.size());
  int64_t ipc_bytes = 0;
  for (size_t p = 0; p < pieces.size(); ++p) {
    const RegionPiece& piece = pieces[p];
    const int64_t bytes = piece.in_shard.NumElements() * item;
    // The first replica, nearest first, that opens here; through the host
    // when none does but one can be read from there.
    bool host_readable = false;
    const absl::Status status = ReadFromAnyReplica(
        *connection_, meta, piece.shard_index, bytes,
        [&](const ShardLocation& location) -> absl::Status {
          const RemoteShard shard = ShardAt(meta, piece.shard_index, location);
          absl::StatusOr<std::shared_ptr<Opened>> opened = Open(shard);
          if (!opened.ok()) {
            // Another host, host memory, a GPU not visible here.
            host_readable |= absl::IsFailedPrecondition(opened.status());
            return opened.status();
          }
          TESSERA_RETURN_IF_ERROR(
              CopyBoxAsync((*opened)->data, shard.shape, piece.in_shard.offsets,
                           dst, region_shape, piece.in_region.offsets,
                           piece.in_shard.sizes, item, stream.get()));
          in_use.push_back(*std::move(opened));
          return absl::OkStatus();
        });
    if (status.ok()) {
      ipc_bytes += bytes;
      continue;
    }
    if (!host_readable) return status;
    // Not reachable through IPC: through the host, then up.
    const Shape piece_shape = ToShape(piece.in_shard.sizes);
    TESSERA_RETURN_IF_ERROR(staged[p].Allocate(bytes));
    TESSERA_RETURN_IF_ERROR(FetchShardBox(*connection_, meta, piece.shard_index,
                                          piece.in_shard, staged[p].data()));
    const std::vector<int64_t> zeros(piece_shape.size(), 0);
    TESSERA_RETURN_IF_ERROR(CopyBoxAsync(
        staged[p].data(), piece_shape, zeros, dst, region_shape,
        piece.in_region.offsets, piece.in_shard.sizes, item, stream.get()));
  }
  TESSERA_RETURN_IF_ERROR(
      Cuda("waiting for the copies", cudaStreamSynchronize(stream.get())));
  ipc_bytes_ += ipc_bytes;
  return absl::OkStatus();
}

namespace {

absl::StatusOr<std::unique_ptr<DeviceAccess>> MakeDeviceReader(
    Connection* connection) {
  TESSERA_RETURN_IF_ERROR(CheckCudaAvailable());
  return std::make_unique<DeviceReader>(connection);
}

const bool registered = RegisterDeviceAccess(&MakeDeviceReader);

}  // namespace
}  // namespace tessera
