// The tessera C++ SDK. A Client talks to the coordinator for metadata and
// straight to the workers for data:
//
//   auto client = Client::Connect("127.0.0.1:7070");
//   (*client)->Put("emb", array, LayoutSpec::Chunk(0, {rank0, rank1}));
//   absl::StatusOr<HostArray> rows = (*client)->Get("emb", region);
//
// A Client is safe for concurrent use from many threads.
#ifndef TESSERA_CLIENT_TESSERA_CLIENT_H_
#define TESSERA_CLIENT_TESSERA_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "client/client_options.h"
#include "client/device_view.h"
#include "client/host_array.h"
#include "core/box.h"
#include "core/box_index.h"
#include "core/dtype.h"
#include "core/file_runs.h"
#include "core/init_fill.h"
#include "core/layout_spec.h"
#include "core/tensor_metadata.h"
#include "core/transfer.h"
#include "core/worker_info.h"
#include "transport/transport_chain.h"

namespace tessera {

namespace v1 {
class SaveCheckpointRequest;
}  // namespace v1

class Connection;    // client/connection.h: channels, stubs, data plane
class DeviceAccess;  // client/device_access.h: the GPU side (CUDA builds)

// What one principal holds against its quota (Client::Quotas).
struct QuotaInfo {
  std::string principal;     // "anonymous": the cluster authenticates no one
  int64_t bytes = 0;         // every replica, mirror and pending new shard
  int64_t bytes_limit = -1;  // -1: unlimited
  int64_t names = 0;         // tensor names held, pending ones too
  int64_t names_limit = -1;  // -1: unlimited
};

struct TensorInfo {
  std::string name;
  Shape shape;
  DType dtype = DType::kFloat32;
  uint64_t version = 0;
  int64_t num_shards = 0;
  int64_t replicas = 1;  // workers holding each shard
  std::string mirror;    // its mirror group's selector; empty: none
  // Listed with List(all): a change not committed yet, "put" (the tensor
  // is not visible yet) or "update" to pending_version, by pending_owner
  // (empty without tokens), begun at pending_since.
  std::string pending;
  uint64_t pending_version = 0;
  std::string pending_owner;
  absl::Time pending_since;
};

// What a reshard cost (CLI.md "reshard --json").
using ReshardStats = ReshardResult;

// What an update did (CLI.md "put --update --json").
struct UpdateStats {
  uint64_t version = 0;       // the version written
  int64_t bytes_written = 0;  // bytes sent to the workers
  int64_t shards_kept = 0;    // shards taken over unchanged (no copy)
  double seconds = 0;
  // What the commit's copies sent between workers in all (replicas and
  // mirrors: only the changes to those holding version N, CLI.md "Mirrors
  // (v4)").
  int64_t relayed_bytes = 0;
};

// RRef-like handle to one shard of one version of a tensor. ToHere() reads
// the shard's bytes straight from its worker; once that version's shards are
// freed (tensor deleted or resharded) it fails with a clear error instead of
// returning other data.
// One coordinator as `tessera coordinators` lists it.
struct CoordinatorStatus {
  std::string address;
  std::string role;  // "leader" or "standby"
  bool alive = false;
};

class ShardHandle {
 public:
  ShardHandle(std::shared_ptr<Connection> connection,
              std::shared_ptr<const TensorMetadata> meta, size_t index);

  const std::string& tensor() const { return meta_->name; }
  uint64_t version() const { return meta_->version; }
  size_t index() const { return index_; }
  const ShardInfo& shard() const { return meta_->shards[index_]; }
  DType dtype() const { return meta_->dtype; }
  // "NAME@vVERSION#SHARD_ID", as `describe` prints it.
  std::string ToString() const { return meta_->HandleString(index_); }

  // The shard's data: an array of the shard's sizes.
  absl::StatusOr<HostArray> ToHere() const;

 private:
  std::shared_ptr<Connection> connection_;
  std::shared_ptr<const TensorMetadata> meta_;
  size_t index_;
};

class Client {
 public:
  // Connects to the coordinator at HOST:PORT; fails with a clear message
  // (naming the address) if it cannot be reached within connect_timeout.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(
      const std::string& coordinator, ClientOptions options = {});

