#include "worker/worker_node.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "core/capability.h"
#include "core/crc32.h"
#include "core/delta_codec.h"
#include "core/errors.h"
#include "core/relay_plan.h"
#include "core/status_macros.h"
#include "rpc/channel.h"
#include "rpc/status.h"
#include "spdlog/spdlog.h"

namespace tessera {
namespace {

// How long a request that needs the registration key waits for the
// coordinator's reply to the registration (Admit).
constexpr absl::Duration kRegistrationReplyGrace = absl::Seconds(2);

// Byte offset of `box`'s first element in a row-major array of `shape`.
int64_t FirstByte(absl::Span<const int64_t> shape, const Box& box,
                  int64_t item) {
  int64_t first = 0, stride = item;
  for (size_t d = shape.size(); d-- > 0;) {
    first += box.offsets[d] * stride;
    stride *= shape[d];
  }
  return first;
}

// The options as the node uses them: the peer links and reads are bounded
// by the pull limits.
WorkerNodeOptions Normalized(WorkerNodeOptions options) {
  options.channels.idle_timeout =
      std::min(options.channels.idle_timeout, options.pull_idle_timeout);
  options.peers.timeout = std::min(options.peers.timeout, options.pull_timeout);
  return options;
}

}  // namespace

absl::Status RegionReader::Read(int64_t begin, int64_t count, char* dst) const {
  return store_->ReadBox(id_, box_, begin, count, dst);
}

absl::Status RegionReader::FitsOneMessage() const {
  const int64_t bytes = total_ * item_;
  if (bytes > kMaxChunkBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "region of ", bytes, " bytes is too large for one message (",
        kMaxChunkBytes, " bytes at most): use ReadRegion"));
  }
  return absl::OkStatus();
}

absl::Status RegionReader::ReadAll(std::string* out) const {
  TESSERA_RETURN_IF_ERROR(FitsOneMessage());
  out->resize(static_cast<size_t>(total_ * item_));
  return Read(0, total_, out->data());
}

// Where transfer pieces land: straight into the destination shard's host
// memory when the store can pin it, else through the store's WriteBox.
// Between pieces it checks the order's deadline and cancellation.
class WorkerNode::Receiver : public TransferReceiver {
 public:
  Receiver(ShardStore* store, absl::Time deadline,
           const std::function<bool()>& cancelled)
      : store_(store), deadline_(deadline), cancelled_(cancelled) {}

  absl::StatusOr<PieceTarget> TargetFor(const TransferPiece& piece) override {
    if (cancelled_ && cancelled_()) {
      return absl::CancelledError("the caller cancelled the transfer");
    }
    if (absl::Now() >= deadline_) {
      return absl::DeadlineExceededError("the transfer's deadline passed");
    }
    const uint64_t id = piece.dst_shard_id;
    const Box box = piece.DstBox();
    absl::StatusOr<PinnedShard> pinned = store_->Pin(id);
    if (pinned.ok()) {
      TESSERA_RETURN_IF_ERROR(
          CheckWithin(box, pinned->desc.box.sizes, "destination region"));
      PieceTarget out{ReadTarget::HostArray(
                          pinned->data, pinned->desc.box.sizes, box.offsets),
                      static_cast<int64_t>(ItemSize(pinned->desc.dtype)),
                      std::move(pinned->keep_alive)};
      return out;
    }
    if (!absl::IsUnimplemented(pinned.status())) return pinned.status();
    TESSERA_ASSIGN_OR_RETURN(ShardDesc desc, store_->Describe(id));
    TESSERA_RETURN_IF_ERROR(
        CheckWithin(box, desc.box.sizes, "destination region"));
    ShardStore* store = store_;
    return PieceTarget{
        ReadTarget::Sink(
            [store, id, box](int64_t first, int64_t count, const char* data) {
              return store->WriteBox(id, box, first, count, data);
            }),
        static_cast<int64_t>(ItemSize(desc.dtype)), nullptr};
  }

 private:
  ShardStore* const store_;
  const absl::Time deadline_;
  const std::function<bool()>& cancelled_;
};

WorkerNode::WorkerNode(ShardStore* store, WorkerNodeOptions options,
                       std::unique_ptr<ShardTransport> peers)
    : store_(store),
      options_(Normalized(std::move(options))),
      checkpoints_(store_, options_.checkpoint_root,
                   [this](uint64_t id) { return TakesWrites(id); }),
      peers_(std::move(peers)),
      pacer_([this] {
        ReadPacer::Options pacing;
        pacing.rate = options_.principal_read_rate;
        return pacing;
      }()) {
  if (options_.arena != nullptr) {
    staging_ = std::make_unique<StagingPool>(options_.arena, store_,
                                             options_.max_staging_bytes,
                                             options_.max_staging_bytes / 4);
  }
  if (peers_ == nullptr) {
    channels_ = std::make_unique<ChannelCache>(options_.channels,
                                               options_.max_peer_channels);
    std::unique_ptr<TransportChain> chain =
        TransportChain::Make(channels_.get(), options_.peers);
    chain_ = chain.get();
    peers_ = std::move(chain);
  }
}

DataPlaneStats WorkerNode::PeerStats() const {
  return chain_ != nullptr ? chain_->Stats() : DataPlaneStats{};
}

WorkerNode::~WorkerNode() {
  peers_.reset();  // before the channels it uses
}

