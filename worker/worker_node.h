// WorkerNode: what a worker does, in core types and without gRPC. It
// allocates shards (all or none), writes them, plans region reads, names the
// shared-memory segment behind a shard for same-host readers, executes
// transfers (pieces whose source is held here are copied in memory, the
// others are read from the source worker through the data plane), and frees
// shards. WorkerService is a thin gRPC layer over it; the fuzzers drive it
// directly.
//
// Thread-safe: the store and the data plane are, and the node's own state
// is fixed at construction.
#ifndef TESSERA_WORKER_WORKER_NODE_H_
#define TESSERA_WORKER_WORKER_NODE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "core/box.h"
#include "core/capability.h"
#include "core/init_fill.h"
#include "core/layout_spec.h"
#include "core/limits.h"
#include "core/read_pacer.h"
#include "core/stop.h"
#include "core/transfer.h"
#include "rpc/channel.h"
#include "transport/shard_transport.h"
#include "transport/shared_memory_arena.h"
#include "transport/transport_chain.h"
#include "worker/checkpoint_io.h"
#include "worker/device_exchange.h"
#include "worker/relay_fills.h"
#include "worker/shard_store.h"
#include "worker/staging_pool.h"

namespace tessera {

// The worker's options, its limits among them (README "Limits").
struct WorkerNodeOptions {
  // Bytes per chunk of a region read when the reader asks for none; tuned
  // in bench/.
  int64_t chunk_bytes = kChunkBytes;

  // --- Limits on what one caller can make the worker hold ---

  // Most shards one AllocateShards may name (more: INVALID_ARGUMENT). The
  // coordinator sends all of a tensor's shards on one worker in one
  // request, so this is at least kMaxShardsPerTensor.
  int64_t max_shards_per_request = kMaxShardsPerTensor;
  // A ReadRegion or WriteShard stream whose peer takes or sends no message
  // for this long is cancelled, which releases its thread and the shard
  // memory its chunks pin (a reader that never reads).
  absl::Duration stream_idle_timeout = absl::Seconds(30);
  // Most ReadRegion and WriteShard streams served at once; more are
  // refused with RESOURCE_EXHAUSTED (unary calls keep their threads).
  int max_streams = 128;
  // Most small reads (ReadSmallRegion, ReadRows) in flight at once where
  // they run on gRPC's callback API (WorkerService), each until its reply
  // is written: no pool thread bounds them there. More are refused with
  // RESOURCE_EXHAUSTED; 0: no limit. The worker sets --max_threads.
  int max_small_reads = 512;

  // --- Pulls from peers (reshard transfers) ---

  // A pull is bounded once: by the order's deadline (the coordinator's),
  // and by `pull_timeout` when the order has none. A peer that sends
  // nothing for `pull_idle_timeout` is given up on (UNAVAILABLE).
  absl::Duration pull_timeout = absl::Minutes(10);
  absl::Duration pull_idle_timeout = absl::Seconds(30);
  // Most peer channels kept (least recently used dropped): an order names
  // any address, and each channel holds a connection.
  size_t max_peer_channels = 64;
  // The links to peers (TLS credentials). Its idle_timeout is at most
  // pull_idle_timeout.
  ChannelOptions channels;
  // How pieces held by other workers are read. A reshard reads each piece
  // once, so mappings are not kept per shard; a same-host piece of any size
  // is copied out of the source's shared memory. Peers' segments stay
  // mapped by identity (up to 8 GiB of address space and 256 segments; the
  // pages are the peers'), so a later reshard that finds a peer's reused
  // pages maps nothing. Its timeout is at most pull_timeout.
  DataPlaneOptions peers = [] {
    DataPlaneOptions options;
    options.cache_mappings = false;
    options.keep_segment_bytes = int64_t{8} << 30;
    options.shared_memory_min_bytes = 0;
    return options;
  }();
  // The shared memory holding the store's large shards (the same arena the
  // HostShardStore was given), so MapShard can name a shard's segment, and
  // the staging slots of StageRead. Null: no shard is offered for mapping,
  // and shards in GPU memory are read over gRPC only.
  std::shared_ptr<SharedMemoryArena> arena;

