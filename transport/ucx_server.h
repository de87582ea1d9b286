// The worker's side of the UCX data plane. It hands out keys — names, not
// addresses: a read key's registration number, or a write key's — over
// gRPC (worker/ucx_service.h, only against a capability), and carries out
// what readers and writers ask with active messages (ucx_common.h): it
// sends ranges of a shard as tagged messages into receives the reader
// posted, receives a writer's bytes into a range of a pending shard, and
// answers liveness checks. No peer ever gets an address or a remote key of
// this process: every range is checked against the key's shard before a
// byte moves, and the UCX context has no one-sided access to serve
// (ucx_common.h MakeUcpContext), so a peer reaches exactly the bytes its
// key names.
//
// Keys and frees: a key pins its shard while it is live. When the shard is
// freed (seen by a check, or by the sweeper within `sweep_interval`) the
// key turns dead and lets the shard go; a dead key is remembered for
// `grace`, so a reader holding it is told the shard was freed (NOT_FOUND)
// rather than to ask again. A send in flight keeps the pages it reads
// mapped (UcxPinnedShard::keep_mapped), not the shard: a freed shard's
// pages may serve the worker's next shard of their size at once, and the
// reader's check after the bytes are in refuses such bytes. A write in
// flight keeps its whole shard.
//
// Staging: a reader whose box has short contiguous runs (a rows -> columns
// reshard's piece reads 1 KiB of every row) asks the worker to pack a range
// of the box into staging memory (Stage), has it sent in a few large
// messages, and ends the lease with a check-and-release. The staging memory
// is one region of `staging_bytes`, mapped at the first Stage and cut into
// `staging_slot_bytes` slots, so memory use is bounded and a reshard does
// not fault in fresh pages per piece; it is unmapped once no lease has been
// taken for `grace` (sends in flight keep it). A lease's slots go back to
// the pool when it is released or lapses (`staging_ttl`); a reader still
// receiving through a lapsed lease may get bytes staged for another lease,
// and its check then answers kStale, so such bytes are never returned. A
// check of a lease answers kFreed when its shard was freed since it was
// staged.
//
// Peers: a reader says hello first with its own UCX address; the worker
// connects back with an endpoint of its own (with peer-failure handling)
// and names the reader by a random peer id, which later requests carry.
// Answers and bytes go only on endpoints the worker made, so none is ever
// used after UCX dropped it. An endpoint maps part of its reader's memory;
// it is closed when the reader says goodbye, fails, stays idle for
// `peer_idle_timeout`, or `max_peers` newer ones push it out (least
// recently used first), so readers that die cost nothing for long.
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
#include <deque>
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
  // Keeps `data` mapped (not the shard) for a send in flight once the key
  // is dead (worker/shard_store.h PinnedShard::keep_mapped); null:
  // keep_alive does both.
  std::shared_ptr<const void> keep_mapped;
  char* data = nullptr;
  int64_t bytes = 0;
  Shape shape;  // the shard's box sizes
  int64_t item_bytes = 1;
};

// A staged range (proto/ucx.proto UcxStageResponse).
struct UcxStaged {
  uint64_t lease = 0;
  int64_t bytes = 0;
};

// What a reader (or writer) needs to name one shard (proto/ucx.proto
// UcxShardKey).
struct UcxKey {
  uint64_t shard_id = 0;
  int64_t bytes = 0;
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
  // Whether shard `id` still takes writes (a put's shard, not sealed).
  // Checked before each write lands; null: every held shard does.
  std::function<bool(uint64_t id)> writable;
  // Who may reach this worker's UCX (ucx_common.h).
  UcxReach reach;
  // Most live keys; the least recently handed out is withdrawn beyond (its
  // readers ask again).
  size_t max_registrations = 16384;
  // How often freed shards, lapsed leases and idle peers are looked for.
  absl::Duration sweep_interval = absl::Milliseconds(200);
  // How long a dead key is remembered (a reader holding it is told its
  // shard was freed), and how long unused staging memory stays mapped.
  // Beyond a reader's key lifetime (UcxTransportOptions::key_ttl, 10 s).
  absl::Duration grace = absl::Minutes(1);
  // Staging memory (see above); 0: Stage answers FAILED_PRECONDITION.
  int64_t staging_bytes = int64_t{256} << 20;
  int64_t staging_slot_bytes = int64_t{1} << 20;
  // Most bytes one lease may hold.
  int64_t max_stage_bytes = int64_t{32} << 20;
  // A lease not released for this long lapses.
  absl::Duration staging_ttl = absl::Seconds(30);
  // Most ranges being sent at once, and queued behind them; a request that
  // does not fit the queue is refused (kBusy) and asked again.
  int max_sends_in_flight = 64;
  size_t max_queued_sends = 4096;
  // Most reader endpoints kept, and how long an idle one is kept (see
  // above). Above a reader's own idle limit
  // (UcxTransportOptions::peer_idle_timeout), so a live reader's endpoint
  // is not closed under it.
  size_t max_peers = 256;
  absl::Duration peer_idle_timeout = absl::Minutes(2);
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

