// When work in progress gives up: StopCondition is polled by the working
// thread (a deadline, a caller's cancellation); Cancellation is how one
// party gives up calls that other threads are blocked in (CancelWhen turns
// the first into the second); OneAtATime is a
// lock whose waiters give up by their StopCondition.
#ifndef TESSERA_CORE_STOP_H_
#define TESSERA_CORE_STOP_H_

#include <cstdint>
#include <functional>
#include <map>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace tessera {

// After `deadline` (DEADLINE_EXCEEDED) or once `cancelled` returns true
// (CANCELLED). Polled by the calling thread; the default never stops.
struct StopCondition {
  absl::Time deadline = absl::InfiniteFuture();
  std::function<bool()> cancelled;  // may be empty

  // OK, or the status saying why to stop `what` now.
  absl::Status Check(absl::string_view what = "planning shard geometry") const;
};

// Gives up a set of calls in flight at once (an NCCL exchange whose member
// failed: its peers would otherwise wait for it until their deadline). A
// call that can be stopped says how while it runs (OnCancel).
class Cancellation {
 public:
  class Registration {
   public:
    Registration(Registration&& other) noexcept;
    Registration& operator=(Registration&&) = delete;
    Registration(const Registration&) = delete;
    ~Registration();

   private:
    friend class Cancellation;
    Registration(Cancellation* owner, uint64_t id) : owner_(owner), id_(id) {}
    Cancellation* owner_;  // null: nothing to undo
    uint64_t id_;
  };

  Cancellation() = default;
  Cancellation(const Cancellation&) = delete;
  Cancellation& operator=(const Cancellation&) = delete;

  // Runs every registered `stop` once; a `stop` registered later runs at
  // once. Idempotent.
  void Cancel() ABSL_LOCKS_EXCLUDED(mu_);
  bool cancelled() const ABSL_LOCKS_EXCLUDED(mu_);

  // Runs `stop` on Cancel until the registration is destroyed. `stop` must
  // not block or call back into this Cancellation; it runs under a lock so
  // that it never runs after the registration is gone.
  [[nodiscard]] Registration OnCancel(std::function<void()> stop)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uint64_t, std::function<void()>> stops_ ABSL_GUARDED_BY(mu_);
};

// Cancels `cancellation` once `cancelled` returns true, polled every
// `every` on a thread of its own while it lives: how a caller's
// cancellation that has no signal (a gRPC server handler's context) stops
// calls blocked in other threads. An empty `cancelled` starts no thread.
class CancelWhen {
 public:
  CancelWhen(std::function<bool()> cancelled, Cancellation* cancellation,
             absl::Duration every = absl::Milliseconds(20));
  ~CancelWhen();
  CancelWhen(const CancelWhen&) = delete;
  CancelWhen& operator=(const CancelWhen&) = delete;

 private:
  absl::Notification done_;
  std::thread poller_;
};

// Waits, with `mu` held, until `condition` holds, or until `stop` says to
// stop `what` (its status). `stop` is polled every 10 ms while waiting: a
// caller's cancellation has no signal to wake on.
absl::Status AwaitUnlessStopped(absl::Mutex& mu,
                                const absl::Condition& condition,
                                const StopCondition& stop,
                                absl::string_view what)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

// One holder at a time, as a mutex, but a waiter gives up by its own
// StopCondition instead of waiting as long as the holder takes (an NCCL
// exchange holds its GPU until its own deadline).
class OneAtATime {
 public:
  class Held {
   public:
    Held(Held&& other) noexcept;
    Held& operator=(Held&&) = delete;
    Held(const Held&) = delete;
    ~Held();

   private:
    friend class OneAtATime;
    explicit Held(OneAtATime* owner) : owner_(owner) {}
    OneAtATime* owner_;  // null: moved from
  };

  OneAtATime() = default;
  OneAtATime(const OneAtATime&) = delete;
  OneAtATime& operator=(const OneAtATime&) = delete;

  // Held until the result is destroyed; else why `stop` stopped the wait
  // for `what`.
  absl::StatusOr<Held> Take(const StopCondition& stop, absl::string_view what)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::Mutex mu_;
  bool held_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace tessera

#endif  // TESSERA_CORE_STOP_H_
