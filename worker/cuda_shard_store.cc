#include "worker/cuda_shard_store.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/box_runs.h"
#include "core/errors.h"
#include "core/status_macros.h"
#include "worker/cuda_status.h"

namespace tessera {

struct CudaShardStore::Shard {
  ShardDesc desc;
  int device = 0;
  int64_t bytes = 0;
  char* data = nullptr;  // device memory
  ShardCharge charge;    // against the capacity, until the memory is gone
  std::once_flag exported;
  std::string ipc_handle;  // set once, by the first export
  cudaError_t export_error = cudaSuccess;
  ~Shard() {
    if (data != nullptr) {
      cudaSetDevice(device);
      cudaFree(data);
    }
  }
};

CudaShardStore::CudaShardStore(int device, int64_t capacity_bytes)
    : device_(device),
      table_(capacity_bytes, absl::StrCat(" on cuda:", device)) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device_) == cudaSuccess) {
    uuid_.assign(prop.uuid.bytes, sizeof(prop.uuid.bytes));
  }
  sweeper_ = std::thread([this] {
    while (!stop_.WaitForNotificationWithTimeout(absl::Seconds(1))) {
      DropExpiredHolds();
    }
  });
}

CudaShardStore::~CudaShardStore() {
  stop_.Notify();
  sweeper_.join();
}

void CudaShardStore::DropExpiredHolds() {
  std::vector<std::shared_ptr<Shard>> expired;  // freed outside the lock
  absl::MutexLock lock(&holds_mu_);
  const absl::Time now = absl::Now();
  for (auto it = holds_.begin(); it != holds_.end();) {
    if (it->second.until <= now) {
      expired.push_back(std::move(it->second.shard));
      it = holds_.erase(it);
    } else {
      ++it;
    }
  }
}

std::optional<DeviceInfo> CudaShardStore::Device() const {
  DeviceInfo info;
  info.index = device_;
  info.uuid = uuid_;
  return info;
}

std::optional<DeviceMemory> CudaShardStore::DeviceMemoryNow() const {
  DeviceMemory memory;
  size_t free_bytes = 0;
  size_t total_bytes = 0;
  if (cudaSetDevice(device_) == cudaSuccess &&
      cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
    memory.total_bytes = static_cast<int64_t>(total_bytes);
    memory.free_bytes = static_cast<int64_t>(free_bytes);
  }
  return memory;
}

absl::StatusOr<std::string> CudaShardStore::ExportDevice(uint64_t id,
                                                         absl::Duration hold) {
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<Shard> shard, table_.Find(id));
  std::call_once(shard->exported, [&] {
    cudaIpcMemHandle_t handle{};
    shard->export_error = cudaSetDevice(device_);
    if (shard->export_error == cudaSuccess) {
      shard->export_error = cudaIpcGetMemHandle(&handle, shard->data);
    }
    if (shard->export_error == cudaSuccess) {
      shard->ipc_handle.assign(handle.reserved, sizeof(handle.reserved));
    }
  });
  TESSERA_RETURN_IF_ERROR(
      CudaError(absl::StrCat("exporting shard ", id, " for CUDA IPC"),
                shard->export_error));
  absl::MutexLock lock(&holds_mu_);
  Hold& held = holds_[id];
  held.until = std::max(held.until, absl::Now() + hold);
  held.shard = shard;
  return shard->ipc_handle;
}

absl::StatusOr<std::shared_ptr<void>> CudaShardStore::RegisterStaging(
    void* data, int64_t bytes) {
  if (data == nullptr || bytes <= 0) {
    return absl::InvalidArgumentError("no staging memory to register");
  }
  TESSERA_RETURN_IF_ERROR(
      CudaError("selecting the device", cudaSetDevice(device_)));
  TESSERA_RETURN_IF_ERROR(CudaError(
      absl::StrCat("page-locking ", bytes, " bytes of staging memory"),
      cudaHostRegister(data, static_cast<size_t>(bytes),
                       cudaHostRegisterPortable)));
  return std::shared_ptr<void>(data, [](void* p) { cudaHostUnregister(p); });
}

