#include "client/tessera_client.h"

#include <algorithm>
#include <optional>
#include <thread>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "client/connection.h"
#include "client/data_plane.h"
#include "client/device_access.h"
#include "client/mapped_file.h"
#include "core/checked_math.h"
#include "core/errors.h"
#include "core/parse.h"
#include "core/status_macros.h"
#include "rpc/call.h"
#include "rpc/convert.h"
#include "rpc/security.h"
#include "rpc/tls_probe.h"

namespace tessera {
namespace {

// Cached tensors of at least this many shards get a BoxIndex: below, a look
// at every shard costs about as much as a query.
constexpr size_t kIndexFromShards = 64;

// The capabilities that came with the metadata, kept beside it for the
// data plane (ReadLocations hands them to the transports).
absl::StatusOr<TensorMetadata> WithCapabilities(
    absl::StatusOr<TensorMetadata> meta,
    const google::protobuf::RepeatedPtrField<v1::WorkerCapability>& grants) {
  if (!meta.ok()) return meta;
  for (const v1::WorkerCapability& grant : grants) {
    meta->capabilities[grant.worker()] = grant.token();
  }
  return meta;
}

// How the SDK calls the coordinator: its own deadline, retries for
// idempotent calls (describe, list, workers) while it cannot be reached, and
// one error a user understands when it cannot be reached at all.
CallOptions CoordinatorCall(const Connection& connection, bool idempotent,
                            absl::Duration timeout) {
  CallOptions options;
  options.timeout = timeout;
  options.idempotent = idempotent;
  options.attempts = connection.options().control_retries + 1;
  const std::string address = connection.coordinator_address();
  // Several coordinators: to the leader, found and followed within the
  // call's deadline (a failover takes a few seconds).
  options.leaders = connection.leaders();
  const TlsFiles files{connection.options().tls_ca,
                       connection.options().tls_cert,
                       connection.options().tls_key};
  // A TLS client without a certificate sees its handshake complete and the
  // socket then closed by a coordinator that requires one (TLS 1.3).
  const bool tls_without_cert = !files.ca.empty() && files.cert.empty();
  const absl::Duration probe_timeout =
      std::min(connection.options().connect_timeout, absl::Seconds(5));
  options.unreachable = [address, files, tls_without_cert,
                         probe_timeout](const grpc::Status& s) {
    // gRPC reports a coordinator that refuses this client's TLS settings
    // (no TLS at all, a certificate of another CA) as one that cannot be
    // reached: one handshake of our own tells them apart.
    std::optional<TlsMaterial> tls;
    if (files.enabled()) {
      absl::StatusOr<TlsMaterial> loaded = LoadTls(files, /*need_cert=*/false);
      if (loaded.ok()) tls = *std::move(loaded);
    }
    if (!files.enabled() || tls.has_value()) {
      absl::Status mismatch = DiagnoseTlsMismatch(
          address, tls.has_value() ? &*tls : nullptr,
          absl::StrCat("the coordinator at ", address), probe_timeout);
      if (!mismatch.ok()) return mismatch;
    }
    if (tls_without_cert &&
        absl::StrContains(s.error_message(), "Socket closed")) {
      return absl::UnauthenticatedError(absl::StrCat(
          "unauthenticated: the coordinator at ", address,
          " closed the connection: it requires a client certificate (pass "
          "--tls_cert and --tls_key)"));
    }
    return absl::UnavailableError(absl::StrCat(
        "cannot reach the coordinator at ", address, " (is it running?)"));
  };
  return options;
}

CallOptions ControlCall(const Connection& connection, bool idempotent) {
  return CoordinatorCall(connection, idempotent,
                         connection.options().rpc_timeout);
}

// Creates with an init fill and reshards of large tensors take longer than a
// plain call.
CallOptions LongControlCall(const Connection& connection) {
  return CoordinatorCall(connection, /*idempotent=*/false,
                         connection.options().data_timeout);
}

// While a put or update is written, keeps it pending on the coordinator
// (KeepPending every third of its lease): a client that dies stops, and
// the coordinator gives the change up within the lease.
class PendingKeeper {
 public:
  PendingKeeper(Connection* connection, std::string name, uint64_t version,
                uint64_t change, int64_t lease_ms) {
    if (lease_ms <= 0) return;  // a coordinator without leases
    request_.set_name(std::move(name));
    request_.set_version(version);
    request_.set_change_id(change);
    const absl::Duration every = absl::Milliseconds(lease_ms) / 3;
    thread_ = std::thread([this, connection, every] {
      while (!stop_.WaitForNotificationWithTimeout(every)) {
        v1::KeepPendingResponse response;
        const absl::Status kept =
            Call(ControlCall(*connection, /*idempotent=*/true),
                 [&](grpc::ClientContext* context) {
                   return connection->coordinator()->KeepPending(
                       context, request_, &response);
                 });
        // Given up already: the commit says so.
        if (absl::IsNotFound(kept)) return;
      }
    });
  }
  ~PendingKeeper() {
    stop_.Notify();
    if (thread_.joinable()) thread_.join();
  }
  PendingKeeper(const PendingKeeper&) = delete;
  PendingKeeper& operator=(const PendingKeeper&) = delete;

