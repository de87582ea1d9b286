// FakeWorkerControl: in-memory workers for the coordinator's unit tests.
// Each worker, named by its address, holds shard ids with their sizes;
// every call is counted, every Transfer kept, and a worker can be told to
// fail its next call. No bytes move: a Transfer checks that both ends hold
// the shards it names. Test-only; thread-safe.
#ifndef TESSERA_COORDINATOR_FAKE_WORKER_CONTROL_H_
#define TESSERA_COORDINATOR_FAKE_WORKER_CONTROL_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/worker_control.h"

namespace tessera {

class FakeWorkerControl : public WorkerControl {
 public:
  // Calls per worker.
  struct Counts {
    int allocate = 0;
    int free = 0;
    int seal = 0;
    int reset = 0;
    int transfer = 0;  // Transfers whose destination is this worker
    int exchange_id = 0;
    int exchange = 0;
    int most_exchanges_at_once = 0;  // shares in progress together
  };

  // Adds an empty worker; calls to addresses never added are UNAVAILABLE.
  void AddWorker(const std::string& address) ABSL_LOCKS_EXCLUDED(mu_);
  // The next call to `address` (Allocate, Free, or a Transfer to or from
  // it) fails with `status` and changes nothing; later calls work again.
  void FailNext(const std::string& address, absl::Status status)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Shard ids the worker holds, ascending.
  std::vector<uint64_t> Held(const std::string& address) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Shards held on every worker together.
  size_t TotalHeld() const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t BytesUsed(const std::string& address) const ABSL_LOCKS_EXCLUDED(mu_);
  Counts counts(const std::string& address) const ABSL_LOCKS_EXCLUDED(mu_);
  // Every Transfer that succeeded, in order.
  std::vector<TransferBatch> transfers() const ABSL_LOCKS_EXCLUDED(mu_);
  // Puts a shard on a worker directly (a shard left over from before).
  void Hold(const std::string& address, uint64_t shard_id, int64_t bytes)
      ABSL_LOCKS_EXCLUDED(mu_);

  absl::StatusOr<BytesUsedReading> Allocate(const WorkerRef& worker,
                                            const AllocateBatch& batch) override
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<BytesUsedReading> Free(
      const WorkerRef& worker, const std::vector<uint64_t>& shard_ids) override
      ABSL_LOCKS_EXCLUDED(mu_);
  // Checks that the worker holds every shard (NOT_FOUND) and marks them
  // sealed.
  absl::Status Seal(const WorkerRef& worker,
                    const std::vector<uint64_t>& shard_ids,
                    bool persist) override ABSL_LOCKS_EXCLUDED(mu_);
  // Whether the worker sealed shard `shard_id`.
  bool Sealed(const std::string& address, uint64_t shard_id) const
      ABSL_LOCKS_EXCLUDED(mu_);
  void Reset(const std::string& address) override ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Transfer(const TransferBatch& batch,
                        SentBytes* sent = nullptr) override
      ABSL_LOCKS_EXCLUDED(mu_);

  // The worker takes part in exchanges (a GPU worker with NCCL); others
  // decline them (FAILED_PRECONDITION), as the default does.
  void EnableExchanges(const std::string& address) ABSL_LOCKS_EXCLUDED(mu_);
  // The worker's shares wait for a peer that never comes, as an NCCL
  // member does: they end only when cancelled (CANCELLED) or after
  // `patience` (DEADLINE_EXCEEDED).
  void WaitInExchanges(const std::string& address, absl::Duration patience)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The worker's shares succeed after `duration` (moving bytes), so that
  // exchanges can overlap.
  void TakeTimeInExchanges(const std::string& address, absl::Duration duration)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Exchange shares in progress together, on all workers.
  int most_shares_at_once() const ABSL_LOCKS_EXCLUDED(mu_);
  // Every exchange share that succeeded, in order, with its worker.
  std::vector<std::pair<std::string, ExchangePlan>> exchanges() const
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<std::string> ExchangeId(const WorkerRef& worker) override
      ABSL_LOCKS_EXCLUDED(mu_);
  // Checks that the worker holds every shard its share names; moves
  // nothing (returns 0 bytes).
  absl::StatusOr<int64_t> Exchange(const WorkerRef& worker,
                                   const ExchangePlan& plan,
                                   Cancellation* cancellation) override
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Worker {
    std::map<uint64_t, int64_t> shards;  // id -> bytes
    std::set<uint64_t> sealed;
    int64_t bytes_used = 0;
    uint64_t readings = 0;  // numbers its bytes_used readings, as a worker does
    absl::Status fail_next;
    Counts counts;
    bool exchanges = false;
    absl::Duration exchange_wait = absl::ZeroDuration();
    absl::Duration exchange_time = absl::ZeroDuration();
    int exchanges_in_progress = 0;
  };
  // The worker at `address`, or UNAVAILABLE; consumes a queued failure.
  absl::StatusOr<Worker*> Reach(const std::string& address)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::map<std::string, Worker> workers_ ABSL_GUARDED_BY(mu_);
  std::vector<TransferBatch> transfers_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<std::string, ExchangePlan>> exchanges_
      ABSL_GUARDED_BY(mu_);
  int ids_made_ ABSL_GUARDED_BY(mu_) = 0;
  int shares_now_ ABSL_GUARDED_BY(mu_) = 0;
  int most_shares_at_once_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tessera

#endif  // TESSERA_COORDINATOR_FAKE_WORKER_CONTROL_H_
