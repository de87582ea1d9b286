#include "worker/nccl_exchange.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/box_runs.h"
#include "core/status_macros.h"
#include "spdlog/spdlog.h"
#include "worker/cuda_status.h"
#include "worker/exchange_layout.h"

namespace tessera {
namespace {

absl::Status NcclError(const std::string& what, ncclResult_t result) {
  const std::string message =
      absl::StrCat(what, ": NCCL: ", ncclGetErrorString(result));
  switch (result) {
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return absl::FailedPreconditionError(message);
    case ncclSystemError:
    case ncclRemoteError:
      return absl::UnavailableError(message);
    default:
      return absl::InternalError(message);
  }
}

// Pitched copies between a packed piece's box in its shard and its range
// of the exchange's buffer, on `stream`.
cudaError_t CopyPiece(const PostedPiece& posted, const DeviceShardBytes& shard,
                      char* buffer, cudaStream_t stream, bool pack) {
  const ExchangePiece& piece = *posted.piece;
  const size_t item = ItemSize(shard.desc.dtype);
  char* const packed = buffer + posted.buffer_offset;
  cudaError_t error = cudaSuccess;
  ForEachBoxBlock(
      shard.desc.box.sizes, piece.offsets, piece.sizes, 0,
      piece.box().NumElements(),
      [&](int64_t element, int64_t range, int64_t run, int64_t rows,
          int64_t pitch) {
        if (error != cudaSuccess) return;
        char* in_shard = shard.data + element * static_cast<int64_t>(item);
        char* dense = packed + range * static_cast<int64_t>(item);
        const size_t width = static_cast<size_t>(run) * item;
        const size_t shard_pitch = static_cast<size_t>(pitch) * item;
        error = pack ? cudaMemcpy2DAsync(dense, width, in_shard, shard_pitch,
                                         width, static_cast<size_t>(rows),
                                         cudaMemcpyDeviceToDevice, stream)
                     : cudaMemcpy2DAsync(in_shard, shard_pitch, dense, width,
                                         width, static_cast<size_t>(rows),
                                         cudaMemcpyDeviceToDevice, stream);
      });
  return error;
}

}  // namespace

struct NcclExchange::Comm {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  int device = 0;
  int32_t ranks = 0;  // as joined: a later plan under its id must match
  int32_t rank = 0;
  bool aborted = false;  // guarded by NcclExchange::gpu_ once joined

  ~Comm() {
    cudaSetDevice(device);
    if (comm != nullptr && !aborted) ncclCommDestroy(comm);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }

  absl::Status Abort(absl::Status why) {
    if (comm != nullptr && !aborted) {
      aborted = true;
      ncclCommAbort(comm);
      comm = nullptr;
    }
    return why;
  }

  // Polls until the communicator is no longer in progress (joined, or a
  // group launched), its stream has drained when `drain`, or `stop` says
  // to stop; aborts on an error, the deadline or the cancellation.
  absl::Status Await(const StopCondition& stop, const std::string& what,
                     bool drain) {
    for (;;) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t got = ncclCommGetAsyncError(comm, &state);
      if (got != ncclSuccess) return Abort(NcclError(what, got));
      if (state != ncclSuccess && state != ncclInProgress) {
        return Abort(NcclError(what, state));
      }
      if (state == ncclSuccess) {
        if (!drain) return absl::OkStatus();
        const cudaError_t queried = cudaStreamQuery(stream);
        if (queried == cudaSuccess) return absl::OkStatus();
        if (queried != cudaErrorNotReady) {
          return Abort(CudaError(what, queried));
        }
      }
      if (stop.cancelled && stop.cancelled()) {
        return Abort(absl::CancelledError(absl::StrCat(
            what,
            ": the coordinator gave the exchange up (another member "
            "failed); the communicator was aborted")));
      }
      if (absl::Now() >= stop.deadline) {
        return Abort(absl::DeadlineExceededError(absl::StrCat(
            what,
            ": not done by the deadline (a peer may have failed or "
            "never joined); the communicator was aborted")));
      }
      absl::SleepFor(absl::Microseconds(50));
    }
  }
};

