#include "coordinator/fake_worker_control.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "core/errors.h"

namespace tessera {

void FakeWorkerControl::AddWorker(const std::string& address) {
  absl::MutexLock lock(&mu_);
  workers_[address];
}

void FakeWorkerControl::FailNext(const std::string& address,
                                 absl::Status status) {
  absl::MutexLock lock(&mu_);
  workers_[address].fail_next = std::move(status);
}

std::vector<uint64_t> FakeWorkerControl::Held(
    const std::string& address) const {
  absl::MutexLock lock(&mu_);
  std::vector<uint64_t> out;
  auto it = workers_.find(address);
  if (it == workers_.end()) return out;
  for (const auto& [id, bytes] : it->second.shards) out.push_back(id);
  return out;
}

size_t FakeWorkerControl::TotalHeld() const {
  absl::MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [address, worker] : workers_) n += worker.shards.size();
  return n;
}

int64_t FakeWorkerControl::BytesUsed(const std::string& address) const {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(address);
  return it == workers_.end() ? 0 : it->second.bytes_used;
}

FakeWorkerControl::Counts FakeWorkerControl::counts(
    const std::string& address) const {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(address);
  return it == workers_.end() ? Counts{} : it->second.counts;
}

std::vector<TransferBatch> FakeWorkerControl::transfers() const {
  absl::MutexLock lock(&mu_);
  return transfers_;
}

void FakeWorkerControl::Hold(const std::string& address, uint64_t shard_id,
                             int64_t bytes) {
  absl::MutexLock lock(&mu_);
  Worker& worker = workers_[address];
  worker.shards[shard_id] = bytes;
  worker.bytes_used += bytes;
}

absl::StatusOr<FakeWorkerControl::Worker*> FakeWorkerControl::Reach(
    const std::string& address) {
  auto it = workers_.find(address);
  if (it == workers_.end()) {
    return UnavailableError(absl::StrCat("worker at ", address));
  }
  Worker* worker = &it->second;
  if (!worker->fail_next.ok()) {
    absl::Status status = std::move(worker->fail_next);
    worker->fail_next = absl::OkStatus();
    return status;
  }
  return worker;
}

absl::StatusOr<BytesUsedReading> FakeWorkerControl::Allocate(
    const WorkerRef& ref, const AllocateBatch& batch) {
  const std::string& address = ref.address;
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(address);
  if (it != workers_.end()) ++it->second.counts.allocate;
  absl::StatusOr<Worker*> worker = Reach(address);
  if (!worker.ok()) return worker.status();
  for (const auto& [id, box] : batch.shards) {
    if ((*worker)->shards.count(id) > 0) {
      return absl::AlreadyExistsError(
          absl::StrCat("shard ", id, " already exists on ", address));
    }
  }
  for (const auto& [id, box] : batch.shards) {
    const int64_t bytes =
        box.NumElements() * static_cast<int64_t>(ItemSize(batch.dtype));
    (*worker)->shards[id] = bytes;
    (*worker)->bytes_used += bytes;
  }
  return BytesUsedReading{(*worker)->bytes_used, ++(*worker)->readings};
}

absl::StatusOr<BytesUsedReading> FakeWorkerControl::Free(
    const WorkerRef& ref, const std::vector<uint64_t>& shard_ids) {
  const std::string& address = ref.address;
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(address);
  if (it != workers_.end()) ++it->second.counts.free;
  absl::StatusOr<Worker*> worker = Reach(address);
  if (!worker.ok()) return worker.status();
  for (uint64_t id : shard_ids) {
    auto shard = (*worker)->shards.find(id);
    if (shard == (*worker)->shards.end()) continue;
    (*worker)->bytes_used -= shard->second;
    (*worker)->shards.erase(shard);
    (*worker)->sealed.erase(id);
  }
  return BytesUsedReading{(*worker)->bytes_used, ++(*worker)->readings};
}

absl::Status FakeWorkerControl::Seal(const WorkerRef& ref,
                                     const std::vector<uint64_t>& shard_ids,
                                     bool persist) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(ref.address);
  if (it != workers_.end()) ++it->second.counts.seal;
  absl::StatusOr<Worker*> worker = Reach(ref.address);
  if (!worker.ok()) return worker.status();
  for (uint64_t id : shard_ids) {
    if ((*worker)->shards.count(id) == 0) {
      return absl::NotFoundError(absl::StrCat("shard ", id, " is not held"));
    }
  }
  for (uint64_t id : shard_ids) (*worker)->sealed.insert(id);
  return absl::OkStatus();
}

bool FakeWorkerControl::Sealed(const std::string& address,
                               uint64_t shard_id) const {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(address);
  return it != workers_.end() && it->second.sealed.count(shard_id) != 0;
}

void FakeWorkerControl::Reset(const std::string& address) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(address);
  if (it != workers_.end()) ++it->second.counts.reset;
}

