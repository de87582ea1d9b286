#include "coordinator/repairs.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "core/errors.h"
#include "core/mirror_plan.h"
#include "core/repair_plan.h"
#include "core/replica_placement.h"
#include "core/status_macros.h"
#include "spdlog/spdlog.h"

namespace tessera {

absl::StatusOr<RepairResult> Repairs::Repair(const std::string& name) {
  const absl::Time start = absl::Now();
  TESSERA_ASSIGN_OR_RETURN(TensorMetadataPtr old_meta,
                           table_->BeginReshard(name, 0));
  auto done = absl::MakeCleanup([&] { table_->EndReshard(name); });
  TensorMetadata sources = orchestrator_->WithWorkerState(*old_meta);
  const std::vector<WorkerRecord> workers = registry_->List();
  absl::flat_hash_map<std::string, int> index;
  const std::vector<ReplicaCandidate> candidates =
      Orchestrator::Candidates(workers, &index);
  auto draining = [&](const std::string& worker) {
    auto it = index.find(worker);
    return it != index.end() &&
           workers[it->second].state == WorkerState::kDraining;
  };

  // Which replicas go, which stay, and where each shard is copied from (an
  // available replica, one on a ready worker first).
  RepairResult result;
  const RepairNeeds needs = FindRepairs(
      sources, [&](const std::string& worker) { return index.at(worker); },
      draining);
  result.shards_short = needs.shards_short;
  if (needs.shards.empty()) return result;
  std::vector<ShardToRepair> todo;
  for (const ShardRepair& shard : needs.shards) todo.push_back(shard.need);
  TESSERA_ASSIGN_OR_RETURN(std::vector<std::vector<int>> placed,
                           PlaceRepairs(candidates, todo));

  // Version N again, each placed replica in place of one that leaves.
  auto new_meta = std::make_shared<TensorMetadata>(*old_meta);
  Orchestrator::NewShards fresh(orchestrator_);
  fresh.meta = WithoutShards(*old_meta);
  TensorMetadata retired = WithoutShards(*old_meta);
  ReshardPlan plan;
  std::vector<Orchestrator::CopySlot>
      slots;  // where each fresh replica goes in new_meta
  for (size_t t = 0; t < todo.size(); ++t) {
    const ShardRepair& repair = needs.shards[t];
    const size_t i = repair.shard;
    if (placed[t].size() < repair.leaving.size()) ++result.shards_short;
    if (placed[t].empty() && repair.promoted.empty()) continue;
    ShardInfo& retired_shard = retired.shards.emplace_back();
    retired_shard.box = old_meta->shards[i].box;
    // A mirror takes a leaving replica's place where it is; its mirror
    // entry goes (mirrors follow the replicas, so no slot below moves).
    std::vector<size_t> gone_mirrors;
    for (const auto& [r, m] : repair.promoted) {
      retired_shard.replicas.push_back(old_meta->shards[i].replicas[r]);
      Replica promoted = old_meta->shards[i].replicas[m];
      promoted.mirror = false;
      new_meta->shards[i].replicas[r] = promoted;
      gone_mirrors.push_back(m);
      ++result.mirrors_promoted;
    }
    std::sort(gone_mirrors.rbegin(), gone_mirrors.rend());
    for (size_t m : gone_mirrors) {
      new_meta->shards[i].replicas.erase(new_meta->shards[i].replicas.begin() +
                                         static_cast<ptrdiff_t>(m));
    }
    if (placed[t].empty()) continue;
    ShardInfo& fresh_shard = fresh.meta.shards.emplace_back();
    fresh_shard.box = old_meta->shards[i].box;
    for (size_t k = 0; k < placed[t].size(); ++k) {
      fresh_shard.replicas.push_back(ReplicaOn(workers[placed[t][k]]));
      retired_shard.replicas.push_back(
          old_meta->shards[i].replicas[repair.leaving[k]]);
      slots.push_back({i, repair.leaving[k]});
      ReshardPiece& piece = plan.pieces.emplace_back();
      piece.src_shard = i;
      piece.src_replica = repair.source;
      piece.dst_shard = i;
      piece.dst_replica = repair.leaving[k];
      piece.global = old_meta->shards[i].box;
      piece.bytes = repair.need.bytes;
      result.bytes_copied += piece.bytes;
      ++result.replicas_made;
    }
  }
  if (plan.pieces.empty() && result.mirrors_promoted == 0) return result;
  if (!plan.pieces.empty()) {
    TESSERA_RETURN_IF_ERROR(orchestrator_->FillNewCopies(
        sources, plan, slots, absl::StrCat("repairing '", name, "'"),
        new_meta.get(), &fresh));
  } else {
    fresh.allocate_start = fresh.move_start = fresh.move_end = absl::Now();
  }
  const absl::Time allocate_start = fresh.allocate_start;
  const absl::Time move_start = fresh.move_start;
  const absl::Time move_end = fresh.move_end;
  TESSERA_RETURN_IF_ERROR(orchestrator_->RecordVersion(
      old_meta, new_meta, std::move(retired), &fresh));
  spdlog::info(
      "repaired '{}' version {}: {} new replica(s), {} bytes copied, {} "
      "mirror(s) made replicas, {} shard(s) still short, {:.3f} s (plan "
      "{:.3f}, allocate {:.3f}, move {:.3f}, record {:.3f})",
      name, new_meta->version, result.replicas_made, result.bytes_copied,
      result.mirrors_promoted, result.shards_short,
      absl::ToDoubleSeconds(absl::Now() - start),
      absl::ToDoubleSeconds(allocate_start - start),
      absl::ToDoubleSeconds(move_start - allocate_start),
      absl::ToDoubleSeconds(move_end - move_start),
      absl::ToDoubleSeconds(absl::Now() - move_end));
  return result;
}

bool Repairs::MirrorsBehind(const TensorMetadata& meta) const {
  if (!HasMirrors(meta)) return false;
  return !PlanMirrors(meta, orchestrator_->MirrorGroupNow(meta.mirror)).empty();
}

absl::StatusOr<MirrorSyncResult> Repairs::SyncMirrors(const std::string& name) {
  const absl::Time start = absl::Now();
  TESSERA_ASSIGN_OR_RETURN(TensorMetadataPtr old_meta,
                           table_->BeginReshard(name, 0));
  auto done = absl::MakeCleanup([&] { table_->EndReshard(name); });
  TensorMetadata sources = orchestrator_->WithWorkerState(*old_meta);
  const std::vector<std::string> group =
      orchestrator_->MirrorGroupNow(old_meta->mirror);
  TESSERA_RETURN_IF_ERROR(Annotate(
      CheckLayoutSize(
          old_meta->shape, static_cast<int64_t>(old_meta->shards.size()),
          orchestrator_->CurrentLimits(), 0,
          ReplicaCount(*old_meta) + static_cast<int64_t>(group.size())),
      absl::StrCat("the mirrors of '", name, "' on ", group.size(),
                   " workers")));
  const std::vector<ShardMirrors> plan_mirrors = PlanMirrors(sources, group);
  MirrorSyncResult result;
  if (plan_mirrors.empty()) return result;

  // Version N again: each shard's replicas, the mirrors that stay, then
  // the new ones.
  auto new_meta = std::make_shared<TensorMetadata>(*old_meta);
  Orchestrator::NewShards fresh(orchestrator_);
  fresh.meta = WithoutShards(*old_meta);
  TensorMetadata retired = WithoutShards(*old_meta);
  const int64_t item = static_cast<int64_t>(ItemSize(old_meta->dtype));
  std::vector<Orchestrator::CopySlot> slots;
  ReshardPlan plan;
  for (const ShardMirrors& change : plan_mirrors) {
    const size_t i = change.shard;
    const ShardInfo& old_shard = old_meta->shards[i];
    Replicas& copies = new_meta->shards[i].replicas;
    copies.clear();
    for (size_t r = 0; r < old_shard.replicas.size(); ++r) {
      if (std::find(change.dropped.begin(), change.dropped.end(), r) !=
          change.dropped.end()) {
        continue;
      }
      copies.push_back(old_shard.replicas[r]);
    }
    if (!change.dropped.empty()) {
      ShardInfo& gone = retired.shards.emplace_back();
      gone.box = old_shard.box;
      for (size_t r : change.dropped)
        gone.replicas.push_back(old_shard.replicas[r]);
      result.mirrors_dropped += static_cast<int64_t>(change.dropped.size());
    }
    if (change.added.empty()) continue;
    ShardInfo& made = fresh.meta.shards.emplace_back();
    made.box = old_shard.box;
    for (const std::string& name_added : change.added) {
      std::optional<WorkerRecord> worker = registry_->Find(name_added);
      if (!worker.has_value()) continue;
      Replica replica = ReplicaOn(*worker);
      replica.mirror = true;
      made.replicas.push_back(replica);
      slots.push_back({i, copies.size()});
      copies.push_back(replica);
      ReshardPiece& piece = plan.pieces.emplace_back();
      piece.src_shard = i;
      piece.src_replica = change.source;
      piece.dst_shard = i;
      piece.dst_replica = copies.size() - 1;
      piece.global = old_shard.box;
      piece.bytes = old_shard.box.NumElements() * item;
      result.bytes_copied += piece.bytes;
      ++result.mirrors_made;
    }
    if (made.replicas.empty()) fresh.meta.shards.pop_back();
  }
  const std::string what = absl::StrCat("filling the mirrors of '", name, "'");
  if (!fresh.meta.shards.empty()) {
    // New mirrors are the owner's bytes: charged, as a new replica is.
    TESSERA_RETURN_IF_ERROR(table_->Charge(name, HeldBytes(fresh.meta), what));
    TESSERA_RETURN_IF_ERROR(orchestrator_->FillNewCopies(
        sources, plan, slots, what, new_meta.get(), &fresh));
  }
  TESSERA_RETURN_IF_ERROR(orchestrator_->RecordVersion(
      old_meta, new_meta, std::move(retired), &fresh));
  spdlog::info(
      "mirrors of '{}' version {}: {} made ({} bytes copied), {} dropped, "
      "{:.3f} s",
      name, new_meta->version, result.mirrors_made, result.bytes_copied,
      result.mirrors_dropped, absl::ToDoubleSeconds(absl::Now() - start));
  return result;
}

}  // namespace tessera
