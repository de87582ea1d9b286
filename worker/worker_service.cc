#include "worker/worker_service.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "core/checked_math.h"
#include "core/checkpoint_index.h"
#include "core/errors.h"
#include "core/limits.h"
#include "core/placement.h"
#include "core/status_macros.h"
#include "rpc/channel.h"
#include "rpc/convert.h"
#include "rpc/security.h"
#include "rpc/server.h"
#include "rpc/status.h"
#include "transport/grpc_transport.h"
#include "worker/checkpoint_io.h"

namespace tessera {
namespace {

// Validates one shard of an allocation request. Every shard shares
// `tensor`'s one string.
absl::StatusOr<ShardDesc> DescFromAllocate(
    const v1::AllocateShardsRequest& request, int index,
    const SharedName& tensor, DType dtype, const Shape& tensor_shape) {
  const v1::AllocateShardsRequest::Item& item = request.shards(index);
  const std::string field = absl::StrCat("shards[", index, "]");
  ShardDesc desc;
  desc.tensor = tensor;
  desc.version = request.version();
  desc.incarnation = request.incarnation();
  desc.writable = request.writable();
  desc.change = request.writable() ? request.change() : 0;
  desc.filled_by_copies = request.filled_by_copies();
  desc.dtype = dtype;
  desc.tensor_shape = tensor_shape;
  TESSERA_ASSIGN_OR_RETURN(desc.box,
                           BoxFromProto(item.offsets(), item.sizes(), field));
  for (int64_t s : desc.box.sizes) {
    if (s < 0)
      return OutOfBoundsError(absl::StrCat(field, " has a negative size"));
  }
  // Chunk sharding makes empty shards past the end; only non-empty ones must
  // fit. (IsEmpty, not NumElements: the sizes are not validated yet and may
  // overflow.)
  if (!desc.box.IsEmpty() || desc.box.rank() != tensor_shape.size()) {
    TESSERA_RETURN_IF_ERROR(CheckWithin(desc.box, tensor_shape, field));
  }
  // An empty shard's sizes still fit the tensor, so its volume cannot overflow.
  for (size_t d = 0; d < desc.box.rank(); ++d) {
    if (desc.box.sizes[d] > tensor_shape[d]) {
      return OutOfBoundsError(
          field, absl::StrCat("dim ", d, " has size ", desc.box.sizes[d],
                              " but the tensor's has ", tensor_shape[d]));
    }
  }
  TESSERA_RETURN_IF_ERROR(ByteSize(desc.box.sizes, ItemSize(dtype)).status());
  return desc;
}

// Slices over shard memory hold a reference to the shard until gRPC drops
// them.
void ReleasePin(void* pin) { delete static_cast<std::shared_ptr<void>*>(pin); }

// Elements [begin, begin + count) of `reader`'s sub-box as one serialized
// ReadRegionResponse. With `over_shard`, a slice over the shard's memory
// when the sub-box is contiguous there: it pins the shard's memory, freed
// or not, until gRPC drops it, so only a stream (which an idle limit ends)
// asks for it. Otherwise one copy into a fresh slice.
absl::Status EncodeChunk(const RegionReader& reader, int64_t begin,
                         int64_t count, bool over_shard,
                         grpc::ByteBuffer* out) {
  const int64_t item = reader.item();
  const size_t bytes = static_cast<size_t>(count * item);
  std::vector<grpc::Slice> data;
  if (bytes > 0 && over_shard && reader.contiguous_base() != nullptr) {
    data.emplace_back(
        const_cast<char*>(reader.contiguous_base()) + begin * item, bytes,
        &ReleasePin, new std::shared_ptr<void>(reader.keep_alive()));
  } else if (bytes > 0) {
    grpc::Slice slice(bytes);
    TESSERA_RETURN_IF_ERROR(reader.Read(
        begin, count,
        reinterpret_cast<char*>(const_cast<uint8_t*>(slice.begin()))));
    data.push_back(std::move(slice));
  }
  EncodeRegionChunk(begin * item, std::move(data), out);
  return absl::OkStatus();
}

absl::StatusOr<RegionReader> OpenRegion(const WorkerNode& node,
                                        const v1::ReadRegionRequest& request) {
  TESSERA_ASSIGN_OR_RETURN(
      Box box, BoxFromProto(request.offsets(), request.sizes(), "region"));
  return node.OpenRegion(request.shard_id(), box, request.chunk_bytes());
}

// Counts a stream against options().max_streams while it lives.
class StreamSlot {
 public:
  StreamSlot(std::atomic<int>* active, int max)
      : active_(active), ok_(active->fetch_add(1) < max) {}
  ~StreamSlot() { active_->fetch_sub(1); }
  // RESOURCE_EXHAUSTED when the stream is one too many.
  absl::Status status(int max) const {
    if (ok_) return absl::OkStatus();
    return absl::ResourceExhaustedError(
        absl::StrCat("this worker serves at most ", max,
                     " streams at once; try again when one ends"));
  }