absl::Status WorkerNode::Allocate(absl::Span<const ShardAllocation> shards,
                                  const InitSpec& init,
                                  const std::function<bool()>& cancelled) {
  auto undo = [&](size_t allocated) {
    for (size_t j = 0; j < allocated; ++j)
      store_->Free(shards[j].id).IgnoreError();
  };
  if (static_cast<int64_t>(shards.size()) > options_.max_shards_per_request) {
    return absl::InvalidArgumentError(absl::StrCat(
        "allocation of ", shards.size(), " shards: a worker takes at most ",
        options_.max_shards_per_request, " per request"));
  }
  const absl::Status cancel_error =
      absl::CancelledError("the caller cancelled the allocation");
  // The init value is parsed once per dtype, not once per shard (a 4 MiB
  // full:V costs milliseconds).
  std::optional<InitFill> fill;
  // Polling for cancellation can be slow (tens of µs for gRPC): ask every
  // 1024 shards, and once at the end.
  for (size_t i = 0; i < shards.size(); ++i) {
    const ShardDesc& desc = shards[i].desc;
    absl::Status s;
    if (i % 1024 == 1023 && cancelled && cancelled()) {
      s = cancel_error;
    } else if (!fill.has_value() || fill->dtype() != desc.dtype) {
      absl::StatusOr<InitFill> made = InitFill::Make(init, desc.dtype);
      s = made.status();
      if (made.ok()) fill = *std::move(made);
    }
    if (s.ok()) s = store_->Allocate(shards[i].id, desc, *fill);
    if (!s.ok()) {
      undo(i);
      return s;
    }
  }
  if (cancelled && cancelled()) {
    undo(shards.size());
    return cancel_error;
  }
  return absl::OkStatus();
}

absl::Status WorkerNode::Write(uint64_t id, int64_t byte_offset,
                               absl::string_view data) {
  return store_->Write(id, byte_offset, data);
}

absl::Status WorkerNode::WriteBox(uint64_t id, const Box& box,
                                  int64_t byte_offset, absl::string_view data) {
  TESSERA_ASSIGN_OR_RETURN(ShardDesc desc, store_->Describe(id));
  TESSERA_RETURN_IF_ERROR(CheckWithin(box, desc.box.sizes, "written region"));
  const int64_t item = static_cast<int64_t>(ItemSize(desc.dtype));
  const int64_t size = static_cast<int64_t>(data.size());
  if (byte_offset < 0 || byte_offset % item != 0 || size % item != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("write of ", size, " bytes at byte ", byte_offset,
                     " of shard ", id, " splits its ", item, "-byte elements"));
  }
  const int64_t box_bytes = box.NumElements() * item;
  if (byte_offset > box_bytes || size > box_bytes - byte_offset) {
    return absl::OutOfRangeError(absl::StrCat(
        "write of ", size, " bytes at byte ", byte_offset, " runs past the ",
        box_bytes, "-byte region ", box.ToString(), " of shard ", id));
  }
  if (size == 0) return absl::OkStatus();
  return store_->WriteBox(id, box, byte_offset / item, size / item,
                          data.data());
}

