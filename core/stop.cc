#include "core/stop.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

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

CancelWhen::CancelWhen(std::function<bool()> cancelled,
                       Cancellation* cancellation, absl::Duration every) {
  if (!cancelled) return;
  poller_ = std::thread(
      [this, cancelled = std::move(cancelled), cancellation, every] {
        while (!done_.WaitForNotificationWithTimeout(every)) {
          if (cancelled()) {
            cancellation->Cancel();
            return;
          }
        }
      });
}

CancelWhen::~CancelWhen() {
  done_.Notify();
  if (poller_.joinable()) poller_.join();
}

absl::Status AwaitUnlessStopped(absl::Mutex& mu,
                                const absl::Condition& condition,
                                const StopCondition& stop,
                                absl::string_view what) {
  while (!condition.Eval()) {
    if (absl::Status stopped = stop.Check(what); !stopped.ok()) return stopped;
    mu.AwaitWithTimeout(condition, absl::Milliseconds(10));
  }
  return absl::OkStatus();
}

absl::StatusOr<OneAtATime::Held> OneAtATime::Take(const StopCondition& stop,
                                                  absl::string_view what) {
  absl::MutexLock lock(&mu_);
  auto free = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !held_; };
  TESSERA_RETURN_IF_ERROR(
      AwaitUnlessStopped(mu_, absl::Condition(&free), stop, what));
  held_ = true;
  return Held(this);
}

}  // namespace tessera
