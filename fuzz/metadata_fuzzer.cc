// Fuzzes the reading of a tensor's metadata from the wire or from the
// coordinator's --data_dir: TensorMetadataFromProto on a parsed
// ShardedTensorMetadata (shards one message each or packed in columns, one
// owner per shard or several replicas). Invariants checked (trap on
// failure): what reads back has at least one replica per shard and boxes of
// the tensor's rank; ReadLocations lists every replica once, the available
// ones first and each group in replica order; WriteLocations lists the
// first replica alone; written again in either encoding it reads back the
// same (the packed one keeps one rank, address and device per worker, so
// that one is compared only where the input agrees with it); a shard of
// one replica is written without replica fields.
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/tensor_metadata.h"
#include "fuzz/fuzz_util.h"
#include "proto/tensor.pb.h"
#include "rpc/convert.h"

namespace tessera {
namespace {

void CheckRules(const TensorMetadata& meta) {
  for (size_t i = 0; i < meta.shards.size(); ++i) {
    const ShardInfo& shard = meta.shards[i];
    FUZZ_CHECK(!shard.replicas.empty(), absl::StrCat("shard ", i));
    FUZZ_CHECK(shard.box.rank() == meta.shape.size(), absl::StrCat(i));
    const ShardLocations reads = ReadLocations(meta, i);
    const ShardLocations writes = WriteLocations(meta, i);
    FUZZ_CHECK(reads.size() == shard.replicas.size(), "reads");
    FUZZ_CHECK(writes.size() == 1, "writes");
    std::vector<bool> seen(shard.replicas.size(), false);
    for (size_t k = 0; k < reads.size(); ++k) {
      const size_t r = reads[k].replica;
      FUZZ_CHECK(r < seen.size() && !seen[r], "read replica listed twice");
      seen[r] = true;
      FUZZ_CHECK(reads[k].available == shard.replicas[r].available &&
                     reads[k].shard_id == shard.replicas[r].shard_id &&
                     reads[k].worker == shard.replicas[r].worker,
                 "read location");
      if (k > 0) {
        const ShardLocation& before = reads[k - 1];
        FUZZ_CHECK(
            before.available > reads[k].available ||
                (before.available == reads[k].available && before.replica < r),
            "read order");
      }
    }
    for (size_t r = 0; r < writes.size(); ++r) {
      FUZZ_CHECK(writes[r].replica == r &&
                     writes[r].shard_id == shard.replicas[r].shard_id,
                 "write location");
    }
    FUZZ_CHECK(&ShownReplica(shard) == &shard.replicas[reads[0].replica],
               "shown replica");
  }
}

// Whether every replica on one worker has the same rank, address and
// device (what the packed encoding keeps per worker).
bool OneFormPerWorker(const TensorMetadata& meta) {
  std::map<std::string, std::tuple<int32_t, std::string, std::string>> form;
  for (const ShardInfo& shard : meta.shards) {
    for (const Replica& r : shard.replicas) {
      auto want = std::make_tuple(r.rank, r.address, r.device.ToString());
      auto [it, added] = form.emplace(r.worker, want);
      if (!added && it->second != want) return false;
    }
  }
  return true;
}

void CheckSame(const TensorMetadata& got, const TensorMetadata& want,
               const char* encoding) {
  FUZZ_CHECK(got.shards.size() == want.shards.size(), encoding);
  for (size_t i = 0; i < want.shards.size(); ++i) {
    FUZZ_CHECK(got.shards[i].box == want.shards[i].box,
               absl::StrCat(encoding, " box ", i));
    FUZZ_CHECK(got.shards[i].replicas == want.shards[i].replicas,
               absl::StrCat(encoding, " replicas of shard ", i));
  }
}

void Run(const uint8_t* data, size_t size) {
  v1::ShardedTensorMetadata wire;
  if (!wire.ParseFromArray(data, static_cast<int>(size))) return;
  absl::StatusOr<TensorMetadata> meta = TensorMetadataFromProto(wire);
  if (!meta.ok()) return;
  CheckRules(*meta);

  v1::ShardedTensorMetadata per_shard;
  TensorMetadataToProto(*meta, &per_shard, ShardEncoding::kPerShard);
  for (int i = 0; i < per_shard.shards_size(); ++i) {
    const int copies = static_cast<int>(meta->shards[i].replicas.size());
    FUZZ_CHECK(per_shard.shards(i).replicas_size() == (copies > 1 ? copies : 0),
               absl::StrCat("replica fields of shard ", i));
  }
  absl::StatusOr<TensorMetadata> back = TensorMetadataFromProto(per_shard);
  FUZZ_CHECK(back.ok(), back.status().ToString());
  CheckSame(*back, *meta, "per shard");

  if (!OneFormPerWorker(*meta)) return;
  v1::ShardedTensorMetadata packed;
  TensorMetadataToProto(*meta, &packed, ShardEncoding::kPacked);
  back = TensorMetadataFromProto(packed);
  FUZZ_CHECK(back.ok(), back.status().ToString());
  CheckSame(*back, *meta, "packed");
}

}  // namespace
}  // namespace tessera

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tessera::Run(data, size);
  return 0;
}