NcclExchange::NcclExchange(CudaShardStore* store) : store_(store) {}

NcclExchange::~NcclExchange() { comms_.Clear(); }

absl::StatusOr<std::string> NcclExchange::UniqueId() {
  ncclUniqueId id;
  const ncclResult_t result = ncclGetUniqueId(&id);
  if (result != ncclSuccess) {
    return NcclError("making a communicator id", result);
  }
  return std::string(id.internal, sizeof(id.internal));
}

absl::StatusOr<std::shared_ptr<NcclExchange::Comm>> NcclExchange::Join(
    const ExchangePlan& plan, const StopCondition& stop) {
  auto comm = std::make_shared<Comm>();
  comm->device = store_->device();
  comm->ranks = plan.ranks;
  comm->rank = plan.rank;
  TESSERA_RETURN_IF_ERROR(
      CudaError("selecting the device", cudaSetDevice(comm->device)));
  TESSERA_RETURN_IF_ERROR(CudaError(
      "making a stream",
      cudaStreamCreateWithFlags(&comm->stream, cudaStreamNonBlocking)));
  ncclUniqueId id;
  std::memcpy(id.internal, plan.unique_id.data(), sizeof(id.internal));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const std::string what = absl::StrCat("joining an NCCL communicator as rank ",
                                        plan.rank, " of ", plan.ranks);
  const ncclResult_t started =
      ncclCommInitRankConfig(&comm->comm, plan.ranks, id, plan.rank, &config);
  if (started != ncclSuccess && started != ncclInProgress) {
    if (comm->comm != nullptr) comm->Abort(absl::OkStatus()).IgnoreError();
    return NcclError(what, started);
  }
  TESSERA_RETURN_IF_ERROR(comm->Await(stop, what, /*drain=*/false));
  return comm;
}

