// Registration: keeps this worker known to the coordinator. Registers at
// start-up (retrying with backoff until the coordinator is reachable), then
// heartbeats; registers again when the coordinator no longer knows it (after
// a coordinator restart). Runs on its own thread; Stop() joins it.
//
// Cluster identity: each registration's reply names the coordinator's
// cluster. Every shard belongs to the cluster this worker served when the
// shard appeared (only that cluster's coordinator can order an allocation:
// the capability key comes with the registration). A coordinator of another
// cluster (one started on an empty or mistyped --data_dir) is served, but
// its orders to free shards of a different cluster are not obeyed: those
// shards stay quarantined (kept, counted in the log) and are left out of
// what heartbeats report. When this worker registers again with their own
// cluster's coordinator (it keeps re-registering whenever the coordinator
// at --coordinator does not know it), they are its shards again.
//
// Heartbeats carry the count and XOR of the ids of the shards held for the
// cluster served; when the coordinator asks, the next heartbeat lists them,
// and the reply names those to free (coordinator/worker_reconciler.h).
#ifndef TESSERA_WORKER_REGISTRATION_H_
#define TESSERA_WORKER_REGISTRATION_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "core/labels.h"
#include "core/placement.h"
#include "rpc/call.h"
#include "rpc/channel.h"
#include "rpc/coordinator_channel.h"
#include "rpc/leader_channels.h"
#include "worker/shard_store.h"

namespace tessera {

struct RegistrationOptions {
  std::string coordinator;      // HOST:PORT of the coordinator
  std::string name;             // this worker's name
  std::optional<int32_t> rank;  // requested rank; none = lowest free
  std::string address;          // where this worker serves
  Device device;                // this worker's device
  std::string gpu_uuid;         // its GPU's UUID ("GPU-<hex>"); empty: none
  std::string zone;             // its failure domain (--zone); empty: none
  std::string data_address;     // its data port (--data_advertise); empty: none
  Labels labels;                // its --labels
  int64_t capacity_bytes = 0;   // 0 = unlimited
  absl::Duration rpc_timeout = absl::Seconds(5);
  absl::Duration max_backoff = absl::Seconds(2);
  // Told (on the registration thread) each time the worker becomes
  // registered (true) or is told to register again (false); the worker's
  // health follows it. A coordinator that is merely unreachable changes
  // nothing: the worker keeps serving what it holds.
  std::function<void(bool registered)> on_registered;
  // Told the key this worker checks capabilities with and the cluster it
  // serves, at each registration, before on_registered(true).
  std::function<void(const std::string& key, const std::string& cluster_id)>
      on_key;
  // Told, with every heartbeat answered, the principals whose grants
  // minted before a time are void (ClusterAuthority::Revoked): principal
  // -> Unix ms.
  std::function<void(std::vector<std::pair<std::string, int64_t>>)> on_revoked;
  // The channel to the coordinator: TLS credentials and the interceptors
  // that present this worker's token.
  ChannelOptions channel;
  // Shards quarantined for another cluster this long (their own cluster's
  // coordinator never came back) are freed, loudly. README "Cluster
  // identity".
  absl::Duration quarantine_grace = absl::Hours(7 * 24);
};

class Registration {
 public:
  // `on_fatal` runs once (on the registration thread) if the coordinator
  // refuses this worker for good, e.g. its rank or name is taken.
  Registration(RegistrationOptions options, ShardStore* store,
               std::function<void(const absl::Status&)> on_fatal);
  ~Registration();

  // Shards found in a --store_dir before the first registration, each of
  // the cluster its record names (those of another cluster than the one
  // served are quarantined, as any). Call before Start.
  void Adopt(const absl::flat_hash_map<uint64_t, std::string>& owners)
      ABSL_LOCKS_EXCLUDED(mu_);

  void Start();
  void Stop();

  // The rank the coordinator assigned; -1 until registered.
  int32_t rank() const ABSL_LOCKS_EXCLUDED(mu_);
  // Blocks until the first successful registration or `timeout`.
  bool WaitRegistered(absl::Duration timeout);
  // The cluster id of the coordinator this worker registered with last
  // ("" before the first registration).
  std::string cluster_id() const ABSL_LOCKS_EXCLUDED(mu_);
  // Shards held that belong to another cluster than the one served now.
  int64_t quarantined() const ABSL_LOCKS_EXCLUDED(mu_);
  // Their ids, and their bytes.
  std::vector<uint64_t> QuarantinedShards() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Where the registration loop stands.
  struct Loop {
    CoordinatorChannel& coordinator;
    bool registered = false;
    bool send_held = false;  // list the held shards in the next heartbeat
    // After a heartbeat that reached no one, the next goes at once (to the
    // next address).
    bool try_next = false;
    int failures = 0;
    absl::Duration backoff = absl::Milliseconds(50);
    absl::Duration heartbeat_interval = absl::Seconds(1);
  };
  void Run();
  // One registration attempt; false when the coordinator refused this
  // worker for good (on_fatal was called).
  bool Register(Loop& loop);
  void Registered(Loop& loop, const v1::RegisterWorkerResponse& response);
  // The heartbeat to send now (the held list too when asked for).
  v1::HeartbeatRequest NextHeartbeat(bool send_held);
  void Heartbeat(Loop& loop);
  // Attributes every held shard not yet attributed to the cluster served
  // now, and forgets shards no longer held. Returns the ids held.
  std::vector<uint64_t> Attribute() ABSL_LOCKS_EXCLUDED(mu_);
  // Switches to the cluster a registration reply names, logging changes.
  void Serve(const std::string& cluster_id) ABSL_LOCKS_EXCLUDED(mu_);
  // Frees (or with `set_aside`, sets aside: ShardStore::SetAside) those
  // of `ids` that belong to the cluster served; returns how many were kept
  // because they belong to another.
  int64_t FreeOwn(const std::vector<uint64_t>& ids, bool set_aside = false)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The held shards of the cluster served (Attribute first).
  std::vector<uint64_t> OwnShards() const ABSL_LOCKS_EXCLUDED(mu_);

  // Register and heartbeat are tried once per round; the loop retries.
  // `leaders`: several coordinators' channels, or null for one.
  CallOptions CoordinatorCall(LeaderChannels* leaders) const;

  const RegistrationOptions options_;
  ShardStore* const store_;
  std::function<void(const absl::Status&)> on_fatal_;
  absl::Notification stop_;
  absl::Notification registered_;
  std::thread thread_;
  mutable absl::Mutex mu_;
  int32_t rank_ ABSL_GUARDED_BY(mu_) = -1;
  // The cluster served; nullopt until the first registration.
  std::optional<std::string> cluster_id_ ABSL_GUARDED_BY(mu_);
  // The cluster each held shard belongs to.
  absl::flat_hash_map<uint64_t, std::string> owner_ ABSL_GUARDED_BY(mu_);
  int64_t quarantined_logged_ ABSL_GUARDED_BY(mu_) = 0;
  // Since when some shard has been quarantined (none: nothing is).
  std::optional<absl::Time> quarantined_since_ ABSL_GUARDED_BY(mu_);

  // Frees the quarantined shards once quarantine_grace has passed.
  void ExpireQuarantine() ABSL_LOCKS_EXCLUDED(mu_);
};

}  // namespace tessera

#endif  // TESSERA_WORKER_REGISTRATION_H_