 private:
  std::atomic<int>* const active_;
  const bool ok_;
};

// Cancels its call when one read or write of the stream takes longer than
// `idle` (a peer that stopped reading or sending): the blocked operation
// then fails, the handler returns, and the chunks gRPC still held (pinning
// shard memory) are dropped.
class IdleLimit {
 public:
  IdleLimit(grpc::ServerContext* context, absl::Duration idle)
      : context_(context), idle_(idle) {}
  // Runs `op` (a blocking read or write) under the limit.
  template <typename Op>
  bool Run(const Op& op) {
    grpc::ServerContext* context = context_;
    const uint64_t alarm = Watchdog::Default().Arm(
        absl::Now() + idle_, [context] { context->TryCancel(); });
    const bool ok = op();
    if (!Watchdog::Default().Disarm(alarm)) fired_ = true;
    return ok;
  }
  // Whether the limit cancelled the call.
  bool fired() const { return fired_; }
  grpc::Status Expired(const char* what) const {
    return grpc::Status(
        grpc::StatusCode::DEADLINE_EXCEEDED,
        absl::StrCat("the peer ", what, " nothing for ",
                     absl::FormatDuration(idle_), "; stream cancelled"));
  }

 private:
  grpc::ServerContext* const context_;
  const absl::Duration idle_;
  bool fired_ = false;
};

// The coordinator's rule for tensor names (core/placement.h), without
// echoing a name far too long to be one: the error goes back in the call's
// trailers.
absl::Status CheckRequestTensorName(const std::string& name) {
  constexpr size_t kShown = 64;
  if (name.size() <= 4 * kShown) return CheckTensorName(name);
  return absl::InvalidArgumentError(absl::StrCat(
      "invalid tensor name '", absl::CEscape(name.substr(0, kShown)), "...' (",
      name.size(), " characters): a tensor name is at most 255 characters"));
}

// Every handler starts here: the caller's capability, checked against
// core/capability.h's table for `method` and the shards it names.
// `principal` (when given) learns whom the capability was granted to.
absl::Status Admit(const WorkerNode& node,
                   const grpc::ServerContextBase& context, const char* method,
                   absl::Span<const uint64_t> ids = {},
                   std::string* principal = nullptr) {
  return node.Admit(PresentedCapability(context),
                    absl::StrCat("/tessera.v1.Worker/", method), ids,
                    principal);
}

// A small region read, admitted and opened (both APIs' start), held to
// its principal's rate.
absl::StatusOr<RegionReader> AdmitSmallRead(
    const WorkerNode& node, const grpc::ServerContextBase& context,
    const v1::ReadRegionRequest& request) {
  std::string principal;
  TESSERA_RETURN_IF_ERROR(Admit(node, context, "ReadSmallRegion",
                                {request.shard_id()}, &principal));
  TESSERA_ASSIGN_OR_RETURN(RegionReader reader, OpenRegion(node, request));
  node.PaceRead(principal, reader.total() * reader.item());
  return reader;
}

// The regions of a coalesced small read, admitted (one capability for
// all) and opened, and their bytes in all: at most one message.
struct SmallReads {
  std::vector<RegionReader> readers;
  int64_t bytes = 0;
};
absl::StatusOr<SmallReads> AdmitSmallReads(
    const WorkerNode& node, const grpc::ServerContextBase& context,
    const v1::ReadSmallRegionsRequest& request) {
  const int count = request.regions_size();
  if (count == 0 || count > kMaxRegionsPerSmallRead) {
    return absl::InvalidArgumentError(
        absl::StrCat("a coalesced small read names 1 to ",
                     kMaxRegionsPerSmallRead, " regions, not ", count));
  }
  std::vector<uint64_t> ids;
  ids.reserve(count);
  for (const v1::ReadRegionRequest& region : request.regions())
    ids.push_back(region.shard_id());
  // Served on the callback API only where reads are not paced (the
  // constructor), so this admits without pacing.
  TESSERA_RETURN_IF_ERROR(Admit(node, context, "ReadSmallRegions", ids));
  SmallReads reads;
  reads.readers.reserve(count);
  for (const v1::ReadRegionRequest& region : request.regions()) {
    TESSERA_ASSIGN_OR_RETURN(RegionReader reader, OpenRegion(node, region));
    // Each region is at most one message, so the sum cannot overflow.
    TESSERA_RETURN_IF_ERROR(reader.FitsOneMessage());
    reads.bytes += reader.total() * reader.item();
    if (reads.bytes > kMaxChunkBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("a coalesced small read is at most ", kMaxChunkBytes,
                       " bytes in all; its first ", reads.readers.size() + 1,
                       " regions are ", reads.bytes));
    }
    reads.readers.push_back(std::move(reader));
  }
  return reads;
}

// Where Worker method `name` sits in the service's table.
int WorkerMethod(const char* name) {
  return v1::ReadRegionRequest::descriptor()
      ->file()
      ->FindServiceByName("Worker")
      ->FindMethodByName(name)
      ->index();
}

// A small read on the callback API, counted in `active` until gRPC is done
// with it (its reply written, or the call cancelled): what bounds the reply
// buffers held for readers that do not read.
class SmallReadReactor final : public grpc::ServerUnaryReactor {
 public:
  explicit SmallReadReactor(std::atomic<int>* active) : active_(active) {}
  void OnDone() override {
    active_->fetch_sub(1);
    delete this;
  }
  // OnDone is trivial: gRPC may run it on the thread that completes the
  // call instead of waking another (as it does for its default reactor);
  // the extra wake-up cost 4 KiB reads at 16 callers about 15 % of QPS.
  bool InternalInlineable() override { return true; }

 private:
  std::atomic<int>* const active_;
};

}  // namespace

