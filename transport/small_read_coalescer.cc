#include "transport/small_read_coalescer.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/limits.h"

namespace tessera {

SmallReadCoalescer::SmallReadCoalescer(int max_in_flight, Send send)
    : max_in_flight_(std::max(1, max_in_flight)), send_(std::move(send)) {}

int64_t SmallReadCoalescer::calls() const {
  absl::MutexLock lock(&mu_);
  return calls_;
}

int64_t SmallReadCoalescer::coalesced_calls() const {
  absl::MutexLock lock(&mu_);
  return coalesced_calls_;
}

int SmallReadCoalescer::waiting() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(waiting_.size());
}

std::vector<SmallRead*> SmallReadCoalescer::TakeBatch(SmallRead* first) {
  std::vector<SmallRead*> batch = {first};
  int64_t bytes = first->bytes;
  waiting_.erase(std::find(waiting_.begin(), waiting_.end(), first));
  for (auto it = waiting_.begin();
       it != waiting_.end() &&
       static_cast<int64_t>(batch.size()) < kMaxRegionsPerSmallRead;) {
    SmallRead* read = *it;
    if (read->key != first->key || bytes + read->bytes > kMaxChunkBytes) {
      ++it;
      continue;
    }
    bytes += read->bytes;
    batch.push_back(read);
    it = waiting_.erase(it);
  }
  for (SmallRead* read : batch) read->taken = true;
  return batch;
}

void SmallReadCoalescer::SendBatch(const std::vector<SmallRead*>& batch) {
  ++in_flight_;
  ++calls_;
  if (batch.size() > 1) ++coalesced_calls_;
  mu_.Unlock();
  const absl::Status status = send_(batch);
  mu_.Lock();
  --in_flight_;
  const bool several = batch.size() > 1;
  // A worker without coalesced reads: one at a time from now on.
  if (several && absl::IsUnimplemented(status)) coalesce_ = false;
  for (SmallRead* read : batch) {
    if (!status.ok()) {
      read->alone = several;
      if (!several) read->status = status;
    }
    read->done = true;
  }
  changed_.SignalAll();
}

absl::Status SmallReadCoalescer::Read(SmallRead& read) {
  mu_.Lock();
  if (!coalesce_ || (in_flight_ < max_in_flight_ && waiting_.empty())) {
    SendBatch({&read});
  } else {
    waiting_.push_back(&read);
    while (!read.done) {
      if (!read.taken && in_flight_ < max_in_flight_) {
        SendBatch(TakeBatch(&read));
        continue;
      }
      // A read already in someone's call waits for that call, whose
      // deadline is the earliest of its reads'.
      if (read.taken) {
        changed_.Wait(&mu_);
        continue;
      }
      if (changed_.WaitWithDeadline(&mu_, read.deadline) && !read.taken) {
        waiting_.erase(std::find(waiting_.begin(), waiting_.end(), &read));
        mu_.Unlock();
        return absl::DeadlineExceededError(
            "deadline passed while the read waited for a call to the worker");
      }
    }
  }
  if (read.alone) {
    // Its call failed as a whole: this read's own answer, by itself.
    read.alone = false;
    read.done = false;
    read.status = absl::OkStatus();
    SendBatch({&read});
  }
  mu_.Unlock();
  return read.status;
}

}  // namespace tessera
