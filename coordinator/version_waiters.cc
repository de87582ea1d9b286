#include "coordinator/version_waiters.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tessera {

struct VersionWaiters::Handle::State {
  std::string name;
  uint64_t least = 0;
  absl::Time deadline;
  absl::Mutex mu;
  Done done ABSL_GUARDED_BY(mu);  // empty once ended or cancelled

  // The callback, once: empty when the wait already ended.
  Done Take() {
    absl::MutexLock lock(&mu);
    Done taken = std::move(done);
    done = nullptr;
    return taken;
  }
  bool ended() {
    absl::MutexLock lock(&mu);
    return done == nullptr;
  }
};

void VersionWaiters::Handle::Cancel() {
  if (state_ != nullptr) state_->Take();
}

VersionWaiters::VersionWaiters(const TensorTable* table, int max_waiters)
    : table_(table), max_waiters_(max_waiters) {
  watcher_ = std::thread([this] { Watch(); });
}

VersionWaiters::~VersionWaiters() {
  stopping_.store(true);
  changes_.fetch_add(1);
  table_->Nudge();
  watcher_.join();
  std::list<std::shared_ptr<Handle::State>> left;
  {
    absl::MutexLock lock(&mu_);
    left.swap(waits_);
  }
  for (const auto& state : left) {
    if (Done done = state->Take()) {
      done(absl::UnavailableError(
          "the coordinator is stopping; wait again at the next one"));
    }
  }
}

int64_t VersionWaiters::waiting() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(waits_.size());
}

absl::StatusOr<VersionWaiters::Handle> VersionWaiters::Wait(
    const std::string& name, uint64_t least, absl::Time deadline, Done done) {
  Handle handle;
  absl::StatusOr<TensorMetadataPtr> meta = table_->Get(name);
  if (!meta.ok()) {
    done(meta.status());
    return handle;
  }
  if ((*meta)->version >= least) {
    done((*meta)->version);
    return handle;
  }
  handle.state_ = std::make_shared<Handle::State>();
  handle.state_->name = name;
  handle.state_->least = least;
  handle.state_->deadline = deadline;
  {
    absl::MutexLock lock(&handle.state_->mu);
    handle.state_->done = std::move(done);
  }
  {
    absl::MutexLock lock(&mu_);
    if (static_cast<int>(waits_.size()) >= max_waiters_) {
      return absl::ResourceExhaustedError(
          absl::StrCat("waiters: this coordinator holds ", max_waiters_,
                       " waits already (--max_waiters); try again later"));
    }
    waits_.push_back(handle.state_);
  }
  // The watcher takes the new wait (and its deadline) into account now.
  changes_.fetch_add(1);
  table_->Nudge();
  return handle;
}

void VersionWaiters::Watch() {
  while (!stopping_.load()) {
    // Read before the snapshot: a wait added after it changes `changes_`
    // and ends the sleep at once.
    const uint64_t seen = changes_.load();
    std::vector<std::pair<std::string, uint64_t>> targets;
    absl::Time earliest = absl::InfiniteFuture();
    {
      absl::MutexLock lock(&mu_);
      targets.reserve(waits_.size());
      for (const auto& state : waits_) {
        targets.emplace_back(state->name, state->least);
        earliest = std::min(earliest, state->deadline);
      }
    }
    table_->AwaitAny(targets, &changes_, seen, earliest);
    Sweep();
  }
}

void VersionWaiters::Sweep() {
  const absl::Time now = absl::Now();
  std::vector<std::pair<Done, absl::StatusOr<uint64_t>>> ended;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = waits_.begin(); it != waits_.end();) {
      Handle::State& state = **it;
      std::optional<absl::StatusOr<uint64_t>> result;
      if (state.ended()) {
        it = waits_.erase(it);  // cancelled
        continue;
      }
      absl::StatusOr<TensorMetadataPtr> meta = table_->Get(state.name);
      if (!meta.ok()) {
        result = meta.status();
      } else if ((*meta)->version >= state.least) {
        result = (*meta)->version;
      } else if (now >= state.deadline) {
        result = absl::DeadlineExceededError(
            absl::StrCat("timeout: tensor '", state.name, "' is at version ",
                         (*meta)->version, ", not yet ", state.least));
      }
      if (!result.has_value()) {
        ++it;
        continue;
      }
      if (Done done = state.Take())
        ended.emplace_back(std::move(done), *result);
      it = waits_.erase(it);
    }
  }
  for (auto& [done, result] : ended) done(std::move(result));
}

}  // namespace tessera
