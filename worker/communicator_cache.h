// CommunicatorCache: the communicators (NCCL's, in NcclExchange) a worker
// has joined, kept by id so that later exchanges among the same workers
// reuse them.
//
// Joining takes as long as the slowest member, up to the caller's deadline,
// so joins under different ids run at once: one member that never comes
// delays only its own set. A second caller for an id being joined waits
// for that join (or its own stop) and shares its outcome instead of
// joining twice. At most `capacity` communicators are kept or being
// joined; past that the least recently used idle one is let go, and when
// none is idle the join is refused. A let-go or dropped communicator is
// destroyed outside the lock, by whoever held it last. Thread-safe.
//
// Kept apart from NCCL so that the host tests run every rule here.
#ifndef TESSERA_WORKER_COMMUNICATOR_CACHE_H_
#define TESSERA_WORKER_COMMUNICATOR_CACHE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/stop.h"

namespace tessera {

template <typename Comm>
class CommunicatorCache {
 public:
  using Join = std::function<absl::StatusOr<std::shared_ptr<Comm>>()>;

  explicit CommunicatorCache(size_t capacity) : capacity_(capacity) {}

  CommunicatorCache(const CommunicatorCache&) = delete;
  CommunicatorCache& operator=(const CommunicatorCache&) = delete;

  // The communicator kept under `id`, or the one `join` makes now (called
  // without the lock; it must end by the caller's own stop condition).
  // While another caller joins `id`, waits for it until `stop`.
  absl::StatusOr<std::shared_ptr<Comm>> Get(const std::string& id,
                                            const StopCondition& stop,
                                            const Join& join)
      ABSL_LOCKS_EXCLUDED(mu_) {
    std::vector<std::shared_ptr<Slot>> let_go;  // destroyed after the lock
    std::shared_ptr<Slot> slot;
    {
      absl::MutexLock lock(&mu_);
      auto it = slots_.find(id);
      if (it != slots_.end()) {
        slot = it->second;
        return AwaitJoin(slot, stop);
      }
      while (slots_.size() >= capacity_) {
        auto oldest = slots_.end();
        for (auto s = slots_.begin(); s != slots_.end(); ++s) {
          if (Idle(s->second) &&
              (oldest == slots_.end() ||
               s->second->last_use < oldest->second->last_use)) {
            oldest = s;
          }
        }
        if (oldest == slots_.end()) {
          return absl::ResourceExhaustedError(absl::StrCat(
              capacity_, " communicators are in use or being joined here"));
        }
        let_go.push_back(std::move(oldest->second));
        slots_.erase(oldest);
      }
      slot = std::make_shared<Slot>();
      slots_.emplace(id, slot);
    }
    let_go.clear();
    absl::StatusOr<std::shared_ptr<Comm>> joined = join();
    if (joined.ok() && *joined == nullptr) {
      joined = absl::InternalError("joining made no communicator");
    }
    absl::MutexLock lock(&mu_);
    slot->done = true;
    slot->result = joined;
    slot->last_use = ++tick_;
    if (!joined.ok()) {
      // Waiters share the failure; the next caller joins afresh.
      auto it = slots_.find(id);
      if (it != slots_.end() && it->second == slot) slots_.erase(it);
    }
    return joined;
  }

  // Forgets `comm` (its exchange failed, or it was aborted) if it is still
  // the one kept under `id`; holders keep theirs until they let it go.
  void Drop(const std::string& id, const Comm* comm) ABSL_LOCKS_EXCLUDED(mu_) {
    std::shared_ptr<Slot> gone;  // destroyed after the lock
    absl::MutexLock lock(&mu_);
    auto it = slots_.find(id);
    if (it == slots_.end() || !it->second->done || !it->second->result.ok() ||
        it->second->result->get() != comm) {
      return;
    }
    gone = std::move(it->second);
    slots_.erase(it);
  }

  // Lets every communicator go (the worker stops).
  void Clear() ABSL_LOCKS_EXCLUDED(mu_) {
    std::map<std::string, std::shared_ptr<Slot>> gone;
    absl::MutexLock lock(&mu_);
    gone.swap(slots_);
  }

  // Kept, or being joined.
  size_t size() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return slots_.size();
  }

 private:
  struct Slot {
    bool done = false;
    absl::StatusOr<std::shared_ptr<Comm>> result =
        absl::UnavailableError("not joined yet");
    uint64_t last_use = 0;
  };

  // Nobody but this cache holds it, and its join is over.
  static bool Idle(const std::shared_ptr<Slot>& slot) {
    return slot.use_count() == 1 && slot->done && slot->result.ok() &&
           slot->result->use_count() == 1;
  }

  absl::StatusOr<std::shared_ptr<Comm>> AwaitJoin(
      const std::shared_ptr<Slot>& slot, const StopCondition& stop)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (absl::Status stopped = AwaitUnlessStopped(
            mu_, absl::Condition(&slot->done), stop,
            "waiting for a communicator another exchange is joining");
        !stopped.ok()) {
      return stopped;
    }
    if (!slot->result.ok()) {
      return absl::Status(
          slot->result.status().code(),
          absl::StrCat("another exchange's join under this id failed: ",
                       slot->result.status().message()));
    }
    slot->last_use = ++tick_;
    return slot->result;
  }

  const size_t capacity_;
  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<Slot>> slots_ ABSL_GUARDED_BY(mu_);
  uint64_t tick_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tessera

#endif  // TESSERA_WORKER_COMMUNICATOR_CACHE_H_