  // --- Shards in GPU memory ---

  // How long a CUDA IPC export keeps a shard's device memory after the
  // MapShard that asked for it, freed or not: a client's mapping is valid
  // that long, and renews it by asking again.
  absl::Duration device_export_hold = absl::Minutes(1);
  // Most bytes of page-locked staging blocks (StageRead) at once; a stream
  // past it is refused (RESOURCE_EXHAUSTED) and its client reads over gRPC
  // instead. Up to a quarter of it stays made between reads.
  int64_t max_staging_bytes = int64_t{1} << 30;
  // NCCL between GPU workers (not owned; outlives the node). Null: this
  // worker takes no part in exchanges (FAILED_PRECONDITION).
  DeviceExchange* exchange = nullptr;

  // Where checkpoints are read from (--checkpoint_root): directories a load
  // names are relative to it; empty: this worker reads none.
  std::string checkpoint_root;

  // --- Bandwidth per principal (core/read_pacer.h) ---

  // Bytes per second this worker serves each principal's reads over gRPC
  // and its data port, at most (--principal_read_rate): a read past it is
  // delayed, never refused. 0: no limit. Same-host shared memory and UCX
  // (whose readers copy the bytes themselves) are not paced.
  int64_t principal_read_rate = 0;
};

// One shard of an allocation.
struct ShardAllocation {
  uint64_t id = 0;
  ShardDesc desc;
};

// What a same-host reader needs to map a shard's bytes.
struct SharedShardInfo {
  std::string host_id;  // LocalHostId() of this worker
  SegmentInfo segment;  // name, size, liveness lock (host shards)
  Shape shape;          // the shard's box sizes
  int64_t item_bytes = 1;
  // A shard in GPU memory has no segment: the device instead, and, when
  // asked for, its CUDA IPC handle, valid `hold` from now.
  std::optional<DeviceInfo> device;
  // A host shard in private memory has none either: read it staged.
  bool staged = false;
  // The segment is a --store_dir shard's file (its absolute path), which
  // readers on this host map read-only.
  bool file = false;
  std::string ipc_handle;
  absl::Duration hold;
};

// A validated read of a sub-box of one shard, cut into chunks of whole
// elements. When the sub-box is one run of the shard's host memory,
// `contiguous_base()` points at its first byte, kept valid by
// `keep_alive()` even after the shard is freed, so chunks can be sent
// without copying. A value; safe to use from one thread at a time.
class RegionReader {
 public:
  uint64_t id() const { return id_; }
  const Box& box() const { return box_; }
  int64_t item() const { return item_; }
  int64_t total() const { return total_; }  // elements
  int64_t chunk_elements() const { return chunk_elements_; }
  const char* contiguous_base() const { return base_; }
  const std::shared_ptr<void>& keep_alive() const { return pinned_; }

  // Copies elements [begin, begin + count) of the row-major sub-box to `dst`.
  absl::Status Read(int64_t begin, int64_t count, char* dst) const;
  // OK when the whole sub-box fits one message (kMaxChunkBytes), else
  // INVALID_ARGUMENT.
  absl::Status FitsOneMessage() const;
  // The whole sub-box into `out`, if it fits one message.
  absl::Status ReadAll(std::string* out) const;

