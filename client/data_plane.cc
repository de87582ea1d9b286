#include "client/data_plane.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/errors.h"
#include "core/region_plan.h"
#include "core/status_macros.h"
#include "core/strided_copy.h"
#include "transport/grpc_transport.h"

namespace tessera {
namespace {

// Runs tasks on up to `parallelism` threads; the first error stops the tasks
// not yet started and is returned.
absl::Status RunParallel(std::vector<std::function<absl::Status()>> tasks, int parallelism) {
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
  return UnavailableError(absl::StrCat("shard ", index, " of tensor '", meta.name,
                                       "' on worker '", shard.worker, "' (rank ", shard.rank, ")"));
}

// Explains a read that failed because the shard's memory is gone.
absl::Status ExplainRead(absl::Status status, const TensorMetadata& meta, size_t index) {
  const ShardInfo& shard = meta.shards[index];
  if (absl::IsNotFound(status)) {
    return absl::AbortedError(absl::StrCat(
        "shard ", index, " of tensor '", meta.name, "' version ", meta.version,
        " is no longer held by worker '", shard.worker,
        "' (the tensor was deleted or resharded): ", status.message()));
  }
  if (absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status)) {
    return Annotate(UnavailableError(absl::StrCat("worker '", shard.worker, "' at ",
                                                  shard.address, " (", status.message(), ")")),
                    absl::StrCat("reading shard ", index, " of tensor '", meta.name, "'"));
  }
  return Annotate(status, absl::StrCat("reading shard ", index, " of tensor '", meta.name,
                                       "' from worker '", shard.worker, "'"));
}

}  // namespace

absl::Status GatherRegion(Connection& connection, const TensorMetadata& meta, const Box& region,
                          char* out) {
  const std::vector<RegionPiece> pieces = PlanRegion(meta.Boxes(), region);
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
    tasks.push_back([&, address = address, worker_pieces = worker_pieces]() -> absl::Status {
      std::unique_ptr<v1::Worker::Stub> stub = connection.WorkerStub(address);
      for (const RegionPiece* piece : worker_pieces) {
        const ShardInfo& shard = meta.shards[piece->shard_index];
        const int64_t total = piece->in_shard.NumElements() * static_cast<int64_t>(item);
        absl::Status status = ReadRegion(
            stub.get(), shard.shard_id, piece->in_shard, total, connection.options().data_timeout,
            [&](int64_t byte_offset, absl::string_view data) -> absl::Status {
              if (byte_offset % item != 0 || data.size() % item != 0) {
                return absl::DataLossError("chunk is not aligned to whole elements");
              }
              CopyFlatRangeToBox(data.data(), byte_offset / static_cast<int64_t>(item),
                                 static_cast<int64_t>(data.size() / item), piece->in_region.sizes,
                                 out, region.sizes, piece->in_region.offsets, item);
              return absl::OkStatus();
            },
            "");
        if (!status.ok()) return ExplainRead(status, meta, piece->shard_index);
      }
      return absl::OkStatus();
    });
  }
  return RunParallel(std::move(tasks), connection.options().max_parallel_streams);
}

absl::Status ScatterTensor(Connection& connection, const TensorMetadata& meta, const char* src) {
  const size_t item = ItemSize(meta.dtype);
  std::map<std::string, std::vector<size_t>> by_worker;
  for (size_t i = 0; i < meta.shards.size(); ++i) by_worker[meta.shards[i].address].push_back(i);
  std::vector<std::function<absl::Status()>> tasks;
  for (const auto& [address, indices] : by_worker) {
    tasks.push_back([&, address = address, indices = indices]() -> absl::Status {
      std::unique_ptr<v1::Worker::Stub> stub = connection.WorkerStub(address);
      for (size_t index : indices) {
        const ShardInfo& shard = meta.shards[index];
        const int64_t bytes = shard.box.NumElements() * static_cast<int64_t>(item);
        absl::Status status = WriteShard(
            stub.get(), shard.shard_id, bytes,
            [&](int64_t byte_offset, absl::Span<char> dst) {
              CopyBoxToFlatRange(src, meta.shape, shard.box.offsets, shard.box.sizes,
                                 byte_offset / static_cast<int64_t>(item),
                                 static_cast<int64_t>(dst.size() / item), dst.data(), item);
            },
            connection.options().data_timeout,
            absl::StrCat("writing shard ", index, " of tensor '", meta.name, "' to worker '",
                         shard.worker, "'"));
        if (!status.ok()) return status;
      }
      return absl::OkStatus();
    });
  }
  return RunParallel(std::move(tasks), connection.options().max_parallel_streams);
}

absl::Status FetchShard(Connection& connection, const TensorMetadata& meta, size_t index,
                        char* out) {
  const ShardInfo& shard = meta.shards[index];
  TESSERA_RETURN_IF_ERROR(CheckAvailable(meta, index));
  const size_t item = ItemSize(meta.dtype);
  Box whole = WholeBox(shard.box.sizes);
  const int64_t total = whole.NumElements() * static_cast<int64_t>(item);
  std::unique_ptr<v1::Worker::Stub> stub = connection.WorkerStub(shard.address);
  absl::Status status = ReadRegion(
      stub.get(), shard.shard_id, whole, total, connection.options().data_timeout,
      [&](int64_t byte_offset, absl::string_view data) -> absl::Status {
        std::memcpy(out + byte_offset, data.data(), data.size());
        return absl::OkStatus();
      },
      "");
  if (!status.ok()) return ExplainRead(status, meta, index);
  return absl::OkStatus();
}

}  // namespace tessera
