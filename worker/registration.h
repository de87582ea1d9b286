// Registration: keeps this worker known to the coordinator. Registers at
// start-up (retrying with backoff until the coordinator is reachable), then
// heartbeats; registers again when the coordinator no longer knows it (after
// a coordinator restart). Runs on its own thread; Stop() joins it.
#ifndef TESSERA_WORKER_REGISTRATION_H_
#define TESSERA_WORKER_REGISTRATION_H_

#include <functional>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "core/placement.h"
#include "rpc/call.h"
#include "rpc/channel.h"
#include "worker/shard_store.h"

namespace tessera {

struct RegistrationOptions {
  std::string coordinator;      // HOST:PORT of the coordinator
  std::string name;             // this worker's name
  std::optional<int32_t> rank;  // requested rank; none = lowest free
  std::string address;          // where this worker serves
  Device device;                // this worker's device
  int64_t capacity_bytes = 0;   // 0 = unlimited
  absl::Duration rpc_timeout = absl::Seconds(5);
  absl::Duration max_backoff = absl::Seconds(2);
  // Told (on the registration thread) each time the worker becomes
  // registered (true) or is told to register again (false); the worker's
  // health follows it. A coordinator that is merely unreachable changes
  // nothing: the worker keeps serving what it holds.
  std::function<void(bool registered)> on_registered;
  // Told the key this worker checks capabilities with, at each
  // registration, before on_registered(true).
  std::function<void(const std::string& key)> on_key;
  // The channel to the coordinator: TLS credentials and the interceptors
  // that present this worker's token.
  ChannelOptions channel;
};

class Registration {
 public:
  // `on_fatal` runs once (on the registration thread) if the coordinator
  // refuses this worker for good, e.g. its rank or name is taken.
  Registration(RegistrationOptions options, ShardStore* store,
               std::function<void(const absl::Status&)> on_fatal);
  ~Registration();

  void Start();
  void Stop();

  // The rank the coordinator assigned; -1 until registered.
  int32_t rank() const ABSL_LOCKS_EXCLUDED(mu_);
  // Blocks until the first successful registration or `timeout`.
  bool WaitRegistered(absl::Duration timeout);

 private:
  void Run();

  // Register and heartbeat are tried once per round; the loop retries.
  CallOptions CoordinatorCall() const;

  const RegistrationOptions options_;
  ShardStore* const store_;
  std::function<void(const absl::Status&)> on_fatal_;
  absl::Notification stop_;
  absl::Notification registered_;
  std::thread thread_;
  mutable absl::Mutex mu_;
  int32_t rank_ ABSL_GUARDED_BY(mu_) = -1;
};

}  // namespace tessera

#endif  // TESSERA_WORKER_REGISTRATION_H_
