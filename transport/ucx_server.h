// The worker's side of the UCX data plane: it registers shard memory with
// UCX (ucp_mem_map) and hands out the packed remote keys through which
// readers get (and writers of a pending shard put) the bytes with one-sided
// operations, and it answers their liveness checks. worker/ucx_service.h
// hands the keys out over gRPC, only against a capability.
//
// Safety across frees: a registration keeps its shard's memory pinned. When
// the shard is freed (seen by a check, or by the sweeper within
// `sweep_interval`) the registration turns dead: every later check of it
// answers kFreed, so a reader holding its key fails with NOT_FOUND instead
// of returning the bytes. A dead registration is unmapped and its pin let go
// only `grace` later, so a get already issued through a stale key lands on
// memory still mapped here, never on an unmapped address. UCX over TCP
// emulates gets in software and does not check addresses against
// registrations; the pin and the grace are what keep such a stale get
// harmless there. A dead read registration keeps only the pages mapped
// (UcxPinnedShard::keep_mapped), not the shard: a freed shard's pages may
// serve the worker's next shard of their size at once (on a VM, new memory
// costs seconds per GiB), and a stale get that reads those bytes is refused
// by its check. Write registrations keep their shard whole.
//
// Staging: a reader whose box has short contiguous runs (a rows -> columns
// reshard's piece reads 1 KiB of every row) asks the worker to pack a range
// of the box into staging memory (Stage), gets it with a few large gets,
// and ends the lease with a check-and-release. The staging memory is one
// region of `staging_bytes`, mapped and registered at the first Stage and
// cut into `staging_slot_bytes` slots, so memory use is bounded and a
// reshard does not fault in fresh pages per piece; it is unmapped once no
// lease has been taken for `grace`. A lease's slots go back to the pool
// when it is released or lapses (`staging_ttl`); a reader still getting
// through a lapsed lease may read bytes staged for another lease, and its
// check then answers kStale, so such bytes are never returned. A check of a
// lease answers kFreed when its shard was freed since it was staged.
//
// Sends: a reader may instead ask for one contiguous range of a live read
// key's shard to be sent to it as a tagged message it has posted a receive
// for (UcxSendRequest); the send keeps the registration and its pages until
// it completes, at most `max_sends_in_flight` at once (more are refused),
// and the reader checks the key afterwards as after gets.
//
// Idle cost: one progress thread that sleeps in epoll on the UCX worker's
// event fd, and a sweeper that wakes every `sweep_interval`.
//
// Thread-safe.
#ifndef TESSERA_TRANSPORT_UCX_SERVER_H_
#define TESSERA_TRANSPORT_UCX_SERVER_H_

#include <ucp/api/ucp.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "core/box.h"
#include "transport/ucx_common.h"

