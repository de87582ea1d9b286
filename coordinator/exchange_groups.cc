#include "coordinator/exchange_groups.h"

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "core/fan_out.h"
#include "core/status_macros.h"

namespace tessera {
namespace {

// Each member's turn, taken in one order and let go in the other. A set of
// locks known only at run time, which the thread-safety analysis cannot
// follow.
void LockInOrder(const std::vector<std::shared_ptr<absl::Mutex>>& turns)
    ABSL_NO_THREAD_SAFETY_ANALYSIS {
  for (const auto& turn : turns) turn->Lock();
}
void UnlockInReverse(const std::vector<std::shared_ptr<absl::Mutex>>& turns)
    ABSL_NO_THREAD_SAFETY_ANALYSIS {
  for (auto turn = turns.rbegin(); turn != turns.rend(); ++turn) {
    (*turn)->Unlock();
  }
}

}  // namespace

ExchangeGroups::ExchangeGroups(WorkerControl* workers, absl::Duration cool_down)
    : workers_(workers), cool_down_(cool_down) {}

void ExchangeGroups::Forget(const std::string& name) {
  absl::MutexLock lock(&mu_);
  for (auto it = groups_.begin(); it != groups_.end();) {
    const std::vector<std::string>& members = it->second->members;
    if (std::find(members.begin(), members.end(), name) == members.end()) {
      ++it;
    } else if (it->second.use_count() == 1) {
      it = groups_.erase(it);
    } else {
      // In use now: marked, for the next exchange to start afresh.
      it->second->member_restarted = true;
      ++it;
    }
  }
}

ExchangeGroups::Stats ExchangeGroups::stats() const {
  return {exchanges_.load(), failures_.load(), bytes_.load()};
}

absl::Status ExchangeGroups::Run(absl::Span<const TransferBatch> batches,
                                 int64_t item_bytes) {
  Exchange exchange = PlanExchange(batches, item_bytes);
  if (exchange.members.size() < 2) return absl::OkStatus();
  for (const ExchangePlan& plan : exchange.plans) {
    const size_t ops = plan.sends.size() + plan.recvs.size();
    if (ops > static_cast<size_t>(kMaxExchangePieces)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "a member would post ", ops,
          " NCCL operations in one group (at most ", kMaxExchangePieces, ")"));
    }
  }
  std::map<std::string, std::string> address_of;
  for (const TransferBatch& batch : batches) {
    address_of.emplace(batch.src_worker, batch.src_address);
    address_of.emplace(batch.dst_worker, batch.dst_address);
  }
  std::vector<WorkerRef> members;
  std::vector<std::string> named;
  for (const std::string& name : exchange.members) {
    members.push_back({name, address_of[name]});
    named.push_back(absl::StrCat(name, "@", address_of[name]));
  }
  const std::string key = absl::StrJoin(named, ",");
  std::shared_ptr<Group> group;
  {
    absl::MutexLock lock(&mu_);
    std::shared_ptr<Group>& slot = groups_[key];
    if (slot == nullptr) {
      slot = std::make_shared<Group>();
      slot->members = exchange.members;
    }
    group = slot;
    // Bounded: sets no exchange is using are forgotten first.
    for (auto it = groups_.begin();
         groups_.size() > kMaxGroups && it != groups_.end();) {
      it = it->second.use_count() == 1 ? groups_.erase(it) : std::next(it);
    }
  }
  const std::string what =
      absl::StrCat("an NCCL exchange among ", members.size(), " GPU workers");
  absl::MutexLock running(&group->run);
  if (group->member_restarted.exchange(false)) {
    group->id.clear();
    group->cool_until = absl::InfinitePast();
  }
  const absl::Time now = absl::Now();
  if (now < group->cool_until) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, " failed ",
        absl::FormatDuration(cool_down_ - (group->cool_until - now)),
        " ago; their pieces are pulled for now"));
  }
  // Each member's turn, in name order (exchange.members is sorted).
  std::vector<std::shared_ptr<absl::Mutex>> turns;
  {
    absl::MutexLock lock(&mu_);
    for (const std::string& name : exchange.members) {
      std::shared_ptr<absl::Mutex>& turn = turns_[name];
      if (turn == nullptr) turn = std::make_shared<absl::Mutex>();
      turns.push_back(turn);
    }
  }
  LockInOrder(turns);
  const absl::Cleanup let_go = [&] {
    UnlockInReverse(turns);
    turns.clear();
    absl::MutexLock lock(&mu_);
    for (const std::string& name : exchange.members) {
      auto it = turns_.find(name);
      if (it != turns_.end() && it->second.use_count() == 1) turns_.erase(it);
    }
  };
  auto failed = [&](absl::Status status) {
    group->run
        .AssertHeld();  // held above; the analysis does not see into lambdas
    group->id.clear();
    group->cool_until = absl::Now() + cool_down_;
    failures_.fetch_add(1);
    return Annotate(status, what);
  };
  if (group->id.empty()) {
    absl::StatusOr<std::string> id = workers_->ExchangeId(members[0]);
    if (!id.ok()) {
      return failed(Annotate(id.status(),
                             absl::StrCat("worker '", members[0].name, "'")));
    }
    group->id = *std::move(id);
  }
  // Every member at once: each waits in its NCCL group for the others. The
  // first to fail gives up the rest, which would otherwise wait for it
  // until their deadline; that failure is the one reported.
  Cancellation give_up;
  absl::Mutex first_mu;
  absl::Status first;
  for (size_t r = 0; r < members.size(); ++r) {
    exchange.plans[r].unique_id = group->id;
  }
  // No bound below the group's size: a member waits for all the others.
  FanOut(members.size(), members.size(), [&](size_t r) {
    absl::StatusOr<int64_t> received =
        workers_->Exchange(members[r], exchange.plans[r], &give_up);
    if (received.ok()) return absl::OkStatus();
    {
      absl::MutexLock lock(&first_mu);
      if (first.ok() && !give_up.cancelled()) {
        first = Annotate(received.status(),
                         absl::StrCat("worker '", members[r].name, "'"));
      }
    }
    give_up.Cancel();
    return absl::OkStatus();
  }).IgnoreError();
  if (!first.ok()) return failed(first);
  exchanges_.fetch_add(1);
  bytes_.fetch_add(exchange.bytes);
  return absl::OkStatus();
}

}  // namespace tessera
