#include "coordinator/checkpoints.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_map.h"
#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "core/errors.h"
#include "core/fan_out.h"
#include "core/status_macros.h"
#include "spdlog/spdlog.h"

namespace tessera {

absl::StatusOr<WorkerRef> Checkpoints::DirectoryWorker() const {
  // Every worker sees the same directory (a shared volume): a ready one,
  // the first by name.
  std::vector<WorkerRecord> workers = registry_->List();
  std::sort(workers.begin(), workers.end(),
            [](const WorkerRecord& a, const WorkerRecord& b) {
              return a.name < b.name;
            });
  for (const WorkerRecord& w : workers) {
    if (w.alive && w.state == WorkerState::kReady)
      return WorkerRef{w.name, w.address};
  }
  return absl::UnavailableError(
      "no ready worker reads or writes checkpoint directories: they are "
      "unavailable");
}

absl::StatusOr<CheckpointListing> Checkpoints::List(const std::string& dir) {
  TESSERA_ASSIGN_OR_RETURN(const WorkerRef worker, DirectoryWorker());
  return workers_->ListCheckpoint(worker, dir);
}

absl::StatusOr<std::vector<std::string>> Checkpoints::SaveNames(
    const SaveArgs& args) const {
  std::vector<std::string> names = args.names;
  if (names.empty()) {
    for (const TensorSummary& t : table_->List()) {
      if (absl::StartsWith(t.name, args.prefix)) names.push_back(t.name);
    }
    if (names.empty()) {
      return absl::NotFoundError(absl::StrCat(
          "save: no tensor's name starts with '", args.prefix, "'"));
    }
  }
  if (static_cast<int64_t>(names.size()) > kMaxCheckpointEntries) {
    return absl::InvalidArgumentError(absl::StrCat(
        "save: ", names.size(), " tensors are more than one checkpoint holds (",
        kMaxCheckpointEntries, ")"));
  }
  absl::flat_hash_set<std::string> seen;
  for (const std::string& name : names) {
    if (!seen.insert(name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("save: '", name, "' is named twice"));
    }
  }
  return names;
}

// An earlier checkpoint in the directory is replaced only when the same
// principal saved it, or when told to. Its files go once the new index is
// in, and only those its save wrote (named by its id, and marked with it
// inside: the worker checks): never a file tessera did not write.
absl::StatusOr<Checkpoints::EarlierSave> Checkpoints::FindEarlierSave(
    const SaveArgs& args) {
  EarlierSave found;
  const char* verb = args.hf ? "export" : "save";
  absl::StatusOr<CheckpointListing> earlier = List(args.dir);
  // A DIR the worker cannot use is said as it is: --overwrite would not help.
  if (IsCheckpointRootError(earlier.status())) return earlier.status();
  if (!earlier.ok() && !absl::IsNotFound(earlier.status()) && !args.overwrite) {
    // Files no one can read as a checkpoint are not taken for none: whose
    // they are is unknown.
    return absl::FailedPreconditionError(absl::StrCat(
        verb, ": '", args.dir, "' holds what cannot be read as a checkpoint (",
        earlier.status().message(), "); give --overwrite to replace it"));
  }
  if (!earlier.ok()) return found;
  const bool own =
      !earlier->save_id.empty() && earlier->saved_by == args.principal;
  if (!own && !args.overwrite) {
    return absl::AlreadyExistsError(
        absl::StrCat(verb, ": '", args.dir, "' already holds a checkpoint",
                     earlier->save_id.empty()
                         ? std::string(" that tessera save did not write")
                         : absl::StrCat(" saved by '", earlier->saved_by, "'"),
                     "; give --overwrite to replace it"));
  }
  found.save_id = earlier->save_id;
  for (const CheckpointEntry& e : earlier->entries) {
    for (const StoredPiece& piece : e.pieces) {
      if (IsSavedFileOf(piece.file, found.save_id)) {
        found.files.insert(piece.file);
      }
    }
  }
  return found;
}

// Every worker writes its files, the workers in parallel; each piece's
// place in its file goes into the plan's listing.
absl::Status Checkpoints::WriteSaveFiles(
    const SaveArgs& args, SavePlan* plan, MoveTally* tally,
    std::vector<std::vector<std::string>>* written) {
  written->assign(plan->workers.size(), {});
  return FanOut(plan->workers.size(), kDefaultFanOut, [&](size_t w) {
    const SavePlanWorker& planned = plan->workers[w];
    const WorkerRef worker{planned.worker, planned.address};
    for (const SavePlanFile& file : planned.files) {
      TESSERA_RETURN_IF_ERROR(args.stop.Check());
      std::vector<SaveItem> order;
      for (const SavePlanItem& item : file.items) {
        const CheckpointEntry& entry = plan->listing.entries[item.tensor];
        order.push_back(SaveItem{item.entry, item.shard_id, entry.name,
                                 item.version, item.scalar});
      }
      absl::StatusOr<std::vector<SavedItem>> saved = workers_->SaveShards(
          worker, args.dir, file.name, order, plan->file_metadata);
      if (!saved.ok()) {
        return Annotate(saved.status(),
                        absl::StrCat("worker '", worker.name, "' writing '",
                                     args.dir, "/", file.name, "'"));
      }
      (*written)[w].push_back(file.name);
      for (size_t j = 0; j < file.items.size(); ++j) {
        const SavePlanItem& item = file.items[j];
        const SavedItem& got = (*saved)[j];
        // The worker's reply is input: it must describe what was asked.
        if (got.bytes != item.bytes || got.data_offset < 0) {
          return absl::InternalError(
              absl::StrCat("worker '", worker.name, "' reports ", got.bytes,
                           " bytes for a piece of ", item.bytes));
        }
        StoredPiece& piece =
            plan->listing.entries[item.tensor].pieces[item.piece];
        piece.file = file.name;
        piece.data_offset = got.data_offset;
        piece.bytes = got.bytes;
        piece.crc32 = got.crc32;
        tally->done += got.bytes;
      }
    }
    return absl::OkStatus();
  });
}

// The index files last, tessera.json first: once it is in, the checkpoint
// is whole.
absl::Status Checkpoints::WriteSaveIndex(const SaveArgs& args,
                                         const CheckpointListing& listing) {
  const std::string tessera_index = TesseraIndexJson(listing);
  if (static_cast<int64_t>(tessera_index.size()) > kMaxCheckpointIndexBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "save: the checkpoint's ", kTesseraIndexName, " would take ",
        tessera_index.size(), " bytes, more than ", kMaxCheckpointIndexBytes,
        " (save fewer tensors, or tensors of fewer shards, at once)"));
  }
  TESSERA_ASSIGN_OR_RETURN(const WorkerRef writer, DirectoryWorker());
  return Annotate(workers_->WriteCheckpointFile(
                      writer, args.dir, kTesseraIndexName, tessera_index,
                      /*size=*/0),
                  absl::StrCat("writing the index of '", args.dir, "'"));
}