 private:
  v1::KeepPendingRequest request_;
  absl::Notification stop_;
  std::thread thread_;
};

absl::StatusOr<WorkerInfo> WorkerInfoFromProto(const v1::WorkerInfo& w) {
  WorkerInfo info;
  info.name = w.name();
  info.rank = w.rank();
  info.address = w.address();
  TESSERA_ASSIGN_OR_RETURN(info.device, DeviceFromProto(w.device()));
  info.alive = w.alive();
  info.bytes_used = w.bytes_used();
  info.capacity_bytes = w.capacity_bytes();
  info.quarantined_shards = w.quarantined_shards();
  info.quarantined_bytes = w.quarantined_bytes();
  info.device_total_bytes = w.device_total_bytes();
  info.device_free_bytes = w.device_free_bytes();
  info.zone = w.zone();
  info.data_address = w.data_address();
  info.labels = Labels(w.labels().begin(), w.labels().end());
  // A coordinator from before worker states sends none.
  info.state = ParseWorkerState(w.state()).value_or(
      info.alive ? WorkerState::kReady : WorkerState::kDead);
  return info;
}

}  // namespace

ShardHandle::ShardHandle(std::shared_ptr<Connection> connection,
                         std::shared_ptr<const TensorMetadata> meta,
                         size_t index)
    : connection_(std::move(connection)),
      meta_(std::move(meta)),
      index_(index) {}

absl::StatusOr<HostArray> ShardHandle::ToHere() const {
  HostArray array =
      HostArray::Allocate(meta_->dtype, ToShape(shard().box.sizes));
  absl::Status status = FetchShard(*connection_, *meta_, index_, array.data());
  if (absl::IsAborted(status)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard handle ", ToString(), " refers to version ", meta_->version,
        ", whose shards were freed (the tensor was resharded or deleted); "
        "describe the tensor again for current handles"));
  }
  if (!status.ok()) return status;
  array.version = meta_->version;
  return array;
}

const std::string& Client::coordinator_address() const {
  return connection_->coordinator_address();
}

Client::Client(std::shared_ptr<Connection> connection)
    : connection_(std::move(connection)) {}

DataPlaneStats Client::TransferStats() const {
  DataPlaneStats stats = connection_->data_plane().Stats();
  {
    absl::MutexLock lock(&sent_mu_);
    stats.workers_sent = workers_sent_;
  }
  absl::MutexLock lock(&device_mu_);
  if (device_ != nullptr && device_->ipc_bytes() > 0) {
    stats.bytes["cuda_ipc"] += device_->ipc_bytes();
  }
  return stats;
}

absl::StatusOr<DeviceAccess*> Client::Device() {
  const DeviceAccessMaker make = RegisteredDeviceAccess();
  if (make == nullptr) {
    return absl::FailedPreconditionError(
        "this SDK was built without CUDA (build it with --config=cuda)");
  }
  absl::MutexLock lock(&device_mu_);
  if (device_ == nullptr) {
    TESSERA_ASSIGN_OR_RETURN(device_, make(connection_.get()));
  }
  return device_.get();
}

absl::Status Client::GetIntoDevice(const std::string& name,
                                   const std::optional<Box>& region, void* dst,
                                   int64_t dst_bytes, int device) {
  TESSERA_ASSIGN_OR_RETURN(DeviceAccess * reader, Device());
  return ReadWithRetry(
      name,
      [&](const TensorMetadata& meta, const BoxIndex* index) {
        const Box box = region.has_value() ? *region : WholeBox(meta.shape);
        TESSERA_RETURN_IF_ERROR(CheckWithin(box, meta.shape, "region"));
        const int64_t need =
            box.NumElements() * static_cast<int64_t>(ItemSize(meta.dtype));
        if (need != dst_bytes) {
          return absl::InvalidArgumentError(absl::StrCat(
              "device buffer has ", dst_bytes, " bytes but region ",
              box.ToString(), " of '", name, "' needs ", need));
        }
        return reader->GatherRegion(meta, index, box, static_cast<char*>(dst),
                                    device);
      },
      nullptr);
}

absl::StatusOr<std::vector<DeviceShardView>> Client::MapDevice(
    const std::string& name) {
  TESSERA_ASSIGN_OR_RETURN(DeviceAccess * reader, Device());
  std::vector<DeviceShardView> views;
  TESSERA_RETURN_IF_ERROR(ReadWithRetry(
      name,
      [&](const TensorMetadata& meta, const BoxIndex*) -> absl::Status {
        TESSERA_ASSIGN_OR_RETURN(views, reader->Map(meta));
        return absl::OkStatus();
      },
      nullptr));
  return views;
}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(
    const std::string& coordinator, ClientOptions options) {
  if (coordinator.empty() || coordinator.find(':') == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "coordinator address '", coordinator, "' is not HOST:PORT"));
  }
  // Several coordinators (one leads): each must be HOST:PORT and resolve.
  TESSERA_RETURN_IF_ERROR(ChannelTarget(coordinator).status());
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<Connection> connection,
                           Connection::Make(coordinator, options));
  // Wait for the connection once here, so later calls fail fast and clearly.
  v1::ListWorkersRequest request;
  v1::ListWorkersResponse response;
  CallOptions call = CoordinatorCall(*connection, /*idempotent=*/false,
                                     options.connect_timeout);
  call.wait_for_ready = true;
  auto list = [&](grpc::ClientContext* context) {
    return connection->coordinator()->ListWorkers(context, request, &response);
  };
  absl::Status status = Call(call, list);
  if (absl::IsUnavailable(status) && !options.tls_ca.empty()) {
    // Waiting for the connection hides why it failed; one plain attempt
    // tells a refused certificate from a coordinator that is down.
    CallOptions probe = CoordinatorCall(*connection, /*idempotent=*/false,
                                        options.connect_timeout);
    absl::Status detail = Call(probe, list);
    if (absl::IsUnauthenticated(detail)) status = detail;
  }
  TESSERA_RETURN_IF_ERROR(status);
  // The workers' zones, for reads from the nearest replica.
  std::vector<WorkerInfo> workers;
  for (const v1::WorkerInfo& w : response.workers()) {
    absl::StatusOr<WorkerInfo> info = WorkerInfoFromProto(w);
    if (info.ok()) workers.push_back(*std::move(info));
  }
  connection->NoteWorkers(workers);
  return std::unique_ptr<Client>(new Client(std::move(connection)));
}

