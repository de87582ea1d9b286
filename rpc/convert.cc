#include "rpc/convert.h"

#include <string>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "core/checked_math.h"
#include "core/checkpoint_index.h"
#include "core/labels.h"
#include "core/relay_plan.h"
#include "core/replica_placement.h"
#include "core/shard_layout.h"
#include "core/status_macros.h"

namespace tessera {

absl::StatusOr<DType> DTypeFromProto(v1::DType dtype) {
  switch (dtype) {
    case v1::FLOAT32:
      return DType::kFloat32;
    case v1::FLOAT64:
      return DType::kFloat64;
    case v1::FLOAT16:
      return DType::kFloat16;
    case v1::BFLOAT16:
      return DType::kBFloat16;
    case v1::INT8:
      return DType::kInt8;
    case v1::UINT8:
      return DType::kUInt8;
    case v1::INT16:
      return DType::kInt16;
    case v1::INT32:
      return DType::kInt32;
    case v1::INT64:
      return DType::kInt64;
    case v1::BOOL:
      return DType::kBool;
    case v1::UINT16:
      return DType::kUInt16;
    case v1::UINT32:
      return DType::kUInt32;
    case v1::UINT64:
      return DType::kUInt64;
    case v1::FLOAT8_E4M3FN:
      return DType::kFloat8E4M3FN;
    case v1::FLOAT8_E5M2:
      return DType::kFloat8E5M2;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("dtype: unknown dtype value ", static_cast<int>(dtype)));
  }
}

v1::DType DTypeToProto(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return v1::FLOAT32;
    case DType::kFloat64:
      return v1::FLOAT64;
    case DType::kFloat16:
      return v1::FLOAT16;
    case DType::kBFloat16:
      return v1::BFLOAT16;
    case DType::kInt8:
      return v1::INT8;
    case DType::kUInt8:
      return v1::UINT8;
    case DType::kInt16:
      return v1::INT16;
    case DType::kInt32:
      return v1::INT32;
    case DType::kInt64:
      return v1::INT64;
    case DType::kBool:
      return v1::BOOL;
    case DType::kUInt16:
      return v1::UINT16;
    case DType::kUInt32:
      return v1::UINT32;
    case DType::kUInt64:
      return v1::UINT64;
    case DType::kFloat8E4M3FN:
      return v1::FLOAT8_E4M3FN;
    case DType::kFloat8E5M2:
      return v1::FLOAT8_E5M2;
  }
  return v1::DTYPE_UNSPECIFIED;
}

absl::StatusOr<Device> DeviceFromProto(const v1::Device& device) {
  Device out;
  switch (device.kind()) {
    case v1::Device::CPU:
      out.kind = Device::Kind::kCpu;
      out.index = 0;
      return out;
    case v1::Device::CUDA:
      if (device.index() < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("device: negative cuda index ", device.index()));
      }
      out.kind = Device::Kind::kCuda;
      out.index = device.index();
      return out;
    default:
      return absl::InvalidArgumentError("device: unknown device kind");
  }
}

v1::Device DeviceToProto(const Device& device) {
  v1::Device out;
  out.set_kind(device.kind == Device::Kind::kCuda ? v1::Device::CUDA
                                                  : v1::Device::CPU);
  out.set_index(device.index);
  return out;
}

absl::StatusOr<Placement> PlacementFromProto(const v1::Placement& placement) {
  Placement out;
  if (placement.has_rank() == !placement.worker().empty()) {
    return absl::InvalidArgumentError(
        "placement: exactly one of rank and worker must be set");
  }
  if (placement.has_rank()) {
    if (placement.rank() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("placement: negative rank ", placement.rank()));
    }
    out.rank = placement.rank();
  } else {
    TESSERA_RETURN_IF_ERROR(CheckWorkerName(placement.worker()));
    out.worker = placement.worker();
  }
  if (placement.has_device()) {
    TESSERA_ASSIGN_OR_RETURN(Device device,
                             DeviceFromProto(placement.device()));
    out.device = device;
  }
  return out;
}

v1::Placement PlacementToProto(const Placement& placement) {
  v1::Placement out;
  if (placement.rank.has_value()) {
    out.set_rank(*placement.rank);
  } else {
    out.set_worker(placement.worker);
  }
  if (placement.device.has_value())
    *out.mutable_device() = DeviceToProto(*placement.device);
  return out;
}

absl::StatusOr<Shape> ShapeFromProto(
    const google::protobuf::RepeatedField<int64_t>& dims,
    absl::string_view field) {
  if (dims.empty() || dims.size() > kMaxRank) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": a shape needs 1 to ", kMaxRank, " dims, got ", dims.size()));
  }
  Shape shape(dims.begin(), dims.end());
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, "[", i, "]: negative size ", shape[i]));
    }
  }
  TESSERA_RETURN_IF_ERROR(Annotate(NumElements(shape).status(), field));
  return shape;
}

absl::StatusOr<Box> BoxFromProto(
    const google::protobuf::RepeatedField<int64_t>& offsets,
    const google::protobuf::RepeatedField<int64_t>& sizes,
    absl::string_view field) {
  if (offsets.size() != sizes.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": ", offsets.size(), " offsets but ", sizes.size(), " sizes"));
  }
  if (offsets.size() > kMaxRank) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": more than ", kMaxRank, " dims"));
  }
  Box box;
  box.offsets.assign(offsets.begin(), offsets.end());
  box.sizes.assign(sizes.begin(), sizes.end());
  return box;
}

