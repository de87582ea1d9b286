#include "coordinator/piece_mover.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/errors.h"
#include "core/fan_out.h"
#include "core/region_plan.h"
#include "core/relay_plan.h"
#include "core/status_macros.h"
#include "spdlog/spdlog.h"

namespace tessera {
namespace {

// Whether every piece of `plan` that crosses workers goes from a GPU shard
// to a GPU shard, each worker on a GPU of its own. NCCL takes one rank per
// GPU: two workers reporting the same GPU UUID (`uuid_of`), or without one
// on one host naming the same device index, are taken to share a GPU.
bool OnSeparateGpus(
    const TensorMetadata& old_meta, const TensorMetadata& new_meta,
    const ReshardPlan& plan,
    const std::function<std::string(const std::string& worker)>& uuid_of) {
  std::map<std::string, std::string> worker_on_gpu;
  std::map<std::string, std::string> uuids;  // one lookup per worker
  auto own_gpu = [&](const Replica& replica) {
    if (replica.device.kind != Device::Kind::kCuda) return false;
    auto [uuid, fresh] = uuids.try_emplace(replica.worker);
    if (fresh) uuid->second = uuid_of(replica.worker);
    std::string gpu = uuid->second;
    if (gpu.empty()) {
      gpu = absl::StrCat(replica.address.substr(0, replica.address.rfind(':')),
                         " cuda:", replica.device.index);
    }
    auto [it, added] = worker_on_gpu.emplace(gpu, replica.worker);
    return added || it->second == replica.worker;
  };
  for (const ReshardPiece& piece : plan.pieces) {
    const Replica& src =
        old_meta.shards[piece.src_shard].replicas[piece.src_replica];
    const Replica& dst =
        new_meta.shards[piece.dst_shard].replicas[piece.dst_replica];
    if (src.worker != dst.worker && (!own_gpu(src) || !own_gpu(dst))) {
      return false;
    }
  }
  return true;
}

// Whether any copy of `meta` is on a GPU: their copies go by NCCL (Move),
// not by relay.
bool OnGpus(const TensorMetadata& meta) {
  for (const ShardInfo& shard : meta.shards) {
    for (const Replica& copy : shard.replicas) {
      if (copy.device.kind == Device::Kind::kCuda) return true;
    }
  }
  return false;
}

// What each worker sent, added from the threads of a fan-out into an
// optional total.
class SentTotal {
 public:
  explicit SentTotal(SentBytes* total) : total_(total) {}
  // Where one Transfer counts its bytes (null when no total is kept).
  SentBytes* ForOne(SentBytes* mine) const {
    return total_ != nullptr ? mine : nullptr;
  }
  void Add(const SentBytes& mine) {
    if (total_ == nullptr) return;
    absl::MutexLock lock(&mu_);
    for (const auto& [worker, bytes] : mine) (*total_)[worker] += bytes;
  }

 private:
  SentBytes* const total_;
  absl::Mutex mu_;
};

// The copies of the version an update replaces (`before`, when given and
// of `now`'s dtype and incarnation), by shard and worker: what a relay's
// copies can take changes against.
class EarlierCopies {
 public:
  EarlierCopies(const TensorMetadata* before, const TensorMetadata& now) {
    if (before == nullptr || before->dtype != now.dtype ||
        before->incarnation != now.incarnation) {
      return;
    }
    // Where a shard's box starts is unique in a layout.
    for (const ShardInfo& shard : before->shards) {
      by_start_[shard.box.offsets] = &shard;
    }
  }
  // `worker`'s available copy of shard `box` in that version (0: none).
  uint64_t On(const Box& box, const std::string& worker) const {
    auto it = by_start_.find(box.offsets);
    if (it == by_start_.end() || !(it->second->box == box)) return 0;
    for (const Replica& old : it->second->replicas) {
      if (old.worker == worker && old.available) return old.shard_id;
    }
    return 0;
  }

