// Fuzzes the Worker service's request validation and the worker's logic:
// the input is a sequence of records (fuzz_util.h), each a serialized
// tessera.v1 request handed to one of two workers, A and B, each a real
// WorkerNode (behind a real WorkerService) on a HostShardStore of kCapacity
// bytes whose large shards live in shared memory:
//   op & 7 == 0  AllocateShardsRequest -> WorkerService::Allocate (direct)
//   op & 7 == 1  ReadRegionRequest     -> ReadRegion (through gRPC, drained)
//   op & 7 == 2  TransferRequest       -> TransferBatchFromProto, then
//                WorkerNode::Transfer; src_address is replaced by A's or
//                B's real address (bit 4 of op), so local copies and peer
//                reads (shared memory and gRPC) are all exercised
//   op & 7 == 3  FreeShardsRequest     -> WorkerService::Free (direct), or
//                with bit 4 SealShardsRequest -> WorkerService::Seal
//                (direct)
//   op & 7 == 4  WriteShardRequest     -> one message of a WriteShard stream
//                (consecutive such records form one stream, through gRPC;
//                with box_* set, a patch of a sub-box)
//   op & 7 == 5  ReadRowsRequest       -> ReadRows (through gRPC), the reply
//                bounded by 4 MiB; with bit 4 ReadSmallRegionsRequest ->
//                ReadSmallRegions (through gRPC; B, whose store reports a
//                GPU, answers UNIMPLEMENTED), the reply bounded by 4 MiB and
//                empty unless OK
//   op & 7 == 6  StageReadRequest      -> a StageRead stream (through gRPC):
//                the message opens it, then asks for its own first/count/
//                slot; each reply's bytes are bounded by the slot
//   op & 7 == 7  NcclExchangeRequest   -> NcclExchange (through gRPC); B
//                takes part in exchanges through a stand-in for NCCL that
//                traps on any share the worker should have refused, A
//                takes none
// Worker B's store reports a GPU (worker/testing/device_like_store.h, host
// bytes behind it): its shards answer MapShard as device shards, are read
// staged, and A's pulls from B go through staging too.
// Bit 3 of op picks the worker (A or B). Each call carries what an honest
// coordinator would grant (an order; a read or write grant for the named
// shard's tensor version), unless bit 5 of op is set: then none, which the
// worker must refuse. The streaming handlers need a real
// ServerReader/ServerWriter, so both workers also serve on 127.0.0.1:0 and
// are called through it. Every shard is freed after each
// input, so inputs are independent. Invariants (trap on failure): a worker
// never uses more than its capacity, and its BytesUsed matches its shards.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/auth.h"
#include "core/capability.h"
#include "core/limits.h"
#include "fuzz/fuzz_util.h"
#include "grpcpp/grpcpp.h"
#include "proto/worker.grpc.pb.h"
#include "rpc/channel.h"
#include "rpc/convert.h"
#include "transport/shared_memory_arena.h"
#include "worker/host_shard_store.h"
#include "worker/testing/device_like_store.h"
#include "worker/testing/served_worker.h"
#include "worker/worker_node.h"
#include "worker/worker_service.h"

