// DaemonLife: how a daemon object's life ends, written once for the worker
// and the coordinator. Stop is asked (Wait returns OK), or the daemon fails
// after Start (a refused registration, a port that stops accepting, a lost
// leader lease): the first failure is kept, `on_fatal` runs once, and only
// then does Wait return it, so that whoever Wait wakes sees what on_fatal
// did. Thread-safe.
#ifndef TESSERA_OPS_DAEMON_LIFE_H_
#define TESSERA_OPS_DAEMON_LIFE_H_

#include <functional>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace tessera {

class DaemonLife {
 public:
  // `on_fatal` (may be empty) runs on the failing thread, once.
  explicit DaemonLife(std::function<void()> on_fatal)
      : on_fatal_(std::move(on_fatal)) {}
  DaemonLife(const DaemonLife&) = delete;
  DaemonLife& operator=(const DaemonLife&) = delete;

  // The daemon failed: the first call keeps `status` and runs on_fatal;
  // later ones change nothing.
  void Fail(const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_);
  // Stop was asked. Returns whether the daemon had failed before.
  bool RequestStop() ABSL_LOCKS_EXCLUDED(mu_);
  // It serves (the coordinator: once it leads).
  void MarkServing() ABSL_LOCKS_EXCLUDED(mu_);

  // Why it failed; OK while it has not.
  absl::Status failure() const ABSL_LOCKS_EXCLUDED(mu_);
  // Blocks until Stop is asked (OK) or a failure has been told (why).
  absl::Status Wait() ABSL_LOCKS_EXCLUDED(mu_);
  // Blocks until it serves (true), fails or is stopped (false), or
  // `timeout` passes (false).
  bool WaitUntilServing(absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const std::function<void()> on_fatal_;
  mutable absl::Mutex mu_;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  bool stop_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool fatal_told_ ABSL_GUARDED_BY(mu_) = false;  // on_fatal has run
  bool serving_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace tessera

#endif  // TESSERA_OPS_DAEMON_LIFE_H_