absl::Status WorkerNode::ReadRows(absl::Span<const ShardRows> shards,
                                  std::string* out) const {
  out->clear();
  // Everything is checked before a byte is copied, so the reply is sized
  // once and a bad row costs no copying.
  struct Part {
    int64_t row_elements = 0;
    int64_t row_bytes = 0;
    Box row_box;  // row 0 of the shard, whole
  };
  std::vector<Part> parts(shards.size());
  int64_t rows_total = 0, bytes_total = 0;
  for (size_t i = 0; i < shards.size(); ++i) {
    const ShardRows& entry = shards[i];
    TESSERA_ASSIGN_OR_RETURN(ShardDesc desc, store_->Describe(entry.id));
    const BoxCoords& sizes = desc.box.sizes;
    if (sizes.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("shard ", entry.id, " is 0-d: it has no rows"));
    }
    Part& part = parts[i];
    part.row_elements = 1;
    for (size_t d = 1; d < sizes.size(); ++d) part.row_elements *= sizes[d];
    part.row_bytes =
        part.row_elements * static_cast<int64_t>(ItemSize(desc.dtype));
    std::vector<int64_t> offsets(sizes.size(), 0),
        row_sizes(sizes.begin(), sizes.end());
    row_sizes[0] = 1;
    part.row_box = Box(absl::Span<const int64_t>(offsets),
                       absl::Span<const int64_t>(row_sizes));
    for (int64_t row : entry.rows) {
      if (row < 0 || row >= sizes[0]) {
        return absl::OutOfRangeError(
            absl::StrCat("row ", row, " is out of bounds for shard ", entry.id,
                         " of ", sizes[0], " rows"));
      }
    }
    rows_total += static_cast<int64_t>(entry.rows.size());
    bytes_total += static_cast<int64_t>(entry.rows.size()) * part.row_bytes;
    if (rows_total > kMaxRowsPerRead || bytes_total > kMaxChunkBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a row read returns at most ", kMaxChunkBytes, " bytes and ",
          kMaxRowsPerRead, " rows per call; split the rows"));
    }
  }
  out->resize(static_cast<size_t>(bytes_total));
  char* dst = out->data();
  for (size_t i = 0; i < shards.size(); ++i) {
    const ShardRows& entry = shards[i];
    const Part& part = parts[i];
    if (part.row_bytes == 0 || entry.rows.empty()) continue;
    absl::StatusOr<PinnedShard> pinned = store_->Pin(entry.id);
    if (pinned.ok()) {
      for (int64_t row : entry.rows) {
        std::memcpy(dst, pinned->data + row * part.row_bytes,
                    static_cast<size_t>(part.row_bytes));
        dst += part.row_bytes;
      }
      continue;
    }
    // Memory the host cannot address (device memory): row by row.
    if (!absl::IsUnimplemented(pinned.status())) return pinned.status();
    Box row_box = part.row_box;
    for (int64_t row : entry.rows) {
      row_box.offsets[0] = row;
      TESSERA_RETURN_IF_ERROR(
          store_->ReadBox(entry.id, row_box, 0, part.row_elements, dst));
      dst += part.row_bytes;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<RegionReader> WorkerNode::OpenRegion(uint64_t id, const Box& box,
                                                    int64_t chunk_bytes) const {
  TESSERA_ASSIGN_OR_RETURN(ShardDesc desc, store_->Describe(id));
  TESSERA_RETURN_IF_ERROR(CheckWithin(box, desc.box.sizes, "region"));
  RegionReader reader;
  reader.store_ = store_;
  reader.id_ = id;
  reader.box_ = box;
  reader.item_ = static_cast<int64_t>(ItemSize(desc.dtype));
  const int64_t bytes = chunk_bytes > 0
                            ? std::min<int64_t>(chunk_bytes, kMaxChunkBytes)
                            : options_.chunk_bytes;
  reader.chunk_elements_ = std::max<int64_t>(1, bytes / reader.item_);
  reader.total_ = box.NumElements();
  // A sub-box whose dims before the last partial one are 1 is one run of
  // the shard's memory: its chunks can be sent straight from there.
  absl::StatusOr<PinnedShard> pinned = store_->Pin(id);
  if (pinned.ok() && reader.total_ > 0) {
    const BoxCoords& shape = pinned->desc.box.sizes;
    size_t last_partial = 0;
    for (size_t d = 0; d < shape.size(); ++d) {
      if (box.sizes[d] != shape[d]) last_partial = d;
    }
    bool contiguous = true;
    for (size_t d = 0; d < last_partial; ++d) contiguous &= box.sizes[d] == 1;
    if (contiguous) {
      reader.base_ = pinned->data + FirstByte(shape, box, reader.item_);
      reader.pinned_ = std::move(pinned->keep_alive);
    }
  }
  return reader;
}

absl::StatusOr<RegionReader> WorkerNode::OpenRegionOf(
    uint64_t id, const Box& box, int64_t item_bytes) const {
  TESSERA_ASSIGN_OR_RETURN(RegionReader reader,
                           OpenRegion(id, box, kChunkBytes));
  if (reader.item() != item_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard ", id, " has ", reader.item(),
                     "-byte elements, not ", item_bytes));
  }
  return reader;
}

absl::Status WorkerNode::ReadRegion(uint64_t id, const Box& box,
                                    int64_t item_bytes,
                                    const ReadTarget& target) const {
  TESSERA_ASSIGN_OR_RETURN(RegionReader reader,
                           OpenRegionOf(id, box, item_bytes));
  const int64_t total = reader.total();
  std::string chunk(
      static_cast<size_t>(std::min(total, reader.chunk_elements()) *
                          reader.item()),
      '\0');
  for (int64_t first = 0; first < total;) {
    const int64_t n = std::min(reader.chunk_elements(), total - first);
    TESSERA_RETURN_IF_ERROR(reader.Read(first, n, chunk.data()));
    TESSERA_RETURN_IF_ERROR(target.Deliver(box.sizes, first, n, chunk.data(),
                                           static_cast<size_t>(reader.item())));
    first += n;
  }
  return absl::OkStatus();
}

absl::StatusOr<SharedShardInfo> WorkerNode::MapShard(uint64_t id,
                                                     bool device_handle) const {
  if (std::optional<DeviceInfo> device = store_->Device(); device) {
    TESSERA_ASSIGN_OR_RETURN(ShardDesc desc, store_->Describe(id));
    SharedShardInfo info;
    info.host_id = LocalHostId();
    info.shape = ToShape(desc.box.sizes);
    info.item_bytes = static_cast<int64_t>(ItemSize(desc.dtype));
    info.device = std::move(device);
    if (device_handle) {
      TESSERA_ASSIGN_OR_RETURN(
          info.ipc_handle,
          store_->ExportDevice(id, options_.device_export_hold));
      info.hold = options_.device_export_hold;
    }
    return info;
  }
  absl::StatusOr<PinnedShard> pinned = store_->Pin(id);
  if (absl::IsUnimplemented(pinned.status())) {
    return absl::FailedPreconditionError("shards are not in host memory");
  }
  TESSERA_RETURN_IF_ERROR(pinned.status());
  std::optional<SegmentInfo> segment;
  if (options_.arena != nullptr) segment = options_.arena->Find(pinned->data);
  const bool file = !segment.has_value() && !pinned->file.empty();
  if (file) {
    segment = SegmentInfo{
        pinned->file, pinned->bytes,
        options_.arena != nullptr ? options_.arena->liveness() : std::string()};
  }
  if (!segment.has_value() && staging_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("shard ", id, " is not in shared memory"));
  }
  SharedShardInfo info;
  info.host_id = LocalHostId();
  // A small shard lives in private memory (a segment per tiny shard costs
  // a file and a mapping): a same-host reader has it staged instead.
  info.staged = !segment.has_value();
  info.file = file;
  if (segment.has_value()) info.segment = *std::move(segment);
  info.shape = ToShape(pinned->desc.box.sizes);
  info.item_bytes = static_cast<int64_t>(ItemSize(pinned->desc.dtype));
  return info;
}

