#include "coordinator/metadata_codec.h"

#include <utility>

#include "core/status_macros.h"
#include "rpc/convert.h"

namespace tessera {
namespace {

v1::WorkerInfo WorkerToProto(const WorkerInfo& w) {
  v1::WorkerInfo out;
  out.set_name(w.name);
  out.set_rank(w.rank);
  out.set_address(w.address);
  *out.mutable_device() = DeviceToProto(w.device);
  out.set_capacity_bytes(w.capacity_bytes);
  if (w.state == WorkerState::kCordoned || w.state == WorkerState::kDraining)
    out.set_state(std::string(WorkerStateName(w.state)));
  return out;
}

absl::StatusOr<WorkerInfo> WorkerFromProto(const v1::WorkerInfo& w) {
  WorkerInfo out;
  out.name = w.name();
  out.rank = w.rank();
  out.address = w.address();
  TESSERA_ASSIGN_OR_RETURN(out.device, DeviceFromProto(w.device()));
  out.capacity_bytes = w.capacity_bytes();
  // What an admin made it; anything else (older records: none) is ready.
  out.state = ParseWorkerState(w.state()).value_or(WorkerState::kReady);
  return out;
}

}  // namespace

v1::MetadataRecord ChangeToProto(const MetadataChange& change) {
  v1::MetadataRecord record;
  switch (change.kind) {
    case MetadataChange::Kind::kWorker:
      *record.mutable_worker() = WorkerToProto(change.worker);
      break;
    case MetadataChange::Kind::kTensor:
      TensorMetadataToProto(*change.tensor, record.mutable_tensor(),
                            ShardEncoding::kPacked);
      break;
    case MetadataChange::Kind::kDeletedTensor:
      record.set_deleted_tensor(change.deleted_tensor);
      break;
    case MetadataChange::Kind::kShardIdHighWater:
      record.set_shard_id_high_water(change.shard_id_high_water);
      break;
    case MetadataChange::Kind::kDeletedWorker:
      record.set_deleted_worker(change.deleted_worker);
      break;
  }
  return record;
}

absl::StatusOr<MetadataChange> ChangeFromProto(
    const v1::MetadataRecord& record) {
  MetadataChange change;
  switch (record.change_case()) {
    case v1::MetadataRecord::kWorker: {
      change.kind = MetadataChange::Kind::kWorker;
      TESSERA_ASSIGN_OR_RETURN(change.worker, WorkerFromProto(record.worker()));
      return change;
    }
    case v1::MetadataRecord::kTensor: {
      change.kind = MetadataChange::Kind::kTensor;
      TESSERA_ASSIGN_OR_RETURN(TensorMetadata tensor,
                               TensorMetadataFromProto(record.tensor()));
      change.tensor = std::make_shared<const TensorMetadata>(std::move(tensor));
      return change;
    }
    case v1::MetadataRecord::kDeletedTensor:
      change.kind = MetadataChange::Kind::kDeletedTensor;
      change.deleted_tensor = record.deleted_tensor();
      return change;
    case v1::MetadataRecord::kShardIdHighWater:
      change.kind = MetadataChange::Kind::kShardIdHighWater;
      change.shard_id_high_water = record.shard_id_high_water();
      return change;
    case v1::MetadataRecord::kDeletedWorker:
      change.kind = MetadataChange::Kind::kDeletedWorker;
      change.deleted_worker = record.deleted_worker();
      return change;
    default:
      return absl::DataLossError("metadata record of unknown kind");
  }
}

absl::StatusOr<std::string> EncodeBatch(
    absl::Span<const MetadataChange> changes) {
  v1::MetadataBatch batch;
  for (const MetadataChange& change : changes) {
    *batch.add_records() = ChangeToProto(change);
  }
  std::string bytes;
  if (!batch.SerializeToString(&bytes)) {
    return absl::InternalError("cannot serialize a metadata batch");
  }
  return bytes;
}

absl::StatusOr<std::vector<MetadataChange>> DecodeBatch(
    absl::string_view bytes) {
  v1::MetadataBatch batch;
  if (!batch.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::DataLossError("not a metadata batch");
  }
  std::vector<MetadataChange> changes;
  changes.reserve(batch.records_size());
  for (const v1::MetadataRecord& record : batch.records()) {
    absl::StatusOr<MetadataChange> change = ChangeFromProto(record);
    if (!change.ok()) {
      return absl::DataLossError(absl::StrCat(
          "a metadata record fails its checks: ", change.status().message()));
    }
    changes.push_back(*std::move(change));
  }
  return changes;
}

absl::StatusOr<std::string> EncodeSnapshot(const MetadataState& state) {
  v1::MetadataSnapshot proto;
  for (const auto& [name, worker] : state.workers)
    *proto.add_workers() = WorkerToProto(worker);
  for (const auto& [name, tensor] : state.tensors)
    TensorMetadataToProto(*tensor, proto.add_tensors(), ShardEncoding::kPacked);
  proto.set_shard_id_high_water(state.shard_id_high_water);
  std::string payload;
  if (!proto.SerializeToString(&payload)) {
    return absl::InternalError("cannot serialize a metadata snapshot");
  }
  return payload;
}

absl::Status DecodeSnapshot(absl::string_view bytes, MetadataState* state) {
  v1::MetadataSnapshot proto;
  if (!proto.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::DataLossError("not a metadata snapshot");
  }
  for (const v1::WorkerInfo& w : proto.workers()) {
    absl::StatusOr<WorkerInfo> worker = WorkerFromProto(w);
    if (!worker.ok()) return absl::DataLossError(worker.status().message());
    state->workers[worker->name] = *std::move(worker);
  }
  for (const v1::ShardedTensorMetadata& t : proto.tensors()) {
    absl::StatusOr<TensorMetadata> tensor = TensorMetadataFromProto(t);
    if (!tensor.ok()) return absl::DataLossError(tensor.status().message());
    std::string name = tensor->name;
    state->tensors[name] =
        std::make_shared<const TensorMetadata>(*std::move(tensor));
  }
  state->shard_id_high_water = proto.shard_id_high_water();
  return absl::OkStatus();
}

}  // namespace tessera
