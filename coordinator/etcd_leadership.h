// EtcdLeadership: which of several coordinators sharing one etcd prefix is
// the leader (CLI.md "Highly available coordinator (v3)"). A coordinator
// holds an etcd lease, renewed every third of its TTL, and is the leader
// while the key P/election/leader, attached to that lease, is the one it
// created: etcd deletes the key when the lease runs out (the coordinator
// died or hung), and a standby, polling for that, creates it in a
// transaction that succeeds only if the key is absent. The key's create
// revision is the leader's fence: EtcdMetadataStore compares it in every
// write, so a coordinator that lost the key can never commit again. The
// key holds the leader's address only once it serves (Publish): standbys
// name it to callers (coordinator/standby_service.h).
//
// A leader that cannot renew its lease before it would run out calls
// `on_lost`: it must stop serving writes (the fence already refuses them).
// A standby whose lease runs out (etcd away) takes a new one and stands on.
// Resign() revokes the lease, handing over at once (SIGTERM).
#ifndef TESSERA_COORDINATOR_ETCD_LEADERSHIP_H_
#define TESSERA_COORDINATOR_ETCD_LEADERSHIP_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "coordinator/etcd_client.h"

namespace tessera {

class EtcdLeadership {
 public:
  // `prefix` is the metadata prefix (ends with '/'); `address` is what
  // the leader key holds: where clients reach this coordinator.
  EtcdLeadership(std::shared_ptr<const EtcdClient> etcd, std::string prefix,
                 std::string address, absl::Duration ttl);
  ~EtcdLeadership();

  const std::string& key() const { return key_; }

  // Waits until this coordinator is the leader, or `stop` is notified
  // (CANCELLED). `on_standby(leader)` is called whenever another
  // coordinator is seen holding the key. Returns the key's create revision
  // (the fence). `on_lost` is called (once, from the renewing thread) if
  // the lease cannot be kept.
  absl::StatusOr<int64_t> Campaign(
      const absl::Notification& stop,
      const std::function<void(const std::string& leader)>& on_standby,
      std::function<void()> on_lost);

  // The leader, once it serves: puts this coordinator's address into the
  // key, so that standbys send clients here only when it answers.
  absl::Status Publish();

  // The address the leader key holds now ("" if none, or while the leader
  // is not serving yet).
  absl::StatusOr<std::string> Leader() const;

  struct Member {
    std::string address;
    bool leader = false;
  };
  // Every coordinator standing for the prefix now (each holds a key on its
  // lease under P/election/members/), the leader first.
  absl::StatusOr<std::vector<Member>> Members() const;

  // Gives the leadership up at once (revokes the lease).
  void Resign();

  // OK unless this coordinator leads and its lease may have run out: not
  // renewed since a TTL before now (counted from when the renewal was
  // asked, so never later than etcd's own expiry). Such a leader may be
  // deposed already (a pause, SIGSTOP): it answers nothing (UNAVAILABLE)
  // until its renewer either renews or gives the leadership up.
  absl::Status CheckLease() const;

 private:
  // Takes a lease and lists this coordinator on it.
  absl::Status Join();
  // Join, tried again until it works or `stop`; then keeps the lease.
  absl::Status JoinUntil(const absl::Notification& stop);
  void Renew();

  const std::shared_ptr<const EtcdClient> etcd_;
  const std::string key_;
  const std::string members_;  // P/election/members/
  const std::string address_;
  const absl::Duration ttl_;
  int64_t lease_ = 0;
  // The TTL etcd grants (whole seconds, at least 1): never more than ttl_.
  const absl::Duration granted_ttl_;
  // When the lease may run out: its last renewal asked + granted_ttl_.
  std::atomic<int64_t> lease_deadline_ns_{0};
  int64_t fence_ = 0;  // the key's create revision, once leading
  std::atomic<bool> leading_{false};
  // A standby's lease ran out: Campaign takes a new one.
  std::atomic<bool> lease_lost_{false};
  std::function<void()> on_lost_;
  absl::Notification done_;
  std::thread renewer_;
};

}  // namespace tessera

#endif  // TESSERA_COORDINATOR_ETCD_LEADERSHIP_H_