void BoxToProto(const Box& box,
                google::protobuf::RepeatedField<int64_t>* offsets,
                google::protobuf::RepeatedField<int64_t>* sizes) {
  offsets->Assign(box.offsets.begin(), box.offsets.end());
  sizes->Assign(box.sizes.begin(), box.sizes.end());
}

absl::StatusOr<InitSpec> InitFromProto(const v1::InitMode& init) {
  InitSpec out;
  switch (init.kind()) {
    case v1::InitMode::EMPTY:
      out.kind = InitSpec::Kind::kEmpty;
      break;
    case v1::InitMode::ZEROS:
      out.kind = InitSpec::Kind::kZeros;
      break;
    case v1::InitMode::ONES:
      out.kind = InitSpec::Kind::kOnes;
      break;
    case v1::InitMode::FULL:
      out.kind = InitSpec::Kind::kFull;
      break;
    case v1::InitMode::ARANGE:
      out.kind = InitSpec::Kind::kArange;
      break;
    case v1::InitMode::RAND:
      out.kind = InitSpec::Kind::kRand;
      break;
    default:
      return absl::InvalidArgumentError("init: unknown init mode");
  }
  out.value = init.value();
  out.seed = init.seed();
  return out;
}

v1::InitMode InitToProto(const InitSpec& init) {
  v1::InitMode out;
  switch (init.kind) {
    case InitSpec::Kind::kEmpty:
      out.set_kind(v1::InitMode::EMPTY);
      break;
    case InitSpec::Kind::kZeros:
      out.set_kind(v1::InitMode::ZEROS);
      break;
    case InitSpec::Kind::kOnes:
      out.set_kind(v1::InitMode::ONES);
      break;
    case InitSpec::Kind::kFull:
      out.set_kind(v1::InitMode::FULL);
      break;
    case InitSpec::Kind::kArange:
      out.set_kind(v1::InitMode::ARANGE);
      break;
    case InitSpec::Kind::kRand:
      out.set_kind(v1::InitMode::RAND);
      break;
  }
  out.set_value(init.value);
  out.set_seed(init.seed);
  return out;
}

