// How the coordinator's metadata is written down, for every durable store
// (a file log and snapshot in --data_dir, keys in etcd): a change as a
// MetadataRecord, a batch of changes, and a whole state as a
// MetadataSnapshot (proto/metadata.proto). Decoding checks every field
// (rpc/convert), so stored bytes are outside input like any RPC's.
#ifndef TESSERA_COORDINATOR_METADATA_CODEC_H_
#define TESSERA_COORDINATOR_METADATA_CODEC_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "coordinator/metadata_store.h"
#include "proto/metadata.pb.h"

namespace tessera {

v1::MetadataRecord ChangeToProto(const MetadataChange& change);
absl::StatusOr<MetadataChange> ChangeFromProto(
    const v1::MetadataRecord& record);

// A batch of changes as one MetadataBatch, in order.
absl::StatusOr<std::string> EncodeBatch(
    absl::Span<const MetadataChange> changes);
// DATA_LOSS for bytes that are no batch or hold a change that fails its
// checks.
absl::StatusOr<std::vector<MetadataChange>> DecodeBatch(
    absl::string_view bytes);

// Workers, tensors and the shard-id high water of `state` (not its
// cluster id, which every store keeps apart).
absl::StatusOr<std::string> EncodeSnapshot(const MetadataState& state);
// Sets what EncodeSnapshot wrote into `state`; DATA_LOSS when `bytes` are
// not one.
absl::Status DecodeSnapshot(absl::string_view bytes, MetadataState* state);

}  // namespace tessera

#endif  // TESSERA_COORDINATOR_METADATA_CODEC_H_
