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

// One end of a piece as the group sees it: a contiguous device range.
struct Posted {
  int32_t peer = 0;
  char* data = nullptr;  // in the shard, or in the exchange's buffer
  size_t bytes = 0;
  size_t buffer_offset = 0;  // where in the buffer, when packed
  // Set when the piece goes through the buffer: where it lies in its shard.
  const ExchangePiece* packed = nullptr;
  const DeviceShardBytes* shard = nullptr;
};

// Pitched copies between a piece's box in its shard and a dense range, on
// `stream`.
cudaError_t CopyPiece(const Posted& posted, cudaStream_t stream, bool pack) {
  const ExchangePiece& piece = *posted.packed;
  const DeviceShardBytes& shard = *posted.shard;
  const size_t item = ItemSize(shard.desc.dtype);
  cudaError_t error = cudaSuccess;
  ForEachBoxBlock(
      shard.desc.box.sizes, piece.offsets, piece.sizes, 0,
      piece.box().NumElements(),
      [&](int64_t element, int64_t range, int64_t run, int64_t rows,
          int64_t pitch) {
        if (error != cudaSuccess) return;
        char* in_shard = shard.data + element * static_cast<int64_t>(item);
        char* dense = posted.data + range * static_cast<int64_t>(item);
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
  shards.reserve(plan.sends.size() + plan.recvs.size());
  std::vector<Posted> sends, recvs;
  size_t buffer_bytes = 0;
  auto post = [&](const ExchangePiece& piece,
                  std::vector<Posted>& into) -> absl::Status {
    TESSERA_ASSIGN_OR_RETURN(DeviceShardBytes shard,
                             store_->DeviceBytes(piece.shard_id));
    shards.push_back(std::move(shard));
    const DeviceShardBytes& held = shards.back();
    const size_t item = ItemSize(held.desc.dtype);
    Posted posted;
    posted.peer = piece.peer;
    posted.bytes = static_cast<size_t>(piece.box().NumElements()) * item;
    if (posted.bytes == 0) return absl::OkStatus();  // both ends skip it
    if (const std::optional<int64_t> first =
            BoxSpanStart(held.desc.box.sizes, piece.offsets, piece.sizes)) {
      posted.data = held.data + *first * static_cast<int64_t>(item);
    } else {
      posted.buffer_offset = buffer_bytes;
      posted.packed = &piece;
      posted.shard = &held;
      buffer_bytes += (posted.bytes + 255) & ~size_t{255};
    }
    into.push_back(posted);
    return absl::OkStatus();
  };
  for (const ExchangePiece& piece : plan.sends) {
    if (absl::Status posted = post(piece, sends); !posted.ok()) {
      return fail(posted);
    }
  }
  for (const ExchangePiece& piece : plan.recvs) {
    if (absl::Status posted = post(piece, recvs); !posted.ok()) {
      return fail(posted);
    }
  }
  char* buffer = nullptr;
  if (buffer_bytes > 0) {
    if (absl::Status allocated =
            CudaError(absl::StrCat("allocating ", buffer_bytes,
                                   " bytes of device memory for packed pieces"),
                      cudaMalloc(&buffer, buffer_bytes));
        !allocated.ok()) {
      return fail(allocated);
    }
  }
  const std::unique_ptr<char, void (*)(char*)> buffer_owner(buffer,
                                                            [](char* p) {
                                                              if (p != nullptr)
                                                                cudaFree(p);
                                                            });
  int64_t received = 0;
  for (std::vector<Posted>* list : {&sends, &recvs}) {
    for (Posted& posted : *list) {
      if (posted.packed != nullptr) {
        posted.data = buffer + posted.buffer_offset;
      }
    }
  }
  for (const Posted& posted : recvs) {
    received += static_cast<int64_t>(posted.bytes);
  }
  for (const Posted& posted : sends) {
    if (posted.packed == nullptr) continue;
    const cudaError_t packed = CopyPiece(posted, comm->stream, /*pack=*/true);
    if (packed != cudaSuccess) {
      return fail(CudaError("packing a piece on the device", packed));
    }
  }
  const std::string what =
      absl::StrCat("exchanging ", sends.size(), " piece(s) out and ",
                   recvs.size(), " in over NCCL as rank ", plan.rank);
  ncclResult_t result = ncclGroupStart();
  for (const Posted& posted : sends) {
    if (result != ncclSuccess) break;
    result = ncclSend(posted.data, posted.bytes, ncclUint8, posted.peer,
                      comm->comm, comm->stream);
  }
  for (const Posted& posted : recvs) {
    if (result != ncclSuccess) break;
    result = ncclRecv(posted.data, posted.bytes, ncclUint8, posted.peer,
                      comm->comm, comm->stream);
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
  for (const Posted& posted : recvs) {
    if (posted.packed == nullptr) continue;
    unpacking = true;
    const cudaError_t unpacked =
        CopyPiece(posted, comm->stream, /*pack=*/false);
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
  return received;
}

}  // namespace tessera