namespace {

void PackShards(const std::vector<ShardInfo>& shards,
                v1::PackedShardList* out) {
  const int n = static_cast<int>(shards.size());
  const int rank = shards.empty() ? 0 : static_cast<int>(shards[0].box.rank());
  bool replicated = false;
  for (const ShardInfo& s : shards) replicated |= s.replicas.size() > 1;
  out->mutable_offsets()->Reserve(n * rank);
  out->mutable_sizes()->Reserve(n * rank);
  out->mutable_shard_ids()->Reserve(n);
  out->mutable_worker_of()->Reserve(n);
  if (replicated) out->mutable_replica_count()->Reserve(n);
  absl::flat_hash_map<absl::string_view, int32_t> index;  // by worker name
  auto worker_index = [&](const Replica& r) {
    auto [it, inserted] = index.try_emplace(r.worker, out->workers_size());
    if (inserted) {
      v1::PackedShardList::Worker* worker = out->add_workers();
      worker->set_name(r.worker);
      worker->set_rank(r.rank);
      worker->set_address(r.address);
      *worker->mutable_device() = DeviceToProto(r.device);
    }
    return it->second;
  };
  for (int i = 0; i < n; ++i) {
    const ShardInfo& s = shards[static_cast<size_t>(i)];
    for (int64_t v : s.box.offsets) out->add_offsets(v);
    for (int64_t v : s.box.sizes) out->add_sizes(v);
    const Replica& shown = ShownReplica(s);
    out->add_shard_ids(shown.shard_id);
    out->add_worker_of(worker_index(shown));
    if (!shown.available) out->add_unavailable(i);
    if (!replicated) continue;
    out->add_replica_count(static_cast<int32_t>(s.replicas.size()));
    for (const Replica& r : s.replicas) {
      if (!r.available)
        out->add_replica_unavailable(out->replica_worker_of_size());
      if (r.mirror) out->add_replica_mirror(out->replica_worker_of_size());
      out->add_replica_shard_ids(r.shard_id);
      out->add_replica_worker_of(worker_index(r));
    }
  }
}

absl::Status UnpackShards(const v1::PackedShardList& packed, size_t rank,
                          std::vector<ShardInfo>* shards) {
  constexpr absl::string_view kField = "packed_shards";
  const size_t n = static_cast<size_t>(packed.shard_ids_size());
  if (static_cast<size_t>(packed.worker_of_size()) != n ||
      static_cast<size_t>(packed.offsets_size()) != n * rank ||
      static_cast<size_t>(packed.sizes_size()) != n * rank) {
    return absl::InvalidArgumentError(absl::StrCat(
        kField, ": ", n, " shard ids, ", packed.worker_of_size(), " workers, ",
        packed.offsets_size(), " offsets and ", packed.sizes_size(),
        " sizes do not describe shards of rank ", rank));
  }
  // Several replicas per shard: their columns must add up.
  const bool replicated = packed.replica_count_size() > 0;
  if (replicated) {
    if (static_cast<size_t>(packed.replica_count_size()) != n) {
      return absl::InvalidArgumentError(
          absl::StrCat(kField, ": ", packed.replica_count_size(),
                       " replica counts for ", n, " shards"));
    }
    int64_t total = 0;
    for (size_t i = 0; i < n; ++i) {
      const int32_t count = packed.replica_count(static_cast<int>(i));
      if (count < 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            kField, ".replica_count[", i, "]: ", count, " (at least 1)"));
      }
      total += count;
    }
    if (packed.replica_shard_ids_size() != total ||
        packed.replica_worker_of_size() != total) {
      return absl::InvalidArgumentError(
          absl::StrCat(kField, ": ", total, " replicas but ",
                       packed.replica_shard_ids_size(), " replica ids and ",
                       packed.replica_worker_of_size(), " replica workers"));
    }
  }
  std::vector<Replica> workers;  // a template per worker of the table
  for (int w = 0; w < packed.workers_size(); ++w) {
    Replica replica;
    replica.worker = packed.workers(w).name();
    replica.rank = packed.workers(w).rank();
    replica.address = packed.workers(w).address();
    absl::StatusOr<Device> device = DeviceFromProto(packed.workers(w).device());
    if (!device.ok()) {
      return Annotate(device.status(),
                      absl::StrCat(kField, ".workers[", w, "]"));
    }
    replica.device = *device;
    workers.push_back(std::move(replica));
  }
  auto check_worker = [&](absl::string_view column, size_t i, int32_t w) {
    if (w >= 0 && static_cast<size_t>(w) < workers.size())
      return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat(kField, ".", column, "[", i, "]: ", w,
                     " is not an index into ", workers.size(), " workers"));
  };
  shards->reserve(n);
  int next = 0;  // the next entry of the replica columns
  for (size_t i = 0; i < n; ++i) {
    const int32_t w = packed.worker_of(static_cast<int>(i));
    TESSERA_RETURN_IF_ERROR(check_worker("worker_of", i, w));
    ShardInfo& shard = shards->emplace_back();
    const int64_t* offsets = packed.offsets().data() + i * rank;
    const int64_t* sizes = packed.sizes().data() + i * rank;
    shard.box.offsets.assign(offsets, offsets + rank);
    shard.box.sizes.assign(sizes, sizes + rank);
    if (!replicated) {
      Replica& replica =
          shard.replicas.emplace_back(workers[static_cast<size_t>(w)]);
      replica.shard_id = packed.shard_ids(static_cast<int>(i));
      continue;
    }
    const int32_t count = packed.replica_count(static_cast<int>(i));
    shard.replicas.reserve(static_cast<size_t>(count));
    for (int32_t r = 0; r < count; ++r, ++next) {
      const int32_t rw = packed.replica_worker_of(next);
      TESSERA_RETURN_IF_ERROR(
          check_worker("replica_worker_of", static_cast<size_t>(next), rw));
      Replica& replica =
          shard.replicas.emplace_back(workers[static_cast<size_t>(rw)]);
      replica.shard_id = packed.replica_shard_ids(next);
    }
  }
  if (!replicated) {
    for (int32_t i : packed.unavailable()) {
      if (i < 0 || static_cast<size_t>(i) >= n) {
        return absl::InvalidArgumentError(
            absl::StrCat(kField, ".unavailable: ", i, " is not a shard index"));
      }
      (*shards)[static_cast<size_t>(i)].replicas[0].available = false;
    }
    return absl::OkStatus();
  }
  // Replica positions, in the order of the columns: shard by shard.
  std::vector<std::pair<uint32_t, uint32_t>> position(
      static_cast<size_t>(next));
  for (size_t i = 0, k = 0; i < n; ++i) {
    for (uint32_t r = 0; r < (*shards)[i].replicas.size(); ++r, ++k)
      position[k] = {static_cast<uint32_t>(i), r};
  }
  for (int32_t k : packed.replica_unavailable()) {
    if (k < 0 || k >= next) {
      return absl::InvalidArgumentError(absl::StrCat(
          kField, ".replica_unavailable: ", k, " is not a replica index"));
    }
    const auto [i, r] = position[static_cast<size_t>(k)];
    (*shards)[i].replicas[r].available = false;
  }
  for (int32_t k : packed.replica_mirror()) {
    if (k < 0 || k >= next) {
      return absl::InvalidArgumentError(absl::StrCat(
          kField, ".replica_mirror: ", k, " is not a replica index"));
    }
    const auto [i, r] = position[static_cast<size_t>(k)];
    (*shards)[i].replicas[r].mirror = true;
  }
  return absl::OkStatus();
}

