// ExchangeGroups: the coordinator's side of NCCL exchanges between GPU
// workers (core/transfer.h Exchange). For each set of member workers it
// keeps the communicator id they joined (asked once of the first member,
// whose process hosts NCCL's bootstrap), and runs one exchange per worker
// at a time: NCCL matches a communicator's operations in the order every
// member posts them, so two reshards among the same workers must not
// interleave, and a GPU that runs two communicators' exchanges at once can
// wait in one for a peer that waits in the other. Each exchange takes its
// members' turns in name order, so exchanges never wait on each other in a
// cycle; exchanges among other workers run alongside.
// After a failure it forgets the id (the members aborted their
// communicators; the next exchange makes a fresh one) and leaves that set
// of workers to pulls for `cool_down`. Thread-safe.
#ifndef TESSERA_COORDINATOR_EXCHANGE_GROUPS_H_
#define TESSERA_COORDINATOR_EXCHANGE_GROUPS_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "coordinator/worker_control.h"
#include "core/transfer.h"

namespace tessera {

class ExchangeGroups {
 public:
  static constexpr size_t kMaxGroups = 1024;

  // `workers` (not owned) outlives this.
  explicit ExchangeGroups(WorkerControl* workers,
                          absl::Duration cool_down = absl::Minutes(1));

  // Moves every piece of `batches` between two different workers by one
  // exchange among those workers, all members at once; pieces within one
  // worker are left to the caller. OK at once when no piece crosses
  // workers. FAILED_PRECONDITION while the set cools down after a failure,
  // when a member's share exceeds kMaxExchangePieces (core/transfer.h) or
  // when a member takes no part; else the first member's error.
  absl::Status Run(absl::Span<const TransferBatch> batches, int64_t item_bytes)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Worker `name` (re)started: every set it is in makes a fresh
  // communicator next time, without cooling down.
  void Forget(const std::string& name) ABSL_LOCKS_EXCLUDED(mu_);

  struct Stats {
    int64_t exchanges = 0;  // that succeeded
    int64_t failures = 0;   // that were tried and failed
    int64_t bytes = 0;      // moved by the successful ones
  };
  Stats stats() const;

 private:
  struct Group {
    std::vector<std::string> members;  // names
    absl::Mutex run;                   // one exchange at a time
    std::string id ABSL_GUARDED_BY(run);
    absl::Time cool_until ABSL_GUARDED_BY(run) = absl::InfinitePast();
    // A member restarted while the set was in use: the next exchange
    // makes a fresh communicator, without cooling down.
    std::atomic<bool> member_restarted{false};
  };

  WorkerControl* const workers_;
  const absl::Duration cool_down_;
  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<Group>> groups_ ABSL_GUARDED_BY(mu_);
  // Held by the exchange a worker is in, by worker name; dropped when no
  // exchange holds or waits for it.
  std::map<std::string, std::shared_ptr<absl::Mutex>> turns_
      ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> exchanges_{0}, failures_{0}, bytes_{0};
};

}  // namespace tessera

#endif  // TESSERA_COORDINATOR_EXCHANGE_GROUPS_H_