WorkerService::WorkerService(WorkerNode* node) : node_(node) {
  // Same method, but chunks go out as ByteBuffers of slices over the shard's
  // memory instead of protobuf copies. (Server streaming, as gRPC's
  // split-streaming handler runs it: one read, then the writes.)
  MarkMethodStreamed(
      WorkerMethod("ReadRegion"),
      new grpc::internal::SplitServerStreamingHandler<v1::ReadRegionRequest,
                                                      grpc::ByteBuffer>(
          [this](grpc::ServerContext* context,
                 grpc::ServerSplitStreamer<v1::ReadRegionRequest,
                                           grpc::ByteBuffer>* stream) {
            return StreamRegion(context, stream);
          }));
  // Shards in host memory: small region reads and row reads on the callback
  // API (a device store's reads wait on the GPU, and a paced worker's wait
  // out their principal's rate: neither may hold gRPC's callback threads).
  if (node_->store().Device().has_value() ||
      node_->options().principal_read_rate > 0) {
    return;
  }
  ServeSmallRead("ReadSmallRegion", &WorkerService::ReadSmall);
  ServeSmallRead("ReadSmallRegions", &WorkerService::ReadSmallBatch);
  ServeSmallRead("ReadRows", &WorkerService::ReadRowsInto);
}

template <typename Request, typename Response>
void WorkerService::ServeSmallRead(
    const char* name,
    absl::Status (WorkerService::*body)(const grpc::ServerContextBase&,
                                        const Request&, Response*) const) {
  MarkMethodCallback(
      WorkerMethod(name),
      new grpc::internal::CallbackUnaryHandler<Request, Response>(
          [this, body](grpc::CallbackServerContext* context,
                       const Request* request, Response* response) {
            return SmallRead(
                [&] { return (this->*body)(*context, *request, response); });
          }));
}

