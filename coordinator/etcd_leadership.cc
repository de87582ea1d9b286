#include "coordinator/etcd_leadership.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "coordinator/etcd_metadata_store.h"
#include "core/status_macros.h"
#include "spdlog/spdlog.h"

namespace tessera {
namespace {

// How often a standby looks whether the leader key is gone.
constexpr absl::Duration kPoll = absl::Milliseconds(100);
// The least time one renewal try is given on a member, and the pause
// before the next try after one failed.
constexpr absl::Duration kMinRenewTry = absl::Milliseconds(50);

}  // namespace

EtcdLeadership::EtcdLeadership(std::shared_ptr<const EtcdClient> etcd,
                               std::string prefix, std::string address,
                               absl::Duration ttl)
    : etcd_(std::move(etcd)),
      key_(absl::StrCat(prefix, kElectionDir, "leader")),
      members_(absl::StrCat(prefix, kElectionDir, "members/")),
      address_(std::move(address)),
      ttl_(ttl),
      granted_ttl_(std::min(ttl, absl::Seconds(std::max<int64_t>(
                                     1, absl::ToInt64Seconds(ttl))))) {}

EtcdLeadership::~EtcdLeadership() {
  if (!done_.HasBeenNotified()) done_.Notify();
  if (renewer_.joinable()) renewer_.join();
}

absl::StatusOr<int64_t> EtcdLeadership::Campaign(
    const absl::Notification& stop,
    const std::function<void(const std::string& leader)>& on_standby,
    std::function<void()> on_lost) {
  on_lost_ = std::move(on_lost);
  TESSERA_RETURN_IF_ERROR(JoinUntil(stop));
  std::string seen;
  for (;;) {
    if (stop.HasBeenNotified()) {
      return absl::CancelledError("stopped while standing by");
    }
    // A standby whose lease ran out (etcd away past its TTL) joins again.
    if (lease_lost_) {
      if (renewer_.joinable()) renewer_.join();
      lease_ = 0;
      lease_lost_ = false;
      TESSERA_RETURN_IF_ERROR(JoinUntil(stop));
    }
    etcdserverpb::TxnRequest txn;
    etcdserverpb::Compare* absent = txn.add_compare();
    absent->set_result(etcdserverpb::Compare::EQUAL);
    absent->set_target(etcdserverpb::Compare::CREATE);
    absent->set_key(key_);
    absent->set_create_revision(0);
    etcdserverpb::PutRequest* put = txn.add_success()->mutable_request_put();
    put->set_key(key_);
    // The address goes in once this coordinator serves (Publish).
    put->set_value("");
    put->set_lease(lease_);
    txn.add_failure()->mutable_request_range()->set_key(key_);
    absl::StatusOr<etcdserverpb::TxnResponse> got = etcd_->Txn(txn);
    if (got.ok() && got->succeeded()) {
      fence_ = got->header().revision();
      leading_ = true;
      // The renewer may have found the lease gone just before, while this
      // coordinator still stood by: it then called no on_lost.
      if (lease_lost_) {
        return absl::UnavailableError(
            "the etcd lease ran out as this coordinator took the lead");
      }
      return fence_;
    }
    if (got.ok() && got->responses_size() == 1 &&
        got->responses(0).response_range().kvs_size() == 1) {
      const std::string leader =
          got->responses(0).response_range().kvs(0).value();
      if (leader != seen) {
        seen = leader;
        on_standby(leader);
      }
    } else if (!got.ok()) {
      spdlog::warn("standing by: {}", std::string(got.status().message()));
    }
    stop.WaitForNotificationWithTimeout(kPoll);
  }
}

absl::Status EtcdLeadership::Publish() {
  etcdserverpb::TxnRequest txn;
  etcdserverpb::Compare* held = txn.add_compare();
  held->set_result(etcdserverpb::Compare::EQUAL);
  held->set_target(etcdserverpb::Compare::CREATE);
  held->set_key(key_);
  held->set_create_revision(fence_);
  etcdserverpb::PutRequest* put = txn.add_success()->mutable_request_put();
  put->set_key(key_);
  put->set_value(address_);
  put->set_lease(lease_);
  TESSERA_ASSIGN_OR_RETURN(etcdserverpb::TxnResponse done, etcd_->Txn(txn));
  if (!done.succeeded()) {
    return absl::FailedPreconditionError(
        "no longer the leader: the election key changed hands");
  }
  return absl::OkStatus();
}

absl::Status EtcdLeadership::JoinUntil(const absl::Notification& stop) {
  // etcd slow or briefly without quorum is waited out: a standby that
  // exited would leave none.
  std::string said;
  for (absl::Duration backoff = absl::Milliseconds(100);;
       backoff = std::min(backoff * 2, absl::Seconds(1))) {
    if (stop.HasBeenNotified()) {
      return absl::CancelledError("stopped while standing by");
    }
    const absl::Status joined = Join();
    if (joined.ok()) break;
    if (joined.ToString() != said) {
      said = joined.ToString();
      spdlog::warn("standing by: cannot join the election yet: {}",
                   std::string(joined.message()));
    }
    stop.WaitForNotificationWithTimeout(backoff);
  }
  renewer_ = std::thread([this] { Renew(); });
  return absl::OkStatus();
}

absl::Status EtcdLeadership::Join() {
  if (lease_ == 0) {
    const absl::Time asked = absl::Now();
    TESSERA_ASSIGN_OR_RETURN(lease_, etcd_->GrantLease(ttl_));
    lease_deadline_ns_ = absl::ToUnixNanos(asked + granted_ttl_);
  }
  etcdserverpb::TxnRequest join;
  etcdserverpb::PutRequest* put = join.add_success()->mutable_request_put();
  put->set_key(members_ + address_);
  put->set_value(address_);
  put->set_lease(lease_);
  absl::Status status = etcd_->Txn(join).status();
  // The lease ran out while etcd was away: the next try takes a new one.
  if (!status.ok()) lease_ = 0;
  return status;
}

void EtcdLeadership::Renew() {
  absl::Duration wait = ttl_ / 3;
  while (!done_.WaitForNotificationWithTimeout(wait)) {
    const absl::Time asked = absl::Now();
    const absl::Time deadline = absl::FromUnixNanos(lease_deadline_ns_);
    // Each member gets a share of the time left, so that one that hangs
    // (its quorum intact) leaves time to renew through the others.
    const absl::Duration share =
        (deadline - asked) /
        static_cast<int64_t>(etcd_->endpoints().size() + 1);
    const absl::Status status = etcd_->KeepAlive(
        lease_, std::clamp(share, kMinRenewTry, etcd_->timeout()));
    if (status.ok()) {
      lease_deadline_ns_ = absl::ToUnixNanos(asked + granted_ttl_);
      wait = ttl_ / 3;
      continue;
    }
    // Expired, or not renewed within its TTL: another coordinator may
    // hold the key now.
    if (absl::IsNotFound(status) || absl::Now() >= deadline) {
      spdlog::error("etcd lease {}: {}", lease_, std::string(status.message()));
      if (leading_) {
        if (on_lost_) on_lost_();
      } else {
        lease_lost_ = true;  // Campaign joins again
      }
      return;
    }
    // Not renewed yet: again at once, starting at the next member.
    spdlog::warn("etcd lease {}: {}; trying again", lease_,
                 std::string(status.message()));
    wait = kMinRenewTry;
  }
}

absl::Status EtcdLeadership::CheckLease() const {
  if (!leading_) return absl::OkStatus();
  const absl::Time deadline = absl::FromUnixNanos(lease_deadline_ns_);
  if (absl::Now() < deadline) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(
      "this coordinator's leader lease has not been renewed since ",
      absl::FormatDuration(absl::Now() - deadline + granted_ttl_),
      " ago: another coordinator may lead; ask again"));
}

absl::StatusOr<std::string> EtcdLeadership::Leader() const {
  TESSERA_ASSIGN_OR_RETURN(std::vector<mvccpb::KeyValue> kv,
                           etcd_->Range(key_));
  return kv.empty() ? std::string() : kv.front().value();
}

absl::StatusOr<std::vector<EtcdLeadership::Member>> EtcdLeadership::Members()
    const {
  TESSERA_ASSIGN_OR_RETURN(const std::string leader, Leader());
  TESSERA_ASSIGN_OR_RETURN(std::vector<mvccpb::KeyValue> kvs,
                           etcd_->Range(members_, PrefixEnd(members_)));
  std::vector<Member> out;
  for (const mvccpb::KeyValue& kv : kvs) {
    Member m{kv.value(), kv.value() == leader};
    if (m.leader) {
      out.insert(out.begin(), m);
    } else {
      out.push_back(m);
    }
  }
  return out;
}

void EtcdLeadership::Resign() {
  if (!done_.HasBeenNotified()) done_.Notify();
  if (renewer_.joinable()) renewer_.join();
  if (lease_ != 0) etcd_->RevokeLease(lease_).IgnoreError();
}

}  // namespace tessera
