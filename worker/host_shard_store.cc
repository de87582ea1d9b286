#include "worker/host_shard_store.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/crc32.h"
#include "core/errors.h"
#include "core/shard_record.h"
#include "core/status_macros.h"
#include "core/strided_copy.h"
#include "spdlog/spdlog.h"

namespace tessera {

struct HostShardStore::Shard {
  ShardDesc desc;
  int64_t bytes = 0;
  // From `block` (zeroed unless filled at once), `file`, or calloc'd.
  char* data = nullptr;
  std::unique_ptr<SharedBlock> block;     // null for other memory
  std::shared_ptr<MappedShardFile> file;  // --store_dir
  ShardCharge charge;  // against the capacity, until the memory is gone
  ~Shard() {
    if (block == nullptr && file == nullptr) std::free(data);
  }
};

HostShardStore::HostShardStore(int64_t capacity_bytes)
    : HostShardStore(HostShardStoreOptions{capacity_bytes}) {}

HostShardStore::HostShardStore(HostShardStoreOptions options)
    : options_(std::move(options)),
      table_(options_.capacity_bytes, "", options_.shard_charge_bytes) {}

HostShardStore::~HostShardStore() = default;

absl::Status HostShardStore::Allocate(uint64_t id, const ShardDesc& desc,
                                      const InitFill& init) {
  if (init.dtype() != desc.dtype) {
    return absl::InvalidArgumentError(
        absl::StrCat("init made for ", DTypeName(init.dtype()),
                     ", not the shard's ", DTypeName(desc.dtype)));
  }
  // Every other kind relies on memory that reads as zero.
  const bool fills = init.kind() != InitSpec::Kind::kEmpty &&
                     init.kind() != InitSpec::Kind::kZeros;
  auto shard = std::make_shared<Shard>();
  shard->desc = desc;
  shard->bytes = desc.ByteSize();
  // Dropping the shard on failure gives the charge back.
  TESSERA_ASSIGN_OR_RETURN(shard->charge, table_.Reserve(id, shard->bytes));
  if (options_.files != nullptr) {
    TESSERA_ASSIGN_OR_RETURN(shard->file,
                             options_.files->Create(id, shard->bytes));
    shard->data = shard->file->data();
  } else if (options_.arena != nullptr && shard->bytes > 0 &&
             shard->bytes >= options_.shared_memory_min_bytes) {
    // A put's shards are written by their client through its own mapping:
    // their pages are never handed to another shard.
    BlockUse use;
    use.reusable = !desc.writable;
    use.overwritten = desc.filled_by_copies || fills;
    shard->block = options_.arena->Allocate(shard->bytes, id, use);
  }
  if (shard->file != nullptr) {
    // Mapped from its file above.
  } else if (shard->block != nullptr) {
    shard->data = shard->block->data();
  } else {
    shard->data =
        static_cast<char*>(std::calloc(std::max<int64_t>(shard->bytes, 1), 1));
  }
  if (shard->data == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("out of host memory allocating ", shard->bytes, " bytes"));
  }
  if (fills) {
    TESSERA_RETURN_IF_ERROR(
        init.Fill(desc.tensor_shape, desc.box, shard->data));
  }
  return table_.Insert(id, std::move(shard));
}

absl::Status HostShardStore::Write(uint64_t id, int64_t byte_offset,
                                   absl::string_view data) {
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<Shard> shard, table_.Find(id));
  const int64_t size = static_cast<int64_t>(data.size());
  TESSERA_RETURN_IF_ERROR(CheckShardWrite(shard->bytes, byte_offset, size));
  if (size > 0)
    std::memcpy(shard->data + byte_offset, data.data(), data.size());
  return absl::OkStatus();
}

absl::Status HostShardStore::WriteBox(uint64_t id, const Box& box,
                                      int64_t flat_begin, int64_t count,
                                      const char* src) {
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<Shard> shard, table_.Find(id));
  TESSERA_RETURN_IF_ERROR(CheckShardRange(shard->desc, box, flat_begin, count));
  if (count == 0) return absl::OkStatus();
  CopyFlatRangeToBox(src, flat_begin, count, box.sizes, shard->data,
                     shard->desc.box.sizes, box.offsets,
                     ItemSize(shard->desc.dtype));
  return absl::OkStatus();
}

absl::Status HostShardStore::ReadBox(uint64_t id, const Box& box,
                                     int64_t flat_begin, int64_t count,
                                     char* dst) {
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<Shard> shard, table_.Find(id));
  TESSERA_RETURN_IF_ERROR(CheckShardRange(shard->desc, box, flat_begin, count));
  if (count == 0) return absl::OkStatus();
  CopyBoxToFlatRange(shard->data, shard->desc.box.sizes, box.offsets, box.sizes,
                     flat_begin, count, dst, ItemSize(shard->desc.dtype));
  return absl::OkStatus();
}

absl::Status HostShardStore::CopyLocal(uint64_t src_id, const Box& src_box,
                                       uint64_t dst_id,
                                       absl::Span<const int64_t> dst_offsets) {
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<Shard> src, table_.Find(src_id));
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<Shard> dst, table_.Find(dst_id));
  if (src->desc.dtype != dst->desc.dtype) {
    return absl::InvalidArgumentError(
        absl::StrCat("copy from a ", DTypeName(src->desc.dtype),
                     " shard into a ", DTypeName(dst->desc.dtype), " shard"));
  }
  TESSERA_RETURN_IF_ERROR(
      CheckWithin(src_box, src->desc.box.sizes, "source region"));
  Box dst_box{std::vector<int64_t>(dst_offsets.begin(), dst_offsets.end()),
              src_box.sizes};
  TESSERA_RETURN_IF_ERROR(
      CheckWithin(dst_box, dst->desc.box.sizes, "destination region"));
  if (src_box.NumElements() == 0) return absl::OkStatus();
  CopyBox(src->data, src->desc.box.sizes, src_box.offsets, dst->data,
          dst->desc.box.sizes, dst_offsets, src_box.sizes,
          ItemSize(src->desc.dtype));
  return absl::OkStatus();
}