// The whole checkpoint in: Hugging Face's index beside tessera's, then the
// earlier save's files go.
absl::Status Checkpoints::FinishSave(const SaveArgs& args,
                                     const CheckpointListing& listing,
                                     EarlierSave earlier) {
  TESSERA_ASSIGN_OR_RETURN(const WorkerRef writer, DirectoryWorker());
  TESSERA_RETURN_IF_ERROR(
      Annotate(workers_->WriteCheckpointFile(writer, args.dir, kHfIndexName,
                                             HfIndexJson(listing), /*size=*/0),
               absl::StrCat("writing '", args.dir, "/", kHfIndexName, "'")));
  for (const CheckpointEntry& e : listing.entries) {
    for (const StoredPiece& piece : e.pieces) earlier.files.erase(piece.file);
  }
  if (earlier.files.empty()) return absl::OkStatus();
  const std::vector<std::string> gone(earlier.files.begin(),
                                      earlier.files.end());
  if (absl::Status s = workers_->RemoveCheckpointFiles(writer, args.dir, gone,
                                                       earlier.save_id);
      !s.ok()) {
    spdlog::warn("save '{}': the earlier checkpoint's files stay: {}", args.dir,
                 s.ToString());
  }
  return absl::OkStatus();
}

absl::StatusOr<SaveResult> Checkpoints::Save(const SaveArgs& args) {
  const absl::Time start = absl::Now();
  TESSERA_ASSIGN_OR_RETURN(std::vector<std::string> names, SaveNames(args));
  // Each tensor at its current version, leased so that a reshard or
  // update meanwhile frees none of its shards until the save is done.
  std::vector<TensorMetadata> metas;
  auto release = absl::MakeCleanup([&] {
    for (const TensorMetadata& meta : metas)
      table_->ReleaseRead(meta.name, meta.version);
  });
  for (const std::string& name : names) {
    TESSERA_ASSIGN_OR_RETURN(TensorMetadataPtr meta, table_->GetLeased(name));
    metas.push_back(orchestrator_->WithWorkerState(*meta));
  }
  TESSERA_ASSIGN_OR_RETURN(EarlierSave earlier, FindEarlierSave(args));
  if (args.hf) {
    auto tally = std::make_shared<MoveTally>();
    progress_->Track(names, tally);
    auto untrack = absl::MakeCleanup([&] { progress_->Untrack(names, tally); });
    TESSERA_ASSIGN_OR_RETURN(
        SaveResult result,
        ExportHf(args, metas, std::move(earlier), tally.get()));
    result.tensors = std::move(names);
    result.seconds = absl::ToDoubleSeconds(absl::Now() - start);
    spdlog::info(
        "exported {} tensor(s) into '{}' (Hugging Face): {} bytes in {} "
        "file(s), {:.3f} s",
        result.tensors.size(), args.dir, result.bytes, result.files,
        result.seconds);
    return result;
  }
  SavePlanOptions plan_options;
  plan_options.save_id =
      absl::StrFormat("%08x", absl::Uniform<uint32_t>(absl::BitGen()));
  plan_options.principal = args.principal;
  plan_options.file_bytes = kSaveFileBytes;
  plan_options.file_items = kSaveFileItems;
  TESSERA_ASSIGN_OR_RETURN(SavePlan plan, PlanSave(metas, plan_options));

  // Progress, as a load's.
  auto tally = std::make_shared<MoveTally>();
  tally->total = plan.bytes;
  progress_->Track(names, tally);
  auto untrack = absl::MakeCleanup([&] { progress_->Untrack(names, tally); });
  std::vector<std::vector<std::string>> written;
  absl::Status saved = WriteSaveFiles(args, &plan, tally.get(), &written);
  if (saved.ok()) saved = WriteSaveIndex(args, plan.listing);
  if (!saved.ok()) {
    // A failed save takes its files back out (best effort: they are named
    // by no index either way).
    for (size_t w = 0; w < written.size(); ++w) {
      if (written[w].empty()) continue;
      const WorkerRef worker{plan.workers[w].worker, plan.workers[w].address};
      workers_
          ->RemoveCheckpointFiles(worker, args.dir, written[w],
                                  plan_options.save_id)
          .IgnoreError();
    }
    return saved;
  }
  TESSERA_RETURN_IF_ERROR(FinishSave(args, plan.listing, std::move(earlier)));
  SaveResult result;
  result.tensors = std::move(names);
  result.bytes = plan.bytes;
  result.files = plan.files;
  result.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  spdlog::info("saved {} tensor(s) into '{}': {} bytes in {} file(s), {:.3f} s",
               result.tensors.size(), args.dir, result.bytes, result.files,
               result.seconds);
  return result;
}

