#include "client/data_plane.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/errors.h"
#include "core/region_plan.h"
#include "core/status_macros.h"
#include "core/strided_copy.h"
#include "rpc/status.h"
#include "transport/grpc_transport.h"
#include "transport/shared_memory.h"

namespace tessera {
namespace {

// Pieces smaller than this are read with one gRPC call even on the same
// host: mapping a segment costs about as much as the call (see bench/).
constexpr int64_t kSharedMemoryMinBytes = 1 << 20;

// Runs tasks on up to `parallelism` threads; the first error stops the tasks
// not yet started and is returned.
absl::Status RunParallel(std::vector<std::function<absl::Status()>> tasks,
                         int parallelism) {
  if (tasks.empty()) return absl::OkStatus();
  std::atomic<size_t> next{0};
  absl::Mutex mu;
  absl::Status first_error;
  std::atomic<bool> failed{false};
  auto worker = [&] {
    for (size_t i = next++; i < tasks.size() && !failed.load(); i = next++) {
      absl::Status status = tasks[i]();
      if (!status.ok()) {
        absl::MutexLock lock(&mu);
        if (first_error.ok()) first_error = status;
        failed = true;
      }
    }
  };
  const size_t n = std::min<size_t>(tasks.size(), std::max(1, parallelism));
  std::vector<std::thread> threads;
  for (size_t i = 1; i < n; ++i) threads.emplace_back(worker);
  worker();
  for (std::thread& t : threads) t.join();
  return first_error;
}

absl::Status CheckAvailable(const TensorMetadata& meta, size_t index) {
  const ShardInfo& shard = meta.shards[index];
  if (shard.available) return absl::OkStatus();
  return UnavailableError(absl::StrCat("shard ", index, " of tensor '",
                                       meta.name, "' on worker '", shard.worker,
                                       "' (rank ", shard.rank, ")"));
}

// Explains a read that failed because the shard's memory is gone.
absl::Status ExplainRead(absl::Status status, const TensorMetadata& meta,
                         size_t index) {
  const ShardInfo& shard = meta.shards[index];
  if (absl::IsNotFound(status)) {
    return absl::AbortedError(absl::StrCat(
        "shard ", index, " of tensor '", meta.name, "' version ", meta.version,
        " is no longer held by worker '", shard.worker,
        "' (the tensor was deleted or resharded): ", status.message()));
  }
  if (absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status)) {
    return Annotate(
        UnavailableError(absl::StrCat("worker '", shard.worker, "' at ",
                                      shard.address, " (", status.message(),
                                      ")")),
        absl::StrCat("reading shard ", index, " of tensor '", meta.name, "'"));
  }
  return Annotate(
      status, absl::StrCat("reading shard ", index, " of tensor '", meta.name,
                           "' from worker '", shard.worker, "'"));
}

// Copies `in_shard` of shard `index` to `in_out` of `out` (of `out_shape`)
// straight from the worker's shared memory when it is on this host.
// FAILED_PRECONDITION: not possible here, read it over gRPC instead.
absl::Status CopyShared(Connection& connection,
                        const std::shared_ptr<grpc::Channel>& channel,
                        const TensorMetadata& meta, size_t index,
                        const Box& in_shard, char* out,
                        absl::Span<const int64_t> out_shape,
                        absl::Span<const int64_t> in_out) {
  if (!connection.options().shared_memory)
    return absl::FailedPreconditionError("disabled");
  const ShardInfo& shard = meta.shards[index];
  const int64_t item = static_cast<int64_t>(ItemSize(meta.dtype));
  if (in_shard.NumElements() * item < kSharedMemoryMinBytes) {
    return absl::FailedPreconditionError("small: one gRPC call is as fast");
  }
  TESSERA_ASSIGN_OR_RETURN(
      std::shared_ptr<const ShardMapping> mapping,
      connection.mappings().Map(shard.address, channel, shard.shard_id, item,
                                connection.options().data_timeout));
  if (!SameDims(mapping->shape(), shard.box.sizes)) {
    return absl::FailedPreconditionError(
        "segment's shape differs from the metadata");
  }
  CopyBox(mapping->At(0), mapping->shape(), in_shard.offsets, out, out_shape,
          in_out, in_shard.sizes, static_cast<size_t>(item));
  return absl::OkStatus();
}

}  // namespace

