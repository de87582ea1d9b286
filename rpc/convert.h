// Conversions between the wire messages (proto/) and core types. Every
// conversion from the wire validates what it reads and names the offending
// field, so services can trust what they get back.
#ifndef TESSERA_RPC_CONVERT_H_
#define TESSERA_RPC_CONVERT_H_

#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/box.h"
#include "core/dtype.h"
#include "core/file_runs.h"
#include "core/init_fill.h"
#include "core/layout_spec.h"
#include "core/placement.h"
#include "core/tensor_metadata.h"
#include "core/transfer.h"
#include "google/protobuf/repeated_field.h"
#include "proto/tensor.pb.h"
#include "proto/worker.pb.h"

namespace tessera {

// Upper bound on the number of dims of a tensor.
inline constexpr int kMaxRank = 32;

absl::StatusOr<DType> DTypeFromProto(v1::DType dtype);
v1::DType DTypeToProto(DType dtype);

absl::StatusOr<Device> DeviceFromProto(const v1::Device& device);
v1::Device DeviceToProto(const Device& device);

absl::StatusOr<Placement> PlacementFromProto(const v1::Placement& placement);
v1::Placement PlacementToProto(const Placement& placement);

// A shape: 1..kMaxRank dims, each >= 0, total bytes within limits.
absl::StatusOr<Shape> ShapeFromProto(
    const google::protobuf::RepeatedField<int64_t>& dims,
    absl::string_view field);

// offsets/sizes pair of equal length <= kMaxRank (values are not bounds-checked
// here).
absl::StatusOr<Box> BoxFromProto(
    const google::protobuf::RepeatedField<int64_t>& offsets,
    const google::protobuf::RepeatedField<int64_t>& sizes,
    absl::string_view field);
void BoxToProto(const Box& box,
                google::protobuf::RepeatedField<int64_t>* offsets,
                google::protobuf::RepeatedField<int64_t>* sizes);

absl::StatusOr<InitSpec> InitFromProto(const v1::InitMode& init);
v1::InitMode InitToProto(const InitSpec& init);

// Sharding specs (chunk or enumerable).
absl::StatusOr<LayoutSpec> LayoutSpecFromProto(const v1::ShardingSpec& spec);
void LayoutSpecToProto(const LayoutSpec& spec, v1::ShardingSpec* out);

// A safetensors import's record of a tensor (bounded: CheckFileOrigin).
void FileOriginToProto(const FileOrigin& origin, v1::FileOrigin* out);
absl::StatusOr<FileOrigin> FileOriginFromProto(const v1::FileOrigin& origin);

// A checkpoint directory's listing (core/file_runs.h) as the worker's and
// the coordinator's replies carry it: entries and the first file's
// metadata. Reading checks every bound: at most kMaxCheckpointEntries
// entries, each entry's bytes equal to its shape's (0-d: no dims), offsets
// not negative, the metadata as CheckFileOrigin.
void CheckpointListingToProto(
    const CheckpointListing& listing,
    google::protobuf::RepeatedPtrField<v1::CheckpointEntry>* entries,
    v1::FileOrigin* origin);
absl::StatusOr<CheckpointListing> CheckpointListingFromProto(
    const google::protobuf::RepeatedPtrField<v1::CheckpointEntry>& entries,
    const v1::FileOrigin& origin);

// How a shard list goes on the wire: a message per shard (what other
// clients read), or packed columns (small and fast for very many shards).
enum class ShardEncoding { kPerShard, kPacked };

// Full metadata as the coordinator sends it (and its store records it).
void TensorMetadataToProto(const TensorMetadata& meta,
                           v1::ShardedTensorMetadata* out,
                           ShardEncoding encoding = ShardEncoding::kPerShard);
// Reads either encoding.
absl::StatusOr<TensorMetadata> TensorMetadataFromProto(
    const v1::ShardedTensorMetadata& meta);

// A batch of pieces moving between two workers. From the wire: at most
// kMaxRank dims per piece, offsets and sizes of equal length, sizes >= 0
// (bounds against the shards are checked where the shards are known).
void TransferBatchToProto(const TransferBatch& batch, v1::TransferRequest* out);
absl::StatusOr<TransferBatch> TransferBatchFromProto(
    const v1::TransferRequest& request);

// One member's share of an exchange (NCCL). From the wire: a 128-byte id,
// 2..kMaxExchangeRanks members, this rank and every peer among them (never
// itself), at most kMaxExchangePieces pieces, each of at most kMaxRank dims
// with sizes >= 0.
void ExchangePlanToProto(const ExchangePlan& plan,
                         v1::NcclExchangeRequest* out);
absl::StatusOr<ExchangePlan> ExchangePlanFromProto(
    const v1::NcclExchangeRequest& request);

}  // namespace tessera

#endif  // TESSERA_RPC_CONVERT_H_