 private:
  std::map<BoxCoords, const ShardInfo*> by_start_;
};

// `plan`'s move of `meta`'s bytes, counted on `board` under its name while
// this lives (in place of whatever was counted there: a reshard's move
// replaces any).
class OnTheBoard {
 public:
  OnTheBoard(MoveProgressBoard* board, const TensorMetadata& meta,
             const ReshardPlan& plan)
      : board_(board), names_{meta.name} {
    for (const ReshardPiece& piece : plan.pieces)
      tally_->total += piece.global.NumElements() * ItemSize(meta.dtype);
    board_->Replace(meta.name, tally_);
  }
  ~OnTheBoard() { board_->Untrack(names_, tally_); }
  MoveTally* tally() const { return tally_.get(); }

 private:
  MoveProgressBoard* const board_;
  const std::vector<std::string> names_;
  const std::shared_ptr<MoveTally> tally_ = std::make_shared<MoveTally>();
};

}  // namespace

absl::Status PieceMover::ForwardReplicas(
    const TensorMetadata& at,
    std::vector<std::pair<size_t, size_t>>* failed_mirrors, SentBytes* sent,
    const TensorMetadata* before) {
  const int64_t item = static_cast<int64_t>(ItemSize(at.dtype));
  const size_t replicas = static_cast<size_t>(ReplicaCount(at));
  if (forward_ == ReplicaForward::kRelay && !OnGpus(at)) {
    // Replicas and mirrors alike: one relay per shard from its first copy.
    std::vector<RelayCopies> copies;
    for (size_t i = 0; i < at.shards.size(); ++i) {
      RelayCopies& shard = copies.emplace_back();
      shard.shard = i;
      for (size_t r = 1; r < at.shards[i].replicas.size(); ++r) {
        shard.destinations.push_back(r);
      }
    }
    std::vector<std::pair<size_t, size_t>> failed;
    const absl::Status relayed = Relay(at, at, copies, &failed, sent, before);
    absl::Status replica_failed;
    for (const auto& [shard, copy] : failed) {
      if (copy >= replicas && failed_mirrors != nullptr) {
        failed_mirrors->emplace_back(shard, copy);
      } else if (replica_failed.ok()) {
        replica_failed = relayed;
      }
    }
    return Annotate(replica_failed,
                    absl::StrCat("copying '", at.name, "' version ", at.version,
                                 " to its other copies"));
  }
  // Fan-out: every further replica pulls from the first at once (one
  // round). Chain: replica r pulls from replica r-1, R-1 rounds.
  const int rounds =
      forward_ == ReplicaForward::kChain ? static_cast<int>(replicas) - 1 : 1;
  for (int round = 0; round < rounds; ++round) {
    ReshardPlan plan;
    for (size_t i = 0; i < at.shards.size(); ++i) {
      const ShardInfo& shard = at.shards[i];
      const int64_t bytes = shard.box.NumElements() * item;
      for (size_t r = 1; r < shard.replicas.size(); ++r) {
        if (shard.replicas[r].mirror) break;  // after the replicas
        const bool chain = forward_ == ReplicaForward::kChain;
        if (chain && r != static_cast<size_t>(round) + 1) continue;
        ReshardPiece& piece = plan.pieces.emplace_back();
        piece.src_shard = piece.dst_shard = i;
        piece.src_replica = chain ? r - 1 : 0;
        piece.dst_replica = r;
        piece.global = shard.box;
        piece.bytes = bytes;
      }
    }
    if (plan.pieces.empty()) continue;
    TESSERA_RETURN_IF_ERROR(Annotate(
        Move(at, at, plan, /*tally=*/nullptr, /*failed=*/nullptr, sent),
        absl::StrCat("copying '", at.name, "' version ", at.version,
                     " to its other replicas")));
  }
  // Mirrors, each from the first replica, in one round.
  ReshardPlan plan;
  for (size_t i = 0; i < at.shards.size(); ++i) {
    const ShardInfo& shard = at.shards[i];
    for (size_t r = 1; r < shard.replicas.size(); ++r) {
      if (!shard.replicas[r].mirror) continue;
      ReshardPiece& piece = plan.pieces.emplace_back();
      piece.src_shard = piece.dst_shard = i;
      piece.src_replica = 0;
      piece.dst_replica = r;
      piece.global = shard.box;
      piece.bytes = shard.box.NumElements() * item;
    }
  }
  if (plan.pieces.empty()) return absl::OkStatus();
  std::vector<size_t> failed;
  const absl::Status moved =
      Move(at, at, plan, /*tally=*/nullptr, &failed, sent);
  if (moved.ok()) return moved;
  if (failed_mirrors == nullptr || failed.empty()) {
    return Annotate(moved, absl::StrCat("copying '", at.name, "' version ",
                                        at.version, " to its mirrors"));
  }
  for (size_t k : failed) {
    failed_mirrors->emplace_back(plan.pieces[k].dst_shard,
                                 plan.pieces[k].dst_replica);
  }
  return absl::OkStatus();
}

absl::Status PieceMover::Relay(const TensorMetadata& from,
                               const TensorMetadata& to,
                               const std::vector<RelayCopies>& copies,
                               std::vector<std::pair<size_t, size_t>>* failed,
                               SentBytes* sent, const TensorMetadata* before,
                               MoveTally* tally) {
  static std::atomic<uint64_t> next_relay{
      static_cast<uint64_t>(absl::ToUnixNanos(absl::Now())) | 1};
  const int64_t item = static_cast<int64_t>(ItemSize(from.dtype));
  struct Hop {
    TransferBatch batch;
    size_t shard = 0;
    size_t copy = 0;
    int depth = 0;
  };
  std::vector<Hop> hops;
  std::map<std::string, int64_t> busy;
  {
    absl::MutexLock lock(&busy_mu_);
    busy = busy_;
  }
  auto member = [&](const Replica& copy) {
    RelayMember m;
    m.name = copy.worker;
    m.host = AddressHost(copy.address);
    const std::optional<WorkerRecord> record = registry_->Find(copy.worker);
    if (record.has_value()) m.zone = record->zone;
    auto it = busy.find(copy.worker);
    m.busy = it == busy.end() ? 0 : it->second;
    return m;
  };
  const EarlierCopies earlier(before, from);
  for (const RelayCopies& shard_copies : copies) {
    if (shard_copies.destinations.empty()) continue;
    const ShardInfo& src_shard = from.shards[shard_copies.shard];
    auto earlier_on = [&](const Replica& copy) {
      return earlier.On(src_shard.box, copy.worker);
    };
    const ShardInfo& dst_shard = to.shards[shard_copies.shard];
    const Replica& source = src_shard.replicas[shard_copies.source];
    const int64_t bytes = src_shard.box.NumElements() * item;
    const int64_t chunk_bytes = RelayChunkBytes(bytes, item);
    const int64_t chunks = static_cast<int64_t>(
        RelayChunks(src_shard.box.sizes, item, chunk_bytes).size());
    std::vector<RelayMember> members;
    for (size_t d : shard_copies.destinations) {
      members.push_back(member(dst_shard.replicas[d]));
    }
    const RelayPlan plan = PlanRelay(member(source), members, chunks);
    const uint64_t id = next_relay.fetch_add(1);
    const std::vector<int64_t> zeros(src_shard.box.rank(), 0);
    const std::vector<int64_t> sizes(src_shard.box.sizes.begin(),
                                     src_shard.box.sizes.end());
    // A copy of the relay as an upstream: a destination (filling) or the
    // source.
    auto upstream = [&](int index) {
      const Replica& copy =
          index < 0
              ? source
              : dst_shard.replicas
                    [shard_copies.destinations[static_cast<size_t>(index)]];
      return RelayUpstream{copy.worker, copy.address, copy.shard_id,
                           "",          index >= 0,   earlier_on(copy)};
    };
    for (int index : plan.order) {
      const size_t copy_index =
          shard_copies.destinations[static_cast<size_t>(index)];
      const Replica& dst = dst_shard.replicas[copy_index];
      const int parent = plan.parent[static_cast<size_t>(index)];
      const RelayUpstream src = upstream(parent);
      Hop& hop = hops.emplace_back();
      hop.shard = shard_copies.shard;
      hop.copy = copy_index;
      TransferBatch& batch = hop.batch;
      batch = TransferBatch::Between(from.name, from.version, src.worker,
                                     src.address, dst.worker, dst.address);
      batch.incarnation = from.incarnation;
      TransferPiece& piece = batch.pieces.emplace_back();
      piece.src_shard_id = src.shard_id;
      piece.dst_shard_id = dst.shard_id;
      piece.src_offsets = piece.dst_offsets = zeros;
      piece.sizes = sizes;
      batch.relay.id = id;
      batch.relay.chunk_bytes = chunk_bytes;
      batch.relay.src_filling = src.filling;
      batch.relay.base_shard_id = earlier_on(dst);
      batch.relay.src_base_shard_id = src.base_shard_id;
      for (int up = parent; up >= 0;) {
        up = plan.parent[static_cast<size_t>(up)];
        batch.relay.fallbacks.push_back(upstream(up));
        ++hop.depth;
      }
    }
  }
  // Parents start before their children, so a bounded fan-out never holds
  // a hop whose source waits for a slot.
  std::stable_sort(hops.begin(), hops.end(), [](const Hop& a, const Hop& b) {
    return a.depth < b.depth;
  });
  std::vector<absl::Status> results(hops.size());
  SentTotal total(sent);
  FanOut(hops.size(), kDefaultFanOut, [&](size_t i) {
    const TransferBatch& batch = hops[i].batch;
    {
      absl::MutexLock lock(&busy_mu_);
      ++busy_[batch.src_worker];
      ++busy_[batch.dst_worker];
    }
    SentBytes mine;
    results[i] = workers_->Transfer(batch, total.ForOne(&mine));
    {
      absl::MutexLock lock(&busy_mu_);
      for (const std::string* w : {&batch.src_worker, &batch.dst_worker}) {
        if (--busy_[*w] <= 0) busy_.erase(*w);
      }
    }
    if (results[i].ok()) {
      total.Add(mine);
      if (tally != nullptr) {
        tally->done += batch.pieces[0].DstBox().NumElements() * item;
      }
    }
    return absl::OkStatus();
  }).IgnoreError();
  absl::Status first;
  for (size_t i = 0; i < hops.size(); ++i) {
    if (results[i].ok()) continue;
    const Hop& hop = hops[i];
    if (failed != nullptr) failed->emplace_back(hop.shard, hop.copy);
    if (first.ok()) {
      first = Annotate(
          results[i], absl::StrCat("relaying shard ", hop.shard, " to worker '",
                                   hop.batch.dst_worker, "'"));
    }
  }
  return first;
}

absl::Status PieceMover::FillCopies(const TensorMetadata& sources,
                                    const TensorMetadata& to,
                                    const ReshardPlan& plan, SentBytes* sent) {
  bool relay = forward_ == ReplicaForward::kRelay && !OnGpus(sources) &&
               !OnGpus(to) && !plan.pieces.empty();
  std::map<size_t, RelayCopies> by_shard;
  for (size_t k = 0; relay && k < plan.pieces.size(); ++k) {
    const ReshardPiece& piece = plan.pieces[k];
    // A relay copies whole shards onto copies of themselves, from one
    // source per shard.
    RelayCopies& shard = by_shard[piece.src_shard];
    relay = !piece.local && piece.src_shard == piece.dst_shard &&
            piece.global == sources.shards[piece.src_shard].box &&
            (shard.destinations.empty() || shard.source == piece.src_replica);
    shard.shard = piece.src_shard;
    shard.source = piece.src_replica;
    shard.destinations.push_back(piece.dst_replica);
  }
  if (!relay) return MoveFromAnyReplica(sources, to, plan, sent);
  std::vector<RelayCopies> copies;
  for (auto& [index, shard] : by_shard) copies.push_back(std::move(shard));
  // Counted on the board as each copy's hop lands, as Move counts a pair's
  // steps.
  const OnTheBoard counted(progress_, sources, plan);
  std::vector<std::pair<size_t, size_t>> failed;
  if (Relay(sources, to, copies, &failed, sent, /*before=*/nullptr,
            counted.tally())
          .ok()) {
    return absl::OkStatus();
  }
  // The copies whose hop failed go again, each from any replica.
  ReshardPlan again;
  for (const ReshardPiece& piece : plan.pieces) {
    if (std::find(failed.begin(), failed.end(),
                  std::make_pair(piece.dst_shard, piece.dst_replica)) !=
        failed.end()) {
      again.pieces.push_back(piece);
    }
  }
  spdlog::warn(
      "filling copies of '{}': {} relay hop(s) failed; they go again "
      "from any replica",
      sources.name, again.pieces.size());
  return MoveFromAnyReplica(sources, to, again, sent);
}

absl::Status PieceMover::MoveFromAnyReplica(const TensorMetadata& old_meta,
                                            const TensorMetadata& new_meta,
                                            const ReshardPlan& plan,
                                            SentBytes* sent) {
  const OnTheBoard counted(progress_, old_meta, plan);
  std::vector<size_t> failed;
  const absl::Status moved =
      Move(old_meta, new_meta, plan, counted.tally(), &failed, sent);
  if (moved.ok() || failed.empty()) return moved;
  // The workers that failed as sources; their replicas are not read again.
  std::set<std::string> gone;
  for (size_t i : failed) {
    const ReshardPiece& piece = plan.pieces[i];
    gone.insert(
        old_meta.shards[piece.src_shard].replicas[piece.src_replica].worker);
  }
  TensorMetadata sources = old_meta;
  for (ShardInfo& shard : sources.shards) {
    for (Replica& replica : shard.replicas) {
      if (gone.count(replica.worker) > 0) replica.available = false;
    }
  }
  ReshardPlan again;
  for (size_t i : failed) {
    ReshardPiece piece = plan.pieces[i];
    if (piece.local) return moved;  // an in-memory copy has no other source
    const ShardLocation from = ReadLocations(sources, piece.src_shard).front();
    if (!from.available) return moved;  // no other replica
    piece.src_replica = from.replica;
    again.pieces.push_back(std::move(piece));
  }
  spdlog::warn("{}; {} piece(s) go on from other replicas",
               std::string(moved.message()), again.pieces.size());
  return Move(sources, new_meta, again, counted.tally(), /*failed=*/nullptr,
              sent);
}

absl::Status PieceMover::Move(const TensorMetadata& old_meta,
                              const TensorMetadata& new_meta,
                              const ReshardPlan& plan, MoveTally* tally,
                              std::vector<size_t>* failed, SentBytes* sent) {
  // One batch per (source, destination) pair of workers; all batches run in
  // parallel.
  std::map<std::pair<std::string, std::string>, TransferBatch> batches;
  std::map<std::pair<std::string, std::string>, std::vector<size_t>> indices;
  for (size_t index = 0; index < plan.pieces.size(); ++index) {
    const ReshardPiece& piece = plan.pieces[index];
    const ShardInfo& src_shard = old_meta.shards[piece.src_shard];
    const ShardInfo& dst_shard = new_meta.shards[piece.dst_shard];
    const Replica& src = src_shard.replicas[piece.src_replica];
    const Replica& dst = dst_shard.replicas[piece.dst_replica];
    TransferBatch& batch = batches[{src.worker, dst.worker}];
    indices[{src.worker, dst.worker}].push_back(index);
    if (batch.pieces.empty()) {
      batch =
          TransferBatch::Between(old_meta.name, old_meta.version, src.worker,
                                 src.address, dst.worker, dst.address);
      batch.incarnation = old_meta.incarnation;
    }
    TransferPiece& move = batch.pieces.emplace_back();
    move.src_shard_id = src.shard_id;
    move.dst_shard_id = dst.shard_id;
    move.sizes = ToShape(piece.global.sizes);
    for (size_t d = 0; d < piece.global.rank(); ++d) {
      move.dst_offsets.push_back(piece.global.offsets[d] -
                                 dst_shard.box.offsets[d]);
      move.src_offsets.push_back(piece.global.offsets[d] -
                                 src_shard.box.offsets[d]);
    }
  }
  // Between GPUs: one exchange among every worker involved moves the pieces
  // that cross workers; each worker then copies its own pieces.
  auto uuid_of = [this](const std::string& worker) {
    const std::optional<WorkerRecord> record = registry_->Find(worker);
    return record.has_value() ? record->gpu_uuid : std::string();
  };
  if (!batches.empty() && OnSeparateGpus(old_meta, new_meta, plan, uuid_of)) {
    std::vector<TransferBatch> all;
    all.reserve(batches.size());
    for (const auto& [pair, batch] : batches) all.push_back(batch);
    const absl::Status exchanged =
        exchanges_.Run(all, static_cast<int64_t>(ItemSize(old_meta.dtype)));
    if (exchanged.ok()) {
      if (tally != nullptr) {
        tally->done += PlanExchange(all, ItemSize(old_meta.dtype)).bytes;
      }
      for (auto it = batches.begin(); it != batches.end();) {
        it = it->first.first != it->first.second ? batches.erase(it)
                                                 : std::next(it);
      }
    } else {
      spdlog::warn("resharding '{}': {}; pulling the pieces instead",
                   old_meta.name, std::string(exchanged.message()));
    }
  }
  std::vector<absl::Status> results(batches.size());
  SentTotal total(sent);
  std::vector<const TransferBatch*> order;
  for (const auto& [pair, batch] : batches) order.push_back(&batch);
  // Every batch runs: the pieces of those that fail are reported.
  FanOut(order.size(), kDefaultFanOut, [&](size_t slot) {
    const TransferBatch& batch = *order[slot];
    const int64_t item = static_cast<int64_t>(ItemSize(old_meta.dtype));
    int64_t landed = 0;
    absl::Status status;
    SentBytes mine;
    for (const TransferBatch& step :
         SplitBatch(batch, item, kProgressStepBytes)) {
      status = workers_->Transfer(step, total.ForOne(&mine));
      if (!status.ok()) break;
      const int64_t bytes = BatchBytes(step, item);
      landed += bytes;
      if (tally != nullptr) tally->done += bytes;
    }
    if (status.ok()) total.Add(mine);
    if (!status.ok()) {
      if (tally != nullptr) tally->done -= landed;
      results[slot] = Annotate(
          status, absl::StrCat("moving ", batch.pieces.size(),
                               " piece(s) from worker '", batch.src_worker,
                               "' to worker '", batch.dst_worker, "'"));
    }
    return absl::OkStatus();
  }).IgnoreError();
  absl::Status first;
  size_t slot = 0;
  for (const auto& [pair, batch] : batches) {
    const absl::Status& status = results[slot++];
    if (status.ok()) continue;
    if (first.ok()) first = status;
    if (failed != nullptr) {
      const std::vector<size_t>& mine = indices[pair];
      failed->insert(failed->end(), mine.begin(), mine.end());
    }
  }
  return first;
}

}  // namespace tessera