// Each shard's mirror copies come after its replicas, and it has at least
// one replica.
absl::Status CheckMirrorOrder(const std::vector<ShardInfo>& shards) {
  for (size_t i = 0; i < shards.size(); ++i) {
    const Replicas& copies = shards[i].replicas;
    bool mirrors = false;
    for (const Replica& r : copies) {
      if (mirrors && !r.mirror) {
        return absl::InvalidArgumentError(absl::StrCat(
            "shards[", i, "]: a replica is listed after a mirror copy"));
      }
      mirrors |= r.mirror;
    }
    if (!copies.empty() && copies.front().mirror) {
      return absl::InvalidArgumentError(
          absl::StrCat("shards[", i, "]: only mirror copies, no replica"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

void FileOriginToProto(const FileOrigin& origin, v1::FileOrigin* out) {
  out->set_entry(origin.entry);
  out->set_scalar(origin.scalar);
  for (const auto& [key, value] : origin.metadata) {
    v1::FileOrigin::Pair* pair = out->add_metadata();
    pair->set_key(key);
    pair->set_value(value);
  }
}

absl::StatusOr<FileOrigin> FileOriginFromProto(const v1::FileOrigin& origin) {
  // Bounds first: nothing is built for a hostile count.
  if (origin.metadata_size() > kMaxOriginPairs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "origin.metadata: ", origin.metadata_size(),
        " pairs are more than a tensor keeps (", kMaxOriginPairs, ")"));
  }
  FileOrigin out;
  out.entry = origin.entry();
  out.scalar = origin.scalar();
  out.metadata.reserve(origin.metadata_size());
  for (const v1::FileOrigin::Pair& pair : origin.metadata())
    out.metadata.emplace_back(pair.key(), pair.value());
  TESSERA_RETURN_IF_ERROR(CheckFileOrigin(out));
  return out;
}

void CheckpointListingToProto(
    const CheckpointListing& listing,
    google::protobuf::RepeatedPtrField<v1::CheckpointEntry>* entries,
    v1::FileOrigin* origin) {
  for (const CheckpointEntry& e : listing.entries) {
    v1::CheckpointEntry* out = entries->Add();
    out->set_name(e.name);
    out->set_dtype(DTypeToProto(e.dtype));
    out->mutable_shape()->Assign(e.shape.begin(), e.shape.end());
    out->set_file(e.file);
    out->set_data_offset(e.data_offset);
    out->set_bytes(e.bytes);
    for (const StoredPiece& piece : e.pieces) {
      v1::StoredPiece* p = out->add_pieces();
      BoxToProto(piece.box, p->mutable_offsets(), p->mutable_sizes());
      p->set_file(piece.file);
      p->set_entry(piece.entry);
      p->set_data_offset(piece.data_offset);
      p->set_bytes(piece.bytes);
      p->set_crc32(piece.crc32);
    }
  }
  FileOrigin kept;
  kept.metadata = listing.metadata;
  FileOriginToProto(kept, origin);
}

absl::StatusOr<CheckpointListing> CheckpointListingFromProto(
    const google::protobuf::RepeatedPtrField<v1::CheckpointEntry>& entries,
    const v1::FileOrigin& origin) {
  if (entries.size() > kMaxCheckpointEntries) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint: a listing of ", entries.size(),
                     " tensors, more than ", kMaxCheckpointEntries));
  }
  CheckpointListing listing;
  int64_t pieces = 0;
  TESSERA_ASSIGN_OR_RETURN(FileOrigin metadata, FileOriginFromProto(origin));
  listing.metadata = std::move(metadata.metadata);
  listing.entries.reserve(entries.size());
  for (const v1::CheckpointEntry& e : entries) {
    CheckpointEntry& out = listing.entries.emplace_back();
    out.name = e.name();
    TESSERA_ASSIGN_OR_RETURN(out.dtype, DTypeFromProto(e.dtype()));
    // A 0-d entry has no dims.
    if (e.shape_size() > 0) {
      TESSERA_ASSIGN_OR_RETURN(out.shape, ShapeFromProto(e.shape(), "shape"));
    }
    absl::StatusOr<int64_t> bytes = ByteSize(out.shape, ItemSize(out.dtype));
    if (!bytes.ok() || *bytes != e.bytes() || e.data_offset() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint: entry '", e.name(),
                       "' is listed with a size that does not match its "
                       "shape, or a negative offset"));
    }
    out.file = e.file();
    out.data_offset = e.data_offset();
    out.bytes = e.bytes();
    // Pieces as tessera.json's reader checks them (the worker did; this
    // side trusts no reply): each a box of the tensor's rank inside it, of
    // its bytes, in a plain file, together tiling the tensor.
    pieces += e.pieces_size();
    if (pieces > kMaxCheckpointPieces) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint: a listing of more than ",
                       kMaxCheckpointPieces, " pieces"));
    }
    std::vector<Box> boxes;
    for (const v1::StoredPiece& p : e.pieces()) {
      StoredPiece& piece = out.pieces.emplace_back();
      if (p.offsets_size() != static_cast<int>(out.shape.size()) ||
          p.sizes_size() != static_cast<int>(out.shape.size())) {
        return absl::InvalidArgumentError(absl::StrCat(
            "checkpoint: a piece of '", e.name(), "' is not of its rank"));
      }
      piece.box = Box(absl::MakeConstSpan(p.offsets().data(), p.offsets_size()),
                      absl::MakeConstSpan(p.sizes().data(), p.sizes_size()));
      TESSERA_RETURN_IF_ERROR(
          CheckWithin(piece.box, out.shape, "a piece of " + e.name()));
      TESSERA_RETURN_IF_ERROR(CheckCheckpointFileName(p.file()));
      piece.file = p.file();
      piece.entry = p.entry();
      piece.data_offset = p.data_offset();
      piece.bytes = p.bytes();
      piece.crc32 = p.crc32();
      if (piece.data_offset < 0 ||
          piece.bytes != piece.box.NumElements() *
                             static_cast<int64_t>(ItemSize(out.dtype))) {
        return absl::InvalidArgumentError(absl::StrCat(
            "checkpoint: a piece of '", e.name(),
            "' has bytes that do not match its box, or a negative offset"));
      }
      boxes.push_back(piece.box);
    }
    if (!out.pieces.empty()) {
      absl::Status tiled =
          out.shape.empty()
              ? (boxes.size() == 1 ? absl::OkStatus()
                                   : absl::InvalidArgumentError("pieces"))
              : ValidateLayout(out.shape, boxes, LayoutKind::kEnumerable);
      if (!tiled.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("checkpoint: the pieces of '", e.name(),
                         "' do not tile it: ", tiled.message()));
      }
    }
  }
  return listing;
}