absl::StatusOr<int64_t> StagedRegion::Fill(int64_t first, int64_t count,
                                           int slot) {
  if (slot != 0 && slot != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("slot ", slot, ": a staged read has slots 0 and 1"));
  }
  const int64_t total = reader_.total();
  if (first < 0 || count < 0 || first > total || count > total - first) {
    return OutOfBoundsError(absl::StrCat("elements [", first, ", ",
                                         first + count, ") of a region of ",
                                         total, " elements"));
  }
  const int64_t bytes = count * reader_.item();  // <= the region's bytes
  if (bytes > slot_bytes_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a chunk of ", bytes, " bytes does not fit a slot of ", slot_bytes_));
  }
  TESSERA_RETURN_IF_ERROR(
      reader_.Read(first, count, block_->shared->data() + slot * slot_bytes_));
  return bytes;
}

absl::StatusOr<std::unique_ptr<StagedRegion>> WorkerNode::OpenStaged(
    uint64_t id, const Box& box, int64_t slot_bytes, int64_t item_bytes) const {
  if (!store_->Device().has_value()) {
    absl::StatusOr<PinnedShard> pinned = store_->Pin(id);
    if (pinned.ok() && options_.arena != nullptr &&
        options_.arena->Find(pinned->data).has_value()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "shard ", id, " is in shared memory: map it (MapShard) instead"));
    }
  }
  if (staging_ == nullptr || LocalHostId().empty()) {
    return absl::FailedPreconditionError("this worker has no shared memory");
  }
  TESSERA_ASSIGN_OR_RETURN(RegionReader reader,
                           OpenRegionOf(id, box, item_bytes));
  if (slot_bytes <= 0 || slot_bytes > kMaxStageSlotBytes ||
      slot_bytes % reader.item() != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a staging slot of ", slot_bytes, " bytes: it must hold whole ",
        reader.item(), "-byte elements and at most ", kMaxStageSlotBytes,
        " bytes"));
  }
  TESSERA_ASSIGN_OR_RETURN(StagingPool::Lease block,
                           staging_->Acquire(2 * slot_bytes));
  return std::unique_ptr<StagedRegion>(
      new StagedRegion(std::move(reader), std::move(block), slot_bytes));
}

absl::StatusOr<int64_t> WorkerNode::Transfer(const TransferBatch& batch,
                                             const StopCondition& stop,
                                             SentBytes* sent) {
  // One bound for every read of this order (the peer channels' interceptor
  // cancels calls started under it), not one per piece or per transport.
  const absl::Time deadline =
      std::min(stop.deadline, absl::Now() + options_.pull_timeout);
  const std::function<bool()>& cancelled = stop.cancelled;
  const ScopedCallDeadline scope(deadline);
  const std::shared_ptr<void> moving = MovingBytes();
  // A piece moves bytes from one shard into another: onto itself it would
  // copy between overlapping ranges, and no reshard asks for that.
  for (size_t i = 0; i < batch.pieces.size(); ++i) {
    if (batch.pieces[i].src_shard_id == batch.pieces[i].dst_shard_id) {
      return absl::InvalidArgumentError(
          absl::StrCat("pieces[", i, "] copies shard ",
                       batch.pieces[i].src_shard_id, " onto itself"));
    }
  }
  // The order's caller going (the coordinator gave up) cancels the reads
  // in flight too, not only the pieces still to start.
  Cancellation caller_gone;
  const CancelWhen watch(cancelled, &caller_gone);
  const ScopedCancellation cancel_scope(&caller_gone);
  if (batch.relay.id != 0) return RunRelayHop(batch, deadline, cancelled, sent);
  int64_t bytes = 0;
  TransferBatch remote = TransferBatch::Between(
      batch.tensor, batch.src_version, batch.src_worker, batch.src_address,
      batch.dst_worker, batch.dst_address);
  remote.src_capability = batch.src_capability;
  for (size_t i = 0; i < batch.pieces.size(); ++i) {
    const TransferPiece& piece = batch.pieces[i];
    TESSERA_ASSIGN_OR_RETURN(ShardDesc dst,
                             store_->Describe(piece.dst_shard_id));
    const Box dst_box = piece.DstBox();
    TESSERA_RETURN_IF_ERROR(CheckWithin(
        dst_box, dst.box.sizes, absl::StrCat("pieces[", i, "] destination")));
    // Shard ids are unique across the cluster: a source held here is copied
    // in memory, never over the network.
    if (store_->Describe(piece.src_shard_id).ok()) {
      TESSERA_RETURN_IF_ERROR(
          store_->CopyLocal(piece.src_shard_id, piece.SrcBox(),
                            piece.dst_shard_id, piece.dst_offsets));
      bytes +=
          dst_box.NumElements() * static_cast<int64_t>(ItemSize(dst.dtype));
    } else {
      remote.pieces.push_back(piece);
    }
  }
  if (remote.pieces.empty()) return bytes;
  Receiver receiver(store_, deadline, cancelled);
  TESSERA_ASSIGN_OR_RETURN(int64_t moved,
                           Pull(remote, receiver, deadline, cancelled));
  if (sent != nullptr) (*sent)[batch.src_worker] += moved;
  return bytes + moved;
}