  // A key to shard `id`: for reads, or for writes when `write` (a separate
  // key, withdrawn by FinishWrite). Reuses the live key when there is one.
  // Errors as `pin` answers them.
  absl::StatusOr<UcxKey> Register(uint64_t id, bool write)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Withdraws the write key of shard `id` (its write is done, or it is
  // sealed): later writes through it are refused.
  void FinishWrite(uint64_t id) ABSL_LOCKS_EXCLUDED(mu_);

  // Packs elements [first, first + count) of `box` of shard `id` into
  // staging memory and leases them (see above). Errors as UcxData.Stage
  // (proto/ucx.proto) gives them.
  absl::StatusOr<UcxStaged> Stage(uint64_t id, const Box& box, int64_t first,
                                  int64_t count) ABSL_LOCKS_EXCLUDED(mu_);

  // Leases now, and staging bytes they hold (for tests and metrics).
  std::pair<size_t, int64_t> StagingCounts() const ABSL_LOCKS_EXCLUDED(mu_);

  // Keys now: live ones, and dead ones remembered for their grace.
  std::pair<size_t, size_t> Counts() const ABSL_LOCKS_EXCLUDED(mu_);
  // Ranges sent to readers so far, ranges packed into staging memory
  // (Stage), and writes received, for tests and reports.
  int64_t RangesSent() const { return ranges_sent_.load(); }
  // Their bytes.
  int64_t BytesSent() const { return bytes_sent_.load(); }
  int64_t RangesStaged() const { return ranges_staged_.load(); }
  int64_t WritesReceived() const { return writes_received_.load(); }
  // Reader endpoints kept now (tessera_ucx_peers).
  int64_t Peers() const { return peers_count_.load(); }

 private:
  struct Registration {
    uint64_t shard_id = 0;
    bool write = false;
    uint64_t nonce = 0;
    UcxPinnedShard pinned;  // released when the key dies
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
  // One range to send to peer `peer`: `pages` keeps `data` mapped until
  // it is sent.
  struct PendingSend {
    uint64_t peer = 0;
    std::shared_ptr<const void> pages;
    const char* data = nullptr;
    uint64_t bytes = 0;
    uint64_t tag = 0;
  };
  struct Sending {
    std::shared_ptr<const void> pages;
    UcxServer* server = nullptr;
  };
  // A write whose bytes are still arriving (rendezvous) into its shard.
  struct Receiving {
    std::shared_ptr<void> shard;  // keeps the destination alive
    uint64_t peer = 0;
    uint64_t request_id = 0;
    UcxServer* server = nullptr;
  };
  struct Reply {
    uint64_t peer = 0;
    UcxCheckReply body;
  };
  // A reader, by its peer id: the endpoint this worker made to it.
  struct Peer {
    ucp_ep_h ep = nullptr;
    absl::Time last_use;
    uint64_t tick = 0;
  };
  // A reader this worker forgot (idle, or pushed out): told so on its
  // endpoint, which closes once the notice is out (or `until`).
  struct Notice {
    UcxCheckReply body;
    bool done = false;  // the send completed (or failed)
  };
  struct Forgetting {
    ucp_ep_h ep = nullptr;
    std::unique_ptr<Notice> notice;
    absl::Time until;
    bool closed = false;
  };
  // A hello to answer once the progress call returns.
  struct Hello {
    std::string address;
    uint64_t request_id = 0;
  };

  UcxServer(UcxServerOptions options, ucp_context_h context, UcpWorker worker,
            std::string address, int epoll_fd, int wake_fd);

  void Progress();
  void Sweep() ABSL_LOCKS_EXCLUDED(mu_);
  // kUcxCheckAm (kRelease false) and kUcxCheckReleaseAm (true).
  template <bool kRelease>
  static ucs_status_t OnCheck(void* arg, const void* header,
                              size_t header_length, void* data, size_t length,
                              const ucp_am_recv_param_t* param);
  static ucs_status_t OnSend(void* arg, const void* header,
                             size_t header_length, void* data, size_t length,
                             const ucp_am_recv_param_t* param);
  static ucs_status_t OnWrite(void* arg, const void* header,
                              size_t header_length, void* data, size_t length,
                              const ucp_am_recv_param_t* param);
  static ucs_status_t OnGoodbye(void* arg, const void* header,
                                size_t header_length, void* data, size_t length,
                                const ucp_am_recv_param_t* param);
  static ucs_status_t OnHello(void* arg, const void* header,
                              size_t header_length, void* data, size_t length,
                              const ucp_am_recv_param_t* param);
  static void OnPeerFailure(void* arg, ucp_ep_h ep, ucs_status_t status);
  static void SendDone(void* request, ucs_status_t status, void* user_data);
  static void NoticeSent(void* request, ucs_status_t status, void* user_data);
  static void WriteDone(void* request, ucs_status_t status, size_t length,
                        void* user_data);
  // Queues a send request's ranges, or queues its refusal.
  void AnswerSend(const void* header, size_t header_length, const void* data,
                  size_t length, const ucp_am_recv_param_t* param);
  // Receives a write's bytes into its shard (or refuses it). Returns what
  // the AM callback returns.
  ucs_status_t AnswerWrite(const void* header, size_t header_length, void* data,
                           size_t length, const ucp_am_recv_param_t* param);
  void AnswerCheck(const void* header, size_t header_length,
                   const ucp_am_recv_param_t* param, bool release);
  // options_.pin(id), with a shard outside host memory (UNIMPLEMENTED) as
  // FAILED_PRECONDITION: UCX reaches host memory only.
  absl::StatusOr<UcxPinnedShard> PinHostShard(uint64_t id) const;
  UcxCheckAnswer Check(uint64_t shard_id, uint64_t nonce, bool release)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Whether `nonce` was a key of shard `shard_id` that died because the
  // shard was freed (kFreed, not kStale).
  bool FreedKey(uint64_t nonce, uint64_t shard_id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether r's shard is still held; if not, kills r (freed) and lets go.
  bool StillHeld(Registration& r) ABSL_LOCKS_EXCLUDED(mu_);
  // Maps the staging region if it is not.
  absl::Status EnsureStaging() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EndLease(uint64_t lease) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Kill(Registration& r, bool freed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the shards Kill let go of (let_go_), outside the lock.
  void LetGo() ABSL_LOCKS_EXCLUDED(mu_);

  // Progress thread only:
  // The peer a request names, made most recently used; null (and the
  // request dropped) when there is none.
  Peer* Known(uint64_t peer);
  // Queues an answer to `peer`.
  void Refuse(uint64_t peer, uint64_t request_id, UcxCheckAnswer answer);
  // Connects back to each reader that said hello, and answers it.
  void Greet();
  void SendReplies();
  void PostSends();
  // Closes the endpoint to a reader, dropping what is queued for it.
  // `notify`: a reader that may still be there (idle, pushed out) is told
  // first, so that it says hello again instead of waiting on requests this
  // worker drops.
  void ClosePeer(uint64_t peer, bool notify);
  void CloseEndpoint(ucp_ep_h ep);
  // Closes the peers marked (goodbyes, failures, pushed out) and the idle.
  void ClosePeers();
  void FreeClosed();
  // Closes the forgotten readers' endpoints whose notice is out.
  void FinishForgetting();

  const UcxServerOptions options_;
  ucp_context_h context_;
  UcpWorker worker_;
  const std::string address_;
  const int epoll_fd_;
  const int wake_fd_;  // eventfd: wakes the progress thread to stop

  // Guards the keys and the staging memory. Invariants: `live_` and
  // `by_nonce_` name the same live keys; every dead one is in `dead_` (by
  // nonce) and in no other map; nonces are never reused.
  mutable absl::Mutex mu_;
  std::map<std::pair<uint64_t, bool>, std::shared_ptr<Registration>> live_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::shared_ptr<Registration>> by_nonce_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::shared_ptr<Registration>> dead_
      ABSL_GUARDED_BY(mu_);
  // Shards dead keys let go of, dropped outside the lock (a shard's
  // destructor parks or unlinks its pages).
  std::vector<std::shared_ptr<void>> let_go_ ABSL_GUARDED_BY(mu_);
  uint64_t tick_ ABSL_GUARDED_BY(mu_) = 0;

  // Staging: the region (null until the first Stage; sends in flight hold
  // it too), which slots are leased, and the leases by their nonce.
  // Invariant: a slot is marked taken iff exactly one lease holds it.
  std::shared_ptr<char> staging_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> slot_taken_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Lease> leases_ ABSL_GUARDED_BY(mu_);
  int64_t leased_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time staging_used_ ABSL_GUARDED_BY(mu_);  // last lease taken

  // Progress thread only.
  std::vector<Reply> replies_;
  std::deque<PendingSend> queued_;
  int sends_in_flight_ = 0;
  int receives_in_flight_ = 0;  // writes' rendezvous receives
  absl::flat_hash_map<uint64_t, Peer> peers_;
  absl::flat_hash_map<ucp_ep_h, uint64_t> peer_of_;  // the same, by endpoint
  uint64_t peer_tick_ = 0;
  std::vector<Hello> hellos_;
  std::vector<uint64_t> to_close_;   // said goodbye, or failed
  std::vector<uint64_t> to_forget_;  // pushed out by newer readers
  std::vector<void*> closing_;       // ucp_ep_close_nbx requests in progress
  std::vector<Forgetting> forgetting_;
  absl::Time last_close_ = absl::InfinitePast();

  std::atomic<int64_t> ranges_sent_{0};
  std::atomic<int64_t> bytes_sent_{0};
  std::atomic<int64_t> ranges_staged_{0};
  std::atomic<int64_t> writes_received_{0};
  std::atomic<int64_t> peers_count_{0};
  absl::Notification stop_;
  std::thread progress_;
  std::thread sweeper_;
};

}  // namespace tessera

#endif  // TESSERA_TRANSPORT_UCX_SERVER_H_