namespace tessera {
namespace {

constexpr int64_t kCapacity = 16 << 20;
constexpr char kKey[] = "worker-fuzzer-key";

// One per process (it holds the process's liveness lock), shared by both
// workers' stores.
std::shared_ptr<SharedMemoryArena> Arena() {
  static auto* arena = new std::shared_ptr<SharedMemoryArena>(
      std::make_shared<SharedMemoryArena>());
  return *arena;
}

HostShardStoreOptions StoreOptions() {
  HostShardStoreOptions options;
  options.capacity_bytes = kCapacity;
  options.arena = Arena();
  return options;
}

WorkerNodeOptions NodeOptions() {
  WorkerNodeOptions options;
  options.peers.timeout = absl::Seconds(5);
  options.arena = Arena();
  options.max_staging_bytes = 64 << 20;
  return options;
}

std::unique_ptr<HostShardStore> MakeStore(bool device) {
  if (device) return std::make_unique<DeviceLikeStore>(StoreOptions());
  return std::make_unique<HostShardStore>(StoreOptions());
}

// Stands in for NCCL (which needs GPUs) on worker B: traps when the worker
// hands it a share it should have refused.
class CheckingExchange : public DeviceExchange {
 public:
  explicit CheckingExchange(ShardStore* store) : store_(store) {}
  absl::StatusOr<std::string> UniqueId() override {
    return std::string(kExchangeIdBytes, 'f');
  }
  absl::StatusOr<int64_t> Run(const ExchangePlan& plan,
                              const StopCondition&) override {
    FUZZ_CHECK(plan.unique_id.size() == kExchangeIdBytes && plan.ranks >= 2 &&
                   plan.rank >= 0 && plan.rank < plan.ranks,
               absl::StrCat(plan.rank, " of ", plan.ranks));
    for (const auto* pieces : {&plan.sends, &plan.recvs}) {
      for (const ExchangePiece& piece : *pieces) {
        FUZZ_CHECK(piece.peer >= 0 && piece.peer < plan.ranks &&
                       piece.peer != plan.rank,
                   absl::StrCat("peer ", piece.peer));
        absl::StatusOr<ShardDesc> desc = store_->Describe(piece.shard_id);
        FUZZ_CHECK(desc.ok(), desc.status().ToString());
        const absl::Status within =
            CheckWithin(piece.box(), desc->box.sizes, "piece");
        FUZZ_CHECK(within.ok(), within.ToString());
      }
    }
    return 0;
  }

 private:
  ShardStore* const store_;
};

WorkerNodeOptions NodeOptions(DeviceExchange* exchange) {
  WorkerNodeOptions options = NodeOptions();
  options.exchange = exchange;
  return options;
}

struct Worker {
  std::string name;
  std::unique_ptr<HostShardStore> owned_store;
  HostShardStore& store;
  std::unique_ptr<CheckingExchange> exchange;  // B's only
  WorkerNode node;
  ServedWorker served;  // its WorkerService, on a port of 127.0.0.1
  WorkerService* service = nullptr;
  std::string address;
  std::unique_ptr<v1::Worker::Stub> stub;  // to this worker

  Worker(std::string worker_name, bool device)
      : name(std::move(worker_name)),
        owned_store(MakeStore(device)),
        store(*owned_store),
        exchange(device ? std::make_unique<CheckingExchange>(&store) : nullptr),
        node(&store, NodeOptions(exchange.get())) {
    node.SetIdentity(name, kKey);
    absl::StatusOr<ServedWorker> started = ServeWorker(&node);
    if (!started.ok()) fuzz::Fail("cannot start the worker server");
    served = *std::move(started);
    service = served.service.get();
    address = served.address;
    // Over TCP, as a client reaches it: gRPC's in-process transport keeps
    // both ends of a client stream alive when the server ends it early (a
    // slow leak that is not the worker's), which TCP does not.
    stub = v1::Worker::NewStub(MakeChannel(address));
  }

  void CheckAccounting() {
    int64_t sum = 0;
    for (uint64_t id : store.ShardIds()) {
      absl::StatusOr<ShardDesc> d = store.Describe(id);
      FUZZ_CHECK(d.ok(), d.status().ToString());
      sum += d->ByteSize();
    }
    FUZZ_CHECK(sum == store.BytesUsed() && sum <= kCapacity,
               absl::StrCat(sum, " vs ", store.BytesUsed()));
  }

