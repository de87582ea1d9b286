// CUDA errors in tessera's vocabulary. Only built with --config=cuda.
#ifndef TESSERA_WORKER_CUDA_STATUS_H_
#define TESSERA_WORKER_CUDA_STATUS_H_

#include <cuda_runtime_api.h>

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tessera {

// OK for cudaSuccess; otherwise an error naming `context` and CUDA's words.
// Out-of-memory maps to RESOURCE_EXHAUSTED, a missing device or driver to
// UNAVAILABLE, anything else to INTERNAL.
absl::Status CudaError(absl::string_view context, cudaError_t error);

// OK when CUDA device `index` exists and can be used; otherwise UNAVAILABLE
// with a message a user can act on (no GPU, no driver, index out of range).
absl::Status CheckCudaDevice(int index);

// Device `index`'s UUID (core/placement.h GpuUuid).
absl::StatusOr<std::string> CudaDeviceUuid(int index);

}  // namespace tessera

#endif  // TESSERA_WORKER_CUDA_STATUS_H_