absl::StatusOr<int64_t> WorkerNode::Pull(
    const TransferBatch& remote, TransferReceiver& receiver,
    absl::Time deadline, const std::function<bool()>& cancelled) {
  absl::StatusOr<int64_t> moved = peers_->Transfer(remote, receiver);
  // A source that restarted leaves our channel to it waiting out gRPC's
  // reconnect backoff: connect afresh and pull again (each piece lands
  // whole in its place, so pulling it twice is harmless).
  if (!moved.ok() && IsTransportFailure(moved.status()) &&
      channels_ != nullptr && absl::Now() < deadline &&
      !(cancelled && cancelled())) {
    channels_->Forget(remote.src_address);
    moved = peers_->Transfer(remote, receiver);
  }
  // The order's deadline passed: whatever the transport made of it (its
  // calls time out at that deadline, or our watchdog cancelled them).
  if (!moved.ok() && !(cancelled && cancelled()) && absl::Now() >= deadline &&
      (absl::IsCancelled(moved.status()) ||
       absl::IsDeadlineExceeded(moved.status()) ||
       absl::IsUnavailable(moved.status()))) {
    return absl::DeadlineExceededError(
        absl::StrCat("pulling from the source worker at ", remote.src_address,
                     ": the transfer's deadline passed"));
  }
  if (absl::IsCancelled(moved.status()) && !(cancelled && cancelled())) {
    // Our own watchdog cancelled a read: the source stalled, or the order's
    // deadline passed.
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("pulling from the source worker at ", remote.src_address,
                       ": the transfer's deadline passed"));
    }
    return UnavailableError(absl::StrCat(
        "source worker at ", remote.src_address, " (it sent nothing for ",
        absl::FormatDuration(options_.pull_idle_timeout), ")"));
  }
  if (absl::IsUnavailable(moved.status()) ||
      absl::IsDeadlineExceeded(moved.status())) {
    return UnavailableError(absl::StrCat("source worker at ",
                                         remote.src_address, " (",
                                         moved.status().message(), ")"));
  }
  return moved;
}

namespace {

// Bytes [offset, offset + bytes) of a shard: in its pinned memory, else a
// copy (device memory).
struct ChunkBytes {
  std::shared_ptr<void> keep_alive;
  std::string copy;
  absl::string_view bytes;
};

absl::StatusOr<ChunkBytes> ReadChunk(ShardStore& store, uint64_t id,
                                     const ShardDesc& desc, int64_t offset,
                                     int64_t bytes) {
  ChunkBytes out;
  absl::StatusOr<PinnedShard> pinned = store.Pin(id);
  if (pinned.ok() && offset + bytes <= pinned->bytes) {
    out.keep_alive = std::move(pinned->keep_alive);
    out.bytes =
        absl::string_view(pinned->data + offset, static_cast<size_t>(bytes));
    return out;
  }
  if (!pinned.ok() && !absl::IsUnimplemented(pinned.status())) {
    return pinned.status();
  }
  const int64_t item = static_cast<int64_t>(ItemSize(desc.dtype));
  out.copy.resize(static_cast<size_t>(bytes));
  TESSERA_RETURN_IF_ERROR(store.ReadBox(id, WholeBox(desc.box.sizes),
                                        offset / item, bytes / item,
                                        out.copy.data()));
  out.bytes = out.copy;
  return out;
}

// Whether `base` is another version of the shard `desc` describes: the
// same tensor, box and dtype.
bool SameShard(const ShardDesc& desc, const ShardDesc& base) {
  return base.tensor.str() == desc.tensor.str() &&
         base.incarnation == desc.incarnation && base.dtype == desc.dtype &&
         base.box == desc.box;
}

// Whether `base` (non-zero) is held here as another version of shard `id`.
bool HoldsEarlierVersion(const ShardStore& store, uint64_t base, uint64_t id,
                         const ShardDesc& desc) {
  if (base == 0 || base == id) return false;
  absl::StatusOr<ShardDesc> held = store.Describe(base);
  return held.ok() && SameShard(desc, *held);
}

// After this many chunks in a row whose changes were not shorter, a hop
// pulls the rest whole without asking (a whole new content).
constexpr int kWholeChunksBeforeGivingUp = 4;

}  // namespace