absl::StatusOr<DeviceShardBytes> CudaShardStore::DeviceBytes(
    uint64_t id) const {
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<Shard> shard, table_.Find(id));
  DeviceShardBytes bytes;
  bytes.data = shard->data;
  bytes.desc = shard->desc;
  bytes.keep = std::move(shard);
  return bytes;
}

namespace {

// Copies elements [flat_begin, +count) of `box` between a shard on the GPU
// and a dense host buffer: one pitched copy per block of equally spaced rows
// (core/box_runs), so a strided sub-box costs a few calls, not one per row.
absl::Status CopyRuns(char* device, const ShardDesc& desc, const Box& box,
                      int64_t flat_begin, int64_t count, char* host,
                      cudaMemcpyKind kind) {
  const int64_t item = static_cast<int64_t>(ItemSize(desc.dtype));
  cudaError_t error = cudaSuccess;
  ForEachBoxBlock(desc.box.sizes, box.offsets, box.sizes, flat_begin, count,
                  [&](int64_t shard_element, int64_t range_element, int64_t run,
                      int64_t rows, int64_t pitch) {
                    if (error != cudaSuccess) return;
                    char* d = device + shard_element * item;
                    char* h = host + range_element * item;
                    const size_t width = static_cast<size_t>(run * item);
                    const size_t d_pitch = static_cast<size_t>(pitch * item);
                    if (rows == 1 || pitch == run) {
                      const size_t bytes = width * static_cast<size_t>(rows);
                      error = kind == cudaMemcpyDeviceToHost
                                  ? cudaMemcpy(h, d, bytes, kind)
                                  : cudaMemcpy(d, h, bytes, kind);
                    } else {
                      error =
                          kind == cudaMemcpyDeviceToHost
                              ? cudaMemcpy2D(h, width, d, d_pitch, width,
                                             static_cast<size_t>(rows), kind)
                              : cudaMemcpy2D(d, d_pitch, h, width, width,
                                             static_cast<size_t>(rows), kind);
                    }
                  });
  return CudaError("copying a region between host and GPU", error);
}

}  // namespace

absl::Status CudaShardStore::Allocate(uint64_t id, const ShardDesc& desc,
                                      const InitFill& init) {
  if (init.dtype() != desc.dtype) {
    return absl::InvalidArgumentError(
        absl::StrCat("init made for ", DTypeName(init.dtype()),
                     ", not the shard's ", DTypeName(desc.dtype)));
  }
  auto shard = std::make_shared<Shard>();
  shard->desc = desc;
  shard->device = device_;
  shard->bytes = desc.ByteSize();
  // Dropping the shard on failure gives the charge back.
  TESSERA_ASSIGN_OR_RETURN(shard->charge, table_.Reserve(id, shard->bytes));
  TESSERA_RETURN_IF_ERROR(
      CudaError("selecting the device", cudaSetDevice(device_)));
  void* data = nullptr;
  TESSERA_RETURN_IF_ERROR(
      CudaError(absl::StrCat("allocating ", shard->bytes, " bytes"),
                cudaMalloc(&data, std::max<int64_t>(shard->bytes, 1))));
  shard->data = static_cast<char*>(data);
  if (init.kind() == InitSpec::Kind::kEmpty ||
      init.kind() == InitSpec::Kind::kZeros) {
    TESSERA_RETURN_IF_ERROR(CudaError(
        "zeroing a shard",
        cudaMemset(shard->data, 0, static_cast<size_t>(shard->bytes))));
  } else if (shard->bytes > 0) {
    std::vector<char> host(static_cast<size_t>(shard->bytes));
    TESSERA_RETURN_IF_ERROR(
        init.Fill(desc.tensor_shape, desc.box, host.data()));
    TESSERA_RETURN_IF_ERROR(
        CudaError("uploading initial values",
                  cudaMemcpy(shard->data, host.data(), host.size(),
                             cudaMemcpyHostToDevice)));
  }
  return table_.Insert(id, std::move(shard));
}