absl::StatusOr<std::vector<CoordinatorStatus>> Client::Coordinators() {
  v1::ListCoordinatorsRequest request;
  v1::ListCoordinatorsResponse response;
  TESSERA_RETURN_IF_ERROR(
      Call(ControlCall(*connection_, /*idempotent=*/true),
           [&](grpc::ClientContext* context) {
             return connection_->coordinator()->ListCoordinators(
                 context, request, &response);
           }));
  std::vector<CoordinatorStatus> out;
  absl::flat_hash_set<std::string> listed;
  for (const v1::CoordinatorInfo& c : response.coordinators()) {
    if (c.role() != "leader" && c.role() != "standby") {
      return absl::InternalError(absl::StrCat(
          "the coordinator lists a coordinator of role '", c.role(), "'"));
    }
    out.push_back({c.address(), c.role(), c.alive()});
    listed.insert(c.address());
  }
  for (absl::string_view given :
       absl::StrSplit(coordinator_address(), ',', absl::SkipEmpty())) {
    if (!listed.contains(given)) {
      out.push_back({std::string(given), "standby", false});
    }
  }
  return out;
}

absl::StatusOr<std::vector<QuotaInfo>> Client::Quotas() {
  v1::GetQuotasRequest request;
  v1::GetQuotasResponse response;
  TESSERA_RETURN_IF_ERROR(Call(ControlCall(*connection_, /*idempotent=*/true),
                               [&](grpc::ClientContext* context) {
                                 return connection_->coordinator()->GetQuotas(
                                     context, request, &response);
                               }));
  std::vector<QuotaInfo> out;
  for (const v1::QuotaInfo& q : response.quotas()) {
    out.push_back({q.principal(), q.bytes(), q.bytes_limit(), q.names(),
                   q.names_limit()});
  }
  return out;
}

absl::StatusOr<std::vector<WorkerInfo>> Client::Workers() {
  v1::ListWorkersRequest request;
  v1::ListWorkersResponse response;
  TESSERA_RETURN_IF_ERROR(Call(ControlCall(*connection_, /*idempotent=*/true),
                               [&](grpc::ClientContext* context) {
                                 return connection_->coordinator()->ListWorkers(
                                     context, request, &response);
                               }));
  std::vector<WorkerInfo> out;
  for (const v1::WorkerInfo& w : response.workers()) {
    TESSERA_ASSIGN_OR_RETURN(WorkerInfo info, WorkerInfoFromProto(w));
    out.push_back(std::move(info));
  }
  connection_->NoteWorkers(out);
  return out;
}

absl::Status Client::SetWorkerState(const std::string& worker,
                                    WorkerState state) {
  v1::SetWorkerStateRequest request;
  request.set_name(worker);
  request.set_state(std::string(WorkerStateName(state)));
  v1::SetWorkerStateResponse response;
  return Call(ControlCall(*connection_, /*idempotent=*/true),
              [&](grpc::ClientContext* context) {
                return connection_->coordinator()->SetWorkerState(
                    context, request, &response);
              });
}

absl::Status Client::DrainWorker(const std::string& worker,
                                 absl::Duration timeout) {
  TESSERA_RETURN_IF_ERROR(SetWorkerState(worker, WorkerState::kDraining));
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    TESSERA_ASSIGN_OR_RETURN(std::vector<WorkerInfo> workers, Workers());
    auto it =
        std::find_if(workers.begin(), workers.end(),
                     [&](const WorkerInfo& w) { return w.name == worker; });
    if (it == workers.end()) return NotFoundError("worker", worker);
    if (it->bytes_used == 0) return absl::OkStatus();
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("worker '", worker, "' still holds ", it->bytes_used,
                       " bytes after ", absl::FormatDuration(timeout),
                       "; the drain goes on (no ready worker with room yet?)"));
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
}

absl::Status Client::RemoveWorker(const std::string& worker) {
  v1::RemoveWorkerRequest request;
  request.set_name(worker);
  v1::RemoveWorkerResponse response;
  return Call(ControlCall(*connection_, /*idempotent=*/false),
              [&](grpc::ClientContext* context) {
                return connection_->coordinator()->RemoveWorker(
                    context, request, &response);
              });
}

