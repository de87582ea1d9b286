#include "ops/daemon_life.h"

namespace tessera {

void DaemonLife::Fail(const absl::Status& status) {
  {
    absl::MutexLock lock(&mu_);
    if (!failure_.ok()) return;
    failure_ = status;
  }
  if (on_fatal_) on_fatal_();
  absl::MutexLock lock(&mu_);
  fatal_told_ = true;
}

bool DaemonLife::RequestStop() {
  absl::MutexLock lock(&mu_);
  stop_requested_ = true;
  return !failure_.ok();
}

void DaemonLife::MarkServing() {
  absl::MutexLock lock(&mu_);
  serving_ = true;
}

absl::Status DaemonLife::failure() const {
  absl::MutexLock lock(&mu_);
  return failure_;
}

absl::Status DaemonLife::Wait() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](DaemonLife* life) ABSL_EXCLUSIVE_LOCKS_REQUIRED(life->mu_) {
        return life->stop_requested_ || life->fatal_told_;
      },
      this));
  return failure_;
}

bool DaemonLife::WaitUntilServing(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(
      absl::Condition(
          +[](DaemonLife* life) ABSL_EXCLUSIVE_LOCKS_REQUIRED(life->mu_) {
            return life->serving_ || life->stop_requested_ ||
                   !life->failure_.ok();
          },
          this),
      timeout);
  return serving_ && !stop_requested_ && failure_.ok();
}

}  // namespace tessera
