#include "worker/checkpoint_io.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "core/errors.h"
#include "core/safetensors.h"
#include "core/status_macros.h"
#include "core/tensor_metadata.h"
#include "worker/write_fully.h"

namespace tessera {
namespace {

// Bytes a save copies out of a shard the host cannot address (GPU memory)
// at a time.
constexpr int64_t kSaveChunkBytes = int64_t{8} << 20;

}  // namespace

absl::StatusOr<CheckpointListing> CheckpointIo::List(
    const std::string& dir) const {
  TESSERA_ASSIGN_OR_RETURN(CheckpointListing listing, root_.List(dir));
  // The metadata within what a tensor keeps, before anything is sent.
  FileOrigin origin;
  origin.metadata = listing.metadata;
  if (absl::Status s = CheckFileOrigin(origin); !s.ok()) {
    return Annotate(s, "checkpoint: the file's __metadata__");
  }
  return listing;
}

absl::StatusOr<LoadedRuns> CheckpointIo::Load(const std::string& dir,
                                              const std::string& file,
                                              uint64_t shard_id,
                                              const std::vector<FileRun>& runs,
                                              int64_t piece_offset,
                                              int64_t piece_bytes) const {
  TESSERA_ASSIGN_OR_RETURN(ShardDesc shard, store_->Describe(shard_id));
  const int64_t shard_bytes = shard.ByteSize();
  int64_t last_end = 0;
  for (const FileRun& r : runs) {
    // Every run inside the shard and after the one before it.
    if (r.length < 0 || r.shard_offset < 0 || r.file_offset < 0 ||
        r.shard_offset > shard_bytes - r.length || r.file_offset < last_end) {
      return absl::InvalidArgumentError(
          absl::StrCat("LoadShard: run (", r.file_offset, ", ", r.length, ", ",
                       r.shard_offset, ") is not inside the shard of ",
                       shard_bytes, " bytes in file order"));
    }
    last_end = r.file_offset + r.length;
  }
  // A piece's part CRC: every run inside the piece.
  if (piece_bytes < 0 || piece_offset < 0 ||
      (piece_bytes > 0 && !runs.empty() &&
       (runs.front().file_offset < piece_offset ||
        last_end - piece_offset > piece_bytes))) {
    return absl::InvalidArgumentError(
        absl::StrCat("LoadShard: runs up to file byte ", last_end,
                     " are not inside the piece of ", piece_bytes, " bytes at ",
                     piece_offset));
  }
  PartCrc32 part(piece_bytes);
  // Host memory is written in place: a column layout lands a run per row
  // (tens of thousands of small copies), each through the store's lookup
  // otherwise. Every run was checked to lie inside the shard above.
  absl::StatusOr<PinnedShard> pinned = store_->Pin(shard_id);
  LoadedRuns loaded;
  TESSERA_ASSIGN_OR_RETURN(
      loaded.bytes_read,
      root_.ReadRuns(dir, file, runs,
                     /*max_gap=*/kLoadMaxGapBytes,
                     /*max_span=*/kLoadSpanBytes,
                     [&](const FileRun& run, absl::string_view bytes) {
                       if (piece_bytes > 0) {
                         part.Add(run.file_offset - piece_offset, bytes);
                       }
                       if (pinned.ok()) {
                         std::memcpy(pinned->data + run.shard_offset,
                                     bytes.data(), bytes.size());
                         return absl::OkStatus();
                       }
                       return store_->Write(shard_id, run.shard_offset, bytes);
                     }));
  if (piece_bytes > 0) loaded.part_crc32 = part.Finish();
  return loaded;
}

absl::StatusOr<uint32_t> CheckpointIo::WriteShard(int fd, uint64_t id,
                                                  const ShardDesc& desc) const {
  const int64_t bytes = desc.ByteSize();
  uint32_t crc = 0;
  absl::StatusOr<PinnedShard> pinned = store_->Pin(id);
  if (pinned.ok()) {
    for (int64_t at = 0; at < bytes; at += kSaveChunkBytes) {
      const absl::string_view chunk(
          pinned->data + at,
          static_cast<size_t>(std::min(kSaveChunkBytes, bytes - at)));
      crc = ExtendCrc32(crc, chunk);
      TESSERA_RETURN_IF_ERROR(WriteFully(fd, chunk, "checkpoint"));
    }
    return crc;
  }
  const Box whole(Shape(desc.box.rank(), 0), desc.box.sizes);
  const int64_t item = ItemSize(desc.dtype);
  const int64_t per = std::max<int64_t>(1, kSaveChunkBytes / item);
  std::string buffer;
  for (int64_t at = 0; at < whole.NumElements(); at += per) {
    const int64_t n = std::min(per, whole.NumElements() - at);
    buffer.resize(static_cast<size_t>(n * item));
    TESSERA_RETURN_IF_ERROR(store_->ReadBox(id, whole, at, n, buffer.data()));
    crc = ExtendCrc32(crc, buffer);
    TESSERA_RETURN_IF_ERROR(WriteFully(fd, buffer, "checkpoint"));
  }
  return crc;
}

absl::StatusOr<CheckpointIo::SavedFile> CheckpointIo::Save(
    const std::string& dir, const std::string& file,
    const std::vector<SaveItem>& items,
    const std::vector<std::pair<std::string, std::string>>& metadata,
    const StopCondition& stop) const {
  FileOrigin origin;
  origin.metadata = metadata;
  TESSERA_RETURN_IF_ERROR(CheckFileOrigin(origin));
  // Each shard must belong to the tensor version the order names (a
  // version keeps the shards a change left alone, made by an earlier one:
  // the read rule), and be sealed: a shard id of another tensor is never
  // written under this one's name.
  std::vector<SafetensorsTensor> tensors;
  std::vector<ShardDesc> descs;
  for (const SaveItem& item : items) {
    TESSERA_ASSIGN_OR_RETURN(ShardDesc desc, store_->Describe(item.shard_id));
    if (desc.tensor != item.tensor || desc.version > item.version ||
        takes_writes_(item.shard_id)) {
      return absl::FailedPreconditionError(
          absl::StrCat("shard ", item.shard_id, " is not a sealed shard of '",
                       item.tensor, "' version ", item.version));
    }
    Shape shape(desc.box.sizes.begin(), desc.box.sizes.end());
    if (item.scalar) {
      if (desc.box.NumElements() != 1) {
        return absl::InvalidArgumentError(
            "a 0-d entry is stored from a one-element shard");
      }
      shape.clear();
    }
    tensors.push_back({item.entry, desc.dtype, std::move(shape)});
    descs.push_back(std::move(desc));
  }
  TESSERA_ASSIGN_OR_RETURN(SafetensorsLayout layout,
                           LayoutSafetensors(tensors, metadata));
  // The layout's order (aligned: larger items first) as items.
  absl::flat_hash_map<absl::string_view, size_t> item_of;
  for (size_t i = 0; i < tensors.size(); ++i)
    item_of.emplace(tensors[i].name, i);
  std::vector<size_t> order;                     // layout entry -> item
  std::vector<size_t> entry_of(tensors.size());  // item -> layout entry
  for (size_t e = 0; e < layout.entries.size(); ++e) {
    order.push_back(item_of.at(layout.entries[e].name));
    entry_of[order.back()] = e;
  }
  std::vector<uint32_t> crcs(descs.size(), 0);
  SavedFile saved;
  TESSERA_ASSIGN_OR_RETURN(
      saved.file_bytes, root_.WriteFile(dir, file, [&](int fd) -> absl::Status {
        TESSERA_RETURN_IF_ERROR(WriteFully(fd, layout.header, "checkpoint"));
        for (const size_t i : order) {
          TESSERA_RETURN_IF_ERROR(stop.Check());
          TESSERA_ASSIGN_OR_RETURN(crcs[i],
                                   WriteShard(fd, items[i].shard_id, descs[i]));
        }
        return absl::OkStatus();
      }));
  for (size_t i = 0; i < descs.size(); ++i) {
    const SafetensorsEntry& entry = layout.entries[entry_of[i]];
    saved.items.push_back(
        SavedItem{static_cast<int64_t>(layout.header.size()) + entry.begin,
                  entry.num_bytes(), crcs[i]});
  }
  return saved;
}

absl::Status CheckpointIo::WriteIndex(const std::string& dir,
                                      const std::string& name,
                                      const std::string& content,
                                      int64_t size) const {
  if (static_cast<int64_t>(content.size()) > kMaxCheckpointIndexBytes) {
    return CheckpointError(absl::StrCat("an index file is larger than ",
                                        kMaxCheckpointIndexBytes, " bytes"));
  }
  // Zeros cost no space until written (a sparse file); the bound keeps the
  // size within what any file system takes.
  if (size < 0 || size > kMaxExportFileBytes) {
    return CheckpointError(absl::StrCat("a file of ", size,
                                        " bytes is more than one may be (",
                                        kMaxExportFileBytes, ")"));
  }
  return root_
      .WriteFile(
          dir, name,
          [&](int fd) -> absl::Status {
            TESSERA_RETURN_IF_ERROR(WriteFully(fd, content, "checkpoint"));
            if (size > static_cast<int64_t>(content.size()) &&
                ftruncate(fd, size) != 0) {
              return absl::ResourceExhaustedError(absl::StrCat(
                  "checkpoint: sizing a file: ", std::strerror(errno)));
            }
            return absl::OkStatus();
          })
      .status();
}

absl::StatusOr<int64_t> CheckpointIo::WriteRuns(
    const std::string& dir, const std::string& file, const std::string& save_id,
    uint64_t shard_id, const std::string& tensor, uint64_t version,
    const std::vector<FileRun>& runs) const {
  // As a save's: only a sealed shard of the tensor version named.
  TESSERA_ASSIGN_OR_RETURN(ShardDesc desc, store_->Describe(shard_id));
  if (desc.tensor != tensor || desc.version > version ||
      takes_writes_(shard_id)) {
    return absl::FailedPreconditionError(
        absl::StrCat("shard ", shard_id, " is not a sealed shard of '", tensor,
                     "' version ", version));
  }
  const int64_t shard_bytes = desc.ByteSize();
  const int64_t item = ItemSize(desc.dtype);
  for (const FileRun& r : runs) {
    if (r.length < 0 || r.shard_offset < 0 ||
        r.shard_offset > shard_bytes - r.length || r.length % item != 0 ||
        r.shard_offset % item != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "WriteShardRuns: run (", r.file_offset, ", ", r.length, ", ",
          r.shard_offset, ") is not whole elements inside the shard of ",
          shard_bytes, " bytes"));
    }
  }
  absl::StatusOr<PinnedShard> pinned = store_->Pin(shard_id);
  const Box whole(Shape(desc.box.rank(), 0), desc.box.sizes);
  return root_.WriteRuns(
      dir, file, save_id, runs, kSaveChunkBytes,
      [&](const FileRun& run,
          std::string* scratch) -> absl::StatusOr<absl::string_view> {
        if (pinned.ok()) {
          return absl::string_view(pinned->data + run.shard_offset,
                                   static_cast<size_t>(run.length));
        }
        // Memory the host cannot address (GPU): copied out a run at a time
        // (a run is at most kSaveChunkBytes).
        scratch->resize(static_cast<size_t>(run.length));
        TESSERA_RETURN_IF_ERROR(
            store_->ReadBox(shard_id, whole, run.shard_offset / item,
                            run.length / item, scratch->data()));
        return absl::string_view(*scratch);
      });
}

absl::Status CheckpointIo::Publish(
    const std::string& dir, const std::string& save_id,
    const std::vector<std::pair<std::string, std::string>>& renames) const {
  return root_.Publish(dir, save_id, renames);
}

absl::Status CheckpointIo::Remove(const std::string& dir,
                                  const std::vector<std::string>& names,
                                  const std::string& save_id) const {
  return root_.RemoveFiles(dir, names, save_id);
}

}  // namespace tessera