absl::StatusOr<TensorMetadata> Client::CreateInternal(
    const std::string& name, const Shape& shape, DType dtype,
    const LayoutSpec& spec, const InitSpec& init, bool pending,
    const FileOrigin& origin, int64_t* pending_lease_ms) {
  v1::CreateTensorRequest request;
  request.set_name(name);
  request.mutable_shape()->Assign(shape.begin(), shape.end());
  request.mutable_properties()->set_dtype(DTypeToProto(dtype));
  LayoutSpecToProto(spec, request.mutable_spec());
  *request.mutable_init() = InitToProto(init);
  request.set_pending(pending);
  request.set_packed_reply(true);
  if (origin.entry != 0 || origin.scalar || !origin.metadata.empty()) {
    FileOriginToProto(origin, request.mutable_origin());
  }
  v1::CreateTensorResponse response;
  TESSERA_RETURN_IF_ERROR(
      Call(LongControlCall(*connection_), [&](grpc::ClientContext* context) {
        return connection_->coordinator()->CreateTensor(context, request,
                                                        &response);
      }));
  TESSERA_ASSIGN_OR_RETURN(
      TensorMetadata meta,
      WithCapabilities(TensorMetadataFromProto(response.tensor()),
                       response.capabilities()));
  meta.change = response.change_id();
  if (pending_lease_ms != nullptr) {
    *pending_lease_ms = response.pending_lease_ms();
  }
  return meta;
}

absl::StatusOr<TensorMetadata> Client::Create(const std::string& name,
                                              const Shape& shape, DType dtype,
                                              const LayoutSpec& spec,
                                              const InitSpec& init) {
  return CreateInternal(name, shape, dtype, spec, init, /*pending=*/false);
}

absl::StatusOr<TensorMetadata> Client::Put(const std::string& name,
                                           const Shape& shape, DType dtype,
                                           const char* data,
                                           const LayoutSpec& spec,
                                           const FileOrigin& origin) {
  int64_t lease_ms = 0;
  TESSERA_ASSIGN_OR_RETURN(TensorMetadata meta,
                           CreateInternal(name, shape, dtype, spec, InitSpec{},
                                          /*pending=*/true, origin, &lease_ms));
  PendingKeeper keeper(connection_.get(), name, meta.version, meta.change,
                       lease_ms);
  absl::Status status = ScatterTensor(*connection_, meta, data);
  // Bytes from a file that shrank or changed while they were read (zeros
  // past its new end) are not committed.
  if (absl::Status input = CheckMappedInput(data, meta.ByteSize());
      !input.ok()) {
    status = input;
  }
  if (status.ok()) {
    status = CommitVersion(name, meta.version, meta.change, /*abandon=*/false);
    if (status.ok()) return meta;
  }
  // Leave nothing half-made behind: this put's shards, never a tensor of
  // the name another client made meanwhile.
  CommitVersion(name, meta.version, meta.change, /*abandon=*/true)
      .IgnoreError();
  return status;
}

absl::Status Client::CommitVersion(const std::string& name, uint64_t version,
                                   uint64_t change, bool abandon,
                                   int64_t* relayed) {
  v1::CommitTensorRequest request;
  request.set_name(name);
  request.set_version(version);
  request.set_change_id(change);
  request.set_abandon(abandon);
  v1::CommitTensorResponse response;
  // A commit forwards the written replicas' bytes to the others.
  TESSERA_RETURN_IF_ERROR(
      Call(abandon ? ControlCall(*connection_, /*idempotent=*/false)
                   : LongControlCall(*connection_),
           [&](grpc::ClientContext* context) {
             return connection_->coordinator()->CommitTensor(context, request,
                                                             &response);
           }));
  const SentBytes sent(response.sent().begin(), response.sent().end());
  CountWorkersSent(sent);
  if (relayed != nullptr) *relayed = TotalSent(sent);
  return absl::OkStatus();
}

void Client::CountWorkersSent(const SentBytes& sent) {
  absl::MutexLock lock(&sent_mu_);
  for (const auto& [worker, bytes] : sent) workers_sent_[worker] += bytes;
}

absl::StatusOr<TensorMetadata> Client::Describe(const std::string& name) {
  return DescribeInternal(name, /*lease=*/false);
}

void Client::ReleaseRead(const std::string& name, uint64_t version) {
  v1::ReleaseReadRequest request;
  request.set_name(name);
  request.set_version(version);
  v1::ReleaseReadResponse response;
  // Best effort: a lease not released just expires.
  Call(ControlCall(*connection_, /*idempotent=*/false), [&](grpc::ClientContext*
                                                                context) {
    return connection_->coordinator()->ReleaseRead(context, request, &response);
  }).IgnoreError();
}

absl::StatusOr<TensorMetadata> Client::DescribeInternal(const std::string& name,
                                                        bool lease) {
  v1::GetTensorRequest request;
  request.set_name(name);
  request.set_packed_reply(true);
  request.set_lease(lease);
  v1::GetTensorResponse response;
  TESSERA_RETURN_IF_ERROR(Call(ControlCall(*connection_, /*idempotent=*/true),
                               [&](grpc::ClientContext* context) {
                                 return connection_->coordinator()->GetTensor(
                                     context, request, &response);
                               }));
  TESSERA_ASSIGN_OR_RETURN(
      TensorMetadata meta,
      WithCapabilities(TensorMetadataFromProto(response.tensor()),
                       response.capabilities()));
  meta.pending = response.pending();
  return meta;
}