absl::StatusOr<SaveResult> Checkpoints::ExportHf(
    const SaveArgs& args, const std::vector<TensorMetadata>& metas,
    EarlierSave earlier, MoveTally* tally) {
  HfExportOptions options;
  options.export_id =
      absl::StrFormat("%08x", absl::Uniform<uint32_t>(absl::BitGen()));
  options.strip_prefix = args.strip_prefix;
  options.max_file_bytes = args.max_file_bytes;
  TESSERA_ASSIGN_OR_RETURN(const HfExportPlan plan,
                           PlanHfExport(metas, options));
  tally->total = plan.bytes;
  TESSERA_ASSIGN_OR_RETURN(const WorkerRef writer, DirectoryWorker());
  // A failure before the renames takes the staging files back out (best
  // effort: no index names them, and they are hidden).
  std::vector<std::string> staged;
  auto drop = absl::MakeCleanup([&] {
    if (staged.empty()) return;
    workers_->RemoveCheckpointFiles(writer, args.dir, staged, options.export_id)
        .IgnoreError();
  });
  // Each file made whole in size, its header in, its data zeros...
  for (const HfExportFile& file : plan.files) {
    TESSERA_RETURN_IF_ERROR(args.stop.Check());
    TESSERA_RETURN_IF_ERROR(
        Annotate(workers_->WriteCheckpointFile(writer, args.dir, file.staging,
                                               file.header, file.bytes),
                 absl::StrCat("making '", args.dir, "/", file.name, "'")));
    staged.push_back(file.staging);
  }
  // ... then filled by every worker holding a shard, in parallel.
  TESSERA_RETURN_IF_ERROR(
      FanOut(plan.workers.size(), kDefaultFanOut, [&](size_t w) {
        const HfExportWorker& planned = plan.workers[w];
        const WorkerRef worker{planned.worker, planned.address};
        for (const HfExportWrite& write : planned.writes) {
          TESSERA_RETURN_IF_ERROR(args.stop.Check());
          const HfExportFile& file = plan.files[write.file];
          absl::StatusOr<int64_t> written = workers_->WriteShardRuns(
              worker, args.dir, file.staging, options.export_id, write.shard_id,
              write.tensor, write.version, write.runs);
          if (!written.ok()) {
            return Annotate(written.status(),
                            absl::StrCat("worker '", worker.name, "' writing '",
                                         write.tensor, "' into '", args.dir,
                                         "/", file.name, "'"));
          }
          // The worker's reply is input: it must be what was asked.
          if (*written != write.bytes) {
            return absl::InternalError(
                absl::StrCat("worker '", worker.name, "' reports ", *written,
                             " bytes written for a shard of ", write.bytes));
          }
          tally->done += write.bytes;
        }
        return absl::OkStatus();
      }));
  // Whole: into place, then the index.
  std::vector<std::pair<std::string, std::string>> renames;
  for (const HfExportFile& file : plan.files) {
    renames.emplace_back(file.staging, file.name);
  }
  TESSERA_RETURN_IF_ERROR(Annotate(
      workers_->PublishCheckpointFiles(writer, args.dir, options.export_id,
                                       renames),
      absl::StrCat("putting the files of '", args.dir, "' into place")));
  staged.clear();
  TESSERA_RETURN_IF_ERROR(
      Annotate(workers_->WriteCheckpointFile(writer, args.dir, kHfIndexName,
                                             plan.index, /*size=*/0),
               absl::StrCat("writing '", args.dir, "/", kHfIndexName, "'")));
  // An earlier save's own files go (an export's were replaced by name).
  for (const HfExportFile& file : plan.files) earlier.files.erase(file.name);
  if (!earlier.files.empty()) {
    const std::vector<std::string> gone(earlier.files.begin(),
                                        earlier.files.end());
    if (absl::Status s = workers_->RemoveCheckpointFiles(writer, args.dir, gone,
                                                         earlier.save_id);
        !s.ok()) {
      spdlog::warn("export '{}': the earlier checkpoint's files stay: {}",
                   args.dir, s.ToString());
    }
  }
  SaveResult result;
  result.bytes = plan.bytes;
  result.files = static_cast<int64_t>(plan.files.size());
  return result;
}