  absl::StatusOr<std::vector<WorkerInfo>> Workers();
  // The coordinators this client was given and those sharing their
  // metadata: which leads, which stand by; an address given that is not
  // standing (down) is listed as a standby that is not alive.
  absl::StatusOr<std::vector<CoordinatorStatus>> Coordinators();
  // What principals hold against their quotas (CLI.md "Quotas (v4)"): an
  // admin sees every principal, others only themselves.
  absl::StatusOr<std::vector<QuotaInfo>> Quotas();
  // Worker management (the admin role; CLI.md "Replicas (v3)"): kCordoned,
  // kReady (uncordon) or kDraining. NOT_FOUND for an unknown worker.
  absl::Status SetWorkerState(const std::string& worker, WorkerState state);
  // Drains `worker` (kDraining) and waits until it holds nothing: each of
  // its shards has replicas elsewhere and its own are freed. NOT_FOUND for
  // an unknown worker; DEADLINE_EXCEEDED saying what it still holds after
  // `timeout` (the drain goes on).
  absl::Status DrainWorker(const std::string& worker, absl::Duration timeout);
  // Forgets a dead or drained worker; FAILED_PRECONDITION ("holds") while
  // it holds the only replica of a shard.
  absl::Status RemoveWorker(const std::string& worker);

  // Allocates a sharded tensor filled per `init`.
  absl::StatusOr<TensorMetadata> Create(const std::string& name,
                                        const Shape& shape, DType dtype,
                                        const LayoutSpec& spec,
                                        const InitSpec& init = {});

  // Scatters a row-major array of `shape` into a new sharded tensor. The
  // tensor becomes visible only once every shard is written; on failure it
  // is removed. When `data` lies in a MappedInputFile (client/
  // mapped_file.h: a .npy or .safetensors file the CLI or SDK mapped), a
  // file that shrank or changed while it was read fails the put
  // (FAILED_PRECONDITION "changed while it was read") before the commit.
  // `origin`: what a safetensors import records (kept for an export).
  absl::StatusOr<TensorMetadata> Put(const std::string& name,
                                     const Shape& shape, DType dtype,
                                     const char* data, const LayoutSpec& spec,
                                     const FileOrigin& origin = {});
  absl::StatusOr<TensorMetadata> Put(const std::string& name,
                                     const HostArray& array,
                                     const LayoutSpec& spec) {
    return Put(name, array.shape, array.dtype, array.data(), spec);
  }

  absl::StatusOr<TensorMetadata> Describe(const std::string& name);
  // The tensors; with `all`, puts not committed yet too, and what change of
  // each is pending.
  absl::StatusOr<std::vector<TensorInfo>> List(bool all = false);
  // Deletes the tensor; with `incarnation` (TensorMetadata::incarnation),
  // only that tensor, never a later one of its name (NOT_FOUND then).
  absl::Status Delete(const std::string& name, uint64_t incarnation = 0);

  // Gathers the whole tensor, or `region` of it (tensor coordinates).
  absl::StatusOr<HostArray> Get(
      const std::string& name, const std::optional<Box>& region = std::nullopt);
  // Same, into a caller's buffer of exactly the region's byte size. With
  // `version`, the version whose bytes were read.
  absl::Status GetInto(const std::string& name,
                       const std::optional<Box>& region, char* out,
                       int64_t out_bytes, uint64_t* version = nullptr);
  // The region `resolve` picks from the tensor's metadata (cached, else
  // fresh: no describe of its own), into a new array; for regions that
  // depend on the shape, such as NumPy keys. `resolve` may run again on
  // fresher metadata; its error fails the read.
  absl::StatusOr<HostArray> GetResolved(
      const std::string& name,
      const std::function<absl::StatusOr<Box>(const TensorMetadata&)>& resolve);
  // Region given as text ("0:5,:"; NumPy rules for negatives and open ends).
  absl::StatusOr<HostArray> GetRegion(const std::string& name,
                                      const std::string& region_text);
  // Rows `indices` of dim 0 (any order, repeats allowed; negatives count
  // from the end), as an array of shape [indices.size()] + shape[1:], row i
  // being row indices[i]. Each distinct row is read once, with one batched
  // request per worker, and repeats are copied here: TransferStats() grows
  // by the distinct rows' bytes, not the output's. OUT_OF_RANGE "out of
  // bounds" for an index outside.
  absl::StatusOr<HostArray> GatherRows(const std::string& name,
                                       absl::Span<const int64_t> indices);
  // Same, into a caller's buffer of exactly that array's byte size. With
  // `version`, the version whose bytes were read.
  absl::Status GatherRowsInto(const std::string& name,
                              absl::Span<const int64_t> indices, char* out,
                              int64_t out_bytes, uint64_t* version = nullptr);

  // Writes new contents into an existing tensor as version N+1, keeping its
  // layout: `data` is a row-major array of `shape`, which must equal the
  // tensor's (or, with `region`, the region's sizes), of the tensor's
  // dtype. With a region, shards outside it are taken over unchanged.
  // Readers see all of N or all of N+1. Of two concurrent changes of one
  // tensor one gets ABORTED and leaves nothing behind. Data from a mapped
  // input file that changed while it was read fails it, as in Put.
  absl::StatusOr<UpdateStats> Update(
      const std::string& name, const Shape& shape, DType dtype,
      const char* data, const std::optional<Box>& region = std::nullopt);
  absl::StatusOr<UpdateStats> Update(
      const std::string& name, const HostArray& array,
      const std::optional<Box>& region = std::nullopt) {
    return Update(name, array.shape, array.dtype, array.data(), region);
  }