absl::Status CudaShardStore::Write(uint64_t id, int64_t byte_offset,
                                   absl::string_view data) {
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<Shard> shard, table_.Find(id));
  const int64_t size = static_cast<int64_t>(data.size());
  TESSERA_RETURN_IF_ERROR(CheckShardWrite(shard->bytes, byte_offset, size));
  if (size == 0) return absl::OkStatus();
  TESSERA_RETURN_IF_ERROR(
      CudaError("selecting the device", cudaSetDevice(device_)));
  return CudaError("writing a shard",
                   cudaMemcpy(shard->data + byte_offset, data.data(),
                              data.size(), cudaMemcpyHostToDevice));
}

absl::Status CudaShardStore::WriteBox(uint64_t id, const Box& box,
                                      int64_t flat_begin, int64_t count,
                                      const char* src) {
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<Shard> shard, table_.Find(id));
  TESSERA_RETURN_IF_ERROR(CheckShardRange(shard->desc, box, flat_begin, count));
  TESSERA_RETURN_IF_ERROR(
      CudaError("selecting the device", cudaSetDevice(device_)));
  return CopyRuns(shard->data, shard->desc, box, flat_begin, count,
                  const_cast<char*>(src), cudaMemcpyHostToDevice);
}

absl::Status CudaShardStore::ReadBox(uint64_t id, const Box& box,
                                     int64_t flat_begin, int64_t count,
                                     char* dst) {
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<Shard> shard, table_.Find(id));
  TESSERA_RETURN_IF_ERROR(CheckShardRange(shard->desc, box, flat_begin, count));
  TESSERA_RETURN_IF_ERROR(
      CudaError("selecting the device", cudaSetDevice(device_)));
  return CopyRuns(shard->data, shard->desc, box, flat_begin, count, dst,
                  cudaMemcpyDeviceToHost);
}

absl::Status CudaShardStore::CopyLocal(uint64_t src_id, const Box& src_box,
                                       uint64_t dst_id,
                                       absl::Span<const int64_t> dst_offsets) {
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<Shard> src, table_.Find(src_id));
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<Shard> dst, table_.Find(dst_id));
  if (src->desc.dtype != dst->desc.dtype) {
    return absl::InvalidArgumentError(
        "copy between shards of different dtypes");
  }
  const int64_t n = src_box.NumElements();
  TESSERA_RETURN_IF_ERROR(CheckShardRange(src->desc, src_box, 0, n));
  Box dst_box{std::vector<int64_t>(dst_offsets.begin(), dst_offsets.end()),
              src_box.sizes};
  TESSERA_RETURN_IF_ERROR(CheckShardRange(dst->desc, dst_box, 0, n));
  if (n == 0) return absl::OkStatus();
  // Staged through the host: pieces are rare and the staging keeps it simple.
  std::vector<char> host(
      static_cast<size_t>(n * static_cast<int64_t>(ItemSize(src->desc.dtype))));
  TESSERA_RETURN_IF_ERROR(
      CudaError("selecting the device", cudaSetDevice(device_)));
  TESSERA_RETURN_IF_ERROR(CopyRuns(src->data, src->desc, src_box, 0, n,
                                   host.data(), cudaMemcpyDeviceToHost));
  return CopyRuns(dst->data, dst->desc, dst_box, 0, n, host.data(),
                  cudaMemcpyHostToDevice);
}

absl::StatusOr<ShardDesc> CudaShardStore::Describe(uint64_t id) const {
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<Shard> shard, table_.Find(id));
  return shard->desc;
}

absl::Status CudaShardStore::Free(uint64_t id) {
  table_.Remove(id);  // device memory goes when the last reader drops it
  return absl::OkStatus();
}

int64_t CudaShardStore::BytesUsed() const { return table_.BytesUsed(); }

int64_t CudaShardStore::ChargedBytes() const { return table_.ChargedBytes(); }

int64_t CudaShardStore::PinnedBytes() const { return table_.PinnedBytes(); }

std::vector<uint64_t> CudaShardStore::ShardIds() const { return table_.Ids(); }

}  // namespace tessera
