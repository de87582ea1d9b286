#include "core/stop.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace tessera {

absl::Status StopCondition::Check(absl::string_view what) const {
  if (cancelled && cancelled()) {
    return absl::CancelledError(absl::StrCat("cancelled while ", what));
  }
  if (deadline != absl::InfiniteFuture() && absl::Now() >= deadline) {
    return absl::DeadlineExceededError(
        absl::StrCat("deadline exceeded while ", what));
  }
  return absl::OkStatus();
}

Cancellation::Registration::Registration(Registration&& other) noexcept
    : owner_(std::exchange(other.owner_, nullptr)), id_(other.id_) {}

Cancellation::Registration::~Registration() {
  if (owner_ == nullptr) return;
  absl::MutexLock lock(&owner_->mu_);
  owner_->stops_.erase(id_);
}

void Cancellation::Cancel() {
  absl::MutexLock lock(&mu_);
  if (cancelled_) return;
  cancelled_ = true;
  for (auto& [id, stop] : stops_) stop();
}

bool Cancellation::cancelled() const {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

Cancellation::Registration Cancellation::OnCancel(std::function<void()> stop) {
  absl::MutexLock lock(&mu_);
  if (cancelled_) {
    stop();
    return Registration(nullptr, 0);
  }
  const uint64_t id = next_++;
  stops_.emplace(id, std::move(stop));
  return Registration(this, id);
}

OneAtATime::Held::Held(Held&& other) noexcept
    : owner_(std::exchange(other.owner_, nullptr)) {}

OneAtATime::Held::~Held() {
  if (owner_ == nullptr) return;
  absl::MutexLock lock(&owner_->mu_);
  owner_->held_ = false;
}

absl::StatusOr<OneAtATime::Held> OneAtATime::Take(const StopCondition& stop,
                                                  absl::string_view what) {
  absl::MutexLock lock(&mu_);
  auto free = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !held_; };
  // Polled in short slices: a caller's cancellation has no signal.
  while (held_) {
    if (absl::Status stopped = stop.Check(what); !stopped.ok()) return stopped;
    mu_.AwaitWithTimeout(absl::Condition(&free), absl::Milliseconds(10));
  }
  held_ = true;
  return Held(this);
}

}  // namespace tessera
