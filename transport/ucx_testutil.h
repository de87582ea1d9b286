// Test helpers for the UCX data plane: the UcxData service a contract-test
// worker serves, and a small in-process worker (WorkerNode on a
// HostShardStore in private memory, behind real gRPC on 127.0.0.1:0) that
// serves UCX or not.
#ifndef TESSERA_TRANSPORT_UCX_TESTUTIL_H_
#define TESSERA_TRANSPORT_UCX_TESTUTIL_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/capability.h"
#include "core/dtype.h"
#include "core/init_fill.h"
#include "core/testing/grants.h"
#include "gtest/gtest.h"
#include "rpc/server.h"
#include "transport/shard_transport.h"
#include "transport/shared_memory_arena.h"
#include "transport/ucx_server.h"
#include "worker/host_shard_store.h"
#include "worker/testing/served_worker.h"
#include "worker/ucx_service.h"
#include "worker/worker_node.h"
#include "worker/worker_service.h"

namespace tessera {
namespace testing {

// The UcxData service over `node`, owning its UcxServer; empty (and a test
// failure) when UCX cannot start.
inline std::vector<std::shared_ptr<grpc::Service>> UcxServices(
    WorkerNode* node, UcxServerOptions options = {}) {
  struct Served {
    std::unique_ptr<UcxServer> server;
    std::unique_ptr<UcxDataService> service;
  };
  // The TCP variants of the suites run on a fabric they trust.
  options.reach.trusted_fabric |= TrustedFabricByEnvironment();
  absl::StatusOr<std::unique_ptr<UcxServer>> started =
      StartUcxServer(node, std::move(options));
  if (!started.ok()) {
    ADD_FAILURE() << "UCX cannot start: " << started.status();
    return {};
  }
  auto served = std::make_shared<Served>();
  served->server = *std::move(started);
  served->service =
      std::make_unique<UcxDataService>(node, served->server.get());
  return {std::shared_ptr<grpc::Service>(served, served->service.get())};
}

// A worker named "w0" in this process, on 127.0.0.1:0.
class LocalWorker {
 public:
  static constexpr char kKey[] = "ucx-test-key";

  // Serves UcxData when `ucx`, with `options`; shards in `arena`'s shared
  // memory when given (else private memory).
  explicit LocalWorker(bool ucx, UcxServerOptions options = {},
                       std::shared_ptr<SharedMemoryArena> arena = nullptr)
      : store_([&] {
          HostShardStoreOptions store;
          store.arena = std::move(arena);
          store.shared_memory_min_bytes = 0;
          return store;
        }()) {
    node_ = std::make_unique<WorkerNode>(&store_, WorkerNodeOptions{});
    node_->SetIdentity("w0", kKey);
    std::vector<grpc::Service*> services;
    if (ucx) {
      options.reach.trusted_fabric |= TrustedFabricByEnvironment();
      absl::StatusOr<std::unique_ptr<UcxServer>> started =
          StartUcxServer(node_.get(), std::move(options));
      EXPECT_TRUE(started.ok()) << started.status();
      if (started.ok()) {
        ucx_ = *std::move(started);
        ucx_service_ =
            std::make_unique<UcxDataService>(node_.get(), ucx_.get());
        services.push_back(ucx_service_.get());
      }
    }
    absl::StatusOr<ServedWorker> served = ServeWorker(node_.get(), services);
    EXPECT_TRUE(served.ok()) << served.status();
    if (served.ok()) served_ = std::move(*served);
    address_ = served_.address;
  }
  ~LocalWorker() {
    served_.Shutdown();
    ucx_service_.reset();
    ucx_.reset();
  }

  // Shard `id`: a whole tensor "t" v1 of `shape`, values 0, 1, 2, ... (or
  // `init`); a put's pending shard unless not `writable`.
  absl::Status Allocate(uint64_t id, Shape shape, DType dtype,
                        bool writable = true,
                        InitSpec init = InitSpec{InitSpec::Kind::kArange}) {
    ShardDesc desc;
    desc.tensor = "t";
    desc.version = 1;
    desc.writable = writable;
    desc.change = writable ? kTestChange : 0;
    desc.dtype = dtype;
    desc.tensor_shape = shape;
    desc.box = WholeBox(shape);
    return store_.Allocate(id, desc, init);
  }

  std::string Bytes(uint64_t id) {
    absl::StatusOr<PinnedShard> pinned = store_.Pin(id);
    if (!pinned.ok()) return "";
    return std::string(pinned->data, static_cast<size_t>(pinned->bytes));
  }

  RemoteShard At(uint64_t id, const Shape& shape, DType dtype) const {
    RemoteShard shard;
    shard.location.worker = "w0";
    shard.location.address = address_;
    shard.location.shard_id = id;
    Capability grant;
    grant.worker = "w0";
    grant.tensor = "t";
    grant.version = 1;
    grant.rights = kRightRead | kRightWrite;
    grant.change = kTestChange;
    grant.expires_ms = absl::ToUnixMillis(absl::Now() + absl::Hours(1));
    shard.location.capability = MintCapability(grant, kKey);
    shard.item_bytes = static_cast<int64_t>(ItemSize(dtype));
    shard.shape = shape;
    return shard;
  }

  HostShardStore& store() { return store_; }
  UcxServer* ucx() { return ucx_.get(); }
  const std::string& address() const { return address_; }

 private:
  HostShardStore store_;
  std::unique_ptr<WorkerNode> node_;
  std::unique_ptr<UcxServer> ucx_;
  std::unique_ptr<UcxDataService> ucx_service_;
  ServedWorker served_;
  std::string address_;
};

}  // namespace testing
}  // namespace tessera

#endif  // TESSERA_TRANSPORT_UCX_TESTUTIL_H_