  // Shard `index` (0-based in describe order).
  absl::StatusOr<HostArray> GetShard(const std::string& name, int64_t index);

  // Handles of every shard of the current version.
  absl::StatusOr<std::vector<ShardHandle>> Handles(const std::string& name);

  // Moves the tensor to a new layout (version + 1).
  absl::StatusOr<ReshardStats> Reshard(const std::string& name,
                                       const LayoutSpec& spec);
  // What checkpoint directory `dir` (relative to the workers'
  // --checkpoint_root) holds.
  absl::StatusOr<CheckpointListing> DescribeCheckpoint(const std::string& dir);
  // One tensor per entry of `dir`, each in its layout, the workers reading
  // only their shards' bytes from the files; all or nothing. The result's
  // tensors hold name, shape, dtype, version and shard count only.
  struct LoadEntry {
    std::string entry;   // its name in the directory
    std::string tensor;  // the tensor to make
    LayoutSpec spec;
  };
  struct LoadStats {
    std::vector<TensorInfo> tensors;
    int64_t bytes = 0;
    int64_t bytes_read = 0;
    double seconds = 0;
  };
  absl::StatusOr<LoadStats> LoadCheckpoint(
      const std::string& dir, const std::vector<LoadEntry>& entries);

  // Saves the tensors `names` (or, none given, every tensor whose name
  // starts with `prefix`), each at its current version, into `dir`
  // (relative to the workers' --checkpoint_root): each worker writes the
  // shards it holds into its own file; then the index files go in.
  struct SaveStats {
    std::vector<std::string> tensors;
    int64_t bytes = 0;
    int64_t files = 0;
    double seconds = 0;
  };
  // A checkpoint already in `dir` that another principal saved (or that
  // tessera did not save) is replaced only with `overwrite`: else
  // ALREADY_EXISTS naming who saved it.
  absl::StatusOr<SaveStats> SaveCheckpoint(
      const std::string& dir, const std::vector<std::string>& names,
      const std::string& prefix = "", bool overwrite = false);
  // The tensors as a Hugging Face sharded directory `dir` under the
  // workers' --checkpoint_root (export --hf): model-0000K-of-0000N
  // .safetensors files of whole tensors, each at most `max_file_bytes` of
  // data (0: 5 GB) unless one tensor is larger, named less `strip_prefix`,
  // and model.safetensors.index.json; written by the workers holding the
  // shards. A checkpoint already in `dir` is replaced as SaveCheckpoint's.
  struct HfExport {
    std::string strip_prefix;
    int64_t max_file_bytes = 0;
    bool overwrite = false;
  };
  absl::StatusOr<SaveStats> ExportHf(const std::string& dir,
                                     const std::vector<std::string>& names,
                                     const std::string& prefix,
                                     const HfExport& options);

  // How far the move of `name`'s bytes running now (a reshard, a repair, a
  // load or a save) has got; what a caller waiting on Reshard in another
  // thread can show.
  absl::StatusOr<MoveProgress> ReshardProgress(const std::string& name);

  // Waits until `name`'s committed version is at least `version` (nullopt:
  // one more than it is now) and returns it; at once if it already is. No
  // polling: the coordinator answers at the commit. DEADLINE_EXCEEDED
  // ("timeout") after `timeout`; NOT_FOUND when the tensor is unknown or
  // deleted meanwhile; RESOURCE_EXHAUSTED ("waiters") when the coordinator
  // holds --max_waiters waits. Given several coordinators, a wait carries
  // on at the next leader after a failover, within `timeout`.
  absl::StatusOr<uint64_t> WaitForVersion(const std::string& name,
                                          std::optional<uint64_t> version,
                                          absl::Duration timeout);

  const std::string& coordinator_address() const;

  // --- GPU. An SDK built without --config=cuda, or a process without a
  // usable GPU, answers FAILED_PRECONDITION saying so. ---

  // Copies the whole tensor, or `region` of it, into `dst`: device memory
  // of exactly the region's byte size on CUDA device `device`, row-major.
  // Shards that a worker on this host keeps in GPU memory are copied device
  // to device through CUDA IPC (no host copy); the others are read through
  // the host and copied up.
  absl::Status GetIntoDevice(const std::string& name,
                             const std::optional<Box>& region, void* dst,
                             int64_t dst_bytes, int device);
  // Opens every shard of the tensor in this process, zero copy: each view
  // points at the worker's own device memory (held by a worker on this
  // host), valid until its valid_until; call again to renew. The weight
  // cache of an inference engine that restarts.
  absl::StatusOr<std::vector<DeviceShardView>> MapDevice(
      const std::string& name);

