// The host data plane over gRPC streams: read a sub-box of a remote shard as
// a stream of bounded row-major chunks, or write a whole shard. Used by the
// client (gather, region fetch, put) and by workers (pulling reshard pieces),
// so both move bytes the same way. Functions are thread-safe; run one per
// stream and as many streams in parallel as there are peers.
#ifndef TESSERA_TRANSPORT_GRPC_TRANSPORT_H_
#define TESSERA_TRANSPORT_GRPC_TRANSPORT_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "absl/time/time.h"
#include "core/box.h"
#include "proto/worker.grpc.pb.h"

namespace tessera {

// Bytes per data message. Well under gRPC's 4 MiB default message limit.
inline constexpr int64_t kDefaultChunkBytes = 1 << 20;

// Receives one chunk: `data` holds bytes [byte_offset, byte_offset + size) of
// the row-major sub-box.
using ChunkSink = std::function<absl::Status(int64_t byte_offset, absl::string_view data)>;

// Streams `box` (in the shard's own coordinates) of shard `shard_id` from the
// worker behind `stub` into `sink`. Fails if the stream ends early or a chunk
// falls outside the box's bytes; `context_text` prefixes errors
// ("reading shard 3 of 'emb' from w1").
absl::Status ReadRegion(v1::Worker::StubInterface* stub, uint64_t shard_id, const Box& box,
                        int64_t total_bytes, absl::Duration timeout, const ChunkSink& sink,
                        absl::string_view context_text);

// Produces one outgoing chunk: fills `dst` with bytes
// [byte_offset, byte_offset + dst.size()) of the shard's row-major contents.
using ChunkSource = std::function<void(int64_t byte_offset, absl::Span<char> dst)>;

// Streams `size` bytes, produced chunk by chunk by `source`, as the full
// contents of shard `shard_id`. Each byte is copied once, straight into the
// outgoing message.
absl::Status WriteShard(v1::Worker::StubInterface* stub, uint64_t shard_id, int64_t size,
                        const ChunkSource& source, absl::Duration timeout,
                        absl::string_view context_text);

}  // namespace tessera

#endif  // TESSERA_TRANSPORT_GRPC_TRANSPORT_H_
