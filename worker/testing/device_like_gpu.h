// A GPU side (worker/gpu_support.h) whose stores are DeviceLikeStores: a
// WorkerDaemon started with a cuda:N device then runs, on a machine without
// a GPU, every path of a GPU worker that needs no CUDA copy — device
// reports, staged reads, device answers to MapShard, reads that fail over
// between device replicas. Tests only; tests/gpu_test runs the CUDA copies.
#ifndef TESSERA_WORKER_TESTING_DEVICE_LIKE_GPU_H_
#define TESSERA_WORKER_TESTING_DEVICE_LIKE_GPU_H_

namespace tessera {

// Registers the device-like GPU side for this process (replacing any other).
// NCCL has no device-like twin: start such workers with `nccl = false`.
void UseDeviceLikeGpu();

}  // namespace tessera

#endif  // TESSERA_WORKER_TESTING_DEVICE_LIKE_GPU_H_
