#include "client/data_plane.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/errors.h"
#include "core/fan_out.h"
#include "core/region_plan.h"
#include "core/status_macros.h"
#include "core/strided_copy.h"
#include "core/tensor_metadata.h"
#include "rpc/channel.h"
#include "rpc/status.h"
#include "transport/shard_transport.h"
#include "transport/transport_chain.h"

namespace tessera {
namespace {

// Runs tasks on up to `parallelism` threads (FanOut); the first error
// stops the tasks not yet started and is returned.
absl::Status RunParallel(std::vector<std::function<absl::Status()>> tasks,
                         int parallelism) {
  // The caller's deadline and cancellation hold in the threads it borrows.
  const absl::Time deadline = ScopedCallDeadline::Current();
  Cancellation* const cancellation = ScopedCancellation::Current();
  return FanOut(tasks.size(), static_cast<size_t>(std::max(1, parallelism)),
                [&](size_t i) {
                  ScopedCallDeadline scoped_deadline(deadline);
                  ScopedCancellation scoped_cancellation(cancellation);
                  return tasks[i]();
                });
}

// Bytes a read being planned has given each worker so far (by address):
// added to what is in flight, so that one read spreads over equally near
// replicas.
using PlannedBytes = std::map<std::string, int64_t>;

// Where shard `index` is read from (ReadLocations, nearest first, counting
// `bytes` into `planned` for the first); UNAVAILABLE naming the worker
// when no replica of it is available.
absl::StatusOr<ShardLocations> Readable(Connection& connection,
                                        const TensorMetadata& meta,
                                        size_t index, int64_t bytes = 0,
                                        PlannedBytes* planned = nullptr) {
  ShardLocations locations = ReadLocations(meta, index);
  if (locations.size() > 1) {
    NearestFirst(&locations, [&](const ShardLocation& at) {
      ReplicaNearness near = connection.NearnessOf(at.address);
      if (planned != nullptr) {
        auto it = planned->find(at.address);
        if (it != planned->end()) near.bytes_in_flight += it->second;
      }
      return near;
    });
  }
  if (planned != nullptr) (*planned)[locations.front().address] += bytes;
  const ShardLocation& best = locations.front();
  if (best.available) return locations;
  return UnavailableError(absl::StrCat(
      "shard ", index, " of tensor '", meta.name, "' on worker '", best.worker,
      "' (rank ", meta.shards[index].replicas[best.replica].rank, ")"));
}

// Explains a read from `location` that failed because the shard's memory
// is gone.
absl::Status ExplainRead(absl::Status status, const TensorMetadata& meta,
                         size_t index, const ShardLocation& location) {
  if (absl::IsNotFound(status)) {
    return absl::AbortedError(absl::StrCat(
        "shard ", index, " of tensor '", meta.name, "' version ", meta.version,
        " is no longer held by worker '", location.worker,
        "' (the tensor was deleted or resharded): ", status.message()));
  }
  if (absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status)) {
    return Annotate(
        UnavailableError(absl::StrCat("worker '", location.worker, "' at ",
                                      location.address, " (", status.message(),
                                      ")")),
        absl::StrCat("reading shard ", index, " of tensor '", meta.name, "'"));
  }
  return Annotate(
      status, absl::StrCat("reading shard ", index, " of tensor '", meta.name,
                           "' from worker '", location.worker, "'"));
}

// Runs `call` (a move to or from the worker at `address`), retrying while
// the worker cannot be reached; if it still cannot, once more on a fresh
// channel (a restarted worker leaves the old one in reconnect backoff).
absl::Status RetryOnFreshChannel(Connection& connection,
                                 const std::string& address,
                                 const std::function<absl::Status()>& call) {
  absl::Status status = RetryTransportFailures(call);
  if (!IsTransportFailure(status)) return status;
  connection.ForgetWorker(address);
  return RetryTransportFailures(call);
}

}  // namespace

