// Sizes every layer agrees on: how bulk bytes are cut into messages and how
// large one message may be. One place, so the client, the worker and the
// transports cannot drift apart.
#ifndef TESSERA_CORE_LIMITS_H_
#define TESSERA_CORE_LIMITS_H_

#include <cstdint>

namespace tessera {

// Bytes per data chunk (one message of a stream, one shared-memory copy
// threshold). Measured best in bench/: 256 KiB..4 MiB within noise, smaller
// worse.
inline constexpr int64_t kChunkBytes = int64_t{1} << 20;

// Largest chunk, or small region read in one unary call, a worker serves.
inline constexpr int64_t kMaxChunkBytes = int64_t{4} << 20;

// Most sub-boxes one coalesced small read (Worker.ReadSmallRegions) names;
// their bytes together are at most kMaxChunkBytes.
inline constexpr int64_t kMaxRegionsPerSmallRead = 64;

// Most rows one row read (Worker.ReadRows) names: with kMaxChunkBytes it
// bounds the work and the reply of one call, even for rows of 0 bytes.
inline constexpr int64_t kMaxRowsPerRead = int64_t{1} << 16;

// Largest gRPC message either side accepts; data chunks are far smaller.
inline constexpr int kMaxMessageBytes = 64 << 20;

}  // namespace tessera

#endif  // TESSERA_CORE_LIMITS_H_