void TensorMetadataToProto(const TensorMetadata& meta,
                           v1::ShardedTensorMetadata* out,
                           ShardEncoding encoding) {
  out->set_name(meta.name);
  out->mutable_shape()->Assign(meta.shape.begin(), meta.shape.end());
  out->mutable_properties()->set_dtype(DTypeToProto(meta.dtype));
  out->mutable_properties()->set_requires_grad(meta.requires_grad);
  out->mutable_properties()->set_pin_memory(meta.pin_memory);
  out->set_version(meta.version);
  out->set_incarnation(meta.incarnation);
  if (!meta.owner.empty()) out->set_owner(meta.owner);
  if (!meta.mirror.empty()) out->set_mirror(meta.mirror);
  if (meta.origin.entry != 0 || meta.origin.scalar ||
      !meta.origin.metadata.empty()) {
    FileOriginToProto(meta.origin, out->mutable_origin());
  }
  bool same_rank = true;
  for (const ShardInfo& s : meta.shards)
    same_rank &= s.box.rank() == meta.shape.size();
  if (encoding == ShardEncoding::kPacked && same_rank) {
    PackShards(meta.shards, out->mutable_packed_shards());
    return;
  }
  out->mutable_shards()->Reserve(meta.shards.size());
  for (size_t i = 0; i < meta.shards.size(); ++i) {
    const ShardInfo& s = meta.shards[i];
    const Replica& shown = ShownReplica(s);
    v1::Shard* shard = out->add_shards();
    BoxToProto(s.box, shard->mutable_metadata()->mutable_offsets(),
               shard->mutable_metadata()->mutable_sizes());
    v1::Placement* placement = shard->mutable_metadata()->mutable_placement();
    placement->set_rank(shown.rank);
    *placement->mutable_device() = DeviceToProto(shown.device);
    v1::ShardHandle* handle = shard->mutable_handle();
    handle->set_tensor(meta.name);
    handle->set_version(meta.version);
    handle->set_shard_id(shown.shard_id);
    handle->set_index(static_cast<int32_t>(i));
    handle->set_worker(shown.worker);
    handle->set_address(shown.address);
    shard->set_available(shown.available);
    if (s.replicas.size() < 2) continue;
    for (const Replica& r : s.replicas) {
      v1::ShardReplica* replica = shard->add_replicas();
      replica->set_worker(r.worker);
      replica->set_rank(r.rank);
      *replica->mutable_device() = DeviceToProto(r.device);
      replica->set_address(r.address);
      replica->set_shard_id(r.shard_id);
      replica->set_available(r.available);
      replica->set_mirror(r.mirror);
    }
  }
}

absl::StatusOr<TensorMetadata> TensorMetadataFromProto(
    const v1::ShardedTensorMetadata& meta) {
  TensorMetadata out;
  out.name = meta.name();
  TESSERA_ASSIGN_OR_RETURN(out.shape, ShapeFromProto(meta.shape(), "shape"));
  TESSERA_ASSIGN_OR_RETURN(out.dtype,
                           DTypeFromProto(meta.properties().dtype()));
  out.requires_grad = meta.properties().requires_grad();
  out.pin_memory = meta.properties().pin_memory();
  out.version = meta.version();
  out.incarnation = meta.incarnation();
  TESSERA_ASSIGN_OR_RETURN(out.origin, FileOriginFromProto(meta.origin()));
  if (meta.owner().size() > kMaxOwnerBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("owner: ", meta.owner().size(), " bytes (at most ",
                     kMaxOwnerBytes, ")"));
  }
  out.owner = meta.owner();
  if (!meta.mirror().empty()) {
    absl::StatusOr<LabelSelector> mirror = ParseLabelSelector(meta.mirror());
    if (!mirror.ok()) return Annotate(mirror.status(), "mirror");
    out.mirror = meta.mirror();
  }
  if (meta.has_packed_shards()) {
    if (meta.shards_size() > 0) {
      return absl::InvalidArgumentError(
          "give either shards or packed_shards, not both");
    }
    TESSERA_RETURN_IF_ERROR(
        UnpackShards(meta.packed_shards(), out.shape.size(), &out.shards));
    TESSERA_RETURN_IF_ERROR(CheckMirrorOrder(out.shards));
    return out;
  }
  out.shards.reserve(meta.shards_size());
  for (int i = 0; i < meta.shards_size(); ++i) {
    const v1::Shard& s = meta.shards(i);
    ShardInfo info;
    TESSERA_ASSIGN_OR_RETURN(
        info.box, BoxFromProto(s.metadata().offsets(), s.metadata().sizes(),
                               absl::StrCat("shards[", i, "]")));
    if (info.box.rank() != out.shape.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("shards[", i, "]: rank does not match the shape"));
    }
    if (s.replicas_size() == 0) {
      // One replica: the one the placement and the handle name.
      Replica& replica = info.replicas.emplace_back();
      replica.rank = s.metadata().placement().rank();
      TESSERA_ASSIGN_OR_RETURN(
          replica.device, DeviceFromProto(s.metadata().placement().device()));
      replica.worker = s.handle().worker();
      replica.address = s.handle().address();
      replica.shard_id = s.handle().shard_id();
      replica.available = s.available();
    }
    info.replicas.reserve(static_cast<size_t>(s.replicas_size()));
    for (int r = 0; r < s.replicas_size(); ++r) {
      const v1::ShardReplica& in = s.replicas(r);
      Replica& replica = info.replicas.emplace_back();
      replica.rank = in.rank();
      absl::StatusOr<Device> device = DeviceFromProto(in.device());
      if (!device.ok()) {
        return Annotate(device.status(),
                        absl::StrCat("shards[", i, "].replicas[", r, "]"));
      }
      replica.device = *device;
      replica.worker = in.worker();
      replica.address = in.address();
      replica.shard_id = in.shard_id();
      replica.available = in.available();
      replica.mirror = in.mirror();
    }
    out.shards.push_back(std::move(info));
  }
  TESSERA_RETURN_IF_ERROR(CheckMirrorOrder(out.shards));
  return out;
}

