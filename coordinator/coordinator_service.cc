#include "coordinator/coordinator_service.h"

#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "core/status_macros.h"
#include "rpc/convert.h"
#include "rpc/server.h"
#include "rpc/status.h"

namespace tessera {
namespace {

ShardEncoding EncodingFor(bool packed_reply) {
  return packed_reply ? ShardEncoding::kPacked : ShardEncoding::kPerShard;
}

// How many shards a spec gives and the most dims one of its boxes has, read
// from the request without converting it.
struct SpecSize {
  int64_t shards = 0;
  int64_t dims = 0;
};

SpecSize SizeOf(const v1::ShardingSpec& spec) {
  SpecSize out;
  if (spec.has_chunk()) {
    out.shards = spec.chunk().placements_size();
  } else if (spec.has_enumerable() && spec.enumerable().has_packed()) {
    const v1::ShardingSpec::PackedShards& packed = spec.enumerable().packed();
    out.shards = packed.placement_of_size();
    if (out.shards > 0) {
      out.dims =
          std::max(packed.offsets_size(), packed.sizes_size()) / out.shards;
    }
  } else if (spec.has_enumerable()) {
    out.shards = spec.enumerable().shards_size();
    for (const v1::ShardMetadata& shard : spec.enumerable().shards()) {
      out.dims = std::max<int64_t>(
          out.dims, std::max(shard.offsets_size(), shard.sizes_size()));
    }
  }
  // More dims than any tensor has are refused by the conversion, cheaply.
  out.dims = std::min<int64_t>(out.dims, kMaxRank);
  return out;
}

}  // namespace

CoordinatorService::CoordinatorService(Coordinator* coordinator,
                                       const ClusterAuthority* authority)
    : coordinator_(coordinator),
      limits_(LimitsOf(coordinator->options())),
      open_authority_(authority != nullptr
                          ? nullptr
                          : std::make_unique<ClusterAuthority>(
                                std::nullopt, RandomBytes(32))),
      authority_(authority != nullptr ? authority : open_authority_.get()) {
  MarkMethodCallback(
      v1::WaitForVersionRequest::descriptor()
          ->file()
          ->FindServiceByName("Coordinator")
          ->FindMethodByName("WaitForVersion")
          ->index(),
      new grpc::internal::CallbackUnaryHandler<v1::WaitForVersionRequest,
                                               v1::WaitForVersionResponse>(
          [this](grpc::CallbackServerContext* context,
                 const v1::WaitForVersionRequest* request,
                 v1::WaitForVersionResponse* response) {
            return StartWaitForVersion(context, request, response);
          }));
}

namespace {

// One wait's call: finished exactly once, by the wait's end or by the
// caller's cancellation, and never touched after gRPC is done with it.
class WaitReactor final : public grpc::ServerUnaryReactor {
 public:
  // What the wait's end reaches: the call while it lasts.
  struct Target {
    absl::Mutex mu;
    WaitReactor* reactor ABSL_GUARDED_BY(mu) = nullptr;
    v1::WaitForVersionResponse* response ABSL_GUARDED_BY(mu) = nullptr;
    bool finished ABSL_GUARDED_BY(mu) = false;
    // The wait, to drop when the caller goes. Kept here, not in the
    // reactor, which gRPC may delete as soon as the call ends.
    VersionWaiters::Handle handle ABSL_GUARDED_BY(mu);
  };

  explicit WaitReactor(v1::WaitForVersionResponse* response)
      : target_(std::make_shared<Target>()) {
    absl::MutexLock lock(&target_->mu);
    target_->reactor = this;
    target_->response = response;
  }
  const std::shared_ptr<Target>& target() const { return target_; }
  // Keeps `handle` for a cancellation; drops the wait at once when the
  // call already ended (cancelled, or answered, meanwhile).
  static void Keep(const std::shared_ptr<Target>& target,
                   VersionWaiters::Handle handle) {
    {
      absl::MutexLock lock(&target->mu);
      if (!target->finished) {
        target->handle = std::move(handle);
        return;
      }
    }
    handle.Cancel();
  }

  // Ends the call with `result` unless it already ended.
  static void End(const std::shared_ptr<Target>& target,
                  const absl::StatusOr<uint64_t>& result) {
    WaitReactor* reactor = nullptr;
    {
      absl::MutexLock lock(&target->mu);
      if (target->finished || target->reactor == nullptr) return;
      target->finished = true;
      reactor = target->reactor;
      if (result.ok()) target->response->set_version(*result);
    }
    reactor->Finish(ToGrpcStatus(result.status()));
  }

