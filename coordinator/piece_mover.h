// PieceMover: the one way bytes move between workers' shards. A reshard's
// and an update's pieces, a repair's and a drain's new replicas, and the
// copies a commit makes to further replicas all go through it:
//   * the pieces are batched per (source, destination) pair of workers and
//     the pairs run at once (core/fan_out), each pair's pieces in Transfers
//     of at most kProgressStepBytes, counted on a MoveTally as they land;
//   * between GPU workers, each on a GPU of its own, one NCCL exchange among
//     them all moves the pieces that cross workers (pulled when it fails);
//   * pieces whose source fails go once more from another replica.
//
// Thread-safe. Its only lock of its own is per set of GPU workers, held
// across their NCCL exchange (ExchangeGroups).
#ifndef TESSERA_COORDINATOR_PIECE_MOVER_H_
#define TESSERA_COORDINATOR_PIECE_MOVER_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/exchange_groups.h"
#include "coordinator/move_progress.h"
#include "coordinator/worker_control.h"
#include "coordinator/worker_registry.h"
#include "core/reshard_plan.h"
#include "core/tensor_metadata.h"

namespace tessera {

// How a commit copies a written shard to its further replicas: all from
// the first at once (the default: one round), or each from the one before
// it (R-1 rounds, but no worker sends more than one copy: for hosts whose
// NICs, not memory, bound the copies). On one host the two are within
// run-to-run noise of each other (bench figure 14).
// The relay (not yet the default: see README): every copy of the same bytes
// moves as one pipeline per shard (core/relay_plan.h), each further copy
// pulling from one before it chunk by chunk while that one still fills.
enum class ReplicaForward { kRelay, kFanOut, kChain };

// One shard's copies filled from one copy of it: the relay's unit. Indices
// into the shard's replicas: `source` in the metadata read from,
// `destinations` in the metadata written.
struct RelayCopies {
  size_t shard = 0;
  size_t source = 0;
  std::vector<size_t> destinations;
};

// Most bytes of one Transfer: a pair's pieces go in steps of this, so a
// move's progress advances at least every ~0.1 s at wire speed, and a call
// per step costs well under 1% of its bytes' time.
inline constexpr int64_t kProgressStepBytes = int64_t{128} << 20;

class PieceMover {
 public:
  // Every pointer must outlive it.
  PieceMover(WorkerRegistry* registry, WorkerControl* workers,
             MoveProgressBoard* progress, ReplicaForward forward)
      : registry_(registry),
        workers_(workers),
        progress_(progress),
        forward_(forward),
        exchanges_(workers) {}

  // NCCL exchanges between GPU workers so far (metrics).
  ExchangeGroups::Stats exchange_stats() const { return exchanges_.stats(); }
  // Worker `name` registered (again): its communicators are gone.
  void ForgetExchangesWith(const std::string& name) { exchanges_.Forget(name); }

  // Runs `plan`'s pieces from `old_meta`'s shards into `new_meta`'s, adding
  // to `tally` (optional) as each Transfer returns; a pair that fails takes
  // its bytes back off (its pieces go again). Every pair runs; the first
  // failure is returned, and `failed` (optional) gets the indices of the
  // pieces of every pair that failed. `sent` (optional) adds what each
  // worker sent for the pairs that succeeded.
  absl::Status Move(const TensorMetadata& old_meta,
                    const TensorMetadata& new_meta, const ReshardPlan& plan,
                    MoveTally* tally, std::vector<size_t>* failed = nullptr,
                    SentBytes* sent = nullptr);
  // Move, counted on the progress board under old_meta's name; when
  // Transfers fail, their pieces go once more from other replicas of their
  // source shards (not on a worker that failed as a source), so a replica
  // that dies during a reshard does not fail it.
  absl::Status MoveFromAnyReplica(const TensorMetadata& old_meta,
                                  const TensorMetadata& new_meta,
                                  const ReshardPlan& plan,
                                  SentBytes* sent = nullptr);
  // Fills new whole copies of `sources`' shards (a repair's replicas, a
  // joining worker's mirrors: `plan`'s pieces, each a whole shard onto a
  // new copy of the same shard in `to`). In relay mode (host shards) one
  // relay per shard carries them, so several new copies of a shard cost
  // its source one send; a copy whose hop fails, and every copy in the
  // other modes, goes by MoveFromAnyReplica.
  absl::Status FillCopies(const TensorMetadata& sources,
                          const TensorMetadata& to, const ReshardPlan& plan,
                          SentBytes* sent = nullptr);
  // Copies each shard of `written` (its worker addresses filled in) from its
  // first replica to the others, per the ReplicaForward mode, then to its
  // mirrors; the workers pull. A replica that fails fails it; a mirror that
  // fails is added to `failed_mirrors` (shard, copy index) when given (else
  // it fails it too). `before` (optional): the version an update replaces;
  // a relayed copy whose worker holds that version's copy of the same
  // shard gets only the changes (CLI.md "Mirrors (v4)").
  absl::Status ForwardReplicas(
      const TensorMetadata& written,
      std::vector<std::pair<size_t, size_t>>* failed_mirrors = nullptr,
      SentBytes* sent = nullptr, const TensorMetadata* before = nullptr);
  // Fills each of `copies`' destinations in `to` from its source in `from`
  // (same shards, same boxes) by relay, every shard's hops at once. A
  // destination whose hop fails is cut out (the hops after it carry on
  // from further up) and added to `failed` (shard, copy index); the first
  // such failure is returned. `sent` (optional) adds what each worker sent.
  // `before` (optional): as ForwardReplicas's. `tally` (optional) adds
  // each copy's bytes as its hop lands.
  absl::Status Relay(const TensorMetadata& from, const TensorMetadata& to,
                     const std::vector<RelayCopies>& copies,
                     std::vector<std::pair<size_t, size_t>>* failed,
                     SentBytes* sent, const TensorMetadata* before = nullptr,
                     MoveTally* tally = nullptr);

 private:
  WorkerRegistry* const registry_;
  WorkerControl* const workers_;
  MoveProgressBoard* const progress_;
  const ReplicaForward forward_;
  ExchangeGroups exchanges_;
  // Hops each worker takes part in now (the relay puts busy ones later).
  absl::Mutex busy_mu_;
  std::map<std::string, int64_t> busy_ ABSL_GUARDED_BY(busy_mu_);
};

}  // namespace tessera

#endif  // TESSERA_COORDINATOR_PIECE_MOVER_H_