  void FreeAll() {
    for (uint64_t id : store.ShardIds()) (void)store.Free(id);
    FUZZ_CHECK(store.BytesUsed() == 0, absl::StrCat(store.BytesUsed()));
  }
};

Worker* workers[2];

// What the coordinator would sign for `w`: `rights` on the tensor version
// shard `id` belongs to (any, for an order or a shard not held).
std::string Grant(const Worker& w, uint64_t id, uint32_t rights) {
  Capability grant;
  grant.worker = w.name;
  grant.rights = rights;
  grant.expires_ms = absl::ToUnixMillis(absl::Now() + absl::Hours(1));
  if (absl::StatusOr<ShardDesc> desc = w.store.Describe(id); desc.ok()) {
    grant.tensor = desc->tensor;
    grant.version = desc->version;
    grant.incarnation = desc->incarnation;
    grant.change = desc->change;
  }
  return MintCapability(grant, kKey);
}

// A call's context, bounded, carrying `capability` (none: empty).
std::unique_ptr<grpc::ClientContext> Context(
    const std::string& capability = "") {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::seconds(5));
  if (!capability.empty()) {
    context->AddMetadata(kCapabilityHeader, capability);
  }
  return context;
}

// Parses one record as `request`; false when it is not one.
template <typename Request>
bool Parse(absl::string_view bytes, Request* request) {
  return request->ParseFromArray(bytes.data(), static_cast<int>(bytes.size()));
}

// Whatever the input, a handler answers with a status that says what was
// wrong with it: never UNKNOWN (an escaped exception) or INTERNAL.
void CheckAnswered(const grpc::Status& s) {
  FUZZ_CHECK(s.error_code() != grpc::StatusCode::UNKNOWN &&
                 s.error_code() != grpc::StatusCode::INTERNAL,
             s.error_message());
}

void FlushWrites(Worker* w, std::vector<v1::WriteShardRequest>* pending,
                 bool granted) {
  if (pending->empty()) return;
  auto context = Context(
      granted ? Grant(*w, pending->front().shard_id(), kRightWrite) : "");
  v1::WriteShardResponse response;
  auto writer = w->stub->WriteShard(context.get(), &response);
  for (const v1::WriteShardRequest& m : *pending) {
    if (!writer->Write(m)) break;
  }
  writer->WritesDone();
  (void)writer->Finish();
  pending->clear();
}

void Run(const uint8_t* data, size_t size) {
  fuzz::Records records(data, size);
  uint8_t op;
  absl::string_view bytes;
  std::vector<v1::WriteShardRequest> pending;
  Worker* pending_worker = nullptr;
  bool pending_granted = true;
  while (records.Next(&op, &bytes)) {
    Worker* w = workers[(op >> 3) & 1];
    const int kind = op & 7;
    const bool granted = (op & 32) == 0;
    const std::string order = granted ? Grant(*w, 0, kRightOrder) : "";
    if (kind != 4 || w != pending_worker) {
      if (pending_worker != nullptr)
        FlushWrites(pending_worker, &pending, pending_granted);
      pending_worker = nullptr;
    }
    switch (kind) {
      case 0: {
        v1::AllocateShardsRequest request;
        if (!Parse(bytes, &request)) break;
        v1::AllocateShardsResponse response;
        (void)w->service->Allocate(order, request, {}, &response);
        break;
      }
      case 1: {
        v1::ReadRegionRequest request;
        if (!Parse(bytes, &request)) break;
        auto context =
            Context(granted ? Grant(*w, request.shard_id(), kRightRead) : "");
        auto reader = w->stub->ReadRegion(context.get(), request);
        v1::ReadRegionResponse chunk;
        int64_t total = 0;
        while (reader->Read(&chunk))
          total += static_cast<int64_t>(chunk.data().size());
        grpc::Status s = reader->Finish();
        FUZZ_CHECK(total <= kCapacity, absl::StrCat(total));
        CheckAnswered(s);
        break;
      }
      case 2: {
        v1::TransferRequest request;
        if (!Parse(bytes, &request)) break;
        const Worker& src = *workers[(op >> 4) & 1];
        request.set_src_address(src.address);
        absl::StatusOr<TransferBatch> batch = TransferBatchFromProto(request);
        if (!batch.ok()) break;
        if (granted && !batch->pieces.empty()) {
          batch->src_capability =
              Grant(src, batch->pieces[0].src_shard_id, kRightRead);
        }
        absl::StatusOr<int64_t> moved = w->node.Transfer(*batch);
        FUZZ_CHECK(moved.ok() ||
                       (moved.status().code() != absl::StatusCode::kUnknown &&
                        moved.status().code() != absl::StatusCode::kInternal),
                   moved.status().ToString());
        break;
      }
      case 3: {
        if ((op & 16) != 0) {
          v1::SealShardsRequest request;
          if (!Parse(bytes, &request)) break;
          (void)w->service->Seal(order, request);
          break;
        }
        v1::FreeShardsRequest request;
        if (!Parse(bytes, &request)) break;
        v1::FreeShardsResponse response;
        (void)w->service->Free(order, request, &response);
        break;
      }
      case 4: {
        v1::WriteShardRequest request;
        if (!Parse(bytes, &request)) break;
        pending.push_back(std::move(request));
        pending_worker = w;
        pending_granted = granted;
        break;
      }
      case 5: {
        if ((op & 16) != 0) {
          v1::ReadSmallRegionsRequest request;
          if (!Parse(bytes, &request)) break;
          auto context = Context();
          if (granted && request.regions_size() > 0) {
            context->AddMetadata(
                kCapabilityHeader,
                Grant(*w, request.regions(0).shard_id(), kRightRead));
          }
          v1::ReadRegionResponse response;
          grpc::Status s =
              w->stub->ReadSmallRegions(context.get(), request, &response);
          FUZZ_CHECK(
              static_cast<int64_t>(response.data().size()) <= kMaxChunkBytes,
              absl::StrCat(response.data().size()));
          FUZZ_CHECK(s.ok() || response.data().empty(), s.error_message());
          CheckAnswered(s);
          break;
        }
        v1::ReadRowsRequest request;
        if (!Parse(bytes, &request)) break;
        auto context = Context();
        if (granted && request.shards_size() > 0) {
          context->AddMetadata(
              kCapabilityHeader,
              Grant(*w, request.shards(0).shard_id(), kRightRead));
        }
        v1::ReadRowsResponse response;
        grpc::Status s = w->stub->ReadRows(context.get(), request, &response);
        FUZZ_CHECK(
            static_cast<int64_t>(response.data().size()) <= kMaxChunkBytes,
            absl::StrCat(response.data().size()));
        CheckAnswered(s);
        break;
      }
      case 6: {
        v1::StageReadRequest request;
        if (!Parse(bytes, &request)) break;
        auto context =
            Context(granted ? Grant(*w, request.shard_id(), kRightRead) : "");
        auto stream = w->stub->StageRead(context.get());
        v1::StageReadResponse reply;
        if (stream->Write(request) && stream->Read(&reply)) {
          FUZZ_CHECK(reply.segment_bytes() >= 2 * request.slot_bytes(),
                     absl::StrCat(reply.segment_bytes()));
          if (stream->Write(request) && stream->Read(&reply)) {
            FUZZ_CHECK(reply.bytes() >= 0 &&
                           reply.bytes() <= request.slot_bytes() &&
                           reply.slot() == request.slot(),
                       absl::StrCat(reply.bytes(), " in slot ", reply.slot()));
          }
        }
        stream->WritesDone();
        grpc::Status s = stream->Finish();
        CheckAnswered(s);
        break;
      }
      case 7: {
        v1::NcclExchangeRequest request;
        if (!Parse(bytes, &request)) break;
        auto context = Context(granted ? order : "");
        v1::NcclExchangeResponse response;
        grpc::Status s =
            w->stub->NcclExchange(context.get(), request, &response);
        CheckAnswered(s);
        FUZZ_CHECK(granted || !s.ok(), "an exchange without an order");
        break;
      }
      default:
        break;
    }
    workers[0]->CheckAccounting();
    workers[1]->CheckAccounting();
  }
  if (pending_worker != nullptr)
    FlushWrites(pending_worker, &pending, pending_granted);
  workers[0]->FreeAll();
  workers[1]->FreeAll();
}

}  // namespace
}  // namespace tessera

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Live for the whole process.
  tessera::workers[0] = new tessera::Worker("A", /*device=*/false);
  tessera::workers[1] = new tessera::Worker("B", /*device=*/true);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tessera::Run(data, size);
  return 0;
}