namespace {

absl::StatusOr<LayoutSpec> PackedShardsFromProto(
    const v1::ShardingSpec::PackedShards& packed) {
  constexpr absl::string_view kField = "spec.enumerable.packed";
  const int64_t n = packed.placement_of_size();
  if (packed.offsets_size() != packed.sizes_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(kField, ": ", packed.offsets_size(), " offsets but ",
                     packed.sizes_size(), " sizes"));
  }
  if (n == 0 ? packed.offsets_size() != 0 : packed.offsets_size() % n != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        kField, ": ", packed.offsets_size(), " offsets do not split into ", n,
        " shards of equal rank"));
  }
  const int64_t rank = n == 0 ? 0 : packed.offsets_size() / n;
  if (rank > kMaxRank) {
    return absl::InvalidArgumentError(
        absl::StrCat(kField, ": more than ", kMaxRank, " dims"));
  }
  std::vector<Placement> distinct;
  distinct.reserve(packed.placements_size());
  for (int i = 0; i < packed.placements_size(); ++i) {
    absl::StatusOr<Placement> p = PlacementFromProto(packed.placements(i));
    if (!p.ok()) {
      return Annotate(p.status(), absl::StrCat(kField, ".placements[", i, "]"));
    }
    distinct.push_back(*std::move(p));
  }
  std::vector<Box> boxes(static_cast<size_t>(n));
  std::vector<Placement> placements;
  placements.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int32_t which = packed.placement_of(static_cast<int>(i));
    if (which < 0 || which >= static_cast<int32_t>(distinct.size())) {
      return absl::InvalidArgumentError(absl::StrCat(
          kField, ".placement_of[", i, "]: ", which, " is not an index into ",
          distinct.size(), " placements"));
    }
    placements.push_back(distinct[static_cast<size_t>(which)]);
    const int64_t* offsets = packed.offsets().data() + i * rank;
    const int64_t* sizes = packed.sizes().data() + i * rank;
    boxes[static_cast<size_t>(i)].offsets.assign(offsets, offsets + rank);
    boxes[static_cast<size_t>(i)].sizes.assign(sizes, sizes + rank);
  }
  return LayoutSpec::Enumerable(std::move(boxes), std::move(placements));
}

absl::StatusOr<LayoutSpec> LayoutOfSpec(const v1::ShardingSpec& spec) {
  switch (spec.spec_case()) {
    case v1::ShardingSpec::kChunk: {
      std::vector<Placement> placements;
      for (int i = 0; i < spec.chunk().placements_size(); ++i) {
        absl::StatusOr<Placement> p =
            PlacementFromProto(spec.chunk().placements(i));
        if (!p.ok())
          return Annotate(p.status(),
                          absl::StrCat("spec.chunk.placements[", i, "]"));
        placements.push_back(*std::move(p));
      }
      return LayoutSpec::Chunk(spec.chunk().dim(), std::move(placements));
    }
    case v1::ShardingSpec::kEnumerable: {
      if (spec.enumerable().has_packed()) {
        if (spec.enumerable().shards_size() > 0) {
          return absl::InvalidArgumentError(
              "spec.enumerable: give either shards or packed, not both");
        }
        return PackedShardsFromProto(spec.enumerable().packed());
      }
      std::vector<Box> boxes;
      std::vector<Placement> placements;
      for (int i = 0; i < spec.enumerable().shards_size(); ++i) {
        const v1::ShardMetadata& shard = spec.enumerable().shards(i);
        const std::string field =
            absl::StrCat("spec.enumerable.shards[", i, "]");
        TESSERA_ASSIGN_OR_RETURN(
            Box box, BoxFromProto(shard.offsets(), shard.sizes(), field));
        absl::StatusOr<Placement> p = PlacementFromProto(shard.placement());
        if (!p.ok()) return Annotate(p.status(), field);
        boxes.push_back(std::move(box));
        placements.push_back(*std::move(p));
      }
      return LayoutSpec::Enumerable(std::move(boxes), std::move(placements));
    }
    default:
      return absl::InvalidArgumentError(
          "spec: neither chunk nor enumerable sharding given");
  }
}

}  // namespace

absl::StatusOr<LayoutSpec> LayoutSpecFromProto(const v1::ShardingSpec& spec) {
  if (spec.replicas() != 0) {
    TESSERA_RETURN_IF_ERROR(CheckReplicaCount(spec.replicas()));
  }
  // A selector is parsed here, before anything else reads it.
  if (!spec.mirror().empty() && spec.mirror() != "none") {
    absl::StatusOr<LabelSelector> mirror = ParseLabelSelector(spec.mirror());
    if (!mirror.ok()) return Annotate(mirror.status(), "--mirror");
  }
  TESSERA_ASSIGN_OR_RETURN(LayoutSpec layout, LayoutOfSpec(spec));
  layout.replicas = spec.replicas();
  layout.mirror = spec.mirror();
  return layout;
}

