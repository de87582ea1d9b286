#include "worker/cuda_status.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/placement.h"

namespace tessera {

absl::Status CudaError(absl::string_view context, cudaError_t error) {
  if (error == cudaSuccess) return absl::OkStatus();
  const std::string message =
      absl::StrCat(context, ": ", cudaGetErrorName(error), " (",
                   cudaGetErrorString(error), ")");
  switch (error) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
      return absl::UnavailableError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::Status CheckCudaDevice(int index) {
  int count = 0;
  cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    return absl::UnavailableError(
        absl::StrCat("no usable GPU: ", cudaGetErrorString(error),
                     "; run this worker with --device=cpu"));
  }
  if (index < 0 || index >= count) {
    return absl::UnavailableError(
        absl::StrCat("cuda:", index, " does not exist on this machine (", count,
                     " CUDA device(s))"));
  }
  return CudaError(absl::StrCat("selecting cuda:", index),
                   cudaSetDevice(index));
}

absl::StatusOr<std::string> CudaDeviceUuid(int index) {
  cudaDeviceProp properties;
  if (absl::Status s =
          CudaError(absl::StrCat("reading cuda:", index, "'s properties"),
                    cudaGetDeviceProperties(&properties, index));
      !s.ok()) {
    return s;
  }
  unsigned char bytes[16];
  std::memcpy(bytes, properties.uuid.bytes, sizeof(bytes));
  return GpuUuid(bytes);
}

}  // namespace tessera
