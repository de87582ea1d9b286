// Fuzzes the Coordinator service's request validation: the input is a
// sequence of records (fuzz_util.h), each a serialized tessera.v1 request
// handed to the real CoordinatorService handler:
//   op % 12: 0 RegisterWorker  1 Heartbeat  2 CreateTensor  3 CommitTensor
//            (a put's commit, an update's commit or abandon)  4 GetTensor
//            5 ListTensors + ListWorkers  6 DeleteTensor  7 ReshardTensor
//            8 ListWorkers  9 UpdateTensor  10 ReleaseRead
//            11 GetMoveProgress
// Each input gets a fresh Coordinator whose WorkerControl is in-process:
// three workers ("fake:7000".."fake:7002", registered as w0..w2) each a real
// WorkerNode on a HostShardStore of kCapacity bytes behind a real
// WorkerService, called directly (WorkerService::Allocate and Free, with
// orders signed by the same ClusterAuthority the coordinator grants with;
// Transfer through WorkerNode::Transfer, which copies pieces held
// by the destination in memory and reads the others from the source node
// through an in-process ShardTransport). Any other address is UNAVAILABLE.
// Invariants (trap on failure): no worker holds more than its capacity; a
// CreateTensor, ReshardTensor or UpdateTensor that fails leaves no new shard
// on any worker (all or nothing); DeleteTensor of every name used leaves no
// tensor listed (staged updates go with their tensor).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/cluster_authority.h"
#include "coordinator/coordinator.h"
#include "coordinator/coordinator_service.h"
#include "coordinator/grpc_worker_control.h"
#include "core/errors.h"
#include "core/status_macros.h"
#include "fuzz/fuzz_util.h"
#include "proto/coordinator.grpc.pb.h"
#include "rpc/convert.h"
#include "spdlog/spdlog.h"
#include "transport/shard_transport.h"
#include "worker/host_shard_store.h"
#include "worker/worker_node.h"
#include "worker/worker_service.h"

namespace tessera {
namespace {

constexpr int64_t kCapacity = 16 << 20;
constexpr int kWorkers = 3;

absl::Status Unreachable(const std::string& address) {
  return UnavailableError(absl::StrCat("worker at ", address));
}

using NodeMap = std::map<std::string, WorkerNode*>;

// The data plane between in-process workers: reads a box straight out of
// the source node, as the gRPC transport reads it from the source's server.
// Thread-safe: the nodes are, and the map is fixed before any transfer.
class InProcessTransport : public ShardTransport {
 public:
  explicit InProcessTransport(const NodeMap* nodes) : nodes_(nodes) {}
  const std::string& name() const override {
    static const std::string* name = new std::string("in-process");
    return *name;
  }
  absl::Status Read(const RemoteShard& shard, const Box& box,
                    const ReadTarget& target) override {
    auto it = nodes_->find(shard.location.address);
    if (it == nodes_->end()) return Unreachable(shard.location.address);
    return it->second->ReadRegion(shard.location.shard_id, box,
                                  shard.item_bytes, target);
  }
  absl::Status Write(const RemoteShard&, const WriteSource&) override {
    return absl::UnimplementedError("in-process workers are written directly");
  }

 private:
  const NodeMap* const nodes_;
};

// A relay hop asking its source's node directly.
class InProcessRelayUpstreams : public RelayUpstreams {
 public:
  explicit InProcessRelayUpstreams(const NodeMap* nodes) : nodes_(nodes) {}
  absl::StatusOr<RelayFillProgress> Await(const RelayUpstream& upstream,
                                          uint64_t relay,
                                          int64_t have) override {
    auto it = nodes_->find(upstream.address);
    if (it == nodes_->end()) return Unreachable(upstream.address);
    return it->second->AwaitRelayFill(relay, upstream.shard_id, have,
                                      absl::Now() + kRelayAwaitSlice);
  }
  absl::StatusOr<ShardDelta> ReadDelta(
      const RelayUpstream& upstream,
      const ShardDeltaRequest& request) override {
    auto it = nodes_->find(upstream.address);
    if (it == nodes_->end()) return Unreachable(upstream.address);
    return it->second->ReadShardDelta(upstream.shard_id, upstream.base_shard_id,
                                      request);
  }

 private:
  const NodeMap* const nodes_;
};

// The cluster's signer: the coordinator grants with it, the fake workers
// check with the keys it derives, and orders are signed by it.
const ClusterAuthority& Authority() {
  static const auto* authority =
      new ClusterAuthority(std::nullopt, "coordinator-fuzzer-secret");
  return *authority;
}

// One fake worker: a real store and node behind a real service, called
// directly; it reads from its peers in `nodes`.
struct FakeWorker {
  FakeWorker(const std::string& name, const NodeMap* nodes)
      : upstreams(nodes),
        node(&store, WorkerNodeOptions(),
             std::make_unique<InProcessTransport>(nodes)) {
    node.SetIdentity(name, Authority().WorkerKey(name));
    node.SetRelayUpstreams(&upstreams);
  }
  HostShardStore store{kCapacity};
  InProcessRelayUpstreams upstreams;
  WorkerNode node;
  WorkerService service{&node};
};

// WorkerControl over in-process workers. Thread-safe: the stores are, and
// the map is fixed after construction.
class InProcessWorkerControl : public WorkerControl {
 public:
  explicit InProcessWorkerControl(std::map<std::string, FakeWorker*> workers)
      : workers_(std::move(workers)) {}