namespace {

// A row of ListTensors (or of a load's reply).
absl::StatusOr<TensorInfo> TensorInfoFromProto(const v1::TensorSummary& t) {
  TensorInfo info;
  info.name = t.name();
  info.shape.assign(t.shape().begin(), t.shape().end());
  TESSERA_ASSIGN_OR_RETURN(info.dtype, DTypeFromProto(t.dtype()));
  info.version = t.version();
  info.num_shards = t.num_shards();
  // A coordinator from before replicas sends none: one.
  info.replicas = std::max<int64_t>(t.replicas(), 1);
  info.mirror = t.mirror();
  info.pending = t.pending();
  info.pending_version = t.pending_version();
  info.pending_owner = t.pending_owner();
  info.pending_since = absl::FromUnixMillis(t.pending_since_ms());
  return info;
}

}  // namespace

absl::StatusOr<std::vector<TensorInfo>> Client::List(bool all) {
  v1::ListTensorsRequest request;
  request.set_all(all);
  v1::ListTensorsResponse response;
  TESSERA_RETURN_IF_ERROR(Call(ControlCall(*connection_, /*idempotent=*/true),
                               [&](grpc::ClientContext* context) {
                                 return connection_->coordinator()->ListTensors(
                                     context, request, &response);
                               }));
  std::vector<TensorInfo> out;
  for (const v1::TensorSummary& t : response.tensors()) {
    TESSERA_ASSIGN_OR_RETURN(TensorInfo info, TensorInfoFromProto(t));
    out.push_back(std::move(info));
  }
  return out;
}

absl::Status Client::Delete(const std::string& name, uint64_t incarnation) {
  ForgetMetadata(name);
  v1::DeleteTensorRequest request;
  request.set_name(name);
  request.set_incarnation(incarnation);
  v1::DeleteTensorResponse response;
  return Call(ControlCall(*connection_, /*idempotent=*/false),
              [&](grpc::ClientContext* context) {
                return connection_->coordinator()->DeleteTensor(
                    context, request, &response);
              });
}

Client::CachedTensor Client::CachedMetadata(const std::string& name) {
  CachedTensor entry;
  {
    absl::MutexLock lock(&cache_mu_);
    auto it = metadata_cache_.find(name);
    if (it == metadata_cache_.end()) return entry;
    entry = it->second;
  }
  if (entry.index != nullptr || entry.meta->shards.size() < kIndexFromShards) {
    return entry;
  }
  // Built once per cached version, outside the lock; a racing reader may
  // build another, and either one serves.
  const TensorMetadata& meta = *entry.meta;
  entry.index = std::make_shared<const BoxIndex>(
      meta.shards.size(),
      [&](size_t i) -> const Box& { return meta.shards[i].box; });
  absl::MutexLock lock(&cache_mu_);
  auto it = metadata_cache_.find(name);
  if (it != metadata_cache_.end() && it->second.meta == entry.meta) {
    it->second.index = entry.index;
  }
  return entry;
}

void Client::CacheMetadata(std::shared_ptr<const TensorMetadata> meta) {
  const int limit = connection_->options().metadata_cache_entries;
  if (limit <= 0) return;
  absl::MutexLock lock(&cache_mu_);
  if (static_cast<int>(metadata_cache_.size()) >= limit)
    metadata_cache_.clear();
  const std::string name = meta->name;
  metadata_cache_[name] = CachedTensor{std::move(meta), nullptr};
}

void Client::ForgetMetadata(const std::string& name) {
  absl::MutexLock lock(&cache_mu_);
  metadata_cache_.erase(name);
}

absl::Status Client::ReadWithRetry(
    const std::string& name,
    const std::function<absl::Status(const TensorMetadata&, const BoxIndex*)>&
        read,
    uint64_t* version) {
  uint64_t last_version = 0;
  for (int attempt = 0;; ++attempt) {
    CachedTensor entry;
    if (attempt == 0) entry = CachedMetadata(name);
    std::shared_ptr<const TensorMetadata> meta = entry.meta;
    const bool cached = meta != nullptr;
    if (!cached) {
      // Leased: the version is not freed under this read even if it is
      // replaced meanwhile.
      TESSERA_ASSIGN_OR_RETURN(TensorMetadata fresh,
                               DescribeInternal(name, /*lease=*/true));
      meta = std::make_shared<const TensorMetadata>(std::move(fresh));
    }
    absl::Status status = read(*meta, entry.index.get());
    if (!cached) ReleaseRead(name, meta->version);
    if (status.ok()) {
      if (version != nullptr) *version = meta->version;
      if (!cached) CacheMetadata(meta);
      return status;
    }
    if (cached) {  // perhaps stale: read again on fresh metadata
      ForgetMetadata(name);
      continue;
    }
    // The version we read was replaced and freed under us: read the new one.
    if (absl::IsAborted(status) && attempt < 4 &&
        meta->version != last_version) {
      last_version = meta->version;
      continue;
    }
    return status;
  }
}

absl::Status Client::ReadRegion(
    const std::string& name, const std::optional<Box>& region,
    const std::function<absl::StatusOr<char*>(const TensorMetadata&,
                                              const Box&)>& destination,
    uint64_t* version) {
  return ReadWithRetry(
      name,
      [&](const TensorMetadata& meta, const BoxIndex* index) {
        const Box box = region.has_value() ? *region : WholeBox(meta.shape);
        TESSERA_RETURN_IF_ERROR(CheckWithin(box, meta.shape, "region"));
        TESSERA_ASSIGN_OR_RETURN(char* out, destination(meta, box));
        return GatherRegion(*connection_, meta, index, box, out);
      },
      version);
}

