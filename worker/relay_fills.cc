#include "worker/relay_fills.h"

#include "absl/strings/str_cat.h"
#include "core/errors.h"

namespace tessera {

absl::Status RelayFills::Begin(uint64_t relay, uint64_t shard) {
  absl::MutexLock lock(&mu_);
  const Key key{relay, shard};
  auto it = fills_.find(key);
  if (it != fills_.end() && !it->second.ended) {
    return absl::AlreadyExistsError(
        absl::StrCat("relay ", relay, " is filling shard ", shard, " already"));
  }
  if (running_ >= kMaxRunningRelayFills) {
    return absl::ResourceExhaustedError(
        absl::StrCat(running_, " relay hops fill shards here: at most ",
                     kMaxRunningRelayFills));
  }
  fills_[key] = Fill{};  // a retried hop starts its record afresh
  ++running_;
  return absl::OkStatus();
}

void RelayFills::Advance(uint64_t relay, uint64_t shard, int64_t chunks_done) {
  absl::MutexLock lock(&mu_);
  auto it = fills_.find({relay, shard});
  if (it != fills_.end() && !it->second.ended) {
    it->second.chunks_done = chunks_done;
  }
}

void RelayFills::Finish(uint64_t relay, uint64_t shard, bool done) {
  absl::MutexLock lock(&mu_);
  const Key key{relay, shard};
  auto it = fills_.find(key);
  if (it == fills_.end() || it->second.ended) return;
  it->second.ended = true;
  it->second.done = done;
  --running_;
  finished_.push_back(key);
  while (finished_.size() > kMaxFinishedRelayFills) {
    auto old = fills_.find(finished_.front());
    if (old != fills_.end() && old->second.ended) fills_.erase(old);
    finished_.pop_front();
  }
}

absl::StatusOr<RelayFillProgress> RelayFills::Await(uint64_t relay,
                                                    uint64_t shard,
                                                    int64_t have,
                                                    absl::Time until) {
  const Key key{relay, shard};
  absl::MutexLock lock(&mu_);
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = fills_.find(key);
    return it != fills_.end() &&
           (it->second.ended || it->second.chunks_done > have);
  };
  mu_.AwaitWithDeadline(absl::Condition(&ready), until);
  RelayFillProgress progress;
  auto it = fills_.find(key);
  if (it == fills_.end()) return progress;
  const Fill& fill = it->second;
  if (fill.ended && !fill.done) {
    return UnavailableError(absl::StrCat("relay ", relay, "'s fill of shard ",
                                         shard, " here (it failed)"));
  }
  progress.started = true;
  progress.chunks_done = fill.chunks_done;
  progress.done = fill.done;
  return progress;
}

size_t RelayFills::running() const {
  absl::MutexLock lock(&mu_);
  return running_;
}

}  // namespace tessera