  void OnCancel() override {
    VersionWaiters::Handle handle;
    {
      absl::MutexLock lock(&target_->mu);
      handle = std::move(target_->handle);
    }
    handle.Cancel();
    End(target_, absl::CancelledError("the caller went away"));
  }
  void OnDone() override {
    {
      absl::MutexLock lock(&target_->mu);
      target_->reactor = nullptr;
    }
    delete this;
  }

 private:
  const std::shared_ptr<Target> target_;
};

// The longest one wait may last.
constexpr absl::Duration kMaxWait = absl::Hours(24);

}  // namespace

grpc::ServerUnaryReactor* CoordinatorService::StartWaitForVersion(
    grpc::CallbackServerContext* context,
    const v1::WaitForVersionRequest* request,
    v1::WaitForVersionResponse* response) {
  auto* reactor = new WaitReactor(response);
  const std::shared_ptr<WaitReactor::Target> target = reactor->target();
  absl::Status refused = [&]() -> absl::Status {
    TESSERA_RETURN_IF_ERROR(Admit(context, "WaitForVersion").status());
    TESSERA_RETURN_IF_ERROR(CheckTensorName(request->name()));
    if (request->timeout_ms() <= 0 ||
        request->timeout_ms() > absl::ToInt64Milliseconds(kMaxWait)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a wait's timeout is 1 ms to ", absl::FormatDuration(kMaxWait),
          ", not ", request->timeout_ms(), " ms"));
    }
    uint64_t least = request->min_version();
    if (least == 0) {
      TESSERA_ASSIGN_OR_RETURN(const uint64_t now,
                               coordinator_->CommittedVersion(request->name()));
      least = now + 1;
    }
    TESSERA_ASSIGN_OR_RETURN(
        VersionWaiters::Handle handle,
        coordinator_->waiters().Wait(
            request->name(), least,
            absl::Now() + absl::Milliseconds(request->timeout_ms()),
            [target](absl::StatusOr<uint64_t> result) {
              WaitReactor::End(target, result);
            }));
    WaitReactor::Keep(target, std::move(handle));
    return absl::OkStatus();
  }();
  if (!refused.ok()) WaitReactor::End(target, refused);
  return reactor;
}

TensorLimits CoordinatorService::SizeLimits() const {
  // The reply's bound needs the workers and the dims the coordinator knows:
  // it checks that one itself.
  TensorLimits out = limits_;
  out.max_reply_bytes = std::numeric_limits<int64_t>::max();
  return out;
}

absl::Status CoordinatorService::CheckReplySize(
    const google::protobuf::Message& reply, absl::string_view what,
    absl::string_view hint) const {
  const size_t bytes = reply.ByteSizeLong();
  if (static_cast<int64_t>(bytes) <= limits_.max_reply_bytes) {
    return absl::OkStatus();
  }
  return absl::ResourceExhaustedError(
      absl::StrCat(what, " takes ", bytes,
                   " bytes, more than one reply may "
                   "carry (",
                   limits_.max_reply_bytes, " bytes)", hint));
}

absl::StatusOr<Principal> CoordinatorService::Admit(
    const grpc::ServerContextBase* context, const char* method) const {
  if (serving_gate_) TESSERA_RETURN_IF_ERROR(serving_gate_());
  return authority_->Admit(*context,
                           absl::StrCat("/tessera.v1.Coordinator/", method));
}

void CoordinatorService::AddGrants(
    const TensorMetadata& meta, uint32_t rights, const Principal& principal,
    google::protobuf::RepeatedPtrField<v1::WorkerCapability>* out) const {
  for (const auto& [worker, token] :
       authority_->GrantTensor(meta, rights, principal.name)) {
    v1::WorkerCapability* grant = out->Add();
    grant->set_worker(worker);
    grant->set_token(token);
  }
}

CoordinatorService::MemoryReleaser::MemoryReleaser()
    : thread_([this] { Run(); }) {}

CoordinatorService::MemoryReleaser::~MemoryReleaser() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    wake_.Signal();
  }
  thread_.join();
}

void CoordinatorService::MemoryReleaser::AfterReplyOf(size_t shards) {
  if (shards < 10000) return;
  // Debounced: one trim 0.2 s after the last such reply.
  absl::MutexLock lock(&mu_);
  due_ = absl::Now() + absl::Milliseconds(200);
  wake_.Signal();
}

