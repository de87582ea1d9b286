// The Coordinator gRPC service: each method converts the request (validating
// it through rpc/convert and core/), calls Coordinator, and converts back.
//
// Bounded: a create's or reshard's size (shards, dims) is checked from the
// request before any of it is converted; the caller's deadline and
// cancellation reach the coordinator as a StopCondition, so long validation
// stops when the caller gives up or the server shuts down; a reply larger
// than max_reply_bytes fails with RESOURCE_EXHAUSTED instead of reaching
// clients that cannot take it.
#ifndef TESSERA_COORDINATOR_COORDINATOR_SERVICE_H_
#define TESSERA_COORDINATOR_COORDINATOR_SERVICE_H_

#include <functional>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/cluster_authority.h"
#include "coordinator/coordinator.h"
#include "proto/coordinator.grpc.pb.h"

namespace tessera {

class CoordinatorService final : public v1::Coordinator::Service {
 public:
  // `authority` (not owned; outlives the service) admits each call and
  // signs capabilities; null: an open one (no tokens, a random secret).
  explicit CoordinatorService(Coordinator* coordinator,
                              const ClusterAuthority* authority = nullptr);

  grpc::Status RegisterWorker(grpc::ServerContext*,
                              const v1::RegisterWorkerRequest* request,
                              v1::RegisterWorkerResponse* response) override;
  grpc::Status Heartbeat(grpc::ServerContext*,
                         const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse* response) override;
  grpc::Status ListWorkers(grpc::ServerContext*,
                           const v1::ListWorkersRequest* request,
                           v1::ListWorkersResponse* response) override;
  grpc::Status ListCoordinators(
      grpc::ServerContext*, const v1::ListCoordinatorsRequest* request,
      v1::ListCoordinatorsResponse* response) override;
  grpc::Status GetQuotas(grpc::ServerContext*,
                         const v1::GetQuotasRequest* request,
                         v1::GetQuotasResponse* response) override;

  // Who answers ListCoordinators: the coordinators of the etcd prefix (the
  // leader first), or this one alone. Set before serving.
  using CoordinatorLister =
      std::function<absl::StatusOr<std::vector<v1::CoordinatorInfo>>()>;
  void SetCoordinatorLister(CoordinatorLister lister) {
    coordinator_lister_ = std::move(lister);
  }
  // Asked before every call is admitted: an error (a leader whose lease
  // may have run out) is the call's answer. Set before serving.
  void SetServingGate(std::function<absl::Status()> gate) {
    serving_gate_ = std::move(gate);
  }
  grpc::Status SetWorkerState(grpc::ServerContext*,
                              const v1::SetWorkerStateRequest* request,
                              v1::SetWorkerStateResponse* response) override;
  grpc::Status RemoveWorker(grpc::ServerContext*,
                            const v1::RemoveWorkerRequest* request,
                            v1::RemoveWorkerResponse* response) override;
  grpc::Status CreateTensor(grpc::ServerContext*,
                            const v1::CreateTensorRequest* request,
                            v1::CreateTensorResponse* response) override;
  grpc::Status CommitTensor(grpc::ServerContext*,
                            const v1::CommitTensorRequest* request,
                            v1::CommitTensorResponse* response) override;
  grpc::Status KeepPending(grpc::ServerContext*,
                           const v1::KeepPendingRequest* request,
                           v1::KeepPendingResponse* response) override;
  grpc::Status GetTensor(grpc::ServerContext*,
                         const v1::GetTensorRequest* request,
                         v1::GetTensorResponse* response) override;
  grpc::Status ListTensors(grpc::ServerContext*,
                           const v1::ListTensorsRequest* request,
                           v1::ListTensorsResponse* response) override;
  grpc::Status DeleteTensor(grpc::ServerContext*,
                            const v1::DeleteTensorRequest* request,
                            v1::DeleteTensorResponse* response) override;
  grpc::Status ReshardTensor(grpc::ServerContext*,
                             const v1::ReshardTensorRequest* request,
                             v1::ReshardTensorResponse* response) override;
  grpc::Status GetMoveProgress(grpc::ServerContext*,
                               const v1::GetMoveProgressRequest* request,
                               v1::GetMoveProgressResponse* response) override;
  grpc::Status DescribeCheckpoint(
      grpc::ServerContext*, const v1::DescribeCheckpointRequest* request,
      v1::DescribeCheckpointResponse* response) override;
  grpc::Status LoadCheckpoint(grpc::ServerContext*,
                              const v1::LoadCheckpointRequest* request,
                              v1::LoadCheckpointResponse* response) override;
  grpc::Status SaveCheckpoint(grpc::ServerContext* context,
                              const v1::SaveCheckpointRequest* request,
                              v1::SaveCheckpointResponse* response) override;
  grpc::Status ReleaseRead(grpc::ServerContext* context,
                           const v1::ReleaseReadRequest* request,
                           v1::ReleaseReadResponse* response) override;
  grpc::Status UpdateTensor(grpc::ServerContext* context,
                            const v1::UpdateTensorRequest* request,
                            v1::UpdateTensorResponse* response) override;

 private:
  std::function<absl::Status()> serving_gate_;
  CoordinatorLister coordinator_lister_;
  // Hands freed memory back to the system shortly after a reply for a
  // tensor of very many shards. Deferred because gRPC frees the reply's
  // buffers only after the handler returns; trimming inside the handler
  // left megabytes of them resident.
  class MemoryReleaser {
   public:
    MemoryReleaser();
    ~MemoryReleaser();
    void AfterReplyOf(size_t shards) ABSL_LOCKS_EXCLUDED(mu_);

   private:
    void Run() ABSL_LOCKS_EXCLUDED(mu_);
    absl::Mutex mu_;
    absl::CondVar wake_;
    absl::Time due_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
    bool stop_ ABSL_GUARDED_BY(mu_) = false;
    std::thread thread_;
  };

  // Every handler starts here: core/auth.h's table decides.
  absl::StatusOr<Principal> Admit(const grpc::ServerContextBase* context,
                                  const char* method) const;
  // WaitForVersion, on the callback API: a wait holds no thread. (Named
  // apart from the generated synchronous handler, which it replaces.)
  grpc::ServerUnaryReactor* StartWaitForVersion(
      grpc::CallbackServerContext* context,
      const v1::WaitForVersionRequest* request,
      v1::WaitForVersionResponse* response);
  // Grants of `rights` on `meta` for `principal` (revoked with it).
  void AddGrants(
      const TensorMetadata& meta, uint32_t rights, const Principal& principal,
      google::protobuf::RepeatedPtrField<v1::WorkerCapability>* out) const;

  // OK, or RESOURCE_EXHAUSTED when `reply` is larger than one reply may be.
  // The limits a request's size is checked against before it is converted:
  // shards and memory (the coordinator checks the reply's bound).
  TensorLimits SizeLimits() const;
  // `what` names the reply in the error, `hint` ends it.
  absl::Status CheckReplySize(const google::protobuf::Message& reply,
                              absl::string_view what,
                              absl::string_view hint) const;

  Coordinator* const coordinator_;
  const TensorLimits limits_;
  std::unique_ptr<ClusterAuthority> open_authority_;  // when given none
  const ClusterAuthority* const authority_;
  MemoryReleaser releaser_;
};

}  // namespace tessera

#endif  // TESSERA_COORDINATOR_COORDINATOR_SERVICE_H_