namespace {

// Where each of a load's entries is in the checkpoint's listing.
absl::StatusOr<std::vector<size_t>> FindLoadEntries(
    const LoadArgs& args, const CheckpointListing& listing) {
  absl::flat_hash_map<std::string, size_t> index;
  for (size_t i = 0; i < listing.entries.size(); ++i)
    index.emplace(listing.entries[i].name, i);
  std::vector<size_t> found;
  for (const LoadArgs::Entry& e : args.entries) {
    auto it = index.find(e.entry);
    if (it == index.end()) {
      return absl::NotFoundError(absl::StrCat(
          "checkpoint: '", args.dir, "' has no tensor '", e.entry, "'"));
    }
    found.push_back(it->second);
  }
  return found;
}

}  // namespace

absl::Status Checkpoints::CreateLoadTargets(
    const LoadArgs& args, const CheckpointListing& listing,
    const std::vector<size_t>& found, std::vector<TensorMetadataPtr>* made) {
  for (size_t k = 0; k < args.entries.size(); ++k) {
    const CheckpointEntry& entry = listing.entries[found[k]];
    CreateTensorArgs create;
    create.name = args.entries[k].tensor;
    // tessera tensors have at least one dim: a 0-d entry is kept as [1].
    create.shape = entry.shape.empty() ? Shape{1} : entry.shape;
    create.dtype = entry.dtype;
    create.spec = args.entries[k].spec;
    create.pending = true;
    create.owner = args.owner;
    create.stop = args.stop;
    create.origin.metadata = listing.metadata;
    create.origin.entry = static_cast<int64_t>(found[k]) + 1;
    create.origin.scalar = entry.shape.empty();
    absl::StatusOr<TensorMetadataPtr> meta = orchestrator_->Create(create);
    if (!meta.ok()) {
      return Annotate(meta.status(), absl::StrCat("loading '", entry.name,
                                                  "' as '", create.name, "'"));
    }
    made->push_back(*meta);
  }
  return absl::OkStatus();
}