absl::Status Client::ReadRows(
    const std::string& name, absl::Span<const int64_t> indices,
    const std::function<absl::StatusOr<char*>(const TensorMetadata&,
                                              const Shape&)>& destination,
    uint64_t* version) {
  return ReadWithRetry(
      name,
      [&](const TensorMetadata& meta, const BoxIndex*) -> absl::Status {
        if (meta.shape.empty()) {
          return absl::InvalidArgumentError(
              absl::StrCat("tensor '", name, "' is 0-d: it has no rows"));
        }
        TESSERA_ASSIGN_OR_RETURN(RowPlan plan,
                                 PlanRows(indices, meta.shape[0]));
        Shape shape = meta.shape;
        shape[0] = static_cast<int64_t>(indices.size());
        TESSERA_RETURN_IF_ERROR(ByteSize(shape, ItemSize(meta.dtype)).status());
        TESSERA_ASSIGN_OR_RETURN(char* out, destination(meta, shape));
        return tessera::GatherRows(*connection_, meta, plan, out);
      },
      version);
}

absl::StatusOr<HostArray> Client::GatherRows(
    const std::string& name, absl::Span<const int64_t> indices) {
  HostArray array;
  TESSERA_RETURN_IF_ERROR(ReadRows(
      name, indices,
      [&](const TensorMetadata& meta,
          const Shape& shape) -> absl::StatusOr<char*> {
        if (array.buffer == nullptr || array.shape != shape ||
            array.dtype != meta.dtype) {
          array = HostArray::Allocate(meta.dtype, shape);
        }
        return array.data();
      },
      &array.version));
  return array;
}

absl::Status Client::GatherRowsInto(const std::string& name,
                                    absl::Span<const int64_t> indices,
                                    char* out, int64_t out_bytes,
                                    uint64_t* version) {
  return ReadRows(
      name, indices,
      [&](const TensorMetadata& meta,
          const Shape& shape) -> absl::StatusOr<char*> {
        const int64_t need = *ByteSize(shape, ItemSize(meta.dtype));
        if (need != out_bytes) {
          return absl::InvalidArgumentError(absl::StrCat(
              "output buffer has ", out_bytes, " bytes but ", indices.size(),
              " rows of '", name, "' need ", need));
        }
        return out;
      },
      version);
}

absl::StatusOr<HostArray> Client::Get(const std::string& name,
                                      const std::optional<Box>& region) {
  return GetResolved(name, [&](const TensorMetadata& meta) {
    return region.has_value() ? *region : WholeBox(meta.shape);
  });
}

absl::StatusOr<HostArray> Client::GetResolved(
    const std::string& name,
    const std::function<absl::StatusOr<Box>(const TensorMetadata&)>& resolve) {
  HostArray array;
  TESSERA_RETURN_IF_ERROR(ReadWithRetry(
      name,
      [&](const TensorMetadata& meta, const BoxIndex* index) -> absl::Status {
        TESSERA_ASSIGN_OR_RETURN(const Box box, resolve(meta));
        TESSERA_RETURN_IF_ERROR(CheckWithin(box, meta.shape, "region"));
        if (array.buffer == nullptr || !SameDims(array.shape, box.sizes) ||
            array.dtype != meta.dtype) {
          array = HostArray::Allocate(meta.dtype, ToShape(box.sizes));
        }
        return GatherRegion(*connection_, meta, index, box, array.data());
      },
      &array.version));
  return array;
}

absl::Status Client::GetInto(const std::string& name,
                             const std::optional<Box>& region, char* out,
                             int64_t out_bytes, uint64_t* version) {
  return ReadRegion(
      name, region,
      [&](const TensorMetadata& meta, const Box& box) -> absl::StatusOr<char*> {
        const int64_t need =
            box.NumElements() * static_cast<int64_t>(ItemSize(meta.dtype));
        if (need != out_bytes) {
          return absl::InvalidArgumentError(absl::StrCat(
              "output buffer has ", out_bytes, " bytes but region ",
              box.ToString(), " of '", name, "' needs ", need));
        }
        return out;
      },
      version);
}

absl::StatusOr<HostArray> Client::GetRegion(const std::string& name,
                                            const std::string& region_text) {
  TESSERA_ASSIGN_OR_RETURN(std::vector<DimRange> ranges,
                           ParseRanges(region_text));
  TESSERA_ASSIGN_OR_RETURN(TensorMetadata meta, Describe(name));
  TESSERA_ASSIGN_OR_RETURN(Box region, ResolveRegion(ranges, meta.shape));
  return Get(name, region);
}

absl::StatusOr<HostArray> Client::GetShard(const std::string& name,
                                           int64_t index) {
  TESSERA_ASSIGN_OR_RETURN(TensorMetadata meta, Describe(name));
  if (index < 0 || index >= static_cast<int64_t>(meta.shards.size())) {
    return OutOfBoundsError(
        absl::StrCat("shard ", index),
        absl::StrCat("tensor '", name, "' has ", meta.shards.size(),
                     meta.shards.size() == 1 ? " shard" : " shards"));
  }
  ShardHandle handle(connection_,
                     std::make_shared<const TensorMetadata>(std::move(meta)),
                     static_cast<size_t>(index));
  return handle.ToHere();
}

