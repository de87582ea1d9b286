// The client's data plane: gather a region of a tensor from the workers that
// own it, and scatter a host array into a tensor's shards. Bytes flow
// directly between this process and the workers through the Connection's
// TransportChain (same-host shared memory when allowed, else gRPC), one
// piece at a time per worker, in parallel across workers, each byte landing
// straight in its final place.
#ifndef TESSERA_CLIENT_DATA_PLANE_H_
#define TESSERA_CLIENT_DATA_PLANE_H_

#include "absl/status/status.h"
#include "client/connection.h"
#include "core/box.h"
#include "core/box_index.h"
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

// Reads the whole of shard `index` of `meta` into `out` (row-major over the
// shard's box), straight from its worker.
absl::Status FetchShard(Connection& connection, const TensorMetadata& meta,
                        size_t index, char* out);

}  // namespace tessera

#endif  // TESSERA_CLIENT_DATA_PLANE_H_