  // Bytes each transport moved for this client since it connected, and the
  // times a transport declined a move (a fallback), by transport name
  // ("shm", "ucx", "grpc", and "cuda_ipc" for device-to-device copies):
  // what `get --json` reports and metrics count. These are bytes that
  // crossed a transport, not bytes delivered: a row gather moves each
  // distinct row once (so with repeated indices they are fewer than the
  // output's), and a read retried elsewhere counts both moves.
  DataPlaneStats TransferStats() const;

 private:
  explicit Client(std::shared_ptr<Connection> connection);
  // The GPU side, made on first use (null without CUDA).
  absl::StatusOr<DeviceAccess*> Device();
  // Describe; with `lease`, the version is held for this read until
  // ReleaseRead (or the coordinator's lease time).
  absl::StatusOr<TensorMetadata> DescribeInternal(const std::string& name,
                                                  bool lease);
  void ReleaseRead(const std::string& name, uint64_t version);
  // Adds a reply's bytes sent by each worker to TransferStats().
  void CountWorkersSent(const SentBytes& sent);
  // A save or an export --hf: one call, one reply.
  absl::StatusOr<SaveStats> Save(const v1::SaveCheckpointRequest& request);
  // Commits the put or update `change` (its reply's change id) that made
  // version `version`, or abandons it: never another client's. `relayed`
  // (optional) gets what its copies sent between workers in all.
  absl::Status CommitVersion(const std::string& name, uint64_t version,
                             uint64_t change, bool abandon,
                             int64_t* relayed = nullptr);
  absl::StatusOr<TensorMetadata> CreateInternal(
      const std::string& name, const Shape& shape, DType dtype,
      const LayoutSpec& spec, const InitSpec& init, bool pending,
      const FileOrigin& origin = {}, int64_t* pending_lease_ms = nullptr);
  // Runs `read` on the tensor's metadata (cached, else fresh) and the
  // cached BoxIndex (may be null). A failure on cached metadata is retried
  // on fresh metadata, and a read of a version replaced and freed meanwhile
  // (ABORTED) on the new version, so a read sees one version whole. Sets
  // `*version` (when given) to the version the successful read read: the
  // only one a caller may report with the bytes.
  absl::Status ReadWithRetry(
      const std::string& name,
      const std::function<absl::Status(const TensorMetadata&, const BoxIndex*)>&
          read,
      uint64_t* version);
  // Reads rows `indices` of the tensor (an array of `shape`: [n] +
  // shape[1:], checked) into the buffer `destination` gives.
  absl::Status ReadRows(const std::string& name,
                        absl::Span<const int64_t> indices,
                        const std::function<absl::StatusOr<char*>(
                            const TensorMetadata&, const Shape&)>& destination,
                        uint64_t* version);
  // Reads `region` of the tensor into the buffer `destination` gives.
  absl::Status ReadRegion(const std::string& name,
                          const std::optional<Box>& region,
                          const std::function<absl::StatusOr<char*>(
                              const TensorMetadata&, const Box&)>& destination,
                          uint64_t* version);

  // Metadata of one tensor version, and once it is read from the cache, a
  // BoxIndex of its shard boxes, so each region fetch finds its shards in
  // O(log n + pieces) rather than by looking at all n.
  struct CachedTensor {
    std::shared_ptr<const TensorMetadata> meta;
    std::shared_ptr<const BoxIndex> index;  // null until first needed
  };

  // The cached metadata of `name` (null meta when none), with its index
  // built if the tensor has enough shards for it to pay.
  CachedTensor CachedMetadata(const std::string& name)
      ABSL_LOCKS_EXCLUDED(cache_mu_);
  void CacheMetadata(std::shared_ptr<const TensorMetadata> meta)
      ABSL_LOCKS_EXCLUDED(cache_mu_);
  void ForgetMetadata(const std::string& name) ABSL_LOCKS_EXCLUDED(cache_mu_);

  std::shared_ptr<Connection> connection_;

  // Metadata of tensors read recently, so a region fetch is one call to one
  // worker instead of two round trips. Shard ids are never reused, so a stale
  // entry cannot return other data — it can only fail (a freed shard, a dead
  // worker, a region outside an old shape); any failure on a cached entry
  // drops it and the read is retried once on fresh metadata.
  mutable absl::Mutex sent_mu_;
  std::map<std::string, int64_t> workers_sent_ ABSL_GUARDED_BY(sent_mu_);
  mutable absl::Mutex device_mu_;
  std::shared_ptr<DeviceAccess> device_ ABSL_GUARDED_BY(device_mu_);
  absl::Mutex cache_mu_;
  absl::flat_hash_map<std::string, CachedTensor> metadata_cache_
      ABSL_GUARDED_BY(cache_mu_);
};

}  // namespace tessera

#endif  // TESSERA_CLIENT_TESSERA_CLIENT_H_