 private:
  friend class WorkerNode;
  ShardStore* store_ = nullptr;
  uint64_t id_ = 0;
  Box box_;
  int64_t item_ = 1;
  int64_t chunk_elements_ = 1;
  int64_t total_ = 0;
  std::shared_ptr<void> pinned_;  // set with base_
  const char* base_ = nullptr;
};

// Largest staging slot a StageRead stream may ask for.
inline constexpr int64_t kMaxStageSlotBytes = int64_t{64} << 20;

// A sub-box of a shard in GPU memory, read through two page-locked slots of
// a shared-memory block lent by the worker's StagingPool, which a client on
// this host maps (Worker.StageRead): each chunk is copied from the device
// straight into a slot, at the full speed of the link. Destroying it gives
// the block back. Used by one stream, from one thread at a time.
class StagedRegion {
 public:
  ~StagedRegion() = default;
  StagedRegion(const StagedRegion&) = delete;
  StagedRegion& operator=(const StagedRegion&) = delete;

  const SegmentInfo& segment() const { return block_->segment; }
  int64_t slot_bytes() const { return slot_bytes_; }
  int64_t total() const { return reader_.total(); }  // elements

  // Copies elements [first, first + count) of the row-major sub-box into
  // slot `slot` (0 or 1) and returns their bytes. OUT_OF_RANGE outside the
  // sub-box; INVALID_ARGUMENT for another slot or more than a slot.
  absl::StatusOr<int64_t> Fill(int64_t first, int64_t count, int slot);

 private:
  friend class WorkerNode;
  StagedRegion(RegionReader reader, StagingPool::Lease block,
               int64_t slot_bytes)
      : reader_(std::move(reader)),
        block_(std::move(block)),
        slot_bytes_(slot_bytes) {}

  RegionReader reader_;
  StagingPool::Lease block_;
  int64_t slot_bytes_;
};

class WorkerNode {
 public:
  // `store` is not owned and outlives the node. `peers` reads transfer
  // pieces from other workers; null: the standard chain (same-host shared
  // memory, then gRPC) per options.peers, over the node's own channels.
  WorkerNode(ShardStore* store, WorkerNodeOptions options,
             std::unique_ptr<ShardTransport> peers = nullptr);
  ~WorkerNode();

  ShardStore& store() const { return *store_; }
  const WorkerNodeOptions& options() const { return options_; }
  // Held while this worker moves bytes (serves a read, pulls a piece): its
  // arena then makes no warm pages (SharedMemoryArena::Moving). Null
  // without an arena.
  std::shared_ptr<void> MovingBytes() const {
    return options_.arena != nullptr ? options_.arena->Moving() : nullptr;
  }
  // Checkpoint I/O under options().checkpoint_root, on this node's shards.
  const CheckpointIo& checkpoints() const { return checkpoints_; }

  // Allocates every shard and fills it per `init`, or none: on any failure,
  // or when `cancelled` (polled now and then, may be empty) turns true, the
  // shards allocated so far are freed again. INVALID_ARGUMENT for more than
  // options().max_shards_per_request shards. `init` is parsed once.
  absl::Status Allocate(absl::Span<const ShardAllocation> shards,
                        const InitSpec& init,
                        const std::function<bool()>& cancelled = {});

  // Copies `data` to bytes [byte_offset, +size) of shard `id`.
  absl::Status Write(uint64_t id, int64_t byte_offset, absl::string_view data);
  // Copies `data` to bytes [byte_offset, +size) of the row-major sub-box
  // `box` (shard coordinates) of shard `id`: a regional update's patch.
  // OUT_OF_RANGE for a box outside the shard or bytes past its end;
  // INVALID_ARGUMENT for a part of an element.
  absl::Status WriteBox(uint64_t id, const Box& box, int64_t byte_offset,
                        absl::string_view data);

  // Rows of one shard for ReadRows: whole rows (dim 0, shard coordinates).
  struct ShardRows {
    uint64_t id = 0;
    std::vector<int64_t> rows;
  };
  // Appends every row of every entry to `out`, whole and in order: one
  // call serves a row gather's rows on this worker. NOT_FOUND for a shard
  // not held, OUT_OF_RANGE for a row outside its shard, INVALID_ARGUMENT
  // for a 0-d shard or more than kMaxChunkBytes of rows (or
  // kMaxRowsPerRead rows) in one call. `out` is cleared first.
  absl::Status ReadRows(absl::Span<const ShardRows> shards,
                        std::string* out) const;

