// VersionWaiters: callers waiting for a tensor's next version (`tessera
// wait`, CLI.md "Waiting for a version (v4)"). Each wait is a callback,
// not a thread: one watcher thread sleeps on the tensor table's mutex
// until a commit meets a wait, a waited tensor goes, a new wait arrives or
// the earliest deadline passes, so a commit answers its waiters at once
// and nothing polls. At most `max_waiters` waits are held. Thread-safe.
#ifndef TESSERA_COORDINATOR_VERSION_WAITERS_H_
#define TESSERA_COORDINATOR_VERSION_WAITERS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/tensor_table.h"

namespace tessera {

class VersionWaiters {
 public:
  // How a wait ends: the committed version; NOT_FOUND (the tensor went);
  // DEADLINE_EXCEEDED; UNAVAILABLE (the coordinator is stopping). Called
  // once, on the watcher's thread or the caller's, never under a lock.
  using Done = std::function<void(absl::StatusOr<uint64_t>)>;
  // Cancels a wait before it ends (its caller went): `done` is then not
  // called. Safe to call after it ended.
  class Handle {
   public:
    void Cancel();

   private:
    friend class VersionWaiters;
    struct State;
    std::shared_ptr<State> state_;
  };

  // `table` (not owned) outlives the waiters.
  VersionWaiters(const TensorTable* table, int max_waiters);
  // Ends every wait (UNAVAILABLE) and stops the watcher.
  ~VersionWaiters();
  VersionWaiters(const VersionWaiters&) = delete;
  VersionWaiters& operator=(const VersionWaiters&) = delete;

  // Waits until `name`'s committed version is at least `least`: `done` is
  // called at once (on this thread) when it already is, or the tensor is
  // not ready (NOT_FOUND). RESOURCE_EXHAUSTED (nothing held, `done` not
  // called) beyond max_waiters.
  absl::StatusOr<Handle> Wait(const std::string& name, uint64_t least,
                              absl::Time deadline, Done done)
      ABSL_LOCKS_EXCLUDED(mu_);

  int max_waiters() const { return max_waiters_; }
  int64_t waiting() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Watch();
  // Ends the waits that are met, gone or past their deadline.
  void Sweep() ABSL_LOCKS_EXCLUDED(mu_);

  const TensorTable* const table_;
  const int max_waiters_;
  // Changes when a wait arrives or the waiters stop: wakes the watcher.
  std::atomic<uint64_t> changes_{0};
  std::atomic<bool> stopping_{false};
  mutable absl::Mutex mu_;
  std::list<std::shared_ptr<Handle::State>> waits_ ABSL_GUARDED_BY(mu_);
  std::thread watcher_;
};

}  // namespace tessera

#endif  // TESSERA_COORDINATOR_VERSION_WAITERS_H_