  absl::StatusOr<BytesUsedReading> Allocate(
      const WorkerRef& worker, const AllocateBatch& batch) override {
    FakeWorker* w = Find(worker.address);
    if (w == nullptr) return Unreachable(worker.address);
    v1::AllocateShardsResponse response;
    TESSERA_RETURN_IF_ERROR(w->service.Allocate(Authority().Order(worker.name),
                                                AllocateRequestFor(batch), {},
                                                &response));
    return BytesUsedReading{response.bytes_used(), response.bytes_used_seq()};
  }

  absl::StatusOr<BytesUsedReading> Free(
      const WorkerRef& worker,
      const std::vector<uint64_t>& shard_ids) override {
    FakeWorker* w = Find(worker.address);
    if (w == nullptr) return Unreachable(worker.address);
    v1::FreeShardsRequest request;
    request.mutable_shard_ids()->Assign(shard_ids.begin(), shard_ids.end());
    v1::FreeShardsResponse response;
    TESSERA_RETURN_IF_ERROR(
        w->service.Free(Authority().Order(worker.name), request, &response));
    return BytesUsedReading{response.bytes_used(), response.bytes_used_seq()};
  }

  absl::Status Seal(const WorkerRef& worker,
                    const std::vector<uint64_t>& shard_ids,
                    bool persist) override {
    FakeWorker* w = Find(worker.address);
    if (w == nullptr) return Unreachable(worker.address);
    v1::SealShardsRequest request;
    request.mutable_shard_ids()->Assign(shard_ids.begin(), shard_ids.end());
    request.set_defer_persist(!persist);
    return w->service.Seal(Authority().Order(worker.name), request);
  }

  void Reset(const std::string&) override {}

  absl::Status Transfer(const TransferBatch& batch, SentBytes* sent) override {
    FakeWorker* dst = Find(batch.dst_address);
    if (dst == nullptr) return Unreachable(batch.dst_address);
    return dst->node.Transfer(batch, {}, sent).status();
  }

 private:
  FakeWorker* Find(const std::string& address) const {
    auto it = workers_.find(address);
    return it == workers_.end() ? nullptr : it->second;
  }

