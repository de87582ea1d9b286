#include "transport/small_read_coalescer.h"

#include <algorithm>
#include <utility>

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
  size_t n = 0;
  for (const auto& [key, lane] : lanes_) n += lane.waiting.size();
  return static_cast<int>(n);
}

int SmallReadCoalescer::lanes() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(lanes_.size());
}

std::vector<SmallRead*> SmallReadCoalescer::TakeBatch(Lane& lane,
                                                      SmallRead* first) {
  std::vector<SmallRead*> batch = {first};
  if (!coalesce_) return batch;
  int64_t bytes = first->bytes;
  for (auto it = lane.waiting.begin();
       it != lane.waiting.end() &&
       static_cast<int64_t>(batch.size()) < kMaxRegionsPerSmallRead;) {
    SmallRead* read = *it;
    if (bytes + read->bytes > kMaxChunkBytes) {
      ++it;
      continue;
    }
    bytes += read->bytes;
    read->taken = true;
    batch.push_back(read);
    it = lane.waiting.erase(it);
  }
  return batch;
}

void SmallReadCoalescer::SendBatch(const std::string& key,
                                   const std::vector<SmallRead*>& batch) {
  ++calls_;
  if (batch.size() > 1) ++coalesced_calls_;
  mu_.Unlock();
  const absl::Status status = send_(batch);
  mu_.Lock();
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
  --lanes_[key].in_flight;
  HandOutPlaces(key);
}

void SmallReadCoalescer::HandOutPlaces(const std::string& key) {
  auto it = lanes_.find(key);
  if (it == lanes_.end()) return;
  Lane& lane = it->second;
  // (A worker found not to coalesce gets every waiting read at once, as
  // it would have without waiting.)
  while (!lane.waiting.empty() &&
         (!coalesce_ || lane.in_flight < max_in_flight_)) {
    SmallRead* next = lane.waiting.front();
    lane.waiting.pop_front();
    next->lead = true;
    ++lane.in_flight;
  }
  if (lane.in_flight == 0 && lane.waiting.empty()) lanes_.erase(it);
}

absl::Status SmallReadCoalescer::Read(SmallRead& read) {
  mu_.Lock();
  // The key outlives every use below even after `read` is handed back.
  const std::string key = read.key;
  Lane& lane = lanes_[key];
  if (!coalesce_ || (lane.in_flight < max_in_flight_ && lane.waiting.empty())) {
    ++lane.in_flight;
    SendBatch(key, {&read});
  } else {
    lane.waiting.push_back(&read);
    // Wakes when this read's call returned, or when it is given a place
    // (absl wakes only the waiters whose condition holds).
    const auto woken = [](SmallRead* r) { return r->done || r->lead; };
    if (!mu_.AwaitWithDeadline(absl::Condition(+woken, &read), read.deadline)) {
      if (!read.taken) {
        lane.waiting.erase(
            std::find(lane.waiting.begin(), lane.waiting.end(), &read));
        HandOutPlaces(key);  // drops the lane if that emptied it
        mu_.Unlock();
        return absl::DeadlineExceededError(
            "deadline passed while the read waited for a call to the worker");
      }
      // In another read's call, whose deadline is the earliest of its
      // reads': it ends by then.
      const auto returned = [](SmallRead* r) { return r->done; };
      mu_.Await(absl::Condition(+returned, &read));
    }
    if (read.lead) {
      read.lead = false;
      SendBatch(key, TakeBatch(lane, &read));
    }
  }
  if (read.alone) {
    // Its call failed as a whole: this read's own answer, by itself.
    read.alone = false;
    read.status = absl::OkStatus();
    ++lanes_[key].in_flight;
    SendBatch(key, {&read});
  }
  mu_.Unlock();
  return read.status;
}

}  // namespace tessera