absl::StatusOr<ShardDesc> HostShardStore::Describe(uint64_t id) const {
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<Shard> shard, table_.Find(id));
  return shard->desc;
}

absl::StatusOr<PinnedShard> HostShardStore::Pin(uint64_t id) {
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<Shard> shard, table_.Find(id));
  PinnedShard pinned;
  pinned.data = shard->data;
  pinned.bytes = shard->bytes;
  pinned.desc = shard->desc;
  if (shard->file != nullptr) pinned.file = shard->file->path();
  // Only a reusable block's pages outlive its shard usefully; anything else
  // stays whole (and counted as pinned) while held mapped.
  if (shard->block != nullptr && shard->block->reusable()) {
    pinned.keep_mapped = shard->block->KeepMapped();
  } else {
    pinned.keep_mapped = shard;
  }
  pinned.keep_alive = std::move(shard);
  return pinned;
}

absl::Status HostShardStore::Persist(uint64_t id,
                                     absl::string_view cluster_id) {
  if (options_.files == nullptr) return absl::OkStatus();
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<Shard> shard, table_.Find(id));
  if (shard->file == nullptr) return absl::OkStatus();
  ShardRecord record;
  record.shard_id = id;
  record.cluster_id = std::string(cluster_id);
  record.tensor = shard->desc.tensor;
  record.version = shard->desc.version;
  record.incarnation = shard->desc.incarnation;
  record.dtype = shard->desc.dtype;
  record.tensor_shape = shard->desc.tensor_shape;
  record.box = shard->desc.box;
  record.bytes = shard->bytes;
  record.crc32 = ExtendCrc32(
      0, absl::string_view(shard->data, static_cast<size_t>(shard->bytes)));
  TESSERA_RETURN_IF_ERROR(options_.files->Seal(record, *shard->file));
  // Freed meanwhile (a seal from a coordinator that died, racing a free
  // from its successor): Free removed the files before the record was
  // written; no record may outlive its shard.
  absl::StatusOr<std::shared_ptr<Shard>> still = table_.Find(id);
  if (!still.ok() || *still != shard) {
    options_.files->Remove(id);
    return absl::NotFoundError(
        absl::StrCat("shard ", id, " was freed while it was persisted"));
  }
  return absl::OkStatus();
}

ShardFiles::ScanResult HostShardStore::Reattach(
    absl::flat_hash_map<uint64_t, std::string>* owners) {
  ShardFiles::ScanResult scan = options_.files->Scan();
  for (ShardFiles::Found& found : scan.intact) {
    const ShardRecord& r = found.record;
    auto shard = std::make_shared<Shard>();
    shard->desc.tensor = r.tensor;
    shard->desc.version = r.version;
    shard->desc.incarnation = r.incarnation;
    shard->desc.dtype = r.dtype;
    shard->desc.tensor_shape = r.tensor_shape;
    shard->desc.box = r.box;
    shard->bytes = r.bytes;
    shard->data = found.file->data();
    shard->file = found.file;
    absl::StatusOr<ShardCharge> charge = table_.Reserve(r.shard_id, r.bytes);
    absl::Status inserted = charge.status();
    if (inserted.ok()) {
      shard->charge = *std::move(charge);
      inserted = table_.Insert(r.shard_id, std::move(shard));
    }
    if (!inserted.ok()) {
      // Past the capacity (it shrank), or a duplicate: kept on disk, not
      // served; the coordinator repairs it elsewhere.
      scan.problems.push_back(absl::StrCat(
          "shard ", r.shard_id, " of '", r.tensor, "': ", inserted.message()));
      continue;
    }
    (*owners)[r.shard_id] = r.cluster_id;
  }
  return scan;
}

absl::Status HostShardStore::Free(uint64_t id) {
  // Memory is released when the last reader drops it, outside any lock.
  std::shared_ptr<Shard> shard = table_.Remove(id);
  if (shard != nullptr && shard->file != nullptr) options_.files->Remove(id);
  // No new same-host mappings from now on; existing ones keep the old bytes
  // until the last reader lets go, then the pages may serve another shard
  // (readers check after each copy: transport/shared_memory.h).
  if (shard != nullptr && shard->block != nullptr) shard->block->Unlink();
  return absl::OkStatus();
}

absl::Status HostShardStore::SetAside(uint64_t id) {
  if (options_.files == nullptr) return Free(id);
  std::shared_ptr<Shard> shard = table_.Remove(id);
  if (shard == nullptr) return absl::OkStatus();
  if (shard->file != nullptr) {
    const std::string kept = options_.files->SetAside(id);
    spdlog::error(
        "shard {} of '{}' is not what the coordinator placed under "
        "its id: no longer served{}",
        id, std::string(shard->desc.tensor),
        kept.empty() ? "" : absl::StrCat("; its files kept in ", kept));
  }
  return absl::OkStatus();
}

int64_t HostShardStore::BytesUsed() const { return table_.BytesUsed(); }

int64_t HostShardStore::ChargedBytes() const { return table_.ChargedBytes(); }

int64_t HostShardStore::PinnedBytes() const { return table_.PinnedBytes(); }

std::vector<uint64_t> HostShardStore::ShardIds() const { return table_.Ids(); }

}  // namespace tessera
