// Leadership: the life of a coordinator that shares its metadata in etcd
// with others (CLI.md "Highly available coordinator (v3)"), one object:
//
//   Stand     its port answers at once, naming the leader (no call runs);
//   Campaign  it follows the metadata (so that a takeover reads little)
//             and waits for the leader key (EtcdLeadership); promoted, the
//             store is fenced with the key's revision;
//   serve     the caller starts its server on the released port, and
//             Publish tells standbys to send callers here; CheckLease gates
//             every call of a leader paused past its lease;
//   StepDown  revokes the lease: a standby takes over at once.
#ifndef TESSERA_COORDINATOR_LEADERSHIP_H_
#define TESSERA_COORDINATOR_LEADERSHIP_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "coordinator/etcd_client.h"
#include "coordinator/etcd_leadership.h"
#include "coordinator/etcd_metadata_store.h"
#include "rpc/channel.h"
#include "rpc/server.h"
#include "rpc/standby_service.h"

namespace tessera {

struct LeadershipOptions {
  std::string listen;     // HOST:PORT the standby (then the leader) binds
  std::string advertise;  // HOST:PORT callers reach this coordinator at
  absl::Duration lease = absl::Seconds(2);
  // The standby port's options (credentials, limits); its fallback is the
  // standby service.
  ServerOptions server;
  // How often a standby reads what the leader wrote since.
  absl::Duration follow_every = absl::Milliseconds(200);
};

class Leadership {
 public:
  // Refuses a prefix of another cluster (or inside one) untouched, then
  // binds the standby port. `store` (not owned) must outlive Campaign.
  static absl::StatusOr<std::unique_ptr<Leadership>> Stand(
      std::shared_ptr<const EtcdClient> etcd, std::string prefix,
      EtcdMetadataStore* store, LeadershipOptions options);
  ~Leadership();

  // The address the standby port is bound at (--listen with its port).
  const std::string& serve_at() const { return serve_at_; }

  // Follows the metadata and waits until this coordinator leads (OK: the
  // store is fenced) or `stop` is notified (CANCELLED). `on_lost` is called
  // once if the leader's lease cannot be kept.
  absl::Status Campaign(const absl::Notification& stop,
                        std::function<void()> on_lost);
  // The leader key's create revision once leading; 0 before.
  int64_t fence() const { return fence_; }
  // What following read before the promotion, and at it.
  const EtcdMetadataStore::FollowStats& followed_before() const {
    return followed_before_;
  }

  // Closes the standby port for the leader's server to bind.
  void ReleasePort();
  // Recovered and serving: standbys now name this coordinator.
  absl::Status Publish();
  absl::Status CheckLease() const { return election_.CheckLease(); }
  // Every coordinator standing for the prefix, the leader first.
  absl::StatusOr<std::vector<EtcdLeadership::Member>> Members() const {
    return election_.Members();
  }
  // The leader a standby saw last ("" while none serves).
  std::string leader_seen() const;
  void StepDown() { election_.Resign(); }

 private:
  Leadership(std::shared_ptr<const EtcdClient> etcd, std::string prefix,
             EtcdMetadataStore* store, LeadershipOptions options);
  void Follow(const absl::Notification& until);

  const std::string prefix_;
  EtcdMetadataStore* const store_;
  const LeadershipOptions options_;
  EtcdLeadership election_;
  StandbyService standby_;
  std::unique_ptr<RunningServer> standby_server_;
  std::string serve_at_;
  int64_t fence_ = 0;
  EtcdMetadataStore::FollowStats followed_before_;
  mutable absl::Mutex mu_;
  std::string leader_seen_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera

#endif  // TESSERA_COORDINATOR_LEADERSHIP_H_