RemoteShard ShardAt(const TensorMetadata& meta, size_t index,
                    const ShardLocation& location) {
  RemoteShard shard;
  shard.location = location;
  shard.item_bytes = static_cast<int64_t>(ItemSize(meta.dtype));
  shard.shape = ToShape(meta.shards[index].box.sizes);
  return shard;
}

namespace {

// How long a read of `bytes` may wait for one replica when another could
// serve it (ClientOptions::replica_timeout).
absl::Time ReplicaDeadline(const Connection& connection, int64_t bytes) {
  const ClientOptions& o = connection.options();
  const double rate =
      static_cast<double>(std::max<int64_t>(1, o.replica_min_bytes_per_second));
  return absl::Now() + o.replica_timeout +
         absl::Seconds(static_cast<double>(bytes) / rate);
}

// Whether `locations` has an available replica after the one at `i`.
bool AnotherAfter(const ShardLocations& locations, size_t i) {
  return i + 1 < locations.size() && locations[i + 1].available;
}

// The one rule for going from replica to replica: runs `read` (`bytes` of
// shard `index`) at each available location of `locations` in order, but
// the one at `failed` (a worker that already failed it), until one serves
// it. While another could serve it a replica gets one try within its
// ReplicaDeadline; the last one gets the retries. When none serves it: the
// last error, explained, or `status` when there was none to try.
absl::Status FromAnyReplica(
    Connection& connection, const TensorMetadata& meta, size_t index,
    const ShardLocations& locations, int64_t bytes,
    const std::function<absl::Status(const ShardLocation&)>& read,
    absl::Status status, const std::string& failed = "") {
  ShardLocations tries;
  for (const ShardLocation& location : locations) {
    if (!location.available) break;  // the rest are unavailable too
    if (location.address != failed) tries.push_back(location);
  }
  for (size_t i = 0; i < tries.size(); ++i) {
    const ShardLocation& location = tries[i];
    if (i + 1 < tries.size()) {
      const ScopedCallDeadline bounded(ReplicaDeadline(connection, bytes));
      status = read(location);
    } else {
      status = RetryOnFreshChannel(connection, location.address,
                                   [&] { return read(location); });
    }
    if (status.ok()) return status;
    status = ExplainRead(status, meta, index, location);
  }
  return status;
}

absl::Status NoReplicaAvailable(size_t index) {
  return absl::UnavailableError(
      absl::StrCat("no replica of shard ", index, " is available"));
}

// Reads `in_shard` (shard coordinates) of shard `index` into `target`, from
// the first of `locations` (Readable's) that serves it.
absl::Status ReadShardBox(Connection& connection, const TensorMetadata& meta,
                          size_t index, const ShardLocations& locations,
                          const Box& in_shard, const ReadTarget& target) {
  return FromAnyReplica(
      connection, meta, index, locations,
      in_shard.NumElements() * static_cast<int64_t>(ItemSize(meta.dtype)),
      [&](const ShardLocation& location) {
        return connection.data_plane().Read(ShardAt(meta, index, location),
                                            in_shard, target);
      },
      NoReplicaAvailable(index));
}

}  // namespace

absl::Status GatherRegion(Connection& connection, const TensorMetadata& meta,
                          const Box& region, char* out) {
  return GatherRegion(connection, meta, nullptr, region, out);
}