// Every worker carries out its orders in sequence, the workers in
// parallel. Returns the bytes they read from the files; `parts` gets each
// checked piece's part CRC-32s.
absl::StatusOr<int64_t> Checkpoints::ReadLoadOrders(
    const LoadArgs& args, const LoadPlan& plan, MoveTally* tally,
    std::vector<std::vector<uint32_t>>* parts) {
  std::vector<int64_t> read(plan.workers.size(), 0);
  std::vector<std::vector<uint32_t>> crcs(plan.workers.size());
  TESSERA_RETURN_IF_ERROR(
      FanOut(plan.workers.size(), kDefaultFanOut, [&](size_t i) {
        const LoadPlan::Worker& planned = plan.workers[i];
        const WorkerRef worker{planned.worker, planned.address};
        for (const LoadPlan::Order& placed : planned.orders) {
          TESSERA_RETURN_IF_ERROR(args.stop.Check());
          absl::StatusOr<LoadedRuns> got =
              workers_->LoadShard(worker, args.dir, placed.order);
          if (!got.ok()) {
            return Annotate(
                got.status(),
                absl::StrCat("worker '", worker.name, "' reading '", args.dir,
                             "/", placed.order.file, "'"));
          }
          read[i] += got->bytes_read;
          crcs[i].push_back(got->part_crc32);
          tally->done += placed.bytes;
        }
        return absl::OkStatus();
      }));
  parts->assign(plan.checked.size(), {});
  int64_t bytes_read = 0;
  for (size_t i = 0; i < plan.workers.size(); ++i) {
    bytes_read += read[i];
    const std::vector<LoadPlan::Order>& orders = plan.workers[i].orders;
    for (size_t j = 0; j < orders.size(); ++j) {
      if (orders[j].checked != 0) {
        (*parts)[orders[j].checked - 1].push_back(crcs[i][j]);
      }
    }
  }
  return bytes_read;
}

absl::StatusOr<LoadResult> Checkpoints::Load(const LoadArgs& args) {
  const absl::Time start = absl::Now();
  if (static_cast<int64_t>(args.entries.size()) > kMaxCheckpointEntries) {
    return absl::InvalidArgumentError(absl::StrCat(
        "load: ", args.entries.size(),
        " entries are more than one load makes (", kMaxCheckpointEntries, ")"));
  }
  TESSERA_ASSIGN_OR_RETURN(CheckpointListing listing, List(args.dir));
  TESSERA_ASSIGN_OR_RETURN(const std::vector<size_t> found,
                           FindLoadEntries(args, listing));

  // Progress (GetMoveProgress of any of the tensors): every byte of the
  // tensors from the start (their shards are made first), each order's
  // bytes as it returns.
  auto tally = std::make_shared<MoveTally>();
  for (size_t i : found) tally->total += listing.entries[i].bytes;
  std::vector<std::string> making;
  for (const LoadArgs::Entry& e : args.entries) making.push_back(e.tensor);
  // (A name already taken fails at its create below.)
  progress_->Track(making, tally);
  auto untrack = absl::MakeCleanup([&] { progress_->Untrack(making, tally); });

  // All or nothing: what was made goes unless every tensor is committed.
  LoadResult result;
  std::vector<TensorMetadataPtr> made;
  auto undo = absl::MakeCleanup([&] {
    for (const TensorMetadataPtr& meta : made) {
      orchestrator_
          ->Delete(meta->name, args.owner, /*admin=*/true, meta->incarnation)
          .IgnoreError();
    }
  });
  TESSERA_RETURN_IF_ERROR(CreateLoadTargets(args, listing, found, &made));
  std::vector<const TensorMetadata*> targets;
  std::vector<const CheckpointEntry*> entries;
  for (size_t k = 0; k < made.size(); ++k) {
    targets.push_back(made[k].get());
    entries.push_back(&listing.entries[found[k]]);
    result.bytes += listing.entries[found[k]].bytes;
  }
  const LoadPlan plan = PlanLoad(targets, entries);
  std::vector<std::vector<uint32_t>> parts;
  TESSERA_ASSIGN_OR_RETURN(result.bytes_read,
                           ReadLoadOrders(args, plan, tally.get(), &parts));
  TESSERA_RETURN_IF_ERROR(CheckLoadedPieces(plan, parts, args.dir));
  for (const TensorMetadataPtr& meta : made) {
    TESSERA_RETURN_IF_ERROR(orchestrator_->Commit(
        meta->name, meta->version, args.owner, meta->change, &result.sent));
  }
  std::move(undo).Cancel();
  result.tensors = std::move(made);
  result.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  spdlog::info("loaded {} tensor(s) from '{}': {} bytes, {} read, {:.3f} s",
               result.tensors.size(), args.dir, result.bytes, result.bytes_read,
               result.seconds);
  return result;
}

}  // namespace tessera