  // Plans a read of `box` (shard coordinates) of shard `id`, in chunks of
  // about `chunk_bytes` (0: the node's default; at most kMaxChunkBytes).
  // NOT_FOUND for a shard not held, OUT_OF_RANGE for a box outside it.
  absl::StatusOr<RegionReader> OpenRegion(uint64_t id, const Box& box,
                                          int64_t chunk_bytes) const;

  // Reads `box` of shard `id`, whose elements the caller expects to be
  // `item_bytes` wide, into `target`, in this process (chunk by chunk
  // through a bounded buffer). INVALID_ARGUMENT when the element size
  // differs.
  absl::Status ReadRegion(uint64_t id, const Box& box, int64_t item_bytes,
                          const ReadTarget& target) const;

  // Names the shared-memory segment holding shard `id`, or, for a shard in
  // GPU memory, the device (and with `device_handle` its CUDA IPC handle,
  // the memory held options().device_export_hold from now).
  // FAILED_PRECONDITION when the shard is in private host memory; NOT_FOUND
  // when it is not held.
  absl::StatusOr<SharedShardInfo> MapShard(uint64_t id,
                                           bool device_handle = false) const;

  // Opens a staged read of `box` (shard coordinates) of shard `id`, held in
  // GPU memory or in private host memory, with two slots of `slot_bytes`
  // (whole elements, at most kMaxStageSlotBytes), for a reader of
  // `item_bytes`-byte elements (INVALID_ARGUMENT when the shard's differ).
  // FAILED_PRECONDITION for a shard in shared memory (map it) or a worker
  // without shared memory;
  // RESOURCE_EXHAUSTED past options().max_staging_bytes; NOT_FOUND /
  // OUT_OF_RANGE as OpenRegion.
  absl::StatusOr<std::unique_ptr<StagedRegion>> OpenStaged(
      uint64_t id, const Box& box, int64_t slot_bytes,
      int64_t item_bytes) const;

  // Moves every piece of `batch` into shards held here and returns the
  // bytes written. Destination boxes are checked against their shards
  // first. Fails with UNAVAILABLE naming the source worker when it cannot be
  // reached or stalls (options().pull_idle_timeout); stops at the first
  // failure. Every read from the source ends by `stop.deadline` (at the
  // latest options().pull_timeout from now): DEADLINE_EXCEEDED after it;
  // CANCELLED once `stop.cancelled` (checked between pieces) turns true.
  //
  // A relay hop (batch.relay.id != 0; core/relay_plan.h) pulls its one
  // whole-shard piece chunk by chunk, each once its source holds it when the
  // source is itself filling (asked through the RelayUpstreams), and
  // records its own progress for the hop after it (AwaitRelayFill). When
  // its source fails it carries on from the next upstream, from the chunk
  // it had reached. `sent` (optional) gets the bytes each source sent.
  absl::StatusOr<int64_t> Transfer(const TransferBatch& batch,
                                   const StopCondition& stop = {},
                                   SentBytes* sent = nullptr);

  // How far relay `relay`'s fill of `shard` here got: answers once it holds
  // more than `have` chunks, ends, or `until` passes. UNAVAILABLE when the
  // fill failed.
  absl::StatusOr<RelayFillProgress> AwaitRelayFill(uint64_t relay,
                                                   uint64_t shard, int64_t have,
                                                   absl::Time until) {
    return relay_fills_.Await(relay, shard, have, until);
  }
  // Bytes [byte_offset, byte_offset + bytes) of shard `id` as the changes
  // from the same bytes of `base_id`, another version of the same shard
  // held here (core/delta_codec.h), when they take at most
  // max_encoded_bytes (else not `encoded`). INVALID_ARGUMENT when the two
  // are not versions of one shard, or the range is not whole elements
  // within it or is longer than kMaxRelayChunkBytes.
  absl::StatusOr<ShardDelta> ReadShardDelta(
      uint64_t id, uint64_t base_id, const ShardDeltaRequest& request) const;
  // How relay hops here ask their sources (not owned; set before the node
  // serves; without it, a relay hop whose source is filling is refused).
  void SetRelayUpstreams(RelayUpstreams* upstreams) {
    relay_upstreams_ = upstreams;
  }
  // The node's channels to its peers (null when its transport was given).
  ChannelCache* peer_channels() const { return channels_.get(); }