absl::Status GatherRegion(Connection& connection, const TensorMetadata& meta,
                          const Box& region, char* out) {
  const std::vector<RegionPiece> pieces = PlanRegion(
      meta.shards.size(),
      [&](size_t i) -> const Box& { return meta.shards[i].box; }, region);
  for (const RegionPiece& piece : pieces) {
    TESSERA_RETURN_IF_ERROR(CheckAvailable(meta, piece.shard_index));
  }
  const size_t item = ItemSize(meta.dtype);
  // Pieces grouped by worker, so each worker serves one stream at a time
  // and all workers stream in parallel.
  std::map<std::string, std::vector<const RegionPiece*>> by_worker;
  for (const RegionPiece& piece : pieces) {
    by_worker[meta.shards[piece.shard_index].address].push_back(&piece);
  }
  std::vector<std::function<absl::Status()>> tasks;
  for (const auto& [address, worker_pieces] : by_worker) {
    tasks.push_back([&, address = address,
                     worker_pieces = worker_pieces]() -> absl::Status {
      std::shared_ptr<grpc::Channel> channel =
          connection.WorkerChannel(address);
      for (const RegionPiece* piece : worker_pieces) {
        const ShardInfo& shard = meta.shards[piece->shard_index];
        absl::Status status = RetryConnectFailures([&]() -> absl::Status {
          absl::Status shared = CopyShared(
              connection, channel, meta, piece->shard_index, piece->in_shard,
              out, region.sizes, piece->in_region.offsets);
          if (!absl::IsFailedPrecondition(shared)) return shared;
          return ReadRegion(
              channel, shard.shard_id, piece->in_shard,
              static_cast<int64_t>(item), connection.options().data_timeout,
              [&](int64_t byte_offset, absl::string_view data) -> absl::Status {
                CopyFlatRangeToBox(data.data(),
                                   byte_offset / static_cast<int64_t>(item),
                                   static_cast<int64_t>(data.size() / item),
                                   piece->in_region.sizes, out, region.sizes,
                                   piece->in_region.offsets, item);
                return absl::OkStatus();
              },
              "");
        });
        if (!status.ok()) return ExplainRead(status, meta, piece->shard_index);
      }
      return absl::OkStatus();
    });
  }
  return RunParallel(std::move(tasks),
                     connection.options().max_parallel_streams);
}

absl::Status ScatterTensor(Connection& connection, const TensorMetadata& meta,
                           const char* src) {
  const size_t item = ItemSize(meta.dtype);
  std::map<std::string, std::vector<size_t>> by_worker;
  for (size_t i = 0; i < meta.shards.size(); ++i)
    by_worker[meta.shards[i].address].push_back(i);
  std::vector<std::function<absl::Status()>> tasks;
  for (const auto& [address, indices] : by_worker) {
    tasks.push_back([&, address = address,
                     indices = indices]() -> absl::Status {
      std::unique_ptr<v1::Worker::Stub> stub = connection.WorkerStub(address);
      std::shared_ptr<grpc::Channel> channel =
          connection.WorkerChannel(address);
      for (size_t index : indices) {
        const ShardInfo& shard = meta.shards[index];
        const int64_t bytes =
            shard.box.NumElements() * static_cast<int64_t>(item);
        const std::string context =
            absl::StrCat("writing shard ", index, " of tensor '", meta.name,
                         "' to worker '", shard.worker, "'");
        absl::Status status = RetryConnectFailures([&]() -> absl::Status {
          // Same host: write into the shard's shared memory directly.
          if (connection.options().shared_memory &&
              bytes >= kSharedMemoryMinBytes) {
            absl::StatusOr<std::unique_ptr<ShardMapping>> mapping =
                MapShardForWrite(channel, shard.shard_id,
                                 static_cast<int64_t>(item),
                                 connection.options().data_timeout);
            if (mapping.ok() &&
                SameDims((*mapping)->shape(), shard.box.sizes)) {
              CopyBox(src, meta.shape, shard.box.offsets,
                      (*mapping)->MutableAt(0), shard.box.sizes,
                      std::vector<int64_t>(shard.box.rank(), 0),
                      shard.box.sizes, item);
              return absl::OkStatus();
            }
            if (!mapping.ok() &&
                !absl::IsFailedPrecondition(mapping.status())) {
              return Annotate(mapping.status(), context);
            }
          }
          return WriteShard(
              stub.get(), shard.shard_id, bytes,
              [&](int64_t byte_offset, absl::Span<char> dst) {
                CopyBoxToFlatRange(
                    src, meta.shape, shard.box.offsets, shard.box.sizes,
                    byte_offset / static_cast<int64_t>(item),
                    static_cast<int64_t>(dst.size() / item), dst.data(), item);
              },
              connection.options().data_timeout, context);
        });
        if (!status.ok()) return status;
      }
      return absl::OkStatus();
    });
  }
  return RunParallel(std::move(tasks),
                     connection.options().max_parallel_streams);
}

absl::Status FetchShard(Connection& connection, const TensorMetadata& meta,
                        size_t index, char* out) {
  const ShardInfo& shard = meta.shards[index];
  TESSERA_RETURN_IF_ERROR(CheckAvailable(meta, index));
  const size_t item = ItemSize(meta.dtype);
  Box whole = WholeBox(shard.box.sizes);
  std::shared_ptr<grpc::Channel> channel =
      connection.WorkerChannel(shard.address);
  absl::Status status = RetryConnectFailures([&]() -> absl::Status {
    absl::Status shared = CopyShared(connection, channel, meta, index, whole,
                                     out, shard.box.sizes, whole.offsets);
    if (!absl::IsFailedPrecondition(shared)) return shared;
    return ReadRegion(
        channel, shard.shard_id, whole, static_cast<int64_t>(item),
        connection.options().data_timeout,
        [&](int64_t byte_offset, absl::string_view data) -> absl::Status {
          std::memcpy(out + byte_offset, data.data(), data.size());
          return absl::OkStatus();
        },
        "");
  });
  if (!status.ok()) return ExplainRead(status, meta, index);
  return absl::OkStatus();
}

}  // namespace tessera