  const std::map<std::string, FakeWorker*> workers_;
};

using ShardSets = std::vector<std::vector<uint64_t>>;

ShardSets Snapshot(FakeWorker* const* fakes) {
  ShardSets out;
  for (int i = 0; i < kWorkers; ++i) {
    std::vector<uint64_t> ids = fakes[i]->store.ShardIds();
    std::sort(ids.begin(), ids.end());
    out.push_back(std::move(ids));
  }
  return out;
}

// After a failed call: every shard held now was held before (the retire
// thread may have freed some meanwhile).
void CheckNothingAdded(const ShardSets& before, FakeWorker* const* fakes,
                       const grpc::Status& s) {
  if (s.ok()) return;
  const ShardSets after = Snapshot(fakes);
  for (int i = 0; i < kWorkers; ++i) {
    FUZZ_CHECK(
        std::includes(before[i].begin(), before[i].end(), after[i].begin(),
                      after[i].end()),
        absl::StrCat("worker ", i, " kept shards after: ", s.error_message()));
  }
}

template <typename Request>
bool Parse(absl::string_view bytes, Request* request) {
  return request->ParseFromArray(bytes.data(), static_cast<int>(bytes.size()));
}

void Run(const uint8_t* data, size_t size) {
  NodeMap nodes;
  std::vector<std::unique_ptr<FakeWorker>> owned;
  FakeWorker* fakes[kWorkers];
  std::map<std::string, FakeWorker*> by_address;
  for (int i = 0; i < kWorkers; ++i) {
    owned.push_back(std::make_unique<FakeWorker>(absl::StrCat("w", i), &nodes));
    fakes[i] = owned.back().get();
    by_address[absl::StrCat("fake:", 7000 + i)] = fakes[i];
    nodes[absl::StrCat("fake:", 7000 + i)] = &fakes[i]->node;
  }
  CoordinatorOptions options;
  options.retire_grace = absl::ZeroDuration();
  auto coordinator = std::make_unique<Coordinator>(
      options, std::make_unique<InProcessWorkerControl>(by_address));
  CoordinatorService service(coordinator.get(), &Authority());
  grpc::ServerContext context;
  for (int i = 0; i < kWorkers; ++i) {
    v1::RegisterWorkerRequest request;
    request.set_name(absl::StrCat("w", i));
    request.set_rank(i);
    request.set_address(absl::StrCat("fake:", 7000 + i));
    request.set_capacity_bytes(kCapacity);
    v1::RegisterWorkerResponse response;
    grpc::Status s = service.RegisterWorker(&context, &request, &response);
    FUZZ_CHECK(s.ok(), s.error_message());
  }

  std::vector<std::string> names;  // every tensor name a request used
  uint64_t change = 0;             // the latest put's or update's change id
  fuzz::Records records(data, size);
  uint8_t op;
  absl::string_view bytes;
  while (records.Next(&op, &bytes)) {
    grpc::ServerContext ctx;
    switch (op % 12) {
      case 0: {
        v1::RegisterWorkerRequest request;
        v1::RegisterWorkerResponse response;
        if (Parse(bytes, &request))
          (void)service.RegisterWorker(&ctx, &request, &response);
        break;
      }
      case 1: {
        v1::HeartbeatRequest request;
        v1::HeartbeatResponse response;
        if (Parse(bytes, &request))
          (void)service.Heartbeat(&ctx, &request, &response);
        break;
      }
      case 2: {
        v1::CreateTensorRequest request;
        v1::CreateTensorResponse response;
        if (!Parse(bytes, &request)) break;
        names.push_back(request.name());
        const ShardSets before = Snapshot(fakes);
        CheckNothingAdded(before, fakes,
                          service.CreateTensor(&ctx, &request, &response));
        if (response.change_id() != 0) change = response.change_id();
        break;
      }
      case 3: {
        v1::CommitTensorRequest request;
        v1::CommitTensorResponse response;
        if (!Parse(bytes, &request)) break;
        // No change id: the latest put's or update's, as its client would.
        if (request.change_id() == 0) request.set_change_id(change);
        (void)service.CommitTensor(&ctx, &request, &response);
        break;
      }
      case 4: {
        v1::GetTensorRequest request;
        v1::GetTensorResponse response;
        if (Parse(bytes, &request))
          (void)service.GetTensor(&ctx, &request, &response);
        break;
      }
      case 5: {
        v1::ListTensorsRequest request;
        v1::ListTensorsResponse response;
        (void)service.ListTensors(&ctx, &request, &response);
        break;
      }
      case 6: {
        v1::DeleteTensorRequest request;
        v1::DeleteTensorResponse response;
        if (Parse(bytes, &request))
          (void)service.DeleteTensor(&ctx, &request, &response);
        break;
      }
      case 7: {
        v1::ReshardTensorRequest request;
        v1::ReshardTensorResponse response;
        if (!Parse(bytes, &request)) break;
        const ShardSets before = Snapshot(fakes);
        CheckNothingAdded(before, fakes,
                          service.ReshardTensor(&ctx, &request, &response));
        break;
      }
      case 9: {
        v1::UpdateTensorRequest request;
        v1::UpdateTensorResponse response;
        if (!Parse(bytes, &request)) break;
        names.push_back(request.name());
        const ShardSets before = Snapshot(fakes);
        CheckNothingAdded(before, fakes,
                          service.UpdateTensor(&ctx, &request, &response));
        if (response.change_id() != 0) change = response.change_id();
        break;
      }
      case 10: {
        v1::ReleaseReadRequest request;
        v1::ReleaseReadResponse response;
        if (Parse(bytes, &request))
          (void)service.ReleaseRead(&ctx, &request, &response);
        break;
      }
      case 11: {
        v1::GetMoveProgressRequest request;
        v1::GetMoveProgressResponse response;
        if (Parse(bytes, &request)) {
          (void)service.GetMoveProgress(&ctx, &request, &response);
          // No move outlives its call here: none runs between requests.
          FUZZ_CHECK(!response.running(), request.name());
        }
        break;
      }
      default: {
        v1::ListWorkersRequest request;
        v1::ListWorkersResponse response;
        (void)service.ListWorkers(&ctx, &request, &response);
        break;
      }
    }
    for (FakeWorker* f : fakes) {
      FUZZ_CHECK(f->store.BytesUsed() <= kCapacity,
                 absl::StrCat(f->store.BytesUsed()));
    }
  }

  // Deleting every tensor leaves only shards of retired versions, which the
  // coordinator frees once their (zero) grace is over.
  for (const std::string& name : names) (void)coordinator->DeleteTensor(name);
  for (const TensorSummary& t : coordinator->ListTensors()) {
    fuzz::Fail("tensor survives DeleteTensor", t.name);
  }
  coordinator.reset();
}

}  // namespace
}  // namespace tessera

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  spdlog::set_level(spdlog::level::off);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tessera::Run(data, size);
  return 0;
}