  // Bootstraps this worker hosts whose communicator never formed: NCCL's
  // root thread for each waits for its members for the life of the
  // process. Past this many, ExchangeId refuses (RESOURCE_EXHAUSTED) and
  // exchanges that need this worker's id are pulled instead.
  static constexpr size_t kMaxUnformedExchanges = 64;

  // A communicator id for an exchange this worker hosts (DeviceExchange).
  absl::StatusOr<std::string> ExchangeId() ABSL_LOCKS_EXCLUDED(exchange_mu_);
  // This worker's share of an exchange: every shard it names must be held
  // here (NOT_FOUND) and every box lie inside its shard (OUT_OF_RANGE),
  // checked before anything moves. Returns the bytes received. Ends by
  // `stop` (its deadline at the latest options().pull_timeout from now).
  absl::StatusOr<int64_t> Exchange(const ExchangePlan& plan, StopCondition stop)
      ABSL_LOCKS_EXCLUDED(exchange_mu_);

  // Frees the shards; unknown ids are fine (frees are retried).
  absl::Status Free(absl::Span<const uint64_t> ids);

  // --- Obeying only the cluster (core/capability.h) ---

  // This worker's name and the key its capabilities are checked with, from
  // each registration. Until the first, every call is refused.
  // `cluster_id`: the cluster served, recorded with each shard a store
  // persists (ShardStore::Persist).
  void SetIdentity(std::string name, std::string key,
                   std::string cluster_id = "") ABSL_LOCKS_EXCLUDED(mu_);
  // OK when the capability `token` lets its bearer call `full_method` on
  // shards `ids`: signed for this worker, unexpired, with the method's right
  // (core/capability.h's table) and, for reads and writes, naming each
  // shard's tensor (reads: at the shard's version or later, since a reshard
  // keeps unchanged shards; writes: exactly its version); a write also
  // needs a writable, unsealed shard.
  // PERMISSION_DENIED (UNAVAILABLE before registration) otherwise.
  absl::Status Admit(absl::string_view token, absl::string_view full_method,
                     absl::Span<const uint64_t> ids) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // The same, also naming the principal the capability was granted to
  // (empty: the coordinator's own moves, or a cluster without identities).
  absl::Status Admit(absl::string_view token, absl::string_view full_method,
                     absl::Span<const uint64_t> ids,
                     std::string* principal) const ABSL_LOCKS_EXCLUDED(mu_);
  // Holds a read of `bytes` for `principal` back to its rate
  // (options().principal_read_rate; returns at once without one).
  void PaceRead(absl::string_view principal, int64_t bytes) const {
    pacer_.Pace(principal, bytes);
  }
  // Seconds each principal's reads were held back so far.
  std::map<std::string, double> ReadDelays() const { return pacer_.Delays(); }
  // Grants of these principals minted before these times are refused from
  // now on (the coordinator's heartbeat answer: principal -> Unix ms).
  void SetRevoked(std::vector<std::pair<std::string, int64_t>> revoked) {
    revocations_.Set(std::move(revoked));
  }
  // A put's shard was written whole: no write reaches it again.
  void Seal(uint64_t id) ABSL_LOCKS_EXCLUDED(mu_);
  // The coordinator commits the change that wrote `ids`: every one is
  // sealed (and persisted: ShardStore::Persist), or none when one is not
  // held (NOT_FOUND naming it).
  absl::Status SealAll(absl::Span<const uint64_t> ids, bool persist = true)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Whether shard `id` still takes writes: held, a put's (or an update's)
  // shard, and not sealed.
  bool TakesWrites(uint64_t id) const ABSL_LOCKS_EXCLUDED(mu_);