absl::StatusOr<int64_t> NcclExchange::Run(const ExchangePlan& plan,
                                          const StopCondition& stop) {
  TESSERA_ASSIGN_OR_RETURN(
      std::shared_ptr<Comm> comm,
      comms_.Get(plan.unique_id, stop, [&] { return Join(plan, stop); }));
  TESSERA_ASSIGN_OR_RETURN(
      OneAtATime::Held gpu,
      gpu_.Take(stop, "waiting for another NCCL exchange on this GPU"));
  if (comm->aborted) {
    comms_.Drop(plan.unique_id, comm.get());
    return absl::UnavailableError(
        "the NCCL communicator was aborted by an earlier exchange");
  }
  if (comm->ranks != plan.ranks || comm->rank != plan.rank) {
    // Its peers' ranks would not be the plan's: refused, nothing posted.
    return absl::FailedPreconditionError(
        absl::StrCat("the plan names rank ", plan.rank, " of ", plan.ranks,
                     " under a communicator joined as rank ", comm->rank,
                     " of ", comm->ranks));
  }
  // Any failure from here aborts the communicator: the peers' operations
  // could never match again, and the coordinator makes a fresh one.
  auto fail = [&](absl::Status why) {
    const absl::Status failed = comm->Abort(std::move(why));
    cudaStreamSynchronize(comm->stream);
    comms_.Drop(plan.unique_id, comm.get());
    spdlog::warn("NCCL exchange as rank {} of {}: {}", plan.rank, plan.ranks,
                 std::string(failed.message()));
    return failed;
  };
  if (absl::Status selected =
          CudaError("selecting the device", cudaSetDevice(comm->device));
      !selected.ok()) {
    return fail(selected);
  }
  // Every shard stays allocated until the stream has drained.
  std::vector<DeviceShardBytes> shards;
  std::vector<ShardDesc> descs;
  shards.reserve(plan.sends.size() + plan.recvs.size());
  for (const auto* pieces : {&plan.sends, &plan.recvs}) {
    for (const ExchangePiece& piece : *pieces) {
      absl::StatusOr<DeviceShardBytes> shard =
          store_->DeviceBytes(piece.shard_id);
      if (!shard.ok()) return fail(shard.status());
      descs.push_back(shard->desc);
      shards.push_back(*std::move(shard));
    }
  }
  absl::StatusOr<ShareLayout> laid_out = LayOutShare(plan, descs);
  if (!laid_out.ok()) return fail(laid_out.status());
  const ShareLayout& layout = *laid_out;
  char* buffer = nullptr;
  if (layout.buffer_bytes > 0) {
    if (absl::Status allocated = CudaError(
            absl::StrCat("allocating ", layout.buffer_bytes,
                         " bytes of device memory for packed pieces"),
            cudaMalloc(&buffer, static_cast<size_t>(layout.buffer_bytes)));
        !allocated.ok()) {
      return fail(allocated);
    }
  }
  const std::unique_ptr<char, void (*)(char*)> buffer_owner(buffer,
                                                            [](char* p) {
                                                              if (p != nullptr)
                                                                cudaFree(p);
                                                            });
  // Where NCCL sends from or receives into.
  const auto data = [&](const PostedPiece& posted) {
    return posted.packed() ? buffer + posted.buffer_offset
                           : shards[posted.shard].data + posted.shard_offset;
  };
  for (const PostedPiece& posted : layout.sends) {
    if (!posted.packed()) continue;
    const cudaError_t packed = CopyPiece(posted, shards[posted.shard], buffer,
                                         comm->stream, /*pack=*/true);
    if (packed != cudaSuccess) {
      return fail(CudaError("packing a piece on the device", packed));
    }
  }
  const std::string what =
      absl::StrCat("exchanging ", layout.sends.size(), " piece(s) out and ",
                   layout.recvs.size(), " in over NCCL as rank ", plan.rank);
  ncclResult_t result = ncclGroupStart();
  for (const PostedPiece& posted : layout.sends) {
    if (result != ncclSuccess) break;
    result = ncclSend(data(posted), static_cast<size_t>(posted.bytes),
                      ncclUint8, posted.peer, comm->comm, comm->stream);
  }
  for (const PostedPiece& posted : layout.recvs) {
    if (result != ncclSuccess) break;
    result = ncclRecv(data(posted), static_cast<size_t>(posted.bytes),
                      ncclUint8, posted.peer, comm->comm, comm->stream);
  }
  const ncclResult_t ended = ncclGroupEnd();
  if (result == ncclSuccess) result = ended;
  if (result != ncclSuccess && result != ncclInProgress) {
    return fail(NcclError(what, result));
  }
  // Every piece is in before any is placed from the buffer: placing after
  // an abort would copy a partly received buffer over bytes the
  // coordinator's fallback pulls may already have written. On failure the
  // abort ends NCCL's kernels, so the stream drains (in fail) before the
  // buffer and the shards are let go.
  if (absl::Status exchanged = comm->Await(stop, what, /*drain=*/true);
      !exchanged.ok()) {
    return fail(exchanged);
  }
  bool unpacking = false;
  for (const PostedPiece& posted : layout.recvs) {
    if (!posted.packed()) continue;
    unpacking = true;
    const cudaError_t unpacked = CopyPiece(posted, shards[posted.shard], buffer,
                                           comm->stream, /*pack=*/false);
    if (unpacked != cudaSuccess) {
      return fail(CudaError("placing a received piece", unpacked));
    }
  }
  if (unpacking) {
    if (absl::Status placed = CudaError("placing received pieces",
                                        cudaStreamSynchronize(comm->stream));
        !placed.ok()) {
      return fail(placed);
    }
  }
  return layout.received_bytes;
}

}  // namespace tessera