namespace tessera {

// A shard's bytes in host memory, kept valid by `keep_alive` even after the
// shard is freed.
struct UcxPinnedShard {
  std::shared_ptr<void> keep_alive;
  // Set: keeps `data` mapped (not the shard) once keep_alive is let go,
  // which a registration does as it turns dead, so a freed shard's pages
  // can serve another shard while stale gets may still land on them
  // (worker/shard_store.h PinnedShard::keep_mapped).
  std::shared_ptr<const void> keep_mapped;
  char* data = nullptr;
  int64_t bytes = 0;
  Shape shape;  // the shard's box sizes
  int64_t item_bytes = 1;
};

// A staged range (proto/ucx.proto UcxStageResponse).
struct UcxStaged {
  uint64_t lease = 0;
  uint64_t base = 0;
  int64_t bytes = 0;
  std::string rkey;
};

// What a reader needs to reach one shard (proto/ucx.proto UcxShardKey).
struct UcxKey {
  uint64_t shard_id = 0;
  uint64_t base = 0;
  int64_t bytes = 0;
  std::string rkey;  // packed; empty when bytes == 0
  uint64_t registration = 0;
  Shape shape;
  int64_t item_bytes = 1;
};

struct UcxServerOptions {
  // Pins shard `id`: NOT_FOUND when not held, UNIMPLEMENTED when its bytes
  // are not in host memory. Required.
  std::function<absl::StatusOr<UcxPinnedShard>(uint64_t id)> pin;
  // Whether shard `id` is still held. Required; called from the progress
  // thread and the sweeper, so it must be quick.
  std::function<bool(uint64_t id)> held;
  // Most live registrations; the least recently handed out is withdrawn
  // beyond (its readers ask again).
  size_t max_registrations = 16384;
  // How often freed shards are looked for: their pages are reused only
  // after (a reshard 0.5 s after the last one finds them).
  absl::Duration sweep_interval = absl::Milliseconds(200);
  // How long a dead registration stays mapped and pinned (see above), and
  // so counted against the store's capacity as pinned bytes. Well beyond a
  // reader's key lifetime (UcxTransportOptions::key_ttl, 10 s).
  absl::Duration grace = absl::Minutes(1);
  // Staging memory (see above); 0: Stage answers FAILED_PRECONDITION.
  int64_t staging_bytes = int64_t{256} << 20;
  int64_t staging_slot_bytes = int64_t{1} << 20;
  // Most bytes one lease may hold.
  int64_t max_stage_bytes = int64_t{32} << 20;
  // A lease not released for this long lapses.
  absl::Duration staging_ttl = absl::Seconds(30);
  // Most ranges being sent to readers at once (UcxSendRequest); more are
  // refused, and those readers get the bytes instead.
  int max_sends_in_flight = 64;
  // Listen for UCX peers on the loopback device only (a worker that serves
  // loopback only); shared-memory transports are unaffected.
  bool loopback_only = false;
};

class UcxServer {
 public:
  // Starts UCX and the progress thread. FAILED_PRECONDITION or UNAVAILABLE
  // when UCX cannot start here (the worker then serves without it).
  static absl::StatusOr<std::unique_ptr<UcxServer>> Start(
      UcxServerOptions options);
  ~UcxServer();
  UcxServer(const UcxServer&) = delete;
  UcxServer& operator=(const UcxServer&) = delete;

  // The UCX worker address readers connect to.
  const std::string& address() const { return address_; }

  // A key to shard `id`: for gets, or for puts when `write` (a separate
  // registration, withdrawn by FinishWrite). Reuses the live registration
  // when there is one. Errors as `pin` answers them.
  absl::StatusOr<UcxKey> Register(uint64_t id, bool write)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Withdraws the write registration of shard `id` (its write is done).
  void FinishWrite(uint64_t id) ABSL_LOCKS_EXCLUDED(mu_);

  // Packs elements [first, first + count) of `box` of shard `id` into
  // staging memory and leases them (see above). Errors as UcxData.Stage
  // (proto/ucx.proto) gives them.
  absl::StatusOr<UcxStaged> Stage(uint64_t id, const Box& box, int64_t first,
                                  int64_t count) ABSL_LOCKS_EXCLUDED(mu_);

  // Leases now, and staging bytes they hold (for tests and metrics).
  std::pair<size_t, int64_t> StagingCounts() const ABSL_LOCKS_EXCLUDED(mu_);

  // Registrations now: live ones, and dead ones waiting out their grace.
  std::pair<size_t, size_t> Counts() const ABSL_LOCKS_EXCLUDED(mu_);
  // Ranges sent to readers so far (UcxSendRequest), and ranges packed into
  // staging memory (Stage), for tests and reports.
  int64_t RangesSent() const { return ranges_sent_.load(); }
  int64_t RangesStaged() const { return ranges_staged_.load(); }

 private:
  struct Registration {
    uint64_t shard_id = 0;
    bool write = false;
    uint64_t nonce = 0;
    UcxPinnedShard pinned;
    ucp_mem_h memh = nullptr;
    std::string rkey;
    bool dead = false;
    bool freed = false;  // dead because the shard was freed
    absl::Time dead_since;
    uint64_t last_use = 0;  // LRU tick
  };
  struct Lease {
    uint64_t shard_id = 0;
    size_t first_slot = 0;
    size_t slots = 0;
    absl::Time expires;
  };
  // A range being sent to a reader (UcxSendRequest): the registration and
  // its pages stay until the send completes.
  struct Sending {
    std::shared_ptr<Registration> registration;
    std::shared_ptr<const void> keep_mapped;
    UcxServer* server = nullptr;
  };
  struct PendingSend {
    ucp_ep_h ep;
    // A read key's shard, or null for a staging lease's slots (the staging
    // memory stays while sends are in flight).
    std::shared_ptr<Registration> registration;
    const char* data = nullptr;
    uint64_t bytes = 0;
    uint64_t tag = 0;
  };
  struct Reply {
    ucp_ep_h ep;
    UcxCheckReply body;
  };