  int64_t BytesUsed() const { return store_->BytesUsed(); }
  BytesUsedReading ReadBytesUsed() const { return store_->ReadBytesUsed(); }

  // Bytes the node's own data plane read from peers, per transport (empty
  // when the node was given its `peers` transport).
  DataPlaneStats PeerStats() const;

 private:
  class Receiver;
  absl::Status NoExchange() const;
  // OpenRegion in chunks of kChunkBytes for a reader of `item_bytes`-byte
  // elements: INVALID_ARGUMENT when the shard's differ.
  absl::StatusOr<RegionReader> OpenRegionOf(uint64_t id, const Box& box,
                                            int64_t item_bytes) const;
  // Reads `remote`'s pieces from its source into `receiver` (a source
  // that restarted is dialled afresh once), with the order's failures
  // named: DEADLINE_EXCEEDED past `deadline`, UNAVAILABLE naming the source.
  absl::StatusOr<int64_t> Pull(const TransferBatch& remote,
                               TransferReceiver& receiver, absl::Time deadline,
                               const std::function<bool()>& cancelled);
  // Fills `chunk` (contiguous in row-major memory) of shard `dst` (a relay
  // hop's, described by `desc`, which `base` matches) from `up` as the
  // changes from the copies of the earlier version there and here
  // (`base`). The bytes `up` sent, or -1 when the chunk must come whole
  // (the changes were not shorter, or the result's CRC-32 differed); an
  // error when `up` failed.
  absl::StatusOr<int64_t> PatchChunk(const RelayUpstream& up, uint64_t dst,
                                     uint64_t base, const ShardDesc& desc,
                                     const Box& chunk);
  // A relay hop (Transfer), its calls already bounded by `deadline`.
  absl::StatusOr<int64_t> RunRelayHop(const TransferBatch& batch,
                                      absl::Time deadline,
                                      const std::function<bool()>& cancelled,
                                      SentBytes* sent);

  ShardStore* const store_;
  const WorkerNodeOptions options_;
  const CheckpointIo checkpoints_;
  // Lends the staging blocks of StageRead (null without an arena).
  std::unique_ptr<StagingPool> staging_;
  mutable absl::Mutex mu_;
  std::string name_ ABSL_GUARDED_BY(mu_);
  std::string key_ ABSL_GUARDED_BY(mu_);
  // Checks capabilities, remembering the tokens that verified.
  mutable CapabilityVerifier verifier_;
  Revocations revocations_;
  std::string cluster_id_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<uint64_t> sealed_ ABSL_GUARDED_BY(mu_);
  // Ids this worker made whose communicator has not formed here yet, and
  // ids being made (NCCL starts a bootstrap: not under the lock).
  absl::Mutex exchange_mu_;
  absl::flat_hash_set<std::string> unformed_ids_ ABSL_GUARDED_BY(exchange_mu_);
  size_t ids_in_making_ ABSL_GUARDED_BY(exchange_mu_) = 0;
  // Relay hops filling shards here; how hops ask their sources.
  RelayFills relay_fills_;
  RelayUpstreams* relay_upstreams_ = nullptr;
  std::unique_ptr<ChannelCache> channels_;  // to peers; with the own chain
  std::unique_ptr<ShardTransport> peers_;
  TransportChain* chain_ = nullptr;  // peers_, when the node made it
  // Holds each principal's reads to options_.principal_read_rate.
  mutable ReadPacer pacer_;
};

}  // namespace tessera

#endif  // TESSERA_WORKER_WORKER_NODE_H_