void LayoutSpecToProto(const LayoutSpec& spec, v1::ShardingSpec* out) {
  out->set_replicas(spec.replicas);
  out->set_mirror(spec.mirror);
  if (spec.kind == LayoutSpec::Kind::kChunk) {
    v1::ShardingSpec::Chunk* chunk = out->mutable_chunk();
    chunk->set_dim(spec.chunk_dim);
    for (const Placement& p : spec.placements)
      *chunk->add_placements() = PlacementToProto(p);
    return;
  }
  // The packed encoding; a spec whose boxes differ in rank (invalid, but
  // the coordinator must be the one to say so) goes shard by shard.
  const size_t rank = spec.boxes.empty() ? 0 : spec.boxes[0].rank();
  bool uniform = spec.placements.size() == spec.boxes.size();
  for (const Box& box : spec.boxes) uniform &= box.rank() == rank;
  v1::ShardingSpec::Enumerable* enumerable = out->mutable_enumerable();
  if (!uniform) {
    for (size_t i = 0; i < spec.boxes.size(); ++i) {
      v1::ShardMetadata* shard = enumerable->add_shards();
      BoxToProto(spec.boxes[i], shard->mutable_offsets(),
                 shard->mutable_sizes());
      if (i < spec.placements.size())
        *shard->mutable_placement() = PlacementToProto(spec.placements[i]);
    }
    return;
  }
  v1::ShardingSpec::PackedShards* packed = enumerable->mutable_packed();
  packed->mutable_offsets()->Reserve(
      static_cast<int>(spec.boxes.size() * rank));
  packed->mutable_sizes()->Reserve(static_cast<int>(spec.boxes.size() * rank));
  packed->mutable_placement_of()->Reserve(static_cast<int>(spec.boxes.size()));
  // Distinct placements, keyed by every field (set or not).
  using Key = std::tuple<bool, int32_t, std::string, bool, int, int>;
  auto key_of = [](const Placement& p) {
    return Key(p.rank.has_value(), p.rank.value_or(0), p.worker,
               p.device.has_value(),
               p.device.has_value() ? static_cast<int>(p.device->kind) : 0,
               p.device.has_value() ? p.device->index : 0);
  };
  absl::flat_hash_map<Key, int32_t> index;
  int32_t previous = -1;
  for (size_t i = 0; i < spec.boxes.size(); ++i) {
    for (int64_t v : spec.boxes[i].offsets) packed->add_offsets(v);
    for (int64_t v : spec.boxes[i].sizes) packed->add_sizes(v);
    const Placement& placement = spec.placements[i];
    // Neighbouring shards usually share a placement: skip the lookup.
    if (previous < 0 || spec.placements[i - 1] != placement) {
      auto [it, inserted] =
          index.try_emplace(key_of(placement), packed->placements_size());
      if (inserted) *packed->add_placements() = PlacementToProto(placement);
      previous = it->second;
    }
    packed->add_placement_of(previous);
  }
}

void TransferBatchToProto(const TransferBatch& batch,
                          v1::TransferRequest* out) {
  out->set_src_worker(batch.src_worker);
  out->set_src_address(batch.src_address);
  out->set_dst_worker(batch.dst_worker);
  out->set_dst_address(batch.dst_address);
  out->set_src_capability(batch.src_capability);
  out->mutable_pieces()->Reserve(static_cast<int>(batch.pieces.size()));
  for (const TransferPiece& piece : batch.pieces) {
    v1::TransferPiece* p = out->add_pieces();
    p->set_src_shard_id(piece.src_shard_id);
    p->mutable_src_offsets()->Assign(piece.src_offsets.begin(),
                                     piece.src_offsets.end());
    p->set_dst_shard_id(piece.dst_shard_id);
    p->mutable_dst_offsets()->Assign(piece.dst_offsets.begin(),
                                     piece.dst_offsets.end());
    p->mutable_sizes()->Assign(piece.sizes.begin(), piece.sizes.end());
  }
  if (batch.relay.id == 0) return;
  out->set_relay_id(batch.relay.id);
  out->set_relay_chunk_bytes(batch.relay.chunk_bytes);
  out->set_src_filling(batch.relay.src_filling);
  for (const RelayUpstream& up : batch.relay.fallbacks) {
    v1::RelayUpstream* u = out->add_relay_upstreams();
    u->set_worker(up.worker);
    u->set_address(up.address);
    u->set_shard_id(up.shard_id);
    u->set_capability(up.capability);
    u->set_filling(up.filling);
    u->set_base_shard_id(up.base_shard_id);
  }
  out->set_relay_base_shard_id(batch.relay.base_shard_id);
  out->set_relay_src_base_shard_id(batch.relay.src_base_shard_id);
}

namespace {

// A relay hop's fields from the wire: one piece, a chunk of whole elements
// within the relay's bounds, at most kMaxRelayUpstreams upstreams.
absl::StatusOr<RelayHop> RelayHopFromProto(const v1::TransferRequest& request) {
  RelayHop hop;
  if (request.relay_id() == 0) {
    if (request.relay_upstreams_size() > 0 || request.src_filling() ||
        request.relay_base_shard_id() != 0 ||
        request.relay_src_base_shard_id() != 0) {
      return absl::InvalidArgumentError(
          "relay_upstreams, src_filling or relay base shards without a "
          "relay_id");
    }
    return hop;
  }
  if (request.pieces_size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a relay hop moves one piece, not ", request.pieces_size()));
  }
  if (request.relay_chunk_bytes() < 1 ||
      request.relay_chunk_bytes() > kMaxRelayChunkBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("relay_chunk_bytes ", request.relay_chunk_bytes(),
                     ": expected 1 to ", kMaxRelayChunkBytes));
  }
  if (request.relay_upstreams_size() > kMaxRelayUpstreams) {
    return absl::InvalidArgumentError(
        absl::StrCat(request.relay_upstreams_size(),
                     " relay_upstreams: at most ", kMaxRelayUpstreams));
  }
  hop.id = request.relay_id();
  hop.chunk_bytes = request.relay_chunk_bytes();
  hop.src_filling = request.src_filling();
  for (const v1::RelayUpstream& u : request.relay_upstreams()) {
    hop.fallbacks.push_back(RelayUpstream{u.worker(), u.address(), u.shard_id(),
                                          u.capability(), u.filling(),
                                          u.base_shard_id()});
  }
  hop.base_shard_id = request.relay_base_shard_id();
  hop.src_base_shard_id = request.relay_src_base_shard_id();
  return hop;
}