absl::StatusOr<int64_t> WorkerNode::RunRelayHop(
    const TransferBatch& batch, absl::Time deadline,
    const std::function<bool()>& cancelled, SentBytes* sent) {
  const RelayHop& relay = batch.relay;
  const TransferPiece& piece = batch.pieces.front();  // one (convert.cc)
  TESSERA_ASSIGN_OR_RETURN(ShardDesc dst, store_->Describe(piece.dst_shard_id));
  // A hop copies a whole shard onto a whole shard of its shape: chunk i is
  // the same box at both ends.
  const std::vector<int64_t> zeros(dst.box.sizes.size(), 0);
  if (piece.sizes !=
          std::vector<int64_t>(dst.box.sizes.begin(), dst.box.sizes.end()) ||
      piece.src_offsets != zeros || piece.dst_offsets != zeros) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a relay hop copies a whole shard: its piece must cover shard ",
        piece.dst_shard_id, " whole"));
  }
  const int64_t item = static_cast<int64_t>(ItemSize(dst.dtype));
  const std::vector<Box> chunks = RelayChunks(
      dst.box.sizes, item, std::max(item, relay.chunk_bytes / item * item));
  const int64_t count = static_cast<int64_t>(chunks.size());
  if (relay.src_filling && relay_upstreams_ == nullptr) {
    return absl::FailedPreconditionError(
        "this worker cannot follow a relay (no way to ask its source)");
  }
  TESSERA_RETURN_IF_ERROR(relay_fills_.Begin(relay.id, piece.dst_shard_id));
  bool done = false;
  auto finish = absl::MakeCleanup(
      [&] { relay_fills_.Finish(relay.id, piece.dst_shard_id, done); });
  // The parent, then the copies further up, nearest first.
  std::vector<RelayUpstream> upstreams;
  upstreams.push_back(RelayUpstream{
      batch.src_worker, batch.src_address, piece.src_shard_id,
      batch.src_capability, relay.src_filling, relay.src_base_shard_id});
  upstreams.insert(upstreams.end(), relay.fallbacks.begin(),
                   relay.fallbacks.end());
  // An update's relay: chunks cross as their changes from the version
  // before, which this worker holds too.
  const bool changes = relay_upstreams_ != nullptr &&
                       HoldsEarlierVersion(*store_, relay.base_shard_id,
                                           piece.dst_shard_id, dst);
  int64_t patched_chunks = 0;
  int64_t patched_bytes = 0;  // what the changes took
  Receiver receiver(store_, deadline, cancelled);
  int64_t next = 0;  // the first chunk not held yet
  int64_t bytes = 0;
  absl::Status failed;
  for (const RelayUpstream& up : upstreams) {
    if (up.filling && relay_upstreams_ == nullptr) continue;
    TransferBatch one =
        TransferBatch::Between(batch.tensor, batch.src_version, up.worker,
                               up.address, batch.dst_worker, batch.dst_address);
    one.src_capability = up.capability;
    int64_t held_there = up.filling ? 0 : count;  // chunks the source holds
    int whole_in_a_row =
        changes && up.base_shard_id != 0 ? 0 : kWholeChunksBeforeGivingUp;
    const absl::Time asked_since = absl::Now();
    failed = absl::OkStatus();
    while (next < count && failed.ok()) {
      if (cancelled && cancelled()) {
        return absl::CancelledError("the caller cancelled the transfer");
      }
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError("the relay hop's deadline passed");
      }
      if (held_there <= next) {
        absl::StatusOr<RelayFillProgress> there =
            relay_upstreams_->Await(up, relay.id, next);
        if (!there.ok()) {
          failed = there.status();
        } else if (!there->started) {
          // Its order has not reached it yet; one that never does is given
          // up on like a source that stalled.
          if (absl::Now() - asked_since > options_.pull_idle_timeout) {
            failed = UnavailableError(absl::StrCat(
                "relay source worker '", up.worker, "' (it began no fill for ",
                absl::FormatDuration(options_.pull_idle_timeout), ")"));
          }
        } else {
          held_there = there->done ? count : there->chunks_done;
        }
        continue;
      }
      const Box& chunk = chunks[static_cast<size_t>(next)];
      int64_t from_up = -1;  // what `up` sent for the chunk
      if (whole_in_a_row < kWholeChunksBeforeGivingUp) {
        absl::StatusOr<int64_t> patched =
            PatchChunk(up, piece.dst_shard_id, relay.base_shard_id, dst, chunk);
        if (!patched.ok() && (absl::IsUnavailable(patched.status()) ||
                              absl::IsDeadlineExceeded(patched.status()))) {
          failed = patched.status();
          break;
        }
        // Not shorter, a failed check, or a source that cannot encode
        // (asked no more): the chunk comes whole.
        from_up = patched.ok() ? *patched : -1;
        whole_in_a_row = from_up >= 0   ? 0
                         : patched.ok() ? whole_in_a_row + 1
                                        : kWholeChunksBeforeGivingUp;
        if (from_up >= 0) {
          ++patched_chunks;
          patched_bytes += from_up;
        }
      }
      if (from_up < 0) {
        TransferPiece& part = one.pieces.emplace_back();
        part.src_shard_id = up.shard_id;
        part.dst_shard_id = piece.dst_shard_id;
        part.src_offsets = part.dst_offsets = ToShape(chunk.offsets);
        part.sizes = ToShape(chunk.sizes);
        absl::StatusOr<int64_t> moved =
            Pull(one, receiver, deadline, cancelled);
        one.pieces.clear();
        if (!moved.ok()) {
          failed = moved.status();
          break;
        }
        from_up = *moved;
      }
      bytes += chunk.NumElements() * item;
      if (sent != nullptr) (*sent)[up.worker] += from_up;
      relay_fills_.Advance(relay.id, piece.dst_shard_id, ++next);
    }
    if (next >= count) break;
    if ((cancelled && cancelled()) || absl::Now() >= deadline) return failed;
    spdlog::warn(
        "relay {} into shard {}: source worker '{}' failed at chunk {} of "
        "{} ({}); carrying on from the next one up",
        relay.id, piece.dst_shard_id, up.worker, next, count,
        std::string(failed.message()));
  }
  if (next < count) {
    return Annotate(
        failed.ok() ? UnavailableError("every relay source") : failed,
        absl::StrCat("relay hop into shard ", piece.dst_shard_id, " (", next,
                     " of ", count, " chunks held)"));
  }
  if (changes) {
    spdlog::debug(
        "relay {} into shard {}: {} of {} chunks as their changes ({} bytes)",
        relay.id, piece.dst_shard_id, patched_chunks, count, patched_bytes);
  }
  done = true;
  return bytes;
}