grpc::ServerUnaryReactor* WorkerService::SmallRead(
    const std::function<absl::Status()>& body) {
  auto* reactor = new SmallReadReactor(&active_small_reads_);
  const int max = node_->options().max_small_reads;
  const absl::Status status =
      active_small_reads_.fetch_add(1) < max || max == 0
          ? body()
          : absl::ResourceExhaustedError(
                absl::StrCat("this worker serves at most ", max,
                             " small reads at once; try again when one ends"));
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

grpc::Status WorkerService::AllocateShards(
    grpc::ServerContext* context, const v1::AllocateShardsRequest* request,
    v1::AllocateShardsResponse* response) {
  // A caller that went away (the coordinator died mid-create) will never
  // record these shards: the node undoes them too.
  return ToGrpcStatus(Allocate(
      PresentedCapability(*context), *request,
      [context] { return context->IsCancelled(); }, response));
}

absl::Status WorkerService::Allocate(absl::string_view capability,
                                     const v1::AllocateShardsRequest& request,
                                     const std::function<bool()>& cancelled,
                                     v1::AllocateShardsResponse* response) {
  absl::Status status = [&]() -> absl::Status {
    TESSERA_RETURN_IF_ERROR(
        node_->Admit(capability, "/tessera.v1.Worker/AllocateShards", {}));
    // The same rule the coordinator applies; the name is kept once for all
    // the shards.
    TESSERA_RETURN_IF_ERROR(CheckRequestTensorName(request.tensor()));
    const SharedName tensor(request.tensor());
    const int64_t max_shards = node_->options().max_shards_per_request;
    if (request.shards_size() > max_shards) {
      return absl::InvalidArgumentError(absl::StrCat(
          "allocation of ", request.shards_size(),
          " shards: a worker takes at most ", max_shards, " per request"));
    }
    TESSERA_ASSIGN_OR_RETURN(DType dtype, DTypeFromProto(request.dtype()));
    TESSERA_ASSIGN_OR_RETURN(
        Shape shape, ShapeFromProto(request.tensor_shape(), "tensor_shape"));
    TESSERA_ASSIGN_OR_RETURN(InitSpec init, InitFromProto(request.init()));
    TESSERA_RETURN_IF_ERROR(CheckInitValue(init, dtype));
    std::vector<ShardAllocation> shards;
    shards.reserve(request.shards_size());
    for (int i = 0; i < request.shards_size(); ++i) {
      ShardAllocation shard;
      shard.id = request.shards(i).shard_id();
      TESSERA_ASSIGN_OR_RETURN(
          shard.desc, DescFromAllocate(request, i, tensor, dtype, shape));
      shards.push_back(std::move(shard));
    }
    return node_->Allocate(shards, init, cancelled);
  }();
  const BytesUsedReading used = node_->ReadBytesUsed();
  response->set_bytes_used(used.bytes);
  response->set_bytes_used_seq(used.seq);
  return status;
}

grpc::Status WorkerService::WriteShard(
    grpc::ServerContext* context,
    grpc::ServerReader<v1::WriteShardRequest>* reader,
    v1::WriteShardResponse* response) {
  const StreamSlot slot(&active_streams_, node_->options().max_streams);
  if (absl::Status s = slot.status(node_->options().max_streams); !s.ok()) {
    return ToGrpcStatus(s);
  }
  IdleLimit limit(context, node_->options().stream_idle_timeout);
  const std::shared_ptr<void> moving = node_->MovingBytes();
  v1::WriteShardRequest chunk;
  int64_t written = 0;
  uint64_t shard_id = 0;
  bool first = true;
  std::optional<Box> part;  // a patch of a sub-box, else the whole shard
  while (limit.Run([&] { return reader->Read(&chunk); })) {
    if (first) {
      shard_id = chunk.shard_id();
      first = false;
      absl::Status admitted = Admit(*node_, *context, "WriteShard", {shard_id});
      if (!admitted.ok()) return ToGrpcStatus(admitted);
      if (chunk.box_sizes_size() > 0 || chunk.box_offsets_size() > 0) {
        absl::StatusOr<Box> box =
            BoxFromProto(chunk.box_offsets(), chunk.box_sizes(), "box");
        if (!box.ok()) return ToGrpcStatus(box.status());
        part = *std::move(box);
      }
    } else if (chunk.shard_id() != shard_id) {
      return ToGrpcStatus(absl::InvalidArgumentError(
          absl::StrCat("write stream switched from shard ", shard_id,
                       " to shard ", chunk.shard_id())));
    }
    absl::Status status =
        part.has_value()
            ? node_->WriteBox(shard_id, *part, chunk.offset(), chunk.data())
            : node_->Write(shard_id, chunk.offset(), chunk.data());
    if (!status.ok()) return ToGrpcStatus(status);
    written += static_cast<int64_t>(chunk.data().size());
  }
  if (limit.fired()) return limit.Expired("sent");
  response->set_bytes_written(written);
  // Written whole: sealed, as its version is about to be committed. (A
  // patch never seals: the rest of its shard was copied in by the
  // coordinator's order.)
  absl::StatusOr<ShardDesc> desc = node_->store().Describe(shard_id);
  if (!first && !part.has_value() && desc.ok() && written >= desc->ByteSize())
    node_->Seal(shard_id);
  return grpc::Status::OK;
}

grpc::Status WorkerService::StreamRegion(
    grpc::ServerContext* context,
    grpc::ServerSplitStreamer<v1::ReadRegionRequest, grpc::ByteBuffer>*
        stream) {
  const StreamSlot slot(&active_streams_, node_->options().max_streams);
  if (absl::Status s = slot.status(node_->options().max_streams); !s.ok()) {
    return ToGrpcStatus(s);
  }
  IdleLimit limit(context, node_->options().stream_idle_timeout);
  v1::ReadRegionRequest request;
  if (!stream->Read(&request)) {
    return ToGrpcStatus(
        absl::InvalidArgumentError("malformed or missing ReadRegionRequest"));
  }
  std::string principal;
  if (absl::Status admitted = Admit(*node_, *context, "ReadRegion",
                                    {request.shard_id()}, &principal);
      !admitted.ok()) {
    return ToGrpcStatus(admitted);
  }
  absl::StatusOr<RegionReader> reader = OpenRegion(*node_, request);
  if (!reader.ok()) return ToGrpcStatus(reader.status());
  const int64_t total = reader->total();
  const std::shared_ptr<void> moving = node_->MovingBytes();
  grpc::ByteBuffer buffer;
  for (int64_t next = 0; next < total;) {
    const int64_t count = std::min(reader->chunk_elements(), total - next);
    // Each chunk keeps to the principal's rate (no wait without one),
    // waited out before the chunk is made, so no chunk is held meanwhile.
    node_->PaceRead(principal, count * reader->item());
    absl::Status status =
        EncodeChunk(*reader, next, count, /*over_shard=*/true, &buffer);
    if (!status.ok()) return ToGrpcStatus(status);
    next += count;
    grpc::WriteOptions options;
    if (next >= total) options.set_last_message();
    // Write fails once the reader has gone (cancelled, disconnected) or
    // stopped reading for the idle limit.
    if (!limit.Run([&] { return stream->Write(buffer, options); })) {
      if (limit.fired()) return limit.Expired("read");
      return grpc::Status(grpc::StatusCode::CANCELLED, "the reader went away");
    }
    served_grpc_.fetch_add(count * reader->item(), std::memory_order_relaxed);
  }
  return grpc::Status::OK;
}

grpc::Status WorkerService::ReadSmallRegion(
    grpc::ServerContext* context, const v1::ReadRegionRequest* request,
    v1::ReadRegionResponse* response) {
  absl::StatusOr<RegionReader> reader =
      AdmitSmallRead(*node_, *context, *request);
  if (!reader.ok()) return ToGrpcStatus(reader.status());
  absl::Status read = reader->ReadAll(response->mutable_data());
  if (read.ok())
    served_grpc_.fetch_add(response->data().size(), std::memory_order_relaxed);
  return ToGrpcStatus(read);
}

absl::Status WorkerService::ReadSmall(const grpc::ServerContextBase& context,
                                      const v1::ReadRegionRequest& request,
                                      grpc::ByteBuffer* response) const {
  TESSERA_ASSIGN_OR_RETURN(RegionReader reader,
                           AdmitSmallRead(*node_, context, request));
  TESSERA_RETURN_IF_ERROR(reader.FitsOneMessage());
  // A copy, not a slice over the shard: a unary call has no idle limit, so
  // a reader that never takes its reply would pin the shard's memory.
  TESSERA_RETURN_IF_ERROR(EncodeChunk(reader, 0, reader.total(),
                                      /*over_shard=*/false, response));
  served_grpc_.fetch_add(reader.total() * reader.item(),
                         std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::Status WorkerService::ReadSmallBatch(
    const grpc::ServerContextBase& context,
    const v1::ReadSmallRegionsRequest& request,
    grpc::ByteBuffer* response) const {
  TESSERA_ASSIGN_OR_RETURN(SmallReads reads,
                           AdmitSmallReads(*node_, context, request));
  std::vector<grpc::Slice> data;
  if (reads.bytes > 0) {
    grpc::Slice slice(static_cast<size_t>(reads.bytes));
    char* dst = reinterpret_cast<char*>(const_cast<uint8_t*>(slice.begin()));
    for (const RegionReader& reader : reads.readers) {
      TESSERA_RETURN_IF_ERROR(reader.Read(0, reader.total(), dst));
      dst += reader.total() * reader.item();
    }
    data.push_back(std::move(slice));
  }
  EncodeRegionChunk(0, std::move(data), response);
  served_grpc_.fetch_add(reads.bytes, std::memory_order_relaxed);
  return absl::OkStatus();
}

grpc::Status WorkerService::ReadRows(grpc::ServerContext* context,
                                     const v1::ReadRowsRequest* request,
                                     v1::ReadRowsResponse* response) {
  return ToGrpcStatus(ReadRowsInto(*context, *request, response));
}

absl::Status WorkerService::ReadRowsInto(const grpc::ServerContextBase& context,
                                         const v1::ReadRowsRequest& request,
                                         v1::ReadRowsResponse* response) const {
  absl::Status status = [&]() -> absl::Status {
    if (request.shards_size() > node_->options().max_shards_per_request) {
      return absl::InvalidArgumentError(
          absl::StrCat("a row read names at most ",
                       node_->options().max_shards_per_request, " shards"));
    }
    std::vector<uint64_t> ids;
    std::vector<WorkerNode::ShardRows> shards(request.shards_size());
    int64_t rows = 0;
    for (int i = 0; i < request.shards_size(); ++i) {
      const v1::ReadRowsRequest::Shard& in = request.shards(i);
      rows += in.rows_size();
      if (rows > kMaxRowsPerRead) {
        return absl::InvalidArgumentError(absl::StrCat(
            "a row read names at most ", kMaxRowsPerRead, " rows"));
      }
      ids.push_back(in.shard_id());
      shards[i].id = in.shard_id();
      shards[i].rows.assign(in.rows().begin(), in.rows().end());
    }
    std::string principal;
    TESSERA_RETURN_IF_ERROR(
        Admit(*node_, context, "ReadRows", ids, &principal));
    TESSERA_RETURN_IF_ERROR(node_->ReadRows(shards, response->mutable_data()));
    node_->PaceRead(principal, static_cast<int64_t>(response->data().size()));
    return absl::OkStatus();
  }();
  if (!status.ok()) {
    response->Clear();
  } else {
    served_grpc_.fetch_add(response->data().size(), std::memory_order_relaxed);
  }
  return status;
}

grpc::Status WorkerService::MapShard(grpc::ServerContext* context,
                                     const v1::MapShardRequest* request,
                                     v1::MapShardResponse* response) {
  // Segments and device handles are named only to holders of a read
  // capability.
  if (absl::Status admitted =
          Admit(*node_, *context, "MapShard", {request->shard_id()});
      !admitted.ok()) {
    return ToGrpcStatus(admitted);
  }
  absl::StatusOr<SharedShardInfo> info =
      node_->MapShard(request->shard_id(), request->device_handle());
  if (!info.ok()) return ToGrpcStatus(info.status());
  response->set_host_id(info->host_id);
  response->set_segment(info->segment.name);
  response->set_bytes(info->segment.bytes);
  for (int64_t s : info->shape) response->add_shape(s);
  response->set_item_bytes(info->item_bytes);
  response->set_liveness(info->segment.liveness);
  response->set_staged(info->staged);
  response->set_file(info->file);
  if (info->device.has_value()) {
    // A held shard's size is known to fit.
    response->set_bytes(
        ByteSize(info->shape, static_cast<size_t>(info->item_bytes))
            .value_or(0));
    response->set_device(absl::StrCat("cuda:", info->device->index));
    response->set_device_uuid(info->device->uuid);
    response->set_ipc_handle(info->ipc_handle);
    response->set_hold_ms(absl::ToInt64Milliseconds(info->hold));
  }
  return grpc::Status::OK;
}

grpc::Status WorkerService::StageRead(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<v1::StageReadResponse, v1::StageReadRequest>*
        stream) {
  const StreamSlot slot(&active_streams_, node_->options().max_streams);
  if (absl::Status s = slot.status(node_->options().max_streams); !s.ok()) {
    return ToGrpcStatus(s);
  }
  IdleLimit limit(context, node_->options().stream_idle_timeout);
  v1::StageReadRequest request;
  if (!limit.Run([&] { return stream->Read(&request); })) {
    if (limit.fired()) return limit.Expired("sent");
    return ToGrpcStatus(
        absl::InvalidArgumentError("malformed or missing StageReadRequest"));
  }
  if (absl::Status admitted =
          Admit(*node_, *context, "StageRead", {request.shard_id()});
      !admitted.ok()) {
    return ToGrpcStatus(admitted);
  }
  absl::StatusOr<Box> box =
      BoxFromProto(request.offsets(), request.sizes(), "region");
  if (!box.ok()) return ToGrpcStatus(box.status());
  absl::StatusOr<std::unique_ptr<StagedRegion>> staged = node_->OpenStaged(
      request.shard_id(), *box, request.slot_bytes(), request.item_bytes());
  if (!staged.ok()) return ToGrpcStatus(staged.status());
  v1::StageReadResponse reply;
  reply.set_host_id(LocalHostId());
  reply.set_segment((*staged)->segment().name);
  reply.set_segment_bytes((*staged)->segment().bytes);
  reply.set_liveness((*staged)->segment().liveness);
  if (!limit.Run([&] { return stream->Write(reply); })) {
    return limit.fired() ? limit.Expired("read") : grpc::Status::OK;
  }
  // One chunk per request, in order; the client's half-close ends it.
  while (limit.Run([&] { return stream->Read(&request); })) {
    absl::StatusOr<int64_t> bytes =
        (*staged)->Fill(request.first(), request.count(), request.slot());
    if (!bytes.ok()) return ToGrpcStatus(bytes.status());
    served_shm_.fetch_add(*bytes, std::memory_order_relaxed);
    reply.Clear();
    reply.set_slot(request.slot());
    reply.set_bytes(*bytes);
    if (!limit.Run([&] { return stream->Write(reply); })) break;
  }
  if (limit.fired()) return limit.Expired("took or sent");
  return grpc::Status::OK;
}

// Public (core/capability.h IsPublicWorkerMethod): no capability asked.
grpc::Status WorkerService::DataAddress(grpc::ServerContext*,
                                        const v1::DataAddressRequest*,
                                        v1::DataAddressResponse* response) {
  absl::MutexLock lock(&mu_);
  response->set_data_address(data_address_);
  return grpc::Status::OK;
}

grpc::Status WorkerService::Transfer(grpc::ServerContext* context,
                                     const v1::TransferRequest* request,
                                     v1::TransferResponse* response) {
  // Only the coordinator orders a transfer, so its source (address and
  // capability) comes from the cluster's registry, never from a stranger.
  if (absl::Status admitted = Admit(*node_, *context, "Transfer");
      !admitted.ok()) {
    return ToGrpcStatus(admitted);
  }
  absl::StatusOr<TransferBatch> batch = TransferBatchFromProto(*request);
  if (!batch.ok()) return ToGrpcStatus(batch.status());
  // The pull ends with the order: at its deadline, or when it is cancelled.
  SentBytes sent;
  absl::StatusOr<int64_t> bytes =
      node_->Transfer(*batch, CallerStop(context), &sent);
  if (!bytes.ok()) return ToGrpcStatus(bytes.status());
  response->set_bytes(*bytes);
  for (const auto& [worker, count] : sent) {
    v1::SentBytes* entry = response->add_sent();
    entry->set_worker(worker);
    entry->set_bytes(count);
  }
  return grpc::Status::OK;
}

grpc::Status WorkerService::AwaitRelayFill(
    grpc::ServerContext* context, const v1::AwaitRelayFillRequest* request,
    v1::AwaitRelayFillResponse* response) {
  if (absl::Status admitted =
          Admit(*node_, *context, "AwaitRelayFill", {request->shard_id()});
      !admitted.ok()) {
    return ToGrpcStatus(admitted);
  }
  // Each waits on a pool thread for at most a second: bounded like streams.
  const StreamSlot slot(&active_streams_, node_->options().max_streams);
  if (absl::Status s = slot.status(node_->options().max_streams); !s.ok()) {
    return ToGrpcStatus(s);
  }
  const absl::Time until = std::min(absl::Now() + kRelayAwaitSlice,
                                    absl::FromChrono(context->deadline()));
  absl::StatusOr<RelayFillProgress> progress = node_->AwaitRelayFill(
      request->relay_id(), request->shard_id(), request->have_chunks(), until);
  if (!progress.ok()) return ToGrpcStatus(progress.status());
  response->set_started(progress->started);
  response->set_chunks_done(progress->chunks_done);
  response->set_done(progress->done);
  return grpc::Status::OK;
}

grpc::Status WorkerService::ReadShardDelta(
    grpc::ServerContext* context, const v1::ReadShardDeltaRequest* request,
    v1::ReadShardDeltaResponse* response) {
  if (absl::Status admitted =
          Admit(*node_, *context, "ReadShardDelta",
                {request->shard_id(), request->base_shard_id()});
      !admitted.ok()) {
    return ToGrpcStatus(admitted);
  }
  // Each holds up to a chunk's changes in memory: bounded like streams.
  const StreamSlot slot(&active_streams_, node_->options().max_streams);
  if (absl::Status s = slot.status(node_->options().max_streams); !s.ok()) {
    return ToGrpcStatus(s);
  }
  absl::StatusOr<ShardDelta> delta = node_->ReadShardDelta(
      request->shard_id(), request->base_shard_id(),
      ShardDeltaRequest{request->byte_offset(), request->bytes(),
                        request->max_encoded_bytes()});
  if (!delta.ok()) return ToGrpcStatus(delta.status());
  response->set_encoded(delta->encoded);
  response->set_changes(std::move(delta->changes));
  response->set_crc32(delta->crc32);
  return grpc::Status::OK;
}

grpc::Status WorkerService::NcclUniqueId(grpc::ServerContext* context,
                                         const v1::NcclUniqueIdRequest*,
                                         v1::NcclUniqueIdResponse* response) {
  if (absl::Status admitted = Admit(*node_, *context, "NcclUniqueId");
      !admitted.ok()) {
    return ToGrpcStatus(admitted);
  }
  absl::StatusOr<std::string> id = node_->ExchangeId();
  if (!id.ok()) return ToGrpcStatus(id.status());
  response->set_unique_id(*id);
  return grpc::Status::OK;
}

grpc::Status WorkerService::NcclExchange(grpc::ServerContext* context,
                                         const v1::NcclExchangeRequest* request,
                                         v1::NcclExchangeResponse* response) {
  // Only the coordinator orders an exchange: its peers come from the
  // cluster's registry.
  if (absl::Status admitted = Admit(*node_, *context, "NcclExchange");
      !admitted.ok()) {
    return ToGrpcStatus(admitted);
  }
  absl::StatusOr<ExchangePlan> plan = ExchangePlanFromProto(*request);
  if (!plan.ok()) return ToGrpcStatus(plan.status());
  absl::StatusOr<int64_t> bytes = node_->Exchange(*plan, CallerStop(context));
  if (!bytes.ok()) return ToGrpcStatus(bytes.status());
  response->set_bytes_received(*bytes);
  return grpc::Status::OK;
}

grpc::Status WorkerService::FreeShards(grpc::ServerContext* context,
                                       const v1::FreeShardsRequest* request,
                                       v1::FreeShardsResponse* response) {
  return ToGrpcStatus(Free(PresentedCapability(*context), *request, response));
}

namespace {

// An order's file runs, at most kMaxRuns of them.
absl::StatusOr<std::vector<FileRun>> RunsOf(
    const google::protobuf::RepeatedPtrField<v1::FileRun>& in,
    absl::string_view method) {
  constexpr int kMaxRuns = 1 << 20;
  if (in.size() > kMaxRuns) {
    return absl::InvalidArgumentError(
        absl::StrCat(method, ": ", in.size(),
                     " runs are more than one order carries (", kMaxRuns, ")"));
  }
  std::vector<FileRun> runs;
  runs.reserve(static_cast<size_t>(in.size()));
  for (const v1::FileRun& r : in) {
    runs.push_back({r.file_offset(), r.length(), r.shard_offset()});
  }
  return runs;
}

}  // namespace

grpc::Status WorkerService::ListCheckpoint(
    grpc::ServerContext* context, const v1::ListCheckpointRequest* request,
    v1::ListCheckpointResponse* response) {
  absl::Status status = [&]() -> absl::Status {
    TESSERA_RETURN_IF_ERROR(node_->Admit(PresentedCapability(*context),
                                         "/tessera.v1.Worker/ListCheckpoint",
                                         {}));
    TESSERA_ASSIGN_OR_RETURN(CheckpointListing listing,
                             node_->checkpoints().List(request->dir()));
    CheckpointListingToProto(listing, response->mutable_entries(),
                             response->mutable_origin());
    response->set_save_id(listing.save_id);
    response->set_saved_by(listing.saved_by);
    return absl::OkStatus();
  }();
  if (!status.ok()) response->Clear();
  return ToGrpcStatus(status);
}

grpc::Status WorkerService::LoadShard(grpc::ServerContext* context,
                                      const v1::LoadShardRequest* request,
                                      v1::LoadShardResponse* response) {
  return ToGrpcStatus([&]() -> absl::Status {
    TESSERA_RETURN_IF_ERROR(node_->Admit(PresentedCapability(*context),
                                         "/tessera.v1.Worker/LoadShard", {}));
    TESSERA_ASSIGN_OR_RETURN(const std::vector<FileRun> runs,
                             RunsOf(request->runs(), "LoadShard"));
    TESSERA_ASSIGN_OR_RETURN(
        const LoadedRuns loaded,
        node_->checkpoints().Load(
            request->dir(), request->file(), request->shard_id(), runs,
            request->piece_offset(), request->piece_bytes()));
    response->set_bytes_read(loaded.bytes_read);
    if (request->piece_bytes() > 0) response->set_part_crc32(loaded.part_crc32);
    return absl::OkStatus();
  }());
}

grpc::Status WorkerService::SaveShards(grpc::ServerContext* context,
                                       const v1::SaveShardsRequest* request,
                                       v1::SaveShardsResponse* response) {
  absl::Status status = [&]() -> absl::Status {
    TESSERA_RETURN_IF_ERROR(node_->Admit(PresentedCapability(*context),
                                         "/tessera.v1.Worker/SaveShards", {}));
    if (request->items_size() > node_->options().max_shards_per_request) {
      return absl::InvalidArgumentError(absl::StrCat(
          "SaveShards names ", request->items_size(), " shards; at most ",
          node_->options().max_shards_per_request, " per request"));
    }
    std::vector<std::pair<std::string, std::string>> metadata;
    for (const v1::FileOrigin::Pair& pair : request->metadata())
      metadata.emplace_back(pair.key(), pair.value());
    std::vector<SaveItem> items;
    for (const v1::SaveShardsRequest::Item& item : request->items()) {
      items.push_back(SaveItem{item.entry(), item.shard_id(), item.tensor(),
                               item.version(), item.scalar()});
    }
    TESSERA_ASSIGN_OR_RETURN(
        const CheckpointIo::SavedFile saved,
        node_->checkpoints().Save(request->dir(), request->file(), items,
                                  metadata, CallerStop(context)));
    for (const SavedItem& item : saved.items) {
      v1::SaveShardsResponse::Stored* out = response->add_items();
      out->set_data_offset(item.data_offset);
      out->set_bytes(item.bytes);
      out->set_crc32(item.crc32);
    }
    response->set_file_bytes(saved.file_bytes);
    return absl::OkStatus();
  }();
  if (!status.ok()) response->Clear();
  return ToGrpcStatus(status);
}

grpc::Status WorkerService::WriteCheckpointFile(
    grpc::ServerContext* context, const v1::WriteCheckpointFileRequest* request,
    v1::WriteCheckpointFileResponse*) {
  return ToGrpcStatus([&]() -> absl::Status {
    TESSERA_RETURN_IF_ERROR(
        node_->Admit(PresentedCapability(*context),
                     "/tessera.v1.Worker/WriteCheckpointFile", {}));
    return node_->checkpoints().WriteIndex(request->dir(), request->name(),
                                           request->content(), request->size());
  }());
}

grpc::Status WorkerService::WriteShardRuns(
    grpc::ServerContext* context, const v1::WriteShardRunsRequest* request,
    v1::WriteShardRunsResponse* response) {
  return ToGrpcStatus([&]() -> absl::Status {
    TESSERA_RETURN_IF_ERROR(node_->Admit(PresentedCapability(*context),
                                         "/tessera.v1.Worker/WriteShardRuns",
                                         {}));
    TESSERA_ASSIGN_OR_RETURN(const std::vector<FileRun> runs,
                             RunsOf(request->runs(), "WriteShardRuns"));
    TESSERA_ASSIGN_OR_RETURN(
        const int64_t written,
        node_->checkpoints().WriteRuns(
            request->dir(), request->file(), request->save_id(),
            request->shard_id(), request->tensor(), request->version(), runs));
    response->set_bytes_written(written);
    return absl::OkStatus();
  }());
}

grpc::Status WorkerService::PublishCheckpointFiles(
    grpc::ServerContext* context,
    const v1::PublishCheckpointFilesRequest* request,
    v1::PublishCheckpointFilesResponse*) {
  return ToGrpcStatus([&]() -> absl::Status {
    TESSERA_RETURN_IF_ERROR(
        node_->Admit(PresentedCapability(*context),
                     "/tessera.v1.Worker/PublishCheckpointFiles", {}));
    if (request->renames_size() > kMaxCheckpointFiles) {
      return CheckpointError(
          absl::StrCat("more than ", kMaxCheckpointFiles, " files to publish"));
    }
    std::vector<std::pair<std::string, std::string>> renames;
    for (const v1::PublishCheckpointFilesRequest::Rename& r :
         request->renames()) {
      renames.emplace_back(r.from(), r.to());
    }
    return node_->checkpoints().Publish(request->dir(), request->save_id(),
                                        renames);
  }());
}

grpc::Status WorkerService::RemoveCheckpointFiles(
    grpc::ServerContext* context,
    const v1::RemoveCheckpointFilesRequest* request,
    v1::RemoveCheckpointFilesResponse*) {
  return ToGrpcStatus([&]() -> absl::Status {
    TESSERA_RETURN_IF_ERROR(
        node_->Admit(PresentedCapability(*context),
                     "/tessera.v1.Worker/RemoveCheckpointFiles", {}));
    if (request->names_size() > kMaxCheckpointFiles) {
      return CheckpointError(
          absl::StrCat("more than ", kMaxCheckpointFiles, " files to remove"));
    }
    return node_->checkpoints().Remove(
        request->dir(),
        std::vector<std::string>(request->names().begin(),
                                 request->names().end()),
        request->save_id());
  }());
}

grpc::Status WorkerService::SealShards(grpc::ServerContext* context,
                                       const v1::SealShardsRequest* request,
                                       v1::SealShardsResponse*) {
  return ToGrpcStatus(Seal(PresentedCapability(*context), *request));
}

absl::Status WorkerService::Seal(absl::string_view capability,
                                 const v1::SealShardsRequest& request) {
  TESSERA_RETURN_IF_ERROR(
      node_->Admit(capability, "/tessera.v1.Worker/SealShards", {}));
  if (request.shard_ids_size() > node_->options().max_shards_per_request) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SealShards names ", request.shard_ids_size(), " shards; at most ",
        node_->options().max_shards_per_request, " per request"));
  }
  return node_->SealAll(absl::MakeConstSpan(request.shard_ids().data(),
                                            request.shard_ids().size()),
                        /*persist=*/!request.defer_persist());
}

absl::Status WorkerService::Free(absl::string_view capability,
                                 const v1::FreeShardsRequest& request,
                                 v1::FreeShardsResponse* response) {
  absl::Status status =
      node_->Admit(capability, "/tessera.v1.Worker/FreeShards", {});
  if (status.ok()) {
    status = node_->Free(absl::MakeConstSpan(request.shard_ids().data(),
                                             request.shard_ids().size()));
  }
  const BytesUsedReading used = node_->ReadBytesUsed();
  response->set_bytes_used(used.bytes);
  response->set_bytes_used_seq(used.seq);
  return status;
}

}  // namespace tessera