// A moved piece's sizes from the wire: none negative.
absl::Status CheckPieceSizes(
    const std::string& field,
    const google::protobuf::RepeatedField<int64_t>& sizes) {
  for (int64_t size : sizes) {
    if (size < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": negative size ", size));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TransferBatch> TransferBatchFromProto(
    const v1::TransferRequest& request) {
  TransferBatch batch;
  batch.src_worker = request.src_worker();
  batch.src_address = request.src_address();
  batch.dst_worker = request.dst_worker();
  batch.dst_address = request.dst_address();
  batch.src_capability = request.src_capability();
  batch.pieces.reserve(request.pieces_size());
  for (int i = 0; i < request.pieces_size(); ++i) {
    const v1::TransferPiece& p = request.pieces(i);
    const std::string field = absl::StrCat("pieces[", i, "]");
    const int rank = p.sizes_size();
    if (rank > kMaxRank) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": more than ", kMaxRank, " dims"));
    }
    if (p.src_offsets_size() != rank || p.dst_offsets_size() != rank) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": ", p.src_offsets_size(), " source and ",
          p.dst_offsets_size(), " destination offsets for ", rank, " sizes"));
    }
    TESSERA_RETURN_IF_ERROR(CheckPieceSizes(field, p.sizes()));
    TransferPiece piece;
    piece.src_shard_id = p.src_shard_id();
    piece.src_offsets.assign(p.src_offsets().begin(), p.src_offsets().end());
    piece.dst_shard_id = p.dst_shard_id();
    piece.dst_offsets.assign(p.dst_offsets().begin(), p.dst_offsets().end());
    piece.sizes.assign(p.sizes().begin(), p.sizes().end());
    batch.pieces.push_back(std::move(piece));
  }
  TESSERA_ASSIGN_OR_RETURN(batch.relay, RelayHopFromProto(request));
  return batch;
}

namespace {

void ExchangePieceToProto(const ExchangePiece& piece, v1::NcclPiece* out) {
  out->set_peer(piece.peer);
  out->set_shard_id(piece.shard_id);
  out->mutable_offsets()->Assign(piece.offsets.begin(), piece.offsets.end());
  out->mutable_sizes()->Assign(piece.sizes.begin(), piece.sizes.end());
}

absl::StatusOr<ExchangePiece> ExchangePieceFromProto(const v1::NcclPiece& p,
                                                     const std::string& field,
                                                     int32_t ranks,
                                                     int32_t rank) {
  if (p.peer() < 0 || p.peer() >= ranks || p.peer() == rank) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": peer ", p.peer(), " is not another of ", ranks, " ranks"));
  }
  if (p.sizes_size() > kMaxRank || p.offsets_size() != p.sizes_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", p.offsets_size(), " offsets and ",
                     p.sizes_size(), " sizes (at most ", kMaxRank, " dims)"));
  }
  TESSERA_RETURN_IF_ERROR(CheckPieceSizes(field, p.sizes()));
  ExchangePiece piece;
  piece.peer = p.peer();
  piece.shard_id = p.shard_id();
  piece.offsets.assign(p.offsets().begin(), p.offsets().end());
  piece.sizes.assign(p.sizes().begin(), p.sizes().end());
  return piece;
}

}  // namespace

void ExchangePlanToProto(const ExchangePlan& plan,
                         v1::NcclExchangeRequest* out) {
  out->set_unique_id(plan.unique_id);
  out->set_ranks(plan.ranks);
  out->set_rank(plan.rank);
  for (const ExchangePiece& piece : plan.sends) {
    ExchangePieceToProto(piece, out->add_sends());
  }
  for (const ExchangePiece& piece : plan.recvs) {
    ExchangePieceToProto(piece, out->add_recvs());
  }
}

absl::StatusOr<ExchangePlan> ExchangePlanFromProto(
    const v1::NcclExchangeRequest& request) {
  if (request.unique_id().size() != kExchangeIdBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("a communicator id of ", request.unique_id().size(),
                     " bytes (", kExchangeIdBytes, " expected)"));
  }
  if (request.ranks() < 2 || request.ranks() > kMaxExchangeRanks ||
      request.rank() < 0 || request.rank() >= request.ranks()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", request.rank(), " of ", request.ranks(),
                     " (2 to ", kMaxExchangeRanks, " members)"));
  }
  if (request.sends_size() + request.recvs_size() > kMaxExchangePieces) {
    return absl::InvalidArgumentError(
        absl::StrCat(request.sends_size() + request.recvs_size(),
                     " pieces (at most ", kMaxExchangePieces, ")"));
  }
  ExchangePlan plan;
  plan.unique_id = request.unique_id();
  plan.ranks = request.ranks();
  plan.rank = request.rank();
  for (int i = 0; i < request.sends_size(); ++i) {
    TESSERA_ASSIGN_OR_RETURN(
        ExchangePiece piece,
        ExchangePieceFromProto(request.sends(i), absl::StrCat("sends[", i, "]"),
                               plan.ranks, plan.rank));
    plan.sends.push_back(std::move(piece));
  }
  for (int i = 0; i < request.recvs_size(); ++i) {
    TESSERA_ASSIGN_OR_RETURN(
        ExchangePiece piece,
        ExchangePieceFromProto(request.recvs(i), absl::StrCat("recvs[", i, "]"),
                               plan.ranks, plan.rank));
    plan.recvs.push_back(std::move(piece));
  }
  return plan;
}

}  // namespace tessera