absl::Status FakeWorkerControl::Transfer(const TransferBatch& batch,
                                         SentBytes* sent) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(batch.dst_address);
  if (it != workers_.end()) ++it->second.counts.transfer;
  absl::StatusOr<Worker*> dst = Reach(batch.dst_address);
  if (!dst.ok()) return dst.status();
  absl::StatusOr<Worker*> src = Reach(batch.src_address);
  if (!src.ok()) return src.status();
  for (const TransferPiece& piece : batch.pieces) {
    if ((*src)->shards.count(piece.src_shard_id) == 0) {
      return NotFoundError(
          "shard", absl::StrCat(piece.src_shard_id, " on ", batch.src_address));
    }
    if ((*dst)->shards.count(piece.dst_shard_id) == 0) {
      return NotFoundError(
          "shard", absl::StrCat(piece.dst_shard_id, " on ", batch.dst_address));
    }
  }
  transfers_.push_back(batch);
  // No bytes move here: each piece counts its elements as sent.
  if (sent != nullptr) {
    for (const TransferPiece& piece : batch.pieces) {
      (*sent)[batch.src_worker] += piece.DstBox().NumElements();
    }
  }
  return absl::OkStatus();
}

int FakeWorkerControl::most_shares_at_once() const {
  absl::MutexLock lock(&mu_);
  return most_shares_at_once_;
}

void FakeWorkerControl::TakeTimeInExchanges(const std::string& address,
                                            absl::Duration duration) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(address);
  if (it != workers_.end()) it->second.exchange_time = duration;
}

void FakeWorkerControl::EnableExchanges(const std::string& address) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(address);
  if (it != workers_.end()) it->second.exchanges = true;
}

std::vector<std::pair<std::string, ExchangePlan>> FakeWorkerControl::exchanges()
    const {
  absl::MutexLock lock(&mu_);
  return exchanges_;
}

absl::StatusOr<std::string> FakeWorkerControl::ExchangeId(
    const WorkerRef& ref) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(ref.address);
  if (it != workers_.end()) ++it->second.counts.exchange_id;
  absl::StatusOr<Worker*> worker = Reach(ref.address);
  if (!worker.ok()) return worker.status();
  if (!(*worker)->exchanges) return WorkerControl::ExchangeId(ref);
  std::string id = absl::StrCat("id-", ++ids_made_, "-");
  id.resize(kExchangeIdBytes, '.');
  return id;
}

absl::StatusOr<int64_t> FakeWorkerControl::Exchange(
    const WorkerRef& ref, const ExchangePlan& plan,
    Cancellation* cancellation) {
  absl::Duration wait;
  {
    absl::MutexLock lock(&mu_);
    auto it = workers_.find(ref.address);
    if (it != workers_.end()) ++it->second.counts.exchange;
    absl::StatusOr<Worker*> worker = Reach(ref.address);
    if (!worker.ok()) return worker.status();
    if (!(*worker)->exchanges) {
      return WorkerControl::Exchange(ref, plan, cancellation);
    }
    if (plan.unique_id.size() != kExchangeIdBytes) {
      return absl::InvalidArgumentError("no communicator id");
    }
    for (const auto* pieces : {&plan.sends, &plan.recvs}) {
      for (const ExchangePiece& piece : *pieces) {
        if ((*worker)->shards.count(piece.shard_id) == 0) {
          return NotFoundError(
              "shard", absl::StrCat(piece.shard_id, " on ", ref.address));
        }
      }
    }
    wait = (*worker)->exchange_wait;
    if (wait == absl::ZeroDuration()) {
      Worker& w = **worker;
      w.counts.most_exchanges_at_once =
          std::max(w.counts.most_exchanges_at_once, ++w.exchanges_in_progress);
      most_shares_at_once_ = std::max(most_shares_at_once_, ++shares_now_);
      const absl::Duration time = w.exchange_time;
      if (time > absl::ZeroDuration()) {
        mu_.Unlock();
        absl::SleepFor(time);
        mu_.Lock();
      }
      --w.exchanges_in_progress;  // workers are never removed
      --shares_now_;
      exchanges_.emplace_back(ref.address, plan);
      return 0;
    }
  }
  absl::Notification given_up;
  std::optional<Cancellation::Registration> registered;
  if (cancellation != nullptr) {
    registered.emplace(cancellation->OnCancel([&] { given_up.Notify(); }));
  }
  if (given_up.WaitForNotificationWithTimeout(wait)) {
    return absl::CancelledError("the exchange was given up");
  }
  return absl::DeadlineExceededError("no peer joined the exchange");
}

void FakeWorkerControl::WaitInExchanges(const std::string& address,
                                        absl::Duration patience) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(address);
  if (it != workers_.end()) it->second.exchange_wait = patience;
}

}  // namespace tessera
