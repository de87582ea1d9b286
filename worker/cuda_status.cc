#include "worker/cuda_status.h"

#include "absl/strings/str_cat.h"

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

}  // namespace tessera