void CoordinatorService::MemoryReleaser::Run() {
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    if (absl::Now() >= due_) {
      due_ = absl::InfiniteFuture();
      mu_.Unlock();
      malloc_trim(0);
      mu_.Lock();
      continue;
    }
    wake_.WaitWithDeadline(&mu_, due_);
  }
}

grpc::Status CoordinatorService::RegisterWorker(
    grpc::ServerContext* context, const v1::RegisterWorkerRequest* request,
    v1::RegisterWorkerResponse* response) {
  absl::StatusOr<Principal> principal = Admit(context, "RegisterWorker");
  if (!principal.ok()) return ToGrpcStatus(principal.status());
  // A worker name is bound to its credential: nobody else may claim it.
  if (absl::Status bound =
          authority_->CheckWorkerName(*principal, request->name());
      !bound.ok()) {
    return ToGrpcStatus(bound);
  }
  WorkerRegistration registration;
  registration.worker.name = request->name();
  if (request->has_rank()) registration.rank = request->rank();
  registration.worker.address = request->address();
  absl::StatusOr<Device> device = DeviceFromProto(request->device());
  if (!device.ok()) return ToGrpcStatus(device.status());
  registration.worker.device = *device;
  registration.worker.capacity_bytes = request->capacity_bytes();
  registration.worker.gpu_uuid = request->gpu_uuid();
  registration.worker.zone = request->zone();
  registration.worker.data_address = request->data_address();
  if (request->labels_size() > static_cast<int>(kMaxLabels)) {
    return ToGrpcStatus(absl::InvalidArgumentError(absl::StrCat(
        request->labels_size(), " labels (at most ", kMaxLabels, ")")));
  }
  registration.worker.labels =
      Labels(request->labels().begin(), request->labels().end());
  registration.worker.bytes_used = request->bytes_used();
  registration.worker.bytes_used_seq = request->bytes_used_seq();
  std::vector<uint64_t> held(request->held_shard_ids().begin(),
                             request->held_shard_ids().end());
  if (request->held_shard_identities_size() != 0 &&
      request->held_shard_identities_size() != request->held_shard_ids_size()) {
    return ToGrpcStatus(absl::InvalidArgumentError(absl::StrCat(
        "held_shard_identities has ", request->held_shard_identities_size(),
        " entries for ", request->held_shard_ids_size(), " held shards")));
  }
  registration.held_identities.assign(request->held_shard_identities().begin(),
                                      request->held_shard_identities().end());
  absl::StatusOr<RegisterResult> result =
      coordinator_->RegisterWorker(registration, held);
  if (!result.ok()) return ToGrpcStatus(result.status());
  response->set_rank(result->rank);
  response->set_heartbeat_interval_ms(
      absl::ToInt64Milliseconds(coordinator_->options().heartbeat_interval));
  response->mutable_free_shard_ids()->Assign(result->free_shard_ids.begin(),
                                             result->free_shard_ids.end());
  response->mutable_set_aside_shard_ids()->Assign(
      result->set_aside_shard_ids.begin(), result->set_aside_shard_ids.end());
  response->set_capability_key(authority_->WorkerKey(request->name()));
  response->set_cluster_id(result->cluster_id);
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::Heartbeat(grpc::ServerContext* context,
                                           const v1::HeartbeatRequest* request,
                                           v1::HeartbeatResponse* response) {
  absl::StatusOr<Principal> principal = Admit(context, "Heartbeat");
  if (!principal.ok()) return ToGrpcStatus(principal.status());
  if (absl::Status bound =
          authority_->CheckWorkerName(*principal, request->name());
      !bound.ok()) {
    return ToGrpcStatus(bound);
  }
  HeldReport held;
  held.count = request->held_count();
  held.xor_ids = request->held_xor();
  if (request->held_list()) {
    held.ids.emplace(request->held_shard_ids().begin(),
                     request->held_shard_ids().end());
  }
  held.quarantined_shards = request->quarantined_shards();
  held.quarantined_bytes = request->quarantined_bytes();
  held.device_total_bytes = request->device_total_bytes();
  held.device_free_bytes = request->device_free_bytes();
  const HeartbeatResult result = coordinator_->Heartbeat(
      request->name(),
      BytesUsedReading{request->bytes_used(), request->bytes_used_seq()}, held);
  response->set_reregister(!result.known);
  response->set_send_held_shards(result.send_held);
  response->mutable_free_shard_ids()->Assign(result.free_shard_ids.begin(),
                                             result.free_shard_ids.end());
  response->set_cluster_id(coordinator_->cluster_id());
  for (const auto& [name, before_ms] : authority_->Revoked()) {
    v1::Revocation* revoked = response->add_revoked();
    revoked->set_principal(name);
    revoked->set_before_ms(before_ms);
  }
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::SetWorkerState(
    grpc::ServerContext* context, const v1::SetWorkerStateRequest* request,
    v1::SetWorkerStateResponse*) {
  if (absl::StatusOr<Principal> p = Admit(context, "SetWorkerState"); !p.ok()) {
    return ToGrpcStatus(p.status());
  }
  if (absl::Status name = CheckWorkerName(request->name()); !name.ok()) {
    return ToGrpcStatus(name);
  }
  const std::optional<WorkerState> state = ParseWorkerState(request->state());
  if (!state.has_value() || *state == WorkerState::kDead) {
    return ToGrpcStatus(absl::InvalidArgumentError(
        "a worker's state can be set to ready, cordoned or draining"));
  }
  return ToGrpcStatus(coordinator_->SetWorkerState(request->name(), *state));
}

grpc::Status CoordinatorService::RemoveWorker(
    grpc::ServerContext* context, const v1::RemoveWorkerRequest* request,
    v1::RemoveWorkerResponse*) {
  if (absl::StatusOr<Principal> p = Admit(context, "RemoveWorker"); !p.ok()) {
    return ToGrpcStatus(p.status());
  }
  if (absl::Status name = CheckWorkerName(request->name()); !name.ok()) {
    return ToGrpcStatus(name);
  }
  return ToGrpcStatus(coordinator_->RemoveWorker(request->name()));
}

grpc::Status CoordinatorService::ListCoordinators(
    grpc::ServerContext* context, const v1::ListCoordinatorsRequest*,
    v1::ListCoordinatorsResponse* response) {
  if (absl::StatusOr<Principal> p = Admit(context, "ListCoordinators");
      !p.ok()) {
    return ToGrpcStatus(p.status());
  }
  if (!coordinator_lister_) {
    return ToGrpcStatus(absl::UnimplementedError("no coordinator list"));
  }
  absl::StatusOr<std::vector<v1::CoordinatorInfo>> listed =
      coordinator_lister_();
  if (!listed.ok()) return ToGrpcStatus(listed.status());
  for (v1::CoordinatorInfo& c : *listed) {
    *response->add_coordinators() = std::move(c);
  }
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::GetQuotas(grpc::ServerContext* context,
                                           const v1::GetQuotasRequest*,
                                           v1::GetQuotasResponse* response) {
  absl::StatusOr<Principal> principal = Admit(context, "GetQuotas");
  if (!principal.ok()) return ToGrpcStatus(principal.status());
  // An admin sees every principal; others only themselves, so that a
  // tenant learns nothing of another's.
  const bool admin = RoleCovers(principal->role, Role::kAdmin);
  for (const Coordinator::QuotaReport& q : coordinator_->Quotas(
           admin ? std::nullopt
                 : std::optional<std::string>(principal->name))) {
    v1::QuotaInfo* info = response->add_quotas();
    info->set_principal(PrincipalLabel(q.principal));
    info->set_bytes(q.use.bytes);
    info->set_bytes_limit(q.limit.bytes);
    info->set_names(q.use.names);
    info->set_names_limit(q.limit.names);
  }
  if (absl::Status size = CheckReplySize(*response, "the list of quotas", "");
      !size.ok()) {
    response->Clear();
    return ToGrpcStatus(size);
  }
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::ListWorkers(
    grpc::ServerContext* context, const v1::ListWorkersRequest*,
    v1::ListWorkersResponse* response) {
  if (absl::StatusOr<Principal> p = Admit(context, "ListWorkers"); !p.ok()) {
    return ToGrpcStatus(p.status());
  }
  for (const WorkerRecord& w : coordinator_->ListWorkers()) {
    v1::WorkerInfo* info = response->add_workers();
    info->set_name(w.name);
    info->set_rank(w.rank);
    info->set_address(w.address);
    *info->mutable_device() = DeviceToProto(w.device);
    info->set_alive(w.alive);
    info->set_bytes_used(w.bytes_used);
    info->set_capacity_bytes(w.capacity_bytes);
    info->set_quarantined_shards(w.quarantined_shards);
    info->set_quarantined_bytes(w.quarantined_bytes);
    info->set_device_total_bytes(w.device_total_bytes);
    info->set_device_free_bytes(w.device_free_bytes);
    info->set_zone(w.zone);
    info->set_data_address(w.data_address);
    info->mutable_labels()->insert(w.labels.begin(), w.labels.end());
    info->set_state(std::string(WorkerStateName(w.state)));
  }
  // Never fails while names and addresses are checked and max_workers
  // holds (coordinator_service_test proves it); kept as a last guard.
  if (absl::Status size = CheckReplySize(*response, "the list of workers", "");
      !size.ok()) {
    response->Clear();
    return ToGrpcStatus(size);
  }
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::CreateTensor(
    grpc::ServerContext* context, const v1::CreateTensorRequest* request,
    v1::CreateTensorResponse* response) {
  absl::StatusOr<Principal> principal = Admit(context, "CreateTensor");
  if (!principal.ok()) return ToGrpcStatus(principal.status());
  absl::StatusOr<std::shared_ptr<const TensorMetadata>> meta =
      [&]() -> absl::StatusOr<std::shared_ptr<const TensorMetadata>> {
    CreateTensorArgs args;
    args.owner = principal->name;
    args.name = request->name();
    TESSERA_ASSIGN_OR_RETURN(args.shape,
                             ShapeFromProto(request->shape(), "shape"));
    // Sizes first: nothing of a huge spec is converted.
    const SpecSize size = SizeOf(request->spec());
    TESSERA_RETURN_IF_ERROR(CheckLayoutSize(args.shape, size.shards,
                                            SizeLimits(), size.dims,
                                            request->spec().replicas()));
    TESSERA_ASSIGN_OR_RETURN(args.dtype,
                             DTypeFromProto(request->properties().dtype()));
    args.requires_grad = request->properties().requires_grad();
    args.pin_memory = request->properties().pin_memory();
    TESSERA_ASSIGN_OR_RETURN(args.spec, LayoutSpecFromProto(request->spec()));
    TESSERA_ASSIGN_OR_RETURN(args.init, InitFromProto(request->init()));
    TESSERA_ASSIGN_OR_RETURN(args.origin,
                             FileOriginFromProto(request->origin()));
    args.pending = request->pending();
    args.stop = CallerStop(context);
    return coordinator_->CreateTensor(args);
  }();
  if (!meta.ok()) return ToGrpcStatus(meta.status());
  TensorMetadataToProto(**meta, response->mutable_tensor(),
                        EncodingFor(request->packed_reply()));
  response->set_change_id((*meta)->change);
  if (request->pending()) {
    response->set_pending_lease_ms(
        absl::ToInt64Milliseconds(coordinator_->options().pending_lease));
  }
  // A put's client writes its shards once; everyone reads.
  AddGrants(**meta,
            request->pending() ? (kRightRead | kRightWrite) : kRightRead,
            *principal, response->mutable_capabilities());
  releaser_.AfterReplyOf((*meta)->shards.size());
  // Only a reply shard by shard can be too large: packed ones are bounded
  // at create.
  if (absl::Status size = CheckReplySize(
          *response,
          absl::StrCat("tensor '", request->name(),
                       "' was created, but its "
                       "metadata (",
                       (*meta)->shards.size(), " shards) shard by shard"),
          "; describe it with a packed reply");
      !size.ok()) {
    response->Clear();
    return ToGrpcStatus(size);
  }
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::CommitTensor(
    grpc::ServerContext* context, const v1::CommitTensorRequest* request,
    v1::CommitTensorResponse* response) {
  absl::StatusOr<Principal> principal = Admit(context, "CommitTensor");
  if (!principal.ok()) return ToGrpcStatus(principal.status());
  if (request->abandon()) {
    return ToGrpcStatus(
        coordinator_->Abandon(request->name(), request->version(),
                              principal->name, request->change_id()));
  }
  SentBytes sent;
  const absl::Status committed =
      coordinator_->CommitTensor(request->name(), request->version(),
                                 principal->name, request->change_id(), &sent);
  if (committed.ok())
    response->mutable_sent()->insert(sent.begin(), sent.end());
  return ToGrpcStatus(committed);
}

grpc::Status CoordinatorService::KeepPending(
    grpc::ServerContext* context, const v1::KeepPendingRequest* request,
    v1::KeepPendingResponse*) {
  absl::StatusOr<Principal> principal = Admit(context, "KeepPending");
  if (!principal.ok()) return ToGrpcStatus(principal.status());
  return ToGrpcStatus(
      coordinator_->KeepPending(request->name(), request->version(),
                                request->change_id(), principal->name));
}

grpc::Status CoordinatorService::GetTensor(grpc::ServerContext* context,
                                           const v1::GetTensorRequest* request,
                                           v1::GetTensorResponse* response) {
  absl::StatusOr<Principal> principal = Admit(context, "GetTensor");
  if (!principal.ok()) return ToGrpcStatus(principal.status());
  absl::StatusOr<TensorMetadata> meta =
      request->lease() ? coordinator_->GetTensorForRead(request->name())
                       : coordinator_->GetTensor(request->name());
  if (!meta.ok()) return ToGrpcStatus(meta.status());
  if (request->lease()) {
    response->set_lease_ms(
        absl::ToInt64Milliseconds(coordinator_->options().retire_grace));
  }
  TensorMetadataToProto(*meta, response->mutable_tensor(),
                        EncodingFor(request->packed_reply()));
  response->set_pending(coordinator_->PendingNote(request->name()));
  AddGrants(*meta, kRightRead, *principal, response->mutable_capabilities());
  releaser_.AfterReplyOf(meta->shards.size());
  if (absl::Status size = CheckReplySize(
          *response,
          absl::StrCat("the metadata of tensor '", request->name(), "' (",
                       meta->shards.size(), " shards",
                       request->packed_reply() ? ", packed" : "", ")"),
          request->packed_reply() ? "" : "; ask for a packed reply");
      !size.ok()) {
    response->Clear();
    return ToGrpcStatus(size);
  }
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::ReleaseRead(
    grpc::ServerContext* context, const v1::ReleaseReadRequest* request,
    v1::ReleaseReadResponse*) {
  if (absl::StatusOr<Principal> p = Admit(context, "ReleaseRead"); !p.ok()) {
    return ToGrpcStatus(p.status());
  }
  coordinator_->ReleaseRead(request->name(), request->version());
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::ListTensors(
    grpc::ServerContext* context, const v1::ListTensorsRequest* request,
    v1::ListTensorsResponse* response) {
  if (absl::StatusOr<Principal> p = Admit(context, "ListTensors"); !p.ok()) {
    return ToGrpcStatus(p.status());
  }
  for (const TensorSummary& t : coordinator_->ListTensors(request->all())) {
    v1::TensorSummary* out = response->add_tensors();
    out->set_name(t.name);
    out->mutable_shape()->Assign(t.shape.begin(), t.shape.end());
    out->set_dtype(DTypeToProto(t.dtype));
    out->set_version(t.version);
    out->set_num_shards(t.num_shards);
    out->set_replicas(t.replicas);
    out->set_mirror(t.mirror);
    if (t.pending != TensorSummary::Pending::kNone) {
      out->set_pending(t.pending == TensorSummary::Pending::kPut ? "put"
                                                                 : "update");
      out->set_pending_version(t.pending_version);
      out->set_pending_owner(t.pending_owner);
      out->set_pending_since_ms(absl::ToUnixMillis(t.pending_since));
    }
  }
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::DeleteTensor(
    grpc::ServerContext* context, const v1::DeleteTensorRequest* request,
    v1::DeleteTensorResponse*) {
  absl::StatusOr<Principal> principal = Admit(context, "DeleteTensor");
  if (!principal.ok()) return ToGrpcStatus(principal.status());
  return ToGrpcStatus(coordinator_->DeleteTensor(
      request->name(), principal->name, principal->role == Role::kAdmin,
      request->incarnation()));
}

grpc::Status CoordinatorService::ReshardTensor(
    grpc::ServerContext* context, const v1::ReshardTensorRequest* request,
    v1::ReshardTensorResponse* response) {
  if (absl::StatusOr<Principal> p = Admit(context, "ReshardTensor"); !p.ok()) {
    return ToGrpcStatus(p.status());
  }
  // Sizes first (the tensor's dims are checked by the coordinator).
  const SpecSize size = SizeOf(request->spec());
  if (absl::Status s = CheckLayoutSize({}, size.shards, SizeLimits(), size.dims,
                                       request->spec().replicas());
      !s.ok()) {
    return ToGrpcStatus(s);
  }
  absl::StatusOr<LayoutSpec> spec = LayoutSpecFromProto(request->spec());
  if (!spec.ok()) return ToGrpcStatus(spec.status());
  absl::StatusOr<ReshardResult> result = coordinator_->ReshardTensor(
      request->name(), *spec, request->expected_version(), CallerStop(context));
  if (!result.ok()) return ToGrpcStatus(result.status());
  response->set_version(result->version);
  response->set_pieces_moved(result->pieces_moved);
  response->set_bytes_moved(result->bytes_moved);
  response->set_bytes_copied_locally(result->bytes_copied_locally);
  response->set_shards_kept(result->shards_kept);
  response->set_seconds(result->seconds);
  response->mutable_sent()->insert(result->sent.begin(), result->sent.end());
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::GetMoveProgress(
    grpc::ServerContext* context, const v1::GetMoveProgressRequest* request,
    v1::GetMoveProgressResponse* response) {
  if (absl::StatusOr<Principal> p = Admit(context, "GetMoveProgress");
      !p.ok()) {
    return ToGrpcStatus(p.status());
  }
  const MoveProgress progress = coordinator_->MoveProgressOf(request->name());
  response->set_running(progress.running);
  response->set_bytes_total(progress.bytes_total);
  response->set_bytes_done(progress.bytes_done);
  return grpc::Status::OK;
}

namespace {

// Longest directory name a checkpoint call takes.
constexpr size_t kMaxCheckpointDirBytes = 4096;

absl::Status CheckDirName(const std::string& dir) {
  if (dir.size() > kMaxCheckpointDirBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint_root: a directory name of ", dir.size(),
                     " bytes is longer than ", kMaxCheckpointDirBytes));
  }
  return absl::OkStatus();
}

}  // namespace

grpc::Status CoordinatorService::DescribeCheckpoint(
    grpc::ServerContext* context, const v1::DescribeCheckpointRequest* request,
    v1::DescribeCheckpointResponse* response) {
  if (absl::StatusOr<Principal> p = Admit(context, "DescribeCheckpoint");
      !p.ok()) {
    return ToGrpcStatus(p.status());
  }
  if (absl::Status s = CheckDirName(request->dir()); !s.ok()) {
    return ToGrpcStatus(s);
  }
  absl::StatusOr<CheckpointListing> listing =
      coordinator_->DescribeCheckpoint(request->dir());
  if (!listing.ok()) return ToGrpcStatus(listing.status());
  CheckpointListingToProto(*listing, response->mutable_entries(),
                           response->mutable_origin());
  if (absl::Status size = CheckReplySize(
          *response, absl::StrCat("the listing of '", request->dir(), "'"), "");
      !size.ok()) {
    response->Clear();
    return ToGrpcStatus(size);
  }
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::LoadCheckpoint(
    grpc::ServerContext* context, const v1::LoadCheckpointRequest* request,
    v1::LoadCheckpointResponse* response) {
  absl::StatusOr<Principal> principal = Admit(context, "LoadCheckpoint");
  if (!principal.ok()) return ToGrpcStatus(principal.status());
  absl::StatusOr<LoadResult> result = [&]() -> absl::StatusOr<LoadResult> {
    TESSERA_RETURN_IF_ERROR(CheckDirName(request->dir()));
    if (request->entries_size() > kMaxCheckpointEntries) {
      return absl::InvalidArgumentError(
          absl::StrCat("load: ", request->entries_size(),
                       " entries are more than one load makes (",
                       kMaxCheckpointEntries, ")"));
    }
    LoadArgs args;
    args.dir = request->dir();
    args.owner = principal->name;
    args.stop = CallerStop(context);
    for (const v1::LoadCheckpointRequest::Entry& e : request->entries()) {
      // Sizes first: nothing of a huge spec is converted.
      const SpecSize size = SizeOf(e.spec());
      TESSERA_RETURN_IF_ERROR(CheckLayoutSize({}, size.shards, SizeLimits(),
                                              size.dims, e.spec().replicas()));
      LoadArgs::Entry& entry = args.entries.emplace_back();
      entry.entry = e.entry();
      entry.tensor = e.tensor();
      TESSERA_ASSIGN_OR_RETURN(entry.spec, LayoutSpecFromProto(e.spec()));
    }
    return coordinator_->LoadCheckpoint(args);
  }();
  if (!result.ok()) return ToGrpcStatus(result.status());
  for (const TensorMetadataPtr& t : result->tensors) {
    v1::TensorSummary* out = response->add_tensors();
    out->set_name(t->name);
    out->mutable_shape()->Assign(t->shape.begin(), t->shape.end());
    out->set_dtype(DTypeToProto(t->dtype));
    out->set_version(t->version);
    out->set_num_shards(static_cast<int64_t>(t->shards.size()));
    out->set_replicas(ReplicaCount(*t));
    out->set_mirror(t->mirror);
  }
  response->set_bytes(result->bytes);
  response->set_bytes_read(result->bytes_read);
  response->set_seconds(result->seconds);
  response->mutable_sent()->insert(result->sent.begin(), result->sent.end());
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::SaveCheckpoint(
    grpc::ServerContext* context, const v1::SaveCheckpointRequest* request,
    v1::SaveCheckpointResponse* response) {
  absl::StatusOr<Principal> principal = Admit(context, "SaveCheckpoint");
  if (!principal.ok()) return ToGrpcStatus(principal.status());
  absl::StatusOr<SaveResult> result = [&]() -> absl::StatusOr<SaveResult> {
    TESSERA_RETURN_IF_ERROR(CheckDirName(request->dir()));
    if (request->names_size() > kMaxCheckpointEntries) {
      return absl::InvalidArgumentError(
          absl::StrCat("save: ", request->names_size(),
                       " tensors are more than one checkpoint holds (",
                       kMaxCheckpointEntries, ")"));
    }
    SaveArgs args;
    args.dir = request->dir();
    args.prefix = request->prefix();
    args.stop = CallerStop(context);
    args.principal = principal->name;
    args.overwrite = request->overwrite();
    args.hf = request->hf();
    args.strip_prefix = request->strip_prefix();
    if (args.strip_prefix.size() > 255 ||  // a tensor name's bound
        request->max_file_bytes() < 0) {
      return absl::InvalidArgumentError(
          "export: --strip_prefix is longer than a tensor name, or "
          "--max_shard_size is negative");
    }
    if (request->max_file_bytes() > 0) {
      args.max_file_bytes = request->max_file_bytes();
    }
    for (const std::string& name : request->names()) {
      TESSERA_RETURN_IF_ERROR(CheckTensorName(name));
      args.names.push_back(name);
    }
    if (!args.names.empty() && !args.prefix.empty()) {
      return absl::InvalidArgumentError(
          "save: give either tensor names or a prefix, not both");
    }
    return coordinator_->SaveCheckpoint(args);
  }();
  if (!result.ok()) return ToGrpcStatus(result.status());
  for (const std::string& name : result->tensors) response->add_tensors(name);
  response->set_bytes(result->bytes);
  response->set_files(result->files);
  response->set_seconds(result->seconds);
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::UpdateTensor(
    grpc::ServerContext* context, const v1::UpdateTensorRequest* request,
    v1::UpdateTensorResponse* response) {
  absl::StatusOr<Principal> principal = Admit(context, "UpdateTensor");
  if (!principal.ok()) return ToGrpcStatus(principal.status());
  absl::StatusOr<StagedUpdate> staged = [&]() -> absl::StatusOr<StagedUpdate> {
    UpdateArgs args;
    args.name = request->name();
    args.expected_version = request->expected_version();
    args.owner = principal->name;
    args.stop = CallerStop(context);
    if (request->has_region()) {
      TESSERA_ASSIGN_OR_RETURN(args.region,
                               BoxFromProto(request->region_offsets(),
                                            request->region_sizes(), "region"));
    } else if (request->region_offsets_size() > 0 ||
               request->region_sizes_size() > 0) {
      return absl::InvalidArgumentError(
          "region offsets or sizes without has_region");
    }
    return coordinator_->UpdateTensor(args);
  }();
  if (!staged.ok()) return ToGrpcStatus(staged.status());
  TensorMetadataToProto(*staged->meta, response->mutable_tensor(),
                        EncodingFor(request->packed_reply()));
  // The caller writes N+1's new shards once; everyone reads.
  AddGrants(*staged->meta, kRightRead | kRightWrite, *principal,
            response->mutable_capabilities());
  response->set_shards_kept(staged->shards_kept);
  response->set_change_id(staged->meta->change);
  response->set_pending_lease_ms(
      absl::ToInt64Milliseconds(coordinator_->options().pending_lease));
  releaser_.AfterReplyOf(staged->meta->shards.size());
  if (absl::Status size = CheckReplySize(
          *response,
          absl::StrCat("the update of tensor '", request->name(),
                       "' was started, but its metadata (",
                       staged->meta->shards.size(), " shards) shard by shard"),
          "; ask for a packed reply");
      !size.ok()) {
    response->Clear();
    coordinator_
        ->Abandon(request->name(), staged->meta->version, principal->name,
                  staged->meta->change)
        .IgnoreError();
    return ToGrpcStatus(size);
  }
  return grpc::Status::OK;
}

}  // namespace tessera