absl::StatusOr<std::vector<ShardHandle>> Client::Handles(
    const std::string& name) {
  TESSERA_ASSIGN_OR_RETURN(TensorMetadata meta, Describe(name));
  auto shared = std::make_shared<const TensorMetadata>(std::move(meta));
  std::vector<ShardHandle> handles;
  for (size_t i = 0; i < shared->shards.size(); ++i)
    handles.emplace_back(connection_, shared, i);
  return handles;
}

absl::StatusOr<UpdateStats> Client::Update(const std::string& name,
                                           const Shape& shape, DType dtype,
                                           const char* data,
                                           const std::optional<Box>& region) {
  const absl::Time start = absl::Now();
  // Checked against the current version, which the update then expects: a
  // change made in between aborts it rather than being overwritten.
  ForgetMetadata(name);
  TESSERA_ASSIGN_OR_RETURN(TensorMetadata current, Describe(name));
  if (dtype != current.dtype) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dtype mismatch: tensor '", name, "' is ", DTypeName(current.dtype),
        ", the new contents are ", DTypeName(dtype)));
  }
  const Box target = region.has_value() ? *region : WholeBox(current.shape);
  TESSERA_RETURN_IF_ERROR(CheckWithin(target, current.shape, "region"));
  if (!SameDims(shape, target.sizes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shape mismatch: the new contents are ", ShapeToString(shape), ", ",
        region.has_value() ? "the region " + target.ToString() + " is "
                           : "tensor '" + name + "' is ",
        ShapeToString(ToShape(target.sizes))));
  }

  v1::UpdateTensorRequest request;
  request.set_name(name);
  request.set_expected_version(current.version);
  if (region.has_value()) {
    request.set_has_region(true);
    request.mutable_region_offsets()->Assign(region->offsets.begin(),
                                             region->offsets.end());
    request.mutable_region_sizes()->Assign(region->sizes.begin(),
                                           region->sizes.end());
  }
  request.set_packed_reply(true);
  v1::UpdateTensorResponse response;
  TESSERA_RETURN_IF_ERROR(
      Call(LongControlCall(*connection_), [&](grpc::ClientContext* context) {
        return connection_->coordinator()->UpdateTensor(context, request,
                                                        &response);
      }));
  TESSERA_ASSIGN_OR_RETURN(
      TensorMetadata next,
      WithCapabilities(TensorMetadataFromProto(response.tensor()),
                       response.capabilities()));
  next.change = response.change_id();
  PendingKeeper keeper(connection_.get(), name, next.version, next.change,
                       response.pending_lease_ms());
  UpdateStats stats;
  stats.version = next.version;
  stats.shards_kept = response.shards_kept();
  absl::Status status =
      ScatterUpdate(*connection_, next, region, data, &stats.bytes_written);
  // As in Put: nothing read from a file that changed meanwhile is committed.
  if (absl::Status input =
          CheckMappedInput(data, ByteSize(shape, ItemSize(dtype)).value_or(0));
      !input.ok()) {
    status = input;
  }
  if (status.ok()) {
    status = CommitVersion(name, next.version, next.change, false,
                           &stats.relayed_bytes);
  }
  if (!status.ok()) {
    // Leave nothing half-made: version N stays, N+1's new shards go.
    CommitVersion(name, next.version, next.change, /*abandon=*/true)
        .IgnoreError();
    return status;
  }
  stats.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return stats;
}

absl::StatusOr<ReshardStats> Client::Reshard(const std::string& name,
                                             const LayoutSpec& spec) {
  ForgetMetadata(name);
  v1::ReshardTensorRequest request;
  request.set_name(name);
  LayoutSpecToProto(spec, request.mutable_spec());
  v1::ReshardTensorResponse response;
  TESSERA_RETURN_IF_ERROR(
      Call(LongControlCall(*connection_), [&](grpc::ClientContext* context) {
        return connection_->coordinator()->ReshardTensor(context, request,
                                                         &response);
      }));
  ReshardStats stats;
  stats.version = response.version();
  stats.pieces_moved = response.pieces_moved();
  stats.bytes_moved = response.bytes_moved();
  stats.bytes_copied_locally = response.bytes_copied_locally();
  stats.shards_kept = response.shards_kept();
  stats.seconds = response.seconds();
  stats.sent.insert(response.sent().begin(), response.sent().end());
  CountWorkersSent(stats.sent);
  return stats;
}

absl::StatusOr<CheckpointListing> Client::DescribeCheckpoint(
    const std::string& dir) {
  v1::DescribeCheckpointRequest request;
  request.set_dir(dir);
  v1::DescribeCheckpointResponse response;
  TESSERA_RETURN_IF_ERROR(
      Call(ControlCall(*connection_, /*idempotent=*/true),
           [&](grpc::ClientContext* context) {
             return connection_->coordinator()->DescribeCheckpoint(
                 context, request, &response);
           }));
  return CheckpointListingFromProto(response.entries(), response.origin());
}

