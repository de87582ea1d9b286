// What the two ends of the UCX data plane share (transport/ucx_server.h on
// the worker, transport/ucx_transport.h in readers): the switches that turn
// UCX off and let it onto the network, the UCP context and worker set-up,
// the messages they exchange as active messages, and the planning of a box
// as runs of contiguous bytes. Everything here is thread-safe unless it says
// otherwise.
#ifndef TESSERA_TRANSPORT_UCX_COMMON_H_
#define TESSERA_TRANSPORT_UCX_COMMON_H_

#include <ucp/api/ucp.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/box.h"

namespace tessera {

// Sends UCX's log lines through spdlog (never to stdout, where UCX's own
// handler prints them). Idempotent; MakeUcpContext calls it.
void RouteUcxLogs();

// False when the environment turns UCX off: TESSERA_UCX set to 0, false,
// off or no. Read once per process.
bool UcxAllowedByEnvironment();
// True when the environment says the network between the cluster's hosts
// is trusted: TESSERA_TRUSTED_FABRIC set to 1, true, on or yes (what a
// worker's --trusted_fabric says). Read once per process.
bool TrustedFabricByEnvironment();

// `what` failed with `status`, as an absl::Status: UNAVAILABLE for the
// failures of a peer or the network, INTERNAL for the rest.
absl::Status UcxError(absl::string_view what, ucs_status_t status);

// Which peers a process's UCX may talk to. UCX's wire protocols trust their
// peers: over TCP a peer's one-sided put lands at whatever address it names
// (uct_tcp's PUT_REQ), and request ids are pointers in the receiver. So UCX
// never listens where a stranger can reach it:
struct UcxReach {
  // False: this host only, over shared memory that the operating system
  // limits to this user (UCX's posix segments, mode 0600 and shared
  // through /proc/PID/fd, and CMA, which needs ptrace rights over the
  // peer). True: the network too (TCP, RDMA), for a fabric between the
  // hosts that the operator says only the cluster reaches; UCX_TLS and
  // UCX_NET_DEVICES then choose.
  bool trusted_fabric = false;
  // With trusted_fabric: the loopback device alone (unless UCX_NET_DEVICES
  // says otherwise), for a worker that serves loopback only.
  bool loopback_only = false;
};

// The UCX transports of a process that reaches only this host's same-user
// peers (UcxReach::trusted_fabric false).
inline constexpr char kUcxSameHostTransports[] = "self,posix,cma";

// A UCP context with active messages, tagged messages and wake-ups, shared
// by several threads' workers. Never one-sided access (UCP_FEATURE_RMA):
// without it UCX does not serve a peer's emulated gets and puts, which
// read and write any address of this process; every byte a peer receives
// is sent by this process after a check, and every byte it writes is
// received here into a range checked first.
absl::StatusOr<ucp_context_h> MakeUcpContext(absl::string_view name,
                                             UcxReach reach);

// A worker of `context` for one thread at a time, with an event fd for
// sleeping until it has work (ucp_worker_get_efd).
struct UcpWorker {
  ucp_worker_h worker = nullptr;
  int efd = -1;
};
// Message ids up to `last_guarded_id` dropped unless handled
// (GuardMessageIds).
absl::StatusOr<UcpWorker> MakeUcpWorker(ucp_context_h context,
                                        uint16_t last_guarded_id);
// Gives message ids 0..`last_id` a handler that drops the message, so that
// a message with an id nobody handles is dropped: UCX 1.13 calls through
// an uninitialised slot otherwise. Real handlers are set after. A worker
// guards all 65,536 ids (1.7 MiB); a reader, which hears only from the
// workers it connects to, the ids tessera uses (kUcxLastMessageId).
absl::Status GuardMessageIds(ucp_worker_h worker, uint16_t last_id);

// The worker's own address, to hand to peers.
absl::StatusOr<std::string> UcpWorkerAddress(ucp_worker_h worker);

// Parameters of a send that calls `done` with `user_data` when it completes
// later; one that completes at once calls nothing.
inline ucp_request_param_t SendParam(ucp_send_nbx_callback_t done,
                                     void* user_data) {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.send = done;
  param.user_data = user_data;
  return param;
}

// ---- The messages between a reader and a worker (active messages) ----
//
// Every request is an active message whose header is one of the structs
// below (magic first); the worker answers with kUcxCheckReplyAm
// (UcxCheckReply), except for a send request it carries out (the bytes are
// the answer) and a goodbye. Names ("registration") are what
// UcxData.Describe / Stage handed out over gRPC against a capability; the
// worker checks every field before it acts.
//
// Hello first: a reader's first request on a new endpoint carries its own
// UCX address; the worker connects back with an endpoint of its own (with
// peer-failure handling, so a dead reader is noticed and the endpoint
// closed for good) and answers with the reader's peer id, which every later
// request names. The worker answers and sends only on endpoints it made;
// a request naming an unknown peer (one the worker closed, idle) gets no
// answer: the reader's wait for one times out and it says hello again.
// Requests carry no reply-endpoint flag, so nothing in a message makes UCX
// look up an endpoint the worker may have closed.
inline constexpr unsigned kUcxHelloAm = 16;

// Liveness check: after its bytes are in, a reader asks whether the shard
// its key names is still held, so that a read of a shard freed meanwhile
// fails (NOT_FOUND) instead of returning bytes the worker no longer vouches
// for.
inline constexpr unsigned kUcxCheckAm = 17;
inline constexpr unsigned kUcxCheckReplyAm = 18;
// The same check for a staging lease (UcxData.Stage), which also ends the
// lease: the reader's reads of it are done.
inline constexpr unsigned kUcxCheckReleaseAm = 19;
// Send request (UcxSendRequest, then `count` UcxRange as the message's
// data): the worker sends each range of a read key's shard, or of a staging
// lease, as a tagged message of exactly its bytes with tag request_id + i,
// into receives the reader posted first. Refused as a whole (a reply, and
// nothing sent) when the key is stale or freed, a range lies outside, or
// the worker's queue of sends is full (kBusy: ask again).
inline constexpr unsigned kUcxSendAm = 20;
// Write (UcxWriteRequest, then the bytes as the message's data): the worker
// receives the bytes into its range of a pending shard it holds a write key
// to, then answers kHeld; anything else is refused before a byte lands.
inline constexpr unsigned kUcxWriteAm = 21;
// Goodbye (UcxGoodbye): the reader closes its endpoint, so the worker
// closes its own to the reader (and what it maps of the reader's memory).
inline constexpr unsigned kUcxGoodbyeAm = 22;
// Every message id tessera uses, now and later, is at most this.
inline constexpr uint16_t kUcxLastMessageId = 63;

inline constexpr uint64_t kUcxCheckMagic = 0x7465737365726132;  // "tessera2"
// Most ranges in one send request; most bytes of a reader's UCX address.
inline constexpr uint32_t kMaxUcxSendRanges = 256;
inline constexpr size_t kMaxUcxAddressBytes = 64 << 10;

// Whether `address` can be a UCX worker address: a size in bounds and a
// format version UCX packs (1.13: v1 or v2). UCX parses the rest unbounded,
// trusting its peers (as in its own wire-up), so this is all that can be
// checked before ucp_ep_create.
inline bool PlausibleUcpAddress(absl::string_view address) {
  return address.size() >= 2 && address.size() <= kMaxUcxAddressBytes &&
         (static_cast<uint8_t>(address[0]) & 0x0f) <= 1;
}

// The reader's address follows as the message's data.
struct UcxHello {
  uint64_t magic = kUcxCheckMagic;
  uint64_t request_id = 0;
};

struct UcxCheckRequest {
  uint64_t magic = kUcxCheckMagic;
  uint64_t peer = 0;  // as the hello's answer named it
  uint64_t request_id = 0;
  uint64_t shard_id = 0;
  uint64_t registration = 0;
};

enum class UcxCheckAnswer : uint32_t {
  kHeld = 0,     // the key is good and the shard held (a write: it landed)
  kFreed = 1,    // the shard was freed
  kStale = 2,    // the key was withdrawn (evicted, a finished write): ask again
  kBusy = 3,     // no room for the sends now: ask again shortly
  kRefused = 4,  // a malformed request, or a range outside what the key names
  kSealed = 5,   // a write to a shard that takes no more writes
  kUnknownPeer = 6,  // no such peer (closed): say hello again (kept on the
                     // wire; this worker drops such requests instead)
};
inline constexpr uint32_t kUcxLastAnswer =
    static_cast<uint32_t>(UcxCheckAnswer::kUnknownPeer);

struct UcxCheckReply {
  uint64_t magic = kUcxCheckMagic;
  uint64_t request_id = 0;
  uint32_t answer = 0;  // UcxCheckAnswer
  uint32_t reserved = 0;
  uint64_t peer = 0;  // a hello's answer: the reader's peer id
};

struct UcxSendRequest {
  uint64_t magic = kUcxCheckMagic;
  uint64_t peer = 0;
  uint64_t request_id = 0;  // the tag of the first range's receive
  uint64_t shard_id = 0;
  uint64_t registration = 0;  // a read key's, or a staging lease's
  uint32_t count = 0;         // ranges in the data, 1 to kMaxUcxSendRanges
  uint32_t reserved = 0;
};

// Bytes [offset, offset + bytes) of a shard (or of a lease's staged bytes).
struct UcxRange {
  uint64_t offset = 0;
  uint64_t bytes = 0;
};

struct UcxWriteRequest {
  uint64_t magic = kUcxCheckMagic;
  uint64_t peer = 0;
  uint64_t request_id = 0;
  uint64_t shard_id = 0;
  uint64_t registration = 0;  // a write key's
  uint64_t offset = 0;        // the data lands at shard bytes [offset, +size)
};

struct UcxGoodbye {
  uint64_t magic = kUcxCheckMagic;
  uint64_t peer = 0;
};

// A box copied between two row-major arrays as runs of contiguous elements:
// the trailing dims that the box covers whole in both arrays merge into one
// run, so a box of whole rows is one run. Made once, then walked in flat
// ranges. A value.
class RunPlan {
 public:
  // REQUIRES: the box (sizes `box_sizes`) lies at `src_offsets` in
  // `src_shape` and at `dst_offsets` in `dst_shape`, all of one rank >= 1.
  RunPlan(absl::Span<const int64_t> box_sizes,
          absl::Span<const int64_t> src_shape,
          absl::Span<const int64_t> src_offsets,
          absl::Span<const int64_t> dst_shape,
          absl::Span<const int64_t> dst_offsets);

  int64_t run() const { return run_; }      // elements per run
  int64_t total() const { return total_; }  // elements of the box
  int64_t runs() const { return run_ > 0 ? total_ / run_ : 0; }

  // Calls fn(src_element, dst_element, flat, count) for the pieces of box
  // elements [begin, begin + count) in row-major order: each piece lies in
  // one run (it is cut where a run ends).
  void ForEach(int64_t begin, int64_t count,
               const std::function<void(int64_t src, int64_t dst, int64_t flat,
                                        int64_t n)>& fn) const;

 private:
  int64_t run_ = 0;
  int64_t total_ = 0;
  std::vector<int64_t> outer_sizes_;  // box sizes of the dims before the run
  std::vector<int64_t> src_strides_;  // elements per step of those dims
  std::vector<int64_t> dst_strides_;
  int64_t src_base_ = 0;  // element of the box's first element
  int64_t dst_base_ = 0;
};

}  // namespace tessera

#endif  // TESSERA_TRANSPORT_UCX_COMMON_H_