absl::Status GatherRegion(Connection& connection, const TensorMetadata& meta,
                          const BoxIndex* index, const Box& region, char* out) {
  const std::vector<RegionPiece> pieces = PlanRegion(
      index, meta.shards.size(),
      [&](size_t i) -> const Box& { return meta.shards[i].box; }, region);
  // Pieces grouped by the worker each is read from first, so each worker
  // serves one stream at a time and all workers stream in parallel.
  struct PieceRead {
    const RegionPiece* piece;
    ShardLocations locations;
  };
  std::vector<PieceRead> reads;
  reads.reserve(pieces.size());
  PlannedBytes planned;
  const int64_t item = static_cast<int64_t>(ItemSize(meta.dtype));
  for (const RegionPiece& piece : pieces) {
    TESSERA_ASSIGN_OR_RETURN(
        ShardLocations locations,
        Readable(connection, meta, piece.shard_index,
                 piece.in_shard.NumElements() * item, &planned));
    reads.push_back({&piece, std::move(locations)});
  }
  std::map<std::string, std::vector<const PieceRead*>> by_worker;
  for (const PieceRead& read : reads) {
    by_worker[read.locations.front().address].push_back(&read);
  }
  std::vector<std::function<absl::Status()>> tasks;
  for (const auto& [address, worker_reads] : by_worker) {
    tasks.push_back([&, worker_reads = worker_reads]() -> absl::Status {
      for (const PieceRead* read : worker_reads) {
        const RegionPiece& piece = *read->piece;
        TESSERA_RETURN_IF_ERROR(ReadShardBox(
            connection, meta, piece.shard_index, read->locations,
            piece.in_shard,
            ReadTarget::HostArray(out, region.sizes, piece.in_region.offsets)));
      }
      return absl::OkStatus();
    });
  }
  return RunParallel(std::move(tasks),
                     connection.options().max_parallel_streams);
}

absl::Status ScatterTensor(Connection& connection, const TensorMetadata& meta,
                           const char* src) {
  // Where each shard is written (WriteLocations: its first replica; the
  // commit forwards to the others), grouped by worker.
  struct ShardWrite {
    size_t index;
    ShardLocation location;
  };
  std::map<std::string, std::vector<ShardWrite>> by_worker;
  for (size_t i = 0; i < meta.shards.size(); ++i) {
    for (ShardLocation& location : WriteLocations(meta, i)) {
      std::vector<ShardWrite>& writes = by_worker[location.address];
      writes.push_back({i, std::move(location)});
    }
  }
  std::vector<std::function<absl::Status()>> tasks;
  for (const auto& [address, writes] : by_worker) {
    tasks.push_back([&, address = address, &writes = writes]() -> absl::Status {
      for (const ShardWrite& write : writes) {
        const size_t index = write.index;
        const ShardInfo& info = meta.shards[index];
        const RemoteShard shard = ShardAt(meta, index, write.location);
        WriteSource source;
        source.data = src;
        source.shape = meta.shape;
        source.offsets.assign(info.box.offsets.begin(), info.box.offsets.end());
        absl::Status status = RetryOnFreshChannel(connection, address, [&] {
          return connection.data_plane().Write(shard, source);
        });
        if (!status.ok()) {
          return Annotate(
              status,
              absl::StrCat("writing shard ", index, " of tensor '", meta.name,
                           "' to worker '", write.location.worker, "'"));
        }
      }
      return absl::OkStatus();
    });
  }
  return RunParallel(std::move(tasks),
                     connection.options().max_parallel_streams);
}

