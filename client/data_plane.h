// The client's data plane: gather a region of a tensor from the workers that
// own it, and scatter a host array into a tensor's shards. Bytes flow
// directly between this process and the workers through the Connection's
// TransportChain (same-host shared memory when allowed, else gRPC), one
// piece at a time per worker, in parallel across workers, each byte landing
// straight in its final place.
#ifndef TESSERA_CLIENT_DATA_PLANE_H_
#define TESSERA_CLIENT_DATA_PLANE_H_

#include <cstdint>
#include <functional>
#include <optional>

#include "absl/status/status.h"
#include "client/connection.h"
#include "core/box.h"
#include "core/box_index.h"
#include "core/region_plan.h"
#include "core/tensor_metadata.h"

namespace tessera {

// Reads `region` (tensor coordinates, validated) of the tensor described by
// `meta` into `out`, a row-major buffer of region.sizes elements. Fails with
// UNAVAILABLE naming the worker if a needed shard is unavailable; never
// leaves a hole silently.
absl::Status GatherRegion(Connection& connection, const TensorMetadata& meta,
                          const Box& region, char* out);
// The same, finding the shards that meet `region` through `index`, a
// BoxIndex of meta's shard boxes in their order: O(log n + pieces) for n
// shards instead of a look at every shard. Null: look at every shard.
absl::Status GatherRegion(Connection& connection, const TensorMetadata& meta,
                          const BoxIndex* index, const Box& region, char* out);

// Writes every shard of `meta` from `src`, a row-major array of the whole
// tensor.
absl::Status ScatterTensor(Connection& connection, const TensorMetadata& meta,
                           const char* src);

// Reads the rows `plan` names (tensor rows, checked against meta's dim 0)
// into `out`, a row-major array of shape [num_positions] + shape[1:], row
// plan.rows[i] landing at each of its positions. Each distinct row is read
// once, from every shard it spans (rows split across column shards too),
// with one batched row read per worker, all workers in parallel.
absl::Status GatherRows(Connection& connection, const TensorMetadata& meta,
                        const RowPlan& plan, char* out);

// Writes the new contents of an update into the shards of version N+1
// (`meta`): `src` is a row-major array of `region`'s sizes (none: the
// whole tensor). Shards outside the region are skipped (taken over from N),
// shards inside it written whole, shards partly inside patched with their
// part. Adds the bytes sent to `*bytes_written`.
absl::Status ScatterUpdate(Connection& connection, const TensorMetadata& meta,
                           const std::optional<Box>& region, const char* src,
                           int64_t* bytes_written);

// Reads the whole of shard `index` of `meta` into `out` (row-major over the
// shard's box), straight from its worker.
absl::Status FetchShard(Connection& connection, const TensorMetadata& meta,
                        size_t index, char* out);
// Reads sub-box `in_shard` (shard coordinates) of shard `index` into `out`,
// row-major over the sub-box.
absl::Status FetchShardBox(Connection& connection, const TensorMetadata& meta,
                           size_t index, const Box& in_shard, char* out);

// The one rule by which a read goes from replica to replica, for reads that
// do not go through the data plane's transports (the GPU side's CUDA IPC):
// runs `read` at the available replicas of shard `index` (nearest first) in
// turn until one serves it, as host reads do. `bytes` is what it reads,
// for the time one replica may take while another could serve it.
// UNAVAILABLE naming the worker when no replica is available; otherwise the
// last replica's error, explained.
absl::Status ReadFromAnyReplica(
    Connection& connection, const TensorMetadata& meta, size_t index,
    int64_t bytes,
    const std::function<absl::Status(const ShardLocation&)>& read);

// The data plane's view of shard `index` of `meta` at `location`.
RemoteShard ShardAt(const TensorMetadata& meta, size_t index,
                    const ShardLocation& location);

}  // namespace tessera

#endif  // TESSERA_CLIENT_DATA_PLANE_H_
