// What a worker started with --store_dir keeps beside each sealed shard's
// bytes (CLI.md "Restart-safe workers (v3)"): which shard the file holds
// (tensor, version, incarnation, dtype, box), the cluster it belongs to,
// and the CRC-32 of its bytes when it was sealed. A restarted worker reads
// the records back (the files may be damaged or written by anyone with
// access to the directory): every field is bounded and checked. Pure
// functions; thread-safe.
#ifndef TESSERA_CORE_SHARD_RECORD_H_
#define TESSERA_CORE_SHARD_RECORD_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/box.h"
#include "core/dtype.h"

namespace tessera {

// Largest record read.
inline constexpr int64_t kMaxShardRecordBytes = 64 << 10;

struct ShardRecord {
  uint64_t shard_id = 0;
  std::string cluster_id;
  std::string tensor;
  uint64_t version = 0;
  uint64_t incarnation = 0;
  DType dtype = DType::kFloat32;
  Shape tensor_shape;
  Box box;            // the shard's box in the tensor
  int64_t bytes = 0;  // box elements x item size
  uint32_t crc32 = 0;
};

std::string ShardRecordJson(const ShardRecord& record);

// INVALID_ARGUMENT "store: ..." unless `text` is a record: every field
// present and of its type, names of 1 to 1024 bytes, rank at most 64, the
// box inside the tensor shape, `bytes` equal to the box's bytes.
absl::StatusOr<ShardRecord> ParseShardRecord(absl::string_view text);

// What a shard is, in 64 bits (FNV-1a of its tensor's name, incarnation and
// box): a registering worker reports it for each shard it holds, and the
// coordinator sets aside a re-attached shard whose identity is not the one
// it placed under that id (a record naming another tensor would otherwise
// be served to no reader: every capability names the tensor).
uint64_t ShardIdentity(absl::string_view tensor, uint64_t incarnation,
                       const Box& box);

}  // namespace tessera

#endif  // TESSERA_CORE_SHARD_RECORD_H_