absl::Status GatherRows(Connection& connection, const TensorMetadata& meta,
                        const RowPlan& plan, char* out) {
  if (meta.shape.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", meta.name, "' is 0-d: it has no rows"));
  }
  const int64_t item = static_cast<int64_t>(ItemSize(meta.dtype));
  // The output: one row of the tensor per position.
  Shape out_shape = meta.shape;
  out_shape[0] = static_cast<int64_t>(plan.positions.size());
  const int64_t out_row_bytes = RowBytes(out_shape, item);
  if (plan.rows.empty() || out_row_bytes == 0) return absl::OkStatus();

  // Each shard's share: the distinct rows inside it, batched per worker.
  struct Share {
    size_t shard_index;
    size_t first_row;  // index into plan.rows of the entry's first row
    bool has_other;    // another available replica could serve it
  };
  std::map<std::string, std::pair<std::vector<ShardRows>, std::vector<Share>>>
      by_worker;
  PlannedBytes planned;
  for (size_t i = 0; i < meta.shards.size(); ++i) {
    const Box& box = meta.shards[i].box;
    const auto [lo, hi] =
        plan.Within(box.offsets[0], box.offsets[0] + box.sizes[0]);
    if (lo == hi || box.NumElements() == 0) continue;
    TESSERA_ASSIGN_OR_RETURN(
        const ShardLocations locations,
        Readable(connection, meta, i,
                 static_cast<int64_t>(hi - lo) * RowBytes(box.sizes, item),
                 &planned));
    const ShardLocation& location = locations.front();
    auto& [entries, shares] = by_worker[location.address];
    ShardRows& entry = entries.emplace_back();
    entry.shard = ShardAt(meta, i, location);
    entry.rows.reserve(hi - lo);
    for (size_t r = lo; r < hi; ++r)
      entry.rows.push_back(plan.rows[r] - box.offsets[0]);
    shares.push_back({i, lo, AnotherAfter(locations, 0)});
  }
  std::vector<std::function<absl::Status()>> tasks;
  for (auto& [address, work] : by_worker) {
    tasks.push_back([&, address = address, &entries = work.first,
                     &shares = work.second]() -> absl::Status {
      // Lands row k of entry e at every position of its tensor row: a
      // shard spanning whole rows is one copy per position, else its part
      // of the row goes to its columns.
      const RowSink sink = [&](size_t e, size_t k, const char* row) {
        const ShardInfo& shard = meta.shards[shares[e].shard_index];
        const size_t r = shares[e].first_row + k;
        const int64_t shard_row_bytes = RowBytes(shard.box.sizes, item);
        if (shard_row_bytes == out_row_bytes) {  // whole rows: one copy each
          for (int64_t p = plan.first[r]; p < plan.first[r + 1]; ++p) {
            std::memcpy(out + plan.positions[p] * out_row_bytes, row,
                        static_cast<size_t>(out_row_bytes));
          }
          return;
        }
        std::vector<int64_t> sizes(shard.box.sizes.begin(),
                                   shard.box.sizes.end());
        sizes[0] = 1;
        std::vector<int64_t> offsets(shard.box.offsets.begin(),
                                     shard.box.offsets.end());
        for (int64_t p = plan.first[r]; p < plan.first[r + 1]; ++p) {
          offsets[0] = plan.positions[p];
          CopyFlatRangeToBox(row, 0, shard_row_bytes / item, sizes, out,
                             out_shape, offsets, static_cast<size_t>(item));
        }
      };
      // Bounded when every share could go on elsewhere (a hung worker).
      auto read = [&] {
        return connection.data_plane().ReadRows(entries, sink);
      };
      absl::Status status;
      if (std::all_of(shares.begin(), shares.end(),
                      [](const Share& s) { return s.has_other; })) {
        int64_t bytes = 0;
        for (const ShardRows& entry : entries) {
          bytes += static_cast<int64_t>(entry.rows.size()) *
                   RowBytes(entry.shard.shape, item);
        }
        const ScopedCallDeadline bounded(ReplicaDeadline(connection, bytes));
        status = read();  // one try: the other replicas can serve it
      } else {
        status = RetryOnFreshChannel(connection, address, read);
      }
      if (status.ok()) return status;
      status = ExplainRead(status, meta, shares.front().shard_index,
                           entries.front().shard.location);
      // This worker failed: each of its shares goes on from the shard's
      // other replicas, in ReadLocations order (rows land again whole).
      for (size_t e = 0; e < entries.size(); ++e) {
        const size_t index = shares[e].shard_index;
        absl::StatusOr<ShardLocations> others =
            Readable(connection, meta, index);
        if (!others.ok()) return status;
        const RowSink to_entry = [&](size_t, size_t k, const char* row) {
          sink(e, k, row);
        };
        TESSERA_RETURN_IF_ERROR(FromAnyReplica(
            connection, meta, index, *others,
            static_cast<int64_t>(entries[e].rows.size()) *
                RowBytes(entries[e].shard.shape, item),
            [&](const ShardLocation& location) {
              std::vector<ShardRows> one(1);
              one[0].shard = ShardAt(meta, index, location);
              one[0].rows = entries[e].rows;
              return connection.data_plane().ReadRows(one, to_entry);
            },
            status, address));
      }
      return absl::OkStatus();
    });
  }
  return RunParallel(std::move(tasks),
                     connection.options().max_parallel_streams);
}