  UcxServer(UcxServerOptions options, ucp_context_h context, UcpWorker worker,
            std::string address, int epoll_fd, int wake_fd);

  void Progress();
  void Sweep() ABSL_LOCKS_EXCLUDED(mu_);
  static ucs_status_t OnCheck(void* arg, const void* header,
                              size_t header_length, void* data, size_t length,
                              const ucp_am_recv_param_t* param);
  static ucs_status_t OnCheckRelease(void* arg, const void* header,
                                     size_t header_length, void* data,
                                     size_t length,
                                     const ucp_am_recv_param_t* param);
  static ucs_status_t OnSend(void* arg, const void* header,
                             size_t header_length, void* data, size_t length,
                             const ucp_am_recv_param_t* param);
  static void SendDone(void* request, ucs_status_t status, void* user_data);
  // A UcxSendRequest: queued to send, or refused (queued reply).
  void AnswerSend(const void* header, size_t header_length,
                  const ucp_am_recv_param_t* param);
  // Posts the queued sends (progress thread, outside ucp_worker_progress).
  void PostSends();
  void AnswerCheck(const void* header, size_t header_length,
                   const ucp_am_recv_param_t* param, bool release);
  UcxCheckAnswer Check(uint64_t shard_id, uint64_t nonce, bool release)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Whether `nonce` was a registration of shard `shard_id` that died
  // because the shard was freed (kFreed, not kStale).
  bool FreedKey(uint64_t nonce, uint64_t shard_id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether r's shard is still held; if not, kills r (freed) and lets go.
  bool StillHeld(Registration& r) ABSL_LOCKS_EXCLUDED(mu_);
  // Maps and registers the staging region if it is not.
  absl::Status EnsureStaging() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropStaging() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EndLease(uint64_t lease) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SendReplies();  // progress thread only
  void Kill(Registration& r, bool freed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Unmap(Registration& r);
  // Drops the shards Kill let go of (let_go_), outside the lock.
  void LetGo() ABSL_LOCKS_EXCLUDED(mu_);

  const UcxServerOptions options_;
  ucp_context_h context_;
  UcpWorker worker_;
  const std::string address_;
  const int epoll_fd_;
  const int wake_fd_;  // eventfd: wakes the progress thread to stop

  // Guards the registrations. Invariants: `live_` and `by_nonce_` name the
  // same live registrations; every dead one is in `dead_` (by nonce) and in
  // no other map; nonces are never reused.
  mutable absl::Mutex mu_;
  std::map<std::pair<uint64_t, bool>, std::shared_ptr<Registration>> live_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::shared_ptr<Registration>> by_nonce_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::shared_ptr<Registration>> dead_
      ABSL_GUARDED_BY(mu_);
  // Shards dead registrations let go of, dropped outside the lock (a
  // shard's destructor parks or unlinks its pages).
  std::vector<std::shared_ptr<void>> let_go_ ABSL_GUARDED_BY(mu_);
  uint64_t tick_ ABSL_GUARDED_BY(mu_) = 0;

  // Staging: the region (null until the first Stage), its registration and
  // packed key, which slots are leased, and the leases by their nonce.
  // Invariant: a slot is marked taken iff exactly one lease holds it.
  char* staging_ ABSL_GUARDED_BY(mu_) = nullptr;
  ucp_mem_h staging_memh_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool staging_mapped_here_ ABSL_GUARDED_BY(mu_) = false;  // else by UCX
  std::string staging_rkey_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> slot_taken_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Lease> leases_ ABSL_GUARDED_BY(mu_);
  int64_t leased_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time staging_used_ ABSL_GUARDED_BY(mu_);  // last lease taken

  std::vector<Reply> replies_;           // progress thread only
  std::vector<PendingSend> sends_;       // progress thread only
  std::atomic<int> sends_in_flight_{0};  // the sweeper reads it too
  std::atomic<int64_t> ranges_sent_{0};
  std::atomic<int64_t> ranges_staged_{0};
  bool stopping_ = false;  // progress thread only
  absl::Notification stop_;
  std::thread progress_;
  std::thread sweeper_;
};

}  // namespace tessera

#endif  // TESSERA_TRANSPORT_UCX_SERVER_H_