absl::StatusOr<ShardDelta> WorkerNode::ReadShardDelta(
    uint64_t id, uint64_t base_id, const ShardDeltaRequest& request) const {
  TESSERA_ASSIGN_OR_RETURN(ShardDesc desc, store_->Describe(id));
  TESSERA_ASSIGN_OR_RETURN(ShardDesc base, store_->Describe(base_id));
  if (id == base_id || !SameShard(desc, base)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shard ", base_id, " is not another version of shard ", id));
  }
  const int64_t item = static_cast<int64_t>(ItemSize(desc.dtype));
  const int64_t offset = request.byte_offset;
  const int64_t bytes = request.bytes;
  if (offset < 0 || bytes < 0 || bytes > kMaxRelayChunkBytes ||
      offset > desc.ByteSize() - bytes || offset % item != 0 ||
      bytes % item != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bytes [", offset, ", ", offset, " + ", bytes, ") of shard ", id,
        ": expected whole ", item, "-byte elements within its ",
        desc.ByteSize(), ", at most ", kMaxRelayChunkBytes));
  }
  TESSERA_ASSIGN_OR_RETURN(ChunkBytes next,
                           ReadChunk(*store_, id, desc, offset, bytes));
  TESSERA_ASSIGN_OR_RETURN(ChunkBytes old,
                           ReadChunk(*store_, base_id, base, offset, bytes));
  ShardDelta delta;
  std::optional<std::string> changes =
      EncodeDelta(old.bytes, next.bytes, item,
                  std::clamp<int64_t>(request.max_encoded_bytes, 0, bytes));
  if (!changes.has_value()) return delta;
  delta.encoded = true;
  delta.changes = *std::move(changes);
  delta.crc32 = ExtendCrc32(0, next.bytes);
  return delta;
}

absl::StatusOr<int64_t> WorkerNode::PatchChunk(const RelayUpstream& up,
                                               uint64_t dst, uint64_t base,
                                               const ShardDesc& desc,
                                               const Box& chunk) {
  int64_t flat = 0;  // the chunk's first element (chunks are contiguous)
  for (size_t d = 0; d < chunk.offsets.size(); ++d) {
    flat = flat * desc.box.sizes[d] + chunk.offsets[d];
  }
  const int64_t item = static_cast<int64_t>(ItemSize(desc.dtype));
  const int64_t count = chunk.NumElements();
  const int64_t offset = flat * item;
  const int64_t bytes = count * item;
  if (bytes == 0) return -1;  // an empty shard's one chunk: nothing to save
  // Changes must save something to be worth applying and checking.
  TESSERA_ASSIGN_OR_RETURN(
      ShardDelta delta, relay_upstreams_->ReadDelta(
                            up, ShardDeltaRequest{offset, bytes, bytes - 1}));
  if (!delta.encoded) return -1;
  TESSERA_ASSIGN_OR_RETURN(ChunkBytes old,
                           ReadChunk(*store_, base, desc, offset, bytes));
  // Patched in place where the shard's memory is this process's (one copy
  // of the chunk), else in a buffer written back. A chunk that fails the
  // check is pulled whole over whatever the patch left.
  absl::StatusOr<PinnedShard> pinned = store_->Pin(dst);
  const bool in_place = pinned.ok() && offset + bytes <= pinned->bytes;
  std::string buffer;
  absl::Span<char> patched;
  if (in_place) {
    patched = absl::MakeSpan(pinned->data + offset, static_cast<size_t>(bytes));
    std::memcpy(patched.data(), old.bytes.data(), old.bytes.size());
  } else {
    buffer.assign(old.bytes.data(), old.bytes.size());
    patched = absl::MakeSpan(buffer);
  }
  if (!ApplyDelta(delta.changes, item, patched).ok() ||
      ExtendCrc32(0, absl::string_view(patched.data(), patched.size())) !=
          delta.crc32) {
    return -1;
  }
  if (!in_place && bytes > 0) {
    TESSERA_RETURN_IF_ERROR(store_->WriteBox(dst, WholeBox(desc.box.sizes),
                                             flat, count, buffer.data()));
  }
  return static_cast<int64_t>(delta.changes.size());
}

absl::StatusOr<std::string> WorkerNode::ExchangeId() {
  if (options_.exchange == nullptr) return NoExchange();
  {
    absl::MutexLock lock(&exchange_mu_);
    if (unformed_ids_.size() + ids_in_making_ >= kMaxUnformedExchanges) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "this worker hosts ", unformed_ids_.size(),
          " NCCL bootstraps whose exchange failed before the communicator "
          "formed (each waits for its members until the worker restarts); "
          "it hosts no more, so exchanges that need it are pulled"));
    }
    ++ids_in_making_;  // the place is taken while NCCL starts its bootstrap
  }
  absl::StatusOr<std::string> id = options_.exchange->UniqueId();
  absl::MutexLock lock(&exchange_mu_);
  --ids_in_making_;
  if (id.ok()) unformed_ids_.insert(*id);
  return id;
}

absl::StatusOr<int64_t> WorkerNode::Exchange(const ExchangePlan& plan,
                                             StopCondition stop) {
  if (options_.exchange == nullptr) return NoExchange();
  for (const auto* pieces : {&plan.sends, &plan.recvs}) {
    const char* what = pieces == &plan.sends ? "sends" : "recvs";
    for (size_t i = 0; i < pieces->size(); ++i) {
      const ExchangePiece& piece = (*pieces)[i];
      TESSERA_ASSIGN_OR_RETURN(ShardDesc desc,
                               store_->Describe(piece.shard_id));
      TESSERA_RETURN_IF_ERROR(CheckWithin(piece.box(), desc.box.sizes,
                                          absl::StrCat(what, "[", i, "]")));
    }
  }
  stop.deadline = std::min(stop.deadline, absl::Now() + options_.pull_timeout);
  absl::StatusOr<int64_t> received = options_.exchange->Run(plan, stop);
  // Every member joined: the bootstrap this worker may host is done.
  if (received.ok()) {
    absl::MutexLock lock(&exchange_mu_);
    unformed_ids_.erase(plan.unique_id);
  }
  return received;
}