absl::Status ScatterUpdate(Connection& connection, const TensorMetadata& meta,
                           const std::optional<Box>& region, const char* src,
                           int64_t* bytes_written) {
  const int64_t item = static_cast<int64_t>(ItemSize(meta.dtype));
  const Box source_box = region.has_value() ? *region : WholeBox(meta.shape);
  struct Part {
    size_t index;
    Box in_shard;
    bool whole;
    ShardLocation location;
  };
  // Each shard the update writes, where it is written (WriteLocations),
  // grouped by worker.
  std::map<std::string, std::vector<Part>> by_worker;
  for (size_t i = 0; i < meta.shards.size(); ++i) {
    Box in_shard;
    const UpdateAction action =
        ClassifyForUpdate(meta.shards[i].box, region, &in_shard);
    if (action == UpdateAction::kKeep) continue;
    for (ShardLocation& location : WriteLocations(meta, i)) {
      std::vector<Part>& parts = by_worker[location.address];
      parts.push_back(
          {i, in_shard, action == UpdateAction::kRewrite, std::move(location)});
    }
    *bytes_written += in_shard.NumElements() * item;
  }
  std::vector<std::function<absl::Status()>> tasks;
  for (const auto& [address, parts] : by_worker) {
    tasks.push_back([&, address = address, &parts = parts]() -> absl::Status {
      for (const Part& part : parts) {
        const ShardInfo& info = meta.shards[part.index];
        const RemoteShard shard = ShardAt(meta, part.index, part.location);
        // The part's bytes in `src`: its tensor box relative to the region.
        WriteSource source;
        source.data = src;
        source.shape = ToShape(source_box.sizes);
        for (size_t d = 0; d < info.box.rank(); ++d) {
          source.offsets.push_back(info.box.offsets[d] +
                                   part.in_shard.offsets[d] -
                                   source_box.offsets[d]);
        }
        absl::Status status = RetryOnFreshChannel(connection, address, [&] {
          return part.whole ? connection.data_plane().Write(shard, source)
                            : connection.data_plane().WriteBox(
                                  shard, part.in_shard, source);
        });
        if (!status.ok()) {
          return Annotate(
              status, absl::StrCat("writing shard ", part.index, " of tensor '",
                                   meta.name, "' to worker '",
                                   part.location.worker, "'"));
        }
      }
      return absl::OkStatus();
    });
  }
  return RunParallel(std::move(tasks),
                     connection.options().max_parallel_streams);
}

absl::Status FetchShard(Connection& connection, const TensorMetadata& meta,
                        size_t index, char* out) {
  return FetchShardBox(connection, meta, index,
                       WholeBox(meta.shards[index].box.sizes), out);
}

absl::Status ReadFromAnyReplica(
    Connection& connection, const TensorMetadata& meta, size_t index,
    int64_t bytes,
    const std::function<absl::Status(const ShardLocation&)>& read) {
  TESSERA_ASSIGN_OR_RETURN(const ShardLocations locations,
                           Readable(connection, meta, index));
  return FromAnyReplica(connection, meta, index, locations, bytes, read,
                        NoReplicaAvailable(index));
}

absl::Status FetchShardBox(Connection& connection, const TensorMetadata& meta,
                           size_t index, const Box& in_shard, char* out) {
  TESSERA_ASSIGN_OR_RETURN(const ShardLocations locations,
                           Readable(connection, meta, index));
  const std::vector<int64_t> zeros(in_shard.rank(), 0);
  return ReadShardBox(connection, meta, index, locations, in_shard,
                      ReadTarget::HostArray(out, in_shard.sizes, zeros));
}

}  // namespace tessera