absl::StatusOr<Client::LoadStats> Client::LoadCheckpoint(
    const std::string& dir, const std::vector<LoadEntry>& entries) {
  v1::LoadCheckpointRequest request;
  request.set_dir(dir);
  for (const LoadEntry& e : entries) {
    v1::LoadCheckpointRequest::Entry* out = request.add_entries();
    out->set_entry(e.entry);
    out->set_tensor(e.tensor);
    LayoutSpecToProto(e.spec, out->mutable_spec());
  }
  v1::LoadCheckpointResponse response;
  TESSERA_RETURN_IF_ERROR(
      Call(LongControlCall(*connection_), [&](grpc::ClientContext* context) {
        return connection_->coordinator()->LoadCheckpoint(context, request,
                                                          &response);
      }));
  LoadStats stats;
  for (const v1::TensorSummary& t : response.tensors()) {
    TESSERA_ASSIGN_OR_RETURN(TensorInfo info, TensorInfoFromProto(t));
    stats.tensors.push_back(std::move(info));
  }
  stats.bytes = response.bytes();
  stats.bytes_read = response.bytes_read();
  stats.seconds = response.seconds();
  CountWorkersSent(SentBytes(response.sent().begin(), response.sent().end()));
  return stats;
}

absl::StatusOr<Client::SaveStats> Client::SaveCheckpoint(
    const std::string& dir, const std::vector<std::string>& names,
    const std::string& prefix, bool overwrite) {
  v1::SaveCheckpointRequest request;
  request.set_dir(dir);
  for (const std::string& name : names) request.add_names(name);
  request.set_prefix(prefix);
  request.set_overwrite(overwrite);
  return Save(request);
}

absl::StatusOr<Client::SaveStats> Client::ExportHf(
    const std::string& dir, const std::vector<std::string>& names,
    const std::string& prefix, const HfExport& options) {
  v1::SaveCheckpointRequest request;
  request.set_dir(dir);
  for (const std::string& name : names) request.add_names(name);
  request.set_prefix(prefix);
  request.set_overwrite(options.overwrite);
  request.set_hf(true);
  request.set_strip_prefix(options.strip_prefix);
  request.set_max_file_bytes(options.max_file_bytes);
  return Save(request);
}

absl::StatusOr<Client::SaveStats> Client::Save(
    const v1::SaveCheckpointRequest& request) {
  v1::SaveCheckpointResponse response;
  TESSERA_RETURN_IF_ERROR(
      Call(LongControlCall(*connection_), [&](grpc::ClientContext* context) {
        return connection_->coordinator()->SaveCheckpoint(context, request,
                                                          &response);
      }));
  SaveStats stats;
  stats.tensors.assign(response.tensors().begin(), response.tensors().end());
  stats.bytes = response.bytes();
  stats.files = response.files();
  stats.seconds = response.seconds();
  return stats;
}

absl::StatusOr<MoveProgress> Client::ReshardProgress(const std::string& name) {
  v1::GetMoveProgressRequest request;
  request.set_name(name);
  v1::GetMoveProgressResponse response;
  TESSERA_RETURN_IF_ERROR(
      Call(ControlCall(*connection_, /*idempotent=*/true),
           [&](grpc::ClientContext* context) {
             return connection_->coordinator()->GetMoveProgress(
                 context, request, &response);
           }));
  MoveProgress progress;
  progress.running = response.running();
  progress.bytes_total = std::max<int64_t>(0, response.bytes_total());
  progress.bytes_done =
      std::clamp<int64_t>(response.bytes_done(), 0, progress.bytes_total);
  return progress;
}

absl::StatusOr<uint64_t> Client::WaitForVersion(const std::string& name,
                                                std::optional<uint64_t> version,
                                                absl::Duration timeout) {
  if (timeout <= absl::ZeroDuration() || timeout > absl::Hours(24)) {
    return absl::InvalidArgumentError(
        absl::StrCat("a wait's timeout is more than 0 and at most 24 h, not ",
                     absl::FormatDuration(timeout)));
  }
  const absl::Time deadline = absl::Now() + timeout;
  v1::WaitForVersionRequest request;
  request.set_name(name);
  if (version.has_value()) {
    request.set_min_version(std::max<uint64_t>(*version, 1));
  } else {
    // Fixed here, not by the coordinator, so that a wait carried on at the
    // next leader waits for the same version.
    TESSERA_ASSIGN_OR_RETURN(const TensorMetadata now, Describe(name));
    request.set_min_version(now.version + 1);
  }
  while (true) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(absl::StrCat(
          "timeout: tensor '", name, "' did not reach version ",
          request.min_version(), " within ", absl::FormatDuration(timeout)));
    }
    request.set_timeout_ms(
        std::max<int64_t>(1, absl::ToInt64Milliseconds(left)));
    v1::WaitForVersionResponse response;
    // One attempt per call; a coordinator that went away (a failover, a
    // restart) is asked again, the next leader found by the channels.
    CallOptions call = CoordinatorCall(*connection_, /*idempotent=*/false,
                                       left + absl::Seconds(5));
    absl::Status status = Call(call, [&](grpc::ClientContext* context) {
      return connection_->coordinator()->WaitForVersion(context, request,
                                                        &response);
    });
    if (status.ok()) return response.version();
    // CANCELLED is never this call's own doing (it has no cancel and no
    // idle timeout): a server that stopped under it, as a standby does
    // when it takes over.
    if (!absl::IsUnavailable(status) && !absl::IsCancelled(status)) {
      return status;
    }
    absl::SleepFor(
        std::min(absl::Milliseconds(200),
                 std::max(absl::ZeroDuration(), deadline - absl::Now())));
  }
}

}  // namespace tessera