absl::Status WorkerNode::NoExchange() const {
  return absl::FailedPreconditionError(
      "this worker takes no part in NCCL exchanges (its shards are in host "
      "memory, NCCL is off, or the build has no CUDA)");
}

absl::Status WorkerNode::Free(absl::Span<const uint64_t> ids) {
  absl::Status status;
  for (uint64_t id : ids) status.Update(store_->Free(id));
  absl::MutexLock lock(&mu_);
  for (uint64_t id : ids) sealed_.erase(id);
  return status;
}

void WorkerNode::SetIdentity(std::string name, std::string key,
                             std::string cluster_id) {
  absl::MutexLock lock(&mu_);
  name_ = std::move(name);
  key_ = std::move(key);
  cluster_id_ = std::move(cluster_id);
}

void WorkerNode::Seal(uint64_t id) {
  absl::MutexLock lock(&mu_);
  sealed_.insert(id);
}

absl::Status WorkerNode::SealAll(absl::Span<const uint64_t> ids, bool persist) {
  for (uint64_t id : ids) {
    if (!store_->Describe(id).ok()) {
      return absl::NotFoundError(absl::StrCat(
          "shard ", id, " is not held by this worker: its bytes are gone"));
    }
  }
  std::string cluster;
  {
    absl::MutexLock lock(&mu_);
    for (uint64_t id : ids) sealed_.insert(id);
    cluster = cluster_id_;
  }
  // Outside the lock: a persisting store syncs and checksums the bytes.
  if (!persist) return absl::OkStatus();
  for (uint64_t id : ids) {
    TESSERA_RETURN_IF_ERROR(store_->Persist(id, cluster));
  }
  return absl::OkStatus();
}

bool WorkerNode::TakesWrites(uint64_t id) const {
  absl::StatusOr<ShardDesc> desc = store_->Describe(id);
  if (!desc.ok() || !desc->writable) return false;
  absl::MutexLock lock(&mu_);
  return !sealed_.contains(id);
}

absl::Status WorkerNode::Admit(absl::string_view token,
                               absl::string_view full_method,
                               absl::Span<const uint64_t> ids) const {
  return Admit(token, full_method, ids, nullptr);
}

absl::Status WorkerNode::Admit(absl::string_view token,
                               absl::string_view full_method,
                               absl::Span<const uint64_t> ids,
                               std::string* principal) const {
  TESSERA_ASSIGN_OR_RETURN(Right right, RequiredRight(full_method));
  std::string name;
  std::string key;
  {
    absl::MutexLock lock(&mu_);
    // The coordinator orders a worker as soon as it has registered it; the
    // reply with the key may still be on its way here. A request that
    // comes first waits for it a moment instead of failing.
    mu_.AwaitWithTimeout(
        absl::Condition(
            +[](const std::string* k) { return !k->empty(); }, &key_),
        kRegistrationReplyGrace);
    name = name_;
    key = key_;
  }
  if (key.empty()) {
    return absl::UnavailableError(
        "this worker is not registered with its coordinator yet");
  }
  TESSERA_ASSIGN_OR_RETURN(Capability capability,
                           verifier_.Verify(token, key, name, absl::Now()));
  TESSERA_RETURN_IF_ERROR(revocations_.Check(capability));
  if (!capability.Allows(right)) {
    return absl::PermissionDeniedError(
        absl::StrCat("permission denied: the capability does not allow ",
                     full_method.substr(full_method.rfind('/') + 1)));
  }
  if (principal != nullptr) *principal = capability.principal;
  if (right == kRightOrder) return absl::OkStatus();
  for (uint64_t id : ids) {
    absl::StatusOr<ShardDesc> desc = store_->Describe(id);
    // Not held: the caller learns no more than it would with a capability.
    if (!desc.ok()) return desc.status();
    // A reshard keeps unchanged shards of earlier versions (no copy), so a
    // read grant for version N covers the tensor's shards made at N or
    // before; a write grant covers only the put's own version.
    const bool version_ok = right == kRightWrite
                                ? desc->version == capability.version
                                : desc->version <= capability.version;
    // The incarnation tells this tensor from a deleted one of its name.
    if (desc->tensor.str() != capability.tensor || !version_ok ||
        desc->incarnation != capability.incarnation) {
      return absl::PermissionDeniedError(
          absl::StrCat("permission denied: shard ", id, " is not part of '",
                       capability.tensor, "' version ", capability.version));
    }
    if (right == kRightWrite) {
      // A write grant is its put's or update's alone, and dies with the
      // commit that seals the shards.
      if (desc->change == 0 || desc->change != capability.change) {
        return absl::PermissionDeniedError(
            absl::StrCat("permission denied: shard ", id,
                         " is not being written by this put or update"));
      }
      absl::MutexLock lock(&mu_);
      if (!desc->writable || sealed_.contains(id)) {
        return absl::PermissionDeniedError(
            absl::StrCat("permission denied: shard ", id,
                         " is sealed (a committed shard never changes)"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace tessera
