#include "transport/ucx_transport.h"

#include <poll.h>
#include <ucp/api/ucp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/box_runs.h"
#include "core/checked_math.h"
#include "core/status_macros.h"
#include "core/strided_copy.h"
#include "proto/ucx.grpc.pb.h"
#include "rpc/call.h"
#include "rpc/channel.h"
#include "rpc/security.h"
#include "rpc/status.h"
#include "spdlog/spdlog.h"
#include "transport/ucx_common.h"

namespace tessera {
namespace {

// Bounds on what a worker's Describe reply may carry.
constexpr size_t kMaxWorkerAddressBytes = 64 << 10;
constexpr int kMaxRank = 64;
constexpr int64_t kMaxItemBytes = 64;
// How long a lane spins on progress before it sleeps on its event fd.
constexpr absl::Duration kSpin = absl::Microseconds(50);
// How long a hello waits for the worker's answer.
constexpr absl::Duration kHelloTimeout = absl::Seconds(5);
constexpr int kHelloAttempts = 2;
// How long a worker's "busy" (its send queue is full) is waited out between
// asks.
constexpr absl::Duration kBusyPause = absl::Microseconds(200);

// Lanes spinning at once, in this process. A spinner past half the cores
// only takes the core from the thread that would answer it (a worker on the
// same host, or another caller whose bytes have landed): with 16 callers on
// 2 cores, spinning cost half the small reads' throughput.
std::atomic<int> spinning_lanes{0};

// One of the process's spin slots, if one was free; given back at the
// latest when it goes.
class SpinSlot {
 public:
  SpinSlot() {
    static const int max_spinning =
        std::max(1, static_cast<int>(std::thread::hardware_concurrency() / 2));
    int now = spinning_lanes.load(std::memory_order_relaxed);
    while (now < max_spinning && !held_) {
      held_ = spinning_lanes.compare_exchange_weak(now, now + 1);
    }
  }
  SpinSlot(const SpinSlot&) = delete;
  SpinSlot& operator=(const SpinSlot&) = delete;
  ~SpinSlot() { Release(); }

  bool held() const { return held_; }
  void Release() {
    if (held_) spinning_lanes.fetch_sub(1);
    held_ = false;
  }

 private:
  bool held_ = false;
};

absl::Status Inconsistent(absl::string_view what) {
  return absl::InternalError(
      absl::StrCat("worker's UcxData reply is inconsistent: ", what));
}

// What a call's errors say it was doing: "reading shard 3 from w1
// (HOST:PORT) over UCX" (`doing` "reading", `toward` "from").
std::string OverUcx(absl::string_view doing, const ShardLocation& at,
                    absl::string_view toward) {
  return absl::StrCat(doing, " shard ", at.shard_id, " ", toward, " ",
                      at.worker, " (", at.address, ") over UCX");
}

// Outstanding operations of one call; completions arrive on the lane's
// thread, inside ucp_worker_progress.
struct Ops {
  int pending = 0;
  int64_t completed = 0;
  ucs_status_t error = UCS_OK;
};

void OpDone(void* request, ucs_status_t status, void* user_data) {
  auto* ops = static_cast<Ops*>(user_data);
  --ops->pending;
  ++ops->completed;
  if (status != UCS_OK && ops->error == UCS_OK) ops->error = status;
  ucp_request_free(request);
}

// A tagged receive: completes its Ops; a message of another length than
// asked is an error (the worker must send exactly the range).
struct Receiving {
  Ops* ops = nullptr;
  size_t expected = 0;
  void* request = nullptr;  // while in flight
};

void ReceiveDone(void* request, ucs_status_t status,
                 const ucp_tag_recv_info_t* info, void* user_data) {
  auto* receiving = static_cast<Receiving*>(user_data);
  Ops* ops = receiving->ops;
  --ops->pending;
  ++ops->completed;
  receiving->request = nullptr;
  if (status == UCS_OK && info != nullptr &&
      info->length != receiving->expected) {
    status = UCS_ERR_MESSAGE_TRUNCATED;
  }
  if (status != UCS_OK && ops->error == UCS_OK) ops->error = status;
  ucp_request_free(request);
}

// A key as the reply gives it, once checked.
struct DescribedKey {
  std::string worker_address;
  int64_t bytes = 0;
  uint64_t registration = 0;
  Shape shape;
  int64_t item_bytes = 1;
};

absl::StatusOr<DescribedKey> ValidateDescribe(
    const v1::UcxDescribeResponse& reply, uint64_t shard_id) {
  if (reply.worker_address().empty() ||
      reply.worker_address().size() > kMaxWorkerAddressBytes) {
    return Inconsistent(absl::StrCat("a UCX address of ",
                                     reply.worker_address().size(), " bytes"));
  }
  if (reply.shards_size() != 1 || reply.shards(0).shard_id() != shard_id) {
    return Inconsistent("the keys do not answer the shards asked for");
  }
  const v1::UcxShardKey& k = reply.shards(0);
  if (k.item_bytes() < 1 || k.item_bytes() > kMaxItemBytes) {
    return Inconsistent(absl::StrCat("element size ", k.item_bytes()));
  }
  if (k.shape_size() < 1 || k.shape_size() > kMaxRank) {
    return Inconsistent(absl::StrCat("a shard of ", k.shape_size(), " dims"));
  }
  DescribedKey key;
  key.shape.assign(k.shape().begin(), k.shape().end());
  int64_t bytes = k.item_bytes();
  for (int64_t d : key.shape) {
    if (d < 0) return Inconsistent("a negative shard size");
    absl::StatusOr<int64_t> product = CheckedMul(bytes, d);
    if (!product.ok()) return Inconsistent("a shard size that overflows");
    bytes = *product;
  }
  if (k.bytes() != bytes) {
    return Inconsistent(absl::StrCat(k.bytes(), " bytes for shape ",
                                     ShapeToString(key.shape), " which needs ",
                                     bytes));
  }
  if (k.registration() == 0) return Inconsistent("a key without a name");
  key.worker_address = reply.worker_address();
  key.bytes = bytes;
  key.registration = k.registration();
  key.item_bytes = k.item_bytes();
  return key;
}

bool IsPeerFailure(const absl::Status& status) {
  return absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status) ||
         absl::IsInternal(status);
}

}  // namespace

// One thread's UCX worker, with its endpoints and keys. Used by one call at
// a time (taken from the transport's pool), so it needs no lock.
class UcxTransport::Lane {
 public:
  struct Key {
    int64_t bytes = 0;
    Shape shape;
    int64_t item_bytes = 1;
    uint64_t registration = 0;
    absl::Time validated;
    uint64_t last_use = 0;
  };
  struct Peer {
    std::string address;      // gRPC address: the cache's key
    std::string ucx_address;  // the worker's UCX address
    ucp_ep_h ep = nullptr;
    ucs_status_t error = UCS_OK;  // set by the endpoint's error handler
    bool forgotten = false;       // the worker said it closed its endpoint
    uint64_t id = 0;              // what the worker calls this lane
    std::map<uint64_t, Key> keys;
    uint64_t last_use = 0;
    absl::Time used;
  };
  // `bytes` at `offset` of a key's shard (or a lease's staged bytes), into
  // `local`.
  struct Range {
    uint64_t offset = 0;
    char* local = nullptr;
    int64_t bytes = 0;
  };

  Lane(UcpWorker worker, const UcxTransportOptions& options,
       ChannelCache* channels, UcxTransport* owner)
      : worker_(worker),
        options_(options),
        channels_(channels),
        owner_(owner) {}

  ~Lane() {
    if (broken()) return;
    while (!peers_.empty()) DropPeer(peers_.begin()->first);
    ucp_worker_destroy(worker_.worker);
  }

  // Its UCX worker was destroyed after a peer stalled (Abandon): the lane
  // is done.
  bool broken() const { return worker_.worker == nullptr; }

  absl::Status SetHandler() {
    ucp_am_handler_param_t handler{};
    handler.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID |
                         UCP_AM_HANDLER_PARAM_FIELD_CB |
                         UCP_AM_HANDLER_PARAM_FIELD_ARG;
    handler.id = kUcxCheckReplyAm;
    handler.cb = &Lane::OnReply;
    handler.arg = this;
    const ucs_status_t s =
        ucp_worker_set_am_recv_handler(worker_.worker, &handler);
    if (s != UCS_OK) return UcxError("setting the UCX reply handler", s);
    absl::StatusOr<std::string> address = UcpWorkerAddress(worker_.worker);
    if (!address.ok()) return address.status();
    address_ = *std::move(address);
    return absl::OkStatus();
  }

  absl::Status Read(const RemoteShard& shard, const Box& box,
                    const ReadTarget& target);
  absl::Status Write(const RemoteShard& shard, const WriteSource& source);
  absl::Status ReadRows(absl::Span<const ShardRows> entries,
                        const RowSink& sink);
  // Closes the endpoints unused for peer_idle_timeout.
  void DropIdlePeers();

 private:
  // Runs `body` (which ends with StillHeld) on a key to `shard` that has
  // the caller's shape and element size; once more on a fresh key after a
  // withdrawn key (ABORTED) or a link failure (on a fresh endpoint, too).
  // A worker reachable over gRPC but not over UCX: FAILED_PRECONDITION.
  absl::Status WithKey(const RemoteShard& shard, const std::string& where,
                       const std::function<absl::Status(Peer&, Key&)>& body);
  // Asks the worker for a key to `shard` (gRPC).
  absl::StatusOr<DescribedKey> Describe(const RemoteShard& shard, bool write);
  // The cached key to `shard`, or a fresh one when `fresh`, the cached one
  // is older than key_ttl, or there is none; connects when needed.
  absl::StatusOr<std::pair<Peer*, Key*>> KeyFor(const RemoteShard& shard,
                                                bool fresh);
  // The endpoint to the worker at `address` whose UCX address is
  // `ucx_address`: the cached one, or a new one.
  absl::StatusOr<Peer*> PeerFor(const std::string& address,
                                const std::string& ucx_address);
  absl::StatusOr<Peer*> Connect(const std::string& address,
                                const std::string& ucx_address);
  // Says goodbye (when the link is sound) and closes the endpoint.
  void DropPeer(const std::string& address);

  // Progresses the worker until `done`, failing when the peer fails, when
  // `progress` (a completion counter) stands still for stall_timeout, or
  // past `deadline`.
  absl::Status Wait(const std::function<bool()>& done, const Peer& peer,
                    const int64_t* progress);
  // Has the worker send every range of `ranges` (key or lease
  // `registration` of shard `shard_id`) into its place, kMaxUcxSendRanges
  // per request, each cut at send_bytes. NOT_FOUND when the shard was
  // freed, ABORTED when the key was withdrawn. The caller checks the key
  // after. With `landed`, each request's bytes are counted there as they
  // land (ranges straight into a read's host array).
  absl::Status ReceiveRanges(Peer& peer, uint64_t registration,
                             uint64_t shard_id, std::vector<Range> ranges,
                             const ReadTarget* landed = nullptr);
  // One request of at most kMaxUcxSendRanges ranges.
  absl::Status ReceiveBatch(Peer& peer, uint64_t registration,
                            uint64_t shard_id, absl::Span<const Range> ranges);
  // OK when the worker still vouches for the key; NOT_FOUND when the shard
  // was freed, ABORTED when the key was withdrawn. `release`: the key is a
  // staging lease, which the check ends.
  absl::Status StillHeld(Peer& peer, uint64_t shard_id, uint64_t registration,
                         bool release = false);
  // After a failure with operations of `ops` outstanding: drops the peer,
  // which cancels them, and waits for their callbacks (which touch `ops`).
  void Abandon(const std::string& address, Ops& ops);
  // After waiting (`waited`) for the operations of `ops` sent to `peer`:
  // the wait's failure (abandoning `ops`), else their first UCX error as
  // "<what> to <address>", else OK.
  absl::Status Settle(Peer& peer, Ops& ops, const absl::Status& waited,
                      absl::string_view what);
  // Long runs into a host array, or a sink: each run (or stage_bytes of
  // whole box elements) a range.
  absl::Status Ranges(Peer& peer, const Key& key, const RemoteShard& shard,
                      const Box& box, const ReadTarget& target);
  // A box whose runs are short: packed by the worker when it can, else
  // read as whole rows.
  absl::Status ShortRuns(Peer& peer, const Key& key, const RemoteShard& shard,
                         const Box& box, const ReadTarget& target);
  // Whole rows of the box sent into a buffer and copied out (a worker that
  // stages nothing).
  absl::Status WholeRows(Peer& peer, const Key& key, uint64_t shard_id,
                         const Box& box, const ReadTarget& target);
  // A box that is one range of the shard, for a target whose runs are
  // short: sent straight from the shard remote_stage_bytes at a time into a
  // buffer and placed from there. `first`: the box's first element, within
  // the shard.
  absl::Status SentSpan(Peer& peer, const Key& key, const RemoteShard& shard,
                        const Box& box, int64_t first,
                        const ReadTarget& target);
  // The box packed by the worker (UcxData.Stage) remote_stage_bytes at a
  // time, each range sent straight into a host array whose runs are long,
  // else into a buffer, and its lease checked and ended. Sets `declined`
  // (and returns OK) when the worker stages nothing for the first range:
  // the caller reads another way.
  absl::Status Staged(Peer& peer, const Key& key, const RemoteShard& shard,
                      const Box& box, const ReadTarget& target, bool* declined);
  // Sends request active message `am` (header `header` of `header_bytes`,
  // data `data` of `data_bytes`, all kept until `ops` completes); its
  // answer, if any, comes on the worker's own endpoint, awaited by
  // `request_id` (OnReply). Counts the send in `ops`.
  absl::Status Ask(Peer& peer, unsigned am, const void* header,
                   size_t header_bytes, const void* data, size_t data_bytes,
                   uint64_t request_id, Ops& ops);
  absl::StatusOr<UcxCheckAnswer> Check(Peer& peer, uint64_t shard_id,
                                       uint64_t registration, bool release);
  // The answer of request `request_id`, once it came.
  std::optional<UcxCheckAnswer> Answer(uint64_t request_id) const;
  // Says hello on a new endpoint (ucx_common.h): the worker connects back
  // and names this lane.
  absl::Status Hello(Peer& peer);
  // The worker closed its endpoint to this lane (idle): a link failure, so
  // the caller starts afresh with a hello.
  static absl::Status ForgottenError(const Peer& peer) {
    return absl::UnavailableError(absl::StrCat(
        "the worker at ", peer.address, " closed its UCX endpoint to us"));
  }
  // Why the worker refused a call on shard `shard_id`, as every call reads
  // it: the shard is freed (NOT_FOUND), `key` was withdrawn (ABORTED), or
  // the worker forgot this lane (UNAVAILABLE); `other` for any other answer.
  static absl::Status Refusal(UcxCheckAnswer answer, uint64_t shard_id,
                              const Peer& peer, absl::string_view key,
                              absl::Status other) {
    switch (answer) {
      case UcxCheckAnswer::kFreed:
        return absl::NotFoundError(absl::StrCat(
            "shard ", shard_id, " is not held by this worker (freed)"));
      case UcxCheckAnswer::kStale:
        return absl::AbortedError(
            absl::StrCat("the worker withdrew the ", key));
      case UcxCheckAnswer::kUnknownPeer:
        return ForgottenError(peer);
      default:
        return other;
    }
  }
  // A bounce buffer of `bytes`, reused across calls (not zeroed).
  BufferPool::Lease Buffer(size_t bytes) {
    return owner_->buffers_.Take(bytes);
  }

  static ucs_status_t OnReply(void* arg, const void* header,
                              size_t header_length, void* data, size_t length,
                              const ucp_am_recv_param_t* param);
  static void OnPeerError(void* arg, ucp_ep_h ep, ucs_status_t status);

  UcpWorker worker_;
  const UcxTransportOptions& options_;
  ChannelCache* const channels_;
  UcxTransport* const owner_;
  std::map<std::string, std::unique_ptr<Peer>> peers_;
  uint64_t tick_ = 0;
  absl::Time deadline_ = absl::InfiniteFuture();  // of the current call
  uint64_t next_request_ = 0;
  // Requests awaiting an answer, and the answers that came (by request id).
  std::map<uint64_t, std::optional<UcxCheckReply>> awaited_;
  std::string address_;  // this lane's own UCX address, for hellos
};

ucs_status_t UcxTransport::Lane::OnReply(void* arg, const void* header,
                                         size_t header_length, void*, size_t,
                                         const ucp_am_recv_param_t*) {
  auto* lane = static_cast<Lane*>(arg);
  if (header_length != sizeof(UcxCheckReply)) return UCS_OK;
  UcxCheckReply reply;
  std::memcpy(&reply, header, sizeof(reply));
  if (reply.magic != kUcxCheckMagic) return UCS_OK;
  if (reply.request_id == 0 &&
      reply.answer == static_cast<uint32_t>(UcxCheckAnswer::kUnknownPeer)) {
    // A notice: the worker forgot the peer it names (idle, or pushed out by
    // newer readers), and drops its requests from now on.
    for (auto& [address, peer] : lane->peers_) {
      if (peer->id == reply.peer && peer->error == UCS_OK) {
        peer->forgotten = true;
        peer->error = UCS_ERR_CONNECTION_RESET;
      }
    }
    return UCS_OK;
  }
  // Late answers to requests given up on are dropped.
  auto it = lane->awaited_.find(reply.request_id);
  if (it == lane->awaited_.end() || it->second.has_value()) return UCS_OK;
  it->second = reply;
  return UCS_OK;
}

std::optional<UcxCheckAnswer> UcxTransport::Lane::Answer(
    uint64_t request_id) const {
  auto it = awaited_.find(request_id);
  if (it == awaited_.end() || !it->second.has_value()) return std::nullopt;
  // An answer this reader does not know is a refusal.
  return it->second->answer > kUcxLastAnswer
             ? UcxCheckAnswer::kRefused
             : static_cast<UcxCheckAnswer>(it->second->answer);
}

void UcxTransport::Lane::OnPeerError(void* arg, ucp_ep_h, ucs_status_t status) {
  static_cast<Peer*>(arg)->error = status;
}

absl::Status UcxTransport::Lane::Wait(const std::function<bool()>& done,
                                      const Peer& peer,
                                      const int64_t* progress) {
  int64_t seen = progress != nullptr ? *progress : 0;
  absl::Time last = absl::Now();
  SpinSlot spin;
  // Bytes of this wait have started landing: the rest follow, and a lane
  // that slept between messages would pay a wake-up for each.
  bool flowing = false;
  for (;;) {
    while (ucp_worker_progress(worker_.worker) != 0) {
    }
    if (done()) return absl::OkStatus();
    if (peer.forgotten) return ForgottenError(peer);
    if (peer.error != UCS_OK) {
      return UcxError(absl::StrCat("UCX link to ", peer.address), peer.error);
    }
    const absl::Time now = absl::Now();
    if (progress != nullptr && *progress != seen) {
      seen = *progress;
      last = now;
      flowing = true;
    }
    if (now >= deadline_) {
      return absl::DeadlineExceededError(absl::StrCat(
          "UCX transfer with ", peer.address, " ran past its deadline"));
    }
    if (now - last >= options_.stall_timeout) {
      return absl::UnavailableError(absl::StrCat(
          "UCX transfer with ", peer.address, " made no progress for ",
          absl::FormatDuration(options_.stall_timeout)));
    }
    if ((spin.held() || flowing) && now - last < kSpin) continue;
    spin.Release();
    // Idle for a while: a caller that gave up (ScopedCancellation) ends the
    // wait; then sleep until the worker has events (100 ms at most).
    if (Cancellation* c = ScopedCancellation::Current();
        c != nullptr && c->cancelled()) {
      return absl::CancelledError(
          absl::StrCat("UCX transfer with ", peer.address, " cancelled"));
    }
    if (ucp_worker_arm(worker_.worker) == UCS_ERR_BUSY) continue;
    pollfd fd{worker_.efd, POLLIN, 0};
    const int64_t ms =
        std::clamp<int64_t>(absl::ToInt64Milliseconds(std::min(
                                deadline_ - now, absl::Milliseconds(100))),
                            1, 100);
    poll(&fd, 1, static_cast<int>(ms));
  }
}

absl::Status UcxTransport::Lane::Ask(Peer& peer, unsigned am,
                                     const void* header, size_t header_bytes,
                                     const void* data, size_t data_bytes,
                                     uint64_t request_id, Ops& ops) {
  awaited_[request_id];
  const ucp_request_param_t param = SendParam(&OpDone, &ops);
  ucs_status_ptr_t sent = ucp_am_send_nbx(peer.ep, am, header, header_bytes,
                                          data, data_bytes, &param);
  if (UCS_PTR_IS_ERR(sent)) {
    awaited_.erase(request_id);
    return UcxError(absl::StrCat("UCX request to ", peer.address),
                    UCS_PTR_STATUS(sent));
  }
  if (sent != nullptr) ++ops.pending;
  return absl::OkStatus();
}

absl::Status UcxTransport::Lane::ReceiveRanges(Peer& peer,
                                               uint64_t registration,
                                               uint64_t shard_id,
                                               std::vector<Range> ranges,
                                               const ReadTarget* landed) {
  // Long ranges go as several messages.
  std::vector<Range> cut;
  cut.reserve(ranges.size());
  for (const Range& range : ranges) {
    for (int64_t done = 0; done < range.bytes;) {
      const int64_t n = std::min(range.bytes - done, options_.send_bytes);
      cut.push_back(Range{range.offset + static_cast<uint64_t>(done),
                          range.local + done, n});
      done += n;
    }
  }
  absl::Time checked = absl::Now();
  for (size_t i = 0; i < cut.size(); i += kMaxUcxSendRanges) {
    const size_t n = std::min<size_t>(kMaxUcxSendRanges, cut.size() - i);
    TESSERA_RETURN_IF_ERROR(ReceiveBatch(peer, registration, shard_id,
                                         absl::MakeConstSpan(&cut[i], n)));
    if (landed != nullptr) {
      for (size_t k = i; k < i + n; ++k) landed->Landed(cut[k].bytes);
    }
    // A long read checks now and then that its shard is still held.
    if (i + n < cut.size() && absl::Now() - checked > options_.key_ttl) {
      checked = absl::Now();
      TESSERA_RETURN_IF_ERROR(StillHeld(peer, shard_id, registration));
    }
  }
  return absl::OkStatus();
}

absl::Status UcxTransport::Lane::ReceiveBatch(Peer& peer, uint64_t registration,
                                              uint64_t shard_id,
                                              absl::Span<const Range> ranges) {
  const absl::Time busy_since = absl::Now();
  for (;;) {
    UcxSendRequest request;
    request.peer = peer.id;
    request.request_id = next_request_ + 1;
    next_request_ += ranges.size();
    request.shard_id = shard_id;
    request.registration = registration;
    request.count = static_cast<uint32_t>(ranges.size());
    std::vector<UcxRange> wire(ranges.size());
    for (size_t i = 0; i < ranges.size(); ++i) {
      wire[i].offset = ranges[i].offset;
      wire[i].bytes = static_cast<uint64_t>(ranges[i].bytes);
    }
    // Every receive is posted before the worker is asked, so each message
    // lands straight in its place.
    Ops received;
    std::vector<Receiving> receiving(ranges.size());
    absl::Status status;
    for (size_t i = 0; i < ranges.size() && status.ok(); ++i) {
      receiving[i].ops = &received;
      receiving[i].expected = static_cast<size_t>(ranges[i].bytes);
      ucp_request_param_t param{};
      param.op_attr_mask =
          UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
      param.cb.recv = &ReceiveDone;
      param.user_data = &receiving[i];
      ucs_status_ptr_t recv = ucp_tag_recv_nbx(
          worker_.worker, ranges[i].local, static_cast<size_t>(ranges[i].bytes),
          request.request_id + i, ~uint64_t{0}, &param);
      if (UCS_PTR_IS_ERR(recv)) {
        status = UcxError(absl::StrCat("UCX receive from ", peer.address),
                          UCS_PTR_STATUS(recv));
      } else if (recv != nullptr) {
        ++received.pending;
        receiving[i].request = recv;
      }
    }
    Ops asked;
    if (status.ok()) {
      status = Ask(peer, kUcxSendAm, &request, sizeof(request), wire.data(),
                   wire.size() * sizeof(UcxRange), request.request_id, asked);
    }
    if (status.ok()) {
      status = Wait(
          [&] {
            return asked.pending == 0 &&
                   (received.pending == 0 ||
                    Answer(request.request_id).has_value());
          },
          peer, &received.completed);
    }
    const std::optional<UcxCheckAnswer> answer = Answer(request.request_id);
    awaited_.erase(request.request_id);
    if (status.ok() && received.pending > 0) {
      // Refused: nothing was sent. Take the receives back.
      for (Receiving& r : receiving) {
        if (r.request != nullptr) ucp_request_cancel(worker_.worker, r.request);
      }
      status = Wait([&] { return received.pending == 0; }, peer,
                    &received.completed);
    }
    if (!status.ok()) {
      // The receives and the request must not outlive this frame: dropping
      // the peer fails what is in flight with it.
      for (Receiving& r : receiving) {
        if (r.request != nullptr) ucp_request_cancel(worker_.worker, r.request);
      }
      // The first Abandon drops the peer: its address is copied first.
      const std::string address = peer.address;
      Abandon(address, received);
      Abandon(address, asked);
      return status;
    }
    if (answer.has_value() && received.error != UCS_OK) {
      if (*answer != UcxCheckAnswer::kBusy) {
        return Refusal(*answer, shard_id, peer, "key",
                       absl::InternalError(absl::StrCat(
                           "the worker at ", peer.address, " refused to send ",
                           ranges.size(), " ranges of shard ", shard_id)));
      }
      if (absl::Now() - busy_since >= options_.stall_timeout ||
          absl::Now() >= deadline_) {
        return absl::UnavailableError(absl::StrCat(
            "the worker at ", peer.address, " had no room to send for ",
            absl::FormatDuration(absl::Now() - busy_since)));
      }
      absl::SleepFor(kBusyPause);
      continue;  // ask again
    }
    if (received.error != UCS_OK) {
      return UcxError(absl::StrCat("UCX receive from ", peer.address),
                      received.error);
    }
    return absl::OkStatus();
  }
}

absl::Status UcxTransport::Lane::Ranges(Peer& peer, const Key& key,
                                        const RemoteShard& shard,
                                        const Box& box,
                                        const ReadTarget& target) {
  const uint64_t shard_id = shard.location.shard_id;
  const int64_t item = key.item_bytes;
  const int64_t total = box.NumElements();
  if (total == 0) return absl::OkStatus();
  const std::vector<int64_t> zeros(box.rank(), 0);
  const std::vector<int64_t> sizes(box.sizes.begin(), box.sizes.end());
  const std::vector<int64_t> offsets(box.offsets.begin(), box.offsets.end());
  if (target.is_host_array()) {
    const RunPlan plan(sizes, key.shape, offsets, target.shape(),
                       target.offsets());
    if (plan.runs() > 1 && plan.run() * item < options_.min_run_bytes) {
      return ShortRuns(peer, key, shard, box, target);
    }
    std::vector<Range> ranges;
    ranges.reserve(static_cast<size_t>(plan.runs()));
    plan.ForEach(0, total, [&](int64_t src, int64_t dst, int64_t, int64_t n) {
      ranges.push_back(Range{static_cast<uint64_t>(src * item),
                             target.data() + dst * item, n * item});
    });
    return ReceiveRanges(peer, key.registration, shard_id, std::move(ranges),
                         &target);
  }
  // A sink: the box in flat ranges of the staging buffer, in order.
  const RunPlan plan(sizes, key.shape, offsets, sizes, zeros);
  if (plan.runs() > 1 && plan.run() * item < options_.min_run_bytes) {
    return ShortRuns(peer, key, shard, box, target);
  }
  const int64_t chunk = std::max<int64_t>(1, options_.stage_bytes / item);
  const BufferPool::Lease stage =
      Buffer(static_cast<size_t>(std::min(chunk, total) * item));
  for (int64_t f = 0; f < total; f += chunk) {
    const int64_t count = std::min(chunk, total - f);
    std::vector<Range> ranges;
    plan.ForEach(f, count, [&](int64_t src, int64_t dst, int64_t, int64_t n) {
      ranges.push_back(Range{static_cast<uint64_t>(src * item),
                             stage.data() + (dst - f) * item, n * item});
    });
    TESSERA_RETURN_IF_ERROR(
        ReceiveRanges(peer, key.registration, shard_id, std::move(ranges)));
    TESSERA_RETURN_IF_ERROR(target.Deliver(box.sizes, f, count, stage.data(),
                                           static_cast<size_t>(item)));
  }
  return absl::OkStatus();
}

absl::Status UcxTransport::Lane::ShortRuns(Peer& peer, const Key& key,
                                           const RemoteShard& shard,
                                           const Box& box,
                                           const ReadTarget& target) {
  if (const std::optional<int64_t> first =
          BoxSpanStart(key.shape, box.offsets, box.sizes)) {
    return SentSpan(peer, key, shard, box, *first, target);
  }
  if (options_.remote_stage_bytes > 0) {
    bool declined = false;
    absl::Status status = Staged(peer, key, shard, box, target, &declined);
    if (!declined) return status;
  }
  return WholeRows(peer, key, shard.location.shard_id, box, target);
}

absl::Status UcxTransport::Lane::Staged(Peer& peer, const Key& key,
                                        const RemoteShard& shard,
                                        const Box& box,
                                        const ReadTarget& target,
                                        bool* declined) {
  *declined = false;
  const ShardLocation& at = shard.location;
  const int64_t item = key.item_bytes;
  const int64_t total = box.NumElements();
  const int64_t per = std::max<int64_t>(1, options_.remote_stage_bytes / item);
  const std::vector<int64_t> zeros(box.rank(), 0);
  const std::vector<int64_t> sizes(box.sizes.begin(), box.sizes.end());
  // The staged bytes are the box in row-major order: they go straight to
  // a host array whose runs are long, else through `local`.
  std::optional<RunPlan> direct;
  if (target.is_host_array()) {
    RunPlan plan(sizes, sizes, zeros, target.shape(), target.offsets());
    if (plan.runs() <= 1 || plan.run() * item >= options_.min_run_bytes) {
      direct = std::move(plan);
    }
  }
  BufferPool::Lease local;
  if (!direct.has_value()) {
    local = Buffer(static_cast<size_t>(std::min(per, total) * item));
  }
  std::unique_ptr<v1::UcxData::Stub> stub =
      v1::UcxData::NewStub(channels_->Get(at.address));
  absl::Time busy_since = absl::InfiniteFuture();
  for (int64_t f = 0; f < total;) {
    const int64_t n = std::min(per, total - f);
    v1::UcxStageRequest request;
    request.set_shard_id(at.shard_id);
    for (int64_t o : box.offsets) request.add_offsets(o);
    for (int64_t z : box.sizes) request.add_sizes(z);
    request.set_first(f);
    request.set_count(n);
    v1::UcxStageResponse reply;
    const absl::Status rpc =
        DataCall(std::min(options_.timeout, deadline_ - absl::Now()),
                 at.capability, [&](grpc::ClientContext* context) {
                   return stub->Stage(context, request, &reply);
                 });
    if (!rpc.ok()) {
      const bool cannot =
          absl::IsUnimplemented(rpc) || absl::IsFailedPrecondition(rpc);
      const bool busy = absl::IsResourceExhausted(rpc);
      if ((cannot || busy) && f == 0) {
        // Nothing delivered yet: the caller reads another way.
        *declined = true;
        return absl::OkStatus();
      }
      if (busy) {
        // Part of the box is delivered (a sink must not see it again):
        // wait for staging memory, up to stall_timeout.
        const absl::Time now = absl::Now();
        if (busy_since == absl::InfiniteFuture()) busy_since = now;
        if (now - busy_since >= options_.stall_timeout || now >= deadline_) {
          return absl::UnavailableError(
              absl::StrCat("the worker at ", at.address,
                           " had no UCX staging memory free for ",
                           absl::FormatDuration(now - busy_since)));
        }
        absl::SleepFor(absl::Milliseconds(1));
        continue;
      }
      return rpc;
    }
    busy_since = absl::InfiniteFuture();
    // Every field is checked before it is used.
    if (reply.worker_address() != peer.ucx_address) {
      // The worker restarted behind its address: ask for a fresh key.
      return absl::AbortedError("the worker's UCX address changed");
    }
    if (reply.lease() == 0 || reply.bytes() != n * item) {
      return Inconsistent(absl::StrCat("a staged range of ", reply.bytes(),
                                       " bytes for ", n * item, " asked"));
    }
    std::vector<Range> ranges;
    if (direct.has_value()) {
      direct->ForEach(
          f, n, [&](int64_t src, int64_t dst, int64_t, int64_t count) {
            ranges.push_back(Range{static_cast<uint64_t>((src - f) * item),
                                   target.data() + dst * item, count * item});
          });
    } else {
      ranges.push_back(Range{0, local.data(), n * item});
    }
    TESSERA_RETURN_IF_ERROR(
        ReceiveRanges(peer, reply.lease(), at.shard_id, std::move(ranges),
                      direct.has_value() ? &target : nullptr));
    // The staged bytes are the shard's only if it is still held now; the
    // check ends the lease.
    TESSERA_RETURN_IF_ERROR(
        StillHeld(peer, at.shard_id, reply.lease(), /*release=*/true));
    if (!direct.has_value()) {
      TESSERA_RETURN_IF_ERROR(target.Deliver(box.sizes, f, n, local.data(),
                                             static_cast<size_t>(item)));
    }
    f += n;
  }
  return absl::OkStatus();
}

absl::Status UcxTransport::Lane::SentSpan(Peer& peer, const Key& key,
                                          const RemoteShard& shard,
                                          const Box& box, int64_t first,
                                          const ReadTarget& target) {
  const uint64_t shard_id = shard.location.shard_id;
  const int64_t item = key.item_bytes;
  const int64_t total = box.NumElements();
  const int64_t per = std::max<int64_t>(
      1, (options_.remote_stage_bytes > 0 ? options_.remote_stage_bytes
                                          : options_.stage_bytes) /
             item);
  const BufferPool::Lease local =
      Buffer(static_cast<size_t>(std::min(per, total) * item));
  absl::Time checked = absl::Now();
  for (int64_t f = 0; f < total; f += per) {
    const int64_t n = std::min(per, total - f);
    const uint64_t offset = static_cast<uint64_t>((first + f) * item);
    TESSERA_RETURN_IF_ERROR(
        ReceiveRanges(peer, key.registration, shard_id,
                      {Range{offset, local.data(), n * item}}));
    TESSERA_RETURN_IF_ERROR(target.Deliver(box.sizes, f, n, local.data(),
                                           static_cast<size_t>(item)));
    // A long read checks now and then that its shard is still held.
    if (f + n < total && absl::Now() - checked > options_.key_ttl) {
      checked = absl::Now();
      TESSERA_RETURN_IF_ERROR(StillHeld(peer, shard_id, key.registration));
    }
  }
  return absl::OkStatus();
}

absl::Status UcxTransport::Lane::WholeRows(Peer& peer, const Key& key,
                                           uint64_t shard_id, const Box& box,
                                           const ReadTarget& target) {
  const int64_t item = key.item_bytes;
  const size_t rank = key.shape.size();
  int64_t row_elements = 1, inner = 1;
  for (size_t d = 1; d < rank; ++d) {
    row_elements *= key.shape[d];
    inner *= box.sizes[d];
  }
  const int64_t row_bytes = row_elements * item;
  const int64_t box_bytes = box.NumElements() * item;
  const int64_t read_bytes = box.sizes[0] * row_bytes;
  if ((read_bytes > options_.max_stage_inflation * box_bytes &&
       read_bytes > options_.stage_bytes) ||
      row_bytes > 16 * options_.stage_bytes) {
    return absl::FailedPreconditionError(absl::StrCat(
        "box ", box.ToString(), " of shard ", ShapeToString(key.shape),
        " is too sparse to read as whole rows"));
  }
  const int64_t rows_per =
      std::max<int64_t>(1, options_.stage_bytes / row_bytes);
  const int64_t rows = std::min(rows_per, box.sizes[0]);
  const BufferPool::Lease stage = Buffer(static_cast<size_t>(rows * row_bytes));
  const BufferPool::Lease flat =
      Buffer(static_cast<size_t>(rows * inner * item));
  Shape slab_shape(key.shape.begin(), key.shape.end());
  std::vector<int64_t> slab_offsets(box.offsets.begin(), box.offsets.end());
  std::vector<int64_t> slab_sizes(box.sizes.begin(), box.sizes.end());
  slab_offsets[0] = 0;
  for (int64_t i0 = 0; i0 < box.sizes[0]; i0 += rows_per) {
    const int64_t n = std::min(rows_per, box.sizes[0] - i0);
    // Whole rows are one range of the shard.
    TESSERA_RETURN_IF_ERROR(ReceiveRanges(
        peer, key.registration, shard_id,
        {Range{static_cast<uint64_t>((box.offsets[0] + i0) * row_bytes),
               stage.data(), n * row_bytes}}));
    slab_shape[0] = n;
    slab_sizes[0] = n;
    CopyBoxToFlatRange(stage.data(), slab_shape, slab_offsets, slab_sizes, 0,
                       n * inner, flat.data(), static_cast<size_t>(item));
    TESSERA_RETURN_IF_ERROR(target.Deliver(box.sizes, i0 * inner, n * inner,
                                           flat.data(),
                                           static_cast<size_t>(item)));
  }
  return absl::OkStatus();
}

absl::StatusOr<UcxCheckAnswer> UcxTransport::Lane::Check(Peer& peer,
                                                         uint64_t shard_id,
                                                         uint64_t registration,
                                                         bool release) {
  UcxCheckRequest request;
  request.peer = peer.id;
  request.request_id = ++next_request_;
  request.shard_id = shard_id;
  request.registration = registration;
  Ops ops;
  TESSERA_RETURN_IF_ERROR(Ask(peer, release ? kUcxCheckReleaseAm : kUcxCheckAm,
                              &request, sizeof(request), nullptr, 0,
                              request.request_id, ops));
  absl::Status waited = Wait(
      [&] {
        return ops.pending == 0 && Answer(request.request_id).has_value();
      },
      peer, &ops.completed);
  const std::optional<UcxCheckAnswer> answer = Answer(request.request_id);
  awaited_.erase(request.request_id);
  // The send must not outlive `request`: dropping the peer cancels it.
  TESSERA_RETURN_IF_ERROR(Settle(peer, ops, waited, "UCX check"));
  return *answer;
}

absl::Status UcxTransport::Lane::StillHeld(Peer& peer, uint64_t shard_id,
                                           uint64_t registration,
                                           bool release) {
  TESSERA_ASSIGN_OR_RETURN(UcxCheckAnswer answer,
                           Check(peer, shard_id, registration, release));
  if (answer == UcxCheckAnswer::kHeld) return absl::OkStatus();
  return Refusal(answer, shard_id, peer, "key",
                 absl::InternalError(absl::StrCat(
                     "worker at ", peer.address, " answered a check with ",
                     static_cast<uint32_t>(answer))));
}

absl::Status UcxTransport::Lane::Settle(Peer& peer, Ops& ops,
                                        const absl::Status& waited,
                                        absl::string_view what) {
  if (!waited.ok()) {
    Abandon(peer.address, ops);
    return waited;
  }
  if (ops.error != UCS_OK) {
    return UcxError(absl::StrCat(what, " to ", peer.address), ops.error);
  }
  return absl::OkStatus();
}

void UcxTransport::Lane::Abandon(const std::string& address, Ops& ops) {
  if (broken()) return;  // nothing of it is in flight
  DropPeer(std::string(address));
  const absl::Time until = absl::Now() + absl::Seconds(1);
  while (ops.pending > 0 && absl::Now() < until) {
    ucp_worker_progress(worker_.worker);
  }
  if (ops.pending > 0) {
    // Without peer-failure handling UCX cannot cancel sends to a peer that
    // stalled: destroying the worker purges them now, while `ops` lives.
    while (!peers_.empty()) peers_.erase(peers_.begin());
    ucp_worker_destroy(worker_.worker);
    worker_.worker = nullptr;
  }
}

absl::StatusOr<DescribedKey> UcxTransport::Lane::Describe(
    const RemoteShard& shard, bool write) {
  const ShardLocation& at = shard.location;
  v1::UcxDescribeRequest request;
  request.add_shard_ids(at.shard_id);
  request.set_write(write);
  v1::UcxDescribeResponse reply;
  const absl::Status rpc =
      DataCall(std::min(options_.timeout, deadline_ - absl::Now()),
               at.capability, [&](grpc::ClientContext* context) {
                 return v1::UcxData::NewStub(channels_->Get(at.address))
                     ->Describe(context, request, &reply);
               });
  if (absl::IsUnimplemented(rpc)) {
    owner_->MarkNoUcx(at.address);
    return absl::FailedPreconditionError(absl::StrCat(
        "worker ", at.worker, " at ", at.address, " offers no UCX transport"));
  }
  if (!rpc.ok()) return rpc;
  return ValidateDescribe(reply, at.shard_id);
}

absl::StatusOr<UcxTransport::Lane::Peer*> UcxTransport::Lane::Connect(
    const std::string& address, const std::string& ucx_address) {
  if (broken()) {
    return absl::UnavailableError(
        "this lane's UCX worker was torn down after a peer stalled");
  }
  DropPeer(address);
  if (peers_.size() >= options_.max_peers) {
    auto oldest = peers_.begin();
    for (auto it = peers_.begin(); it != peers_.end(); ++it) {
      if (it->second->last_use < oldest->second->last_use) oldest = it;
    }
    DropPeer(oldest->first);
  }
  // An unanswered hello gets one more try on a fresh endpoint: a worker
  // under load (or one that lost the first hello) answers the second.
  absl::Status hello;
  for (int attempt = 0; attempt < kHelloAttempts; ++attempt) {
    auto peer = std::make_unique<Peer>();
    peer->address = address;
    peer->ucx_address = ucx_address;
    peer->used = absl::Now();
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                        UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                        UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.address =
        reinterpret_cast<const ucp_address_t*>(peer->ucx_address.data());
    params.err_mode = options_.detect_peer_failure ? UCP_ERR_HANDLING_MODE_PEER
                                                   : UCP_ERR_HANDLING_MODE_NONE;
    params.err_handler.cb = &Lane::OnPeerError;
    params.err_handler.arg = peer.get();
    const ucs_status_t s = ucp_ep_create(worker_.worker, &params, &peer->ep);
    if (s != UCS_OK) {
      // The worker answered gRPC but shares no UCX transport with this
      // process (another host without a trusted fabric, another user):
      // another transport can reach it.
      owner_->MarkNoUcx(address);
      return absl::FailedPreconditionError(
          absl::StrCat("UCX cannot reach the worker at ", address, ": ",
                       ucs_status_string(s)));
    }
    Peer* raw = peer.get();
    peers_[address] = std::move(peer);
    hello = Hello(*raw);
    if (hello.ok()) return raw;
    DropPeer(address);
    if (!absl::IsDeadlineExceeded(hello) || absl::Now() >= deadline_) break;
  }
  // The worker answered gRPC but not UCX: another transport can reach it.
  owner_->MarkNoUcx(address);
  return absl::FailedPreconditionError(absl::StrCat(
      "UCX cannot reach the worker at ", address, ": ", hello.message()));
}

absl::Status UcxTransport::Lane::Hello(Peer& peer) {
  UcxHello hello;
  hello.request_id = ++next_request_;
  Ops ops;
  awaited_[hello.request_id];
  const ucp_request_param_t param = SendParam(&OpDone, &ops);
  ucs_status_ptr_t sent =
      ucp_am_send_nbx(peer.ep, kUcxHelloAm, &hello, sizeof(hello),
                      address_.data(), address_.size(), &param);
  absl::Status status;
  if (UCS_PTR_IS_ERR(sent)) {
    status = UcxError(absl::StrCat("UCX hello to ", peer.address),
                      UCS_PTR_STATUS(sent));
  } else {
    if (sent != nullptr) ++ops.pending;
    // A worker that cannot connect back to this lane (no transport in
    // common that notices failures) never answers: not for long.
    const absl::Time deadline = deadline_;
    deadline_ = std::min(deadline_, absl::Now() + kHelloTimeout);
    status = Wait(
        [&] {
          return ops.pending == 0 && Answer(hello.request_id).has_value();
        },
        peer, &ops.completed);
    deadline_ = deadline;
  }
  const std::optional<UcxCheckReply> reply = awaited_[hello.request_id];
  awaited_.erase(hello.request_id);
  TESSERA_RETURN_IF_ERROR(Settle(peer, ops, status, "UCX hello"));
  if (!reply.has_value() ||
      reply->answer != static_cast<uint32_t>(UcxCheckAnswer::kHeld) ||
      reply->peer == 0) {
    return absl::UnavailableError(
        absl::StrCat("the worker at ", peer.address, " refused our hello"));
  }
  peer.id = reply->peer;
  return absl::OkStatus();
}

absl::StatusOr<UcxTransport::Lane::Peer*> UcxTransport::Lane::PeerFor(
    const std::string& address, const std::string& ucx_address) {
  auto found = peers_.find(address);
  Peer* peer = found != peers_.end() ? found->second.get() : nullptr;
  if (peer == nullptr || peer->error != UCS_OK ||
      peer->ucx_address != ucx_address) {
    // First contact, a failed link, or the worker restarted behind the
    // same address.
    TESSERA_ASSIGN_OR_RETURN(peer, Connect(address, ucx_address));
  }
  peer->last_use = ++tick_;
  peer->used = absl::Now();
  return peer;
}

void UcxTransport::Lane::DropPeer(const std::string& address) {
  auto it = peers_.find(address);
  if (it == peers_.end()) return;
  Peer& peer = *it->second;
  if (broken()) {
    peers_.erase(it);
    return;
  }
  if (peer.error == UCS_OK) {
    // Goodbye: the worker closes its endpoint back to us, and what it maps
    // of this process with it. Waited for briefly: a forced close drops
    // what is not sent.
    UcxGoodbye goodbye;
    goodbye.peer = peer.id;
    ucp_request_param_t param{};
    ucs_status_ptr_t sent = ucp_am_send_nbx(
        peer.ep, kUcxGoodbyeAm, &goodbye, sizeof(goodbye), nullptr, 0, &param);
    if (UCS_PTR_IS_PTR(sent)) {
      const absl::Time until = absl::Now() + absl::Milliseconds(200);
      while (ucp_request_check_status(sent) == UCS_INPROGRESS &&
             absl::Now() < until) {
        ucp_worker_progress(worker_.worker);
      }
      ucp_request_free(sent);  // released by UCX once done
    }
  }
  // Forced: UCX destroys an endpoint its peer connected to only then (and
  // allows it only with peer-failure handling); otherwise flushed, and the
  // endpoint lives on until this lane's worker goes.
  ucp_request_param_t param{};
  if (options_.detect_peer_failure) {
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_EP_CLOSE_FLAG_FORCE;
  }
  ucs_status_ptr_t request = ucp_ep_close_nbx(peer.ep, &param);
  if (UCS_PTR_IS_PTR(request)) {
    const absl::Time until = absl::Now() + absl::Seconds(1);
    while (ucp_request_check_status(request) == UCS_INPROGRESS &&
           absl::Now() < until) {
      ucp_worker_progress(worker_.worker);
    }
    // Released by UCX once done, if it is not yet.
    ucp_request_free(request);
  }
  peers_.erase(it);
}

void UcxTransport::Lane::DropIdlePeers() {
  const absl::Time now = absl::Now();
  std::vector<std::string> idle;
  for (const auto& [address, peer] : peers_) {
    if (now - peer->used >= options_.peer_idle_timeout) idle.push_back(address);
  }
  for (const std::string& address : idle) DropPeer(address);
}

absl::StatusOr<std::pair<UcxTransport::Lane::Peer*, UcxTransport::Lane::Key*>>
UcxTransport::Lane::KeyFor(const RemoteShard& shard, bool fresh) {
  const ShardLocation& at = shard.location;
  // Takes in what came while the lane was idle: a worker's notice that it
  // forgot this lane is seen before a request goes unanswered.
  if (!broken()) {
    while (ucp_worker_progress(worker_.worker) != 0) {
    }
  }
  auto found = peers_.find(at.address);
  Peer* peer = found != peers_.end() ? found->second.get() : nullptr;
  if (peer != nullptr && peer->error != UCS_OK) {
    DropPeer(at.address);
    peer = nullptr;
  }
  if (peer != nullptr && !fresh) {
    auto key = peer->keys.find(at.shard_id);
    if (key != peer->keys.end() &&
        absl::Now() - key->second.validated < options_.key_ttl) {
      peer->last_use = key->second.last_use = ++tick_;
      peer->used = absl::Now();
      return std::make_pair(peer, &key->second);
    }
  }
  TESSERA_ASSIGN_OR_RETURN(DescribedKey described, Describe(shard, false));
  TESSERA_ASSIGN_OR_RETURN(peer, PeerFor(at.address, described.worker_address));
  auto existing = peer->keys.find(at.shard_id);
  if (existing != peer->keys.end() &&
      existing->second.registration == described.registration) {
    existing->second.validated = absl::Now();
    existing->second.last_use = tick_;
    return std::make_pair(peer, &existing->second);
  }
  peer->keys.erase(at.shard_id);
  if (peer->keys.size() >= options_.max_keys) {
    auto oldest = peer->keys.begin();
    for (auto it = peer->keys.begin(); it != peer->keys.end(); ++it) {
      if (it->second.last_use < oldest->second.last_use) oldest = it;
    }
    peer->keys.erase(oldest);
  }
  Key key;
  key.bytes = described.bytes;
  key.shape = std::move(described.shape);
  key.item_bytes = described.item_bytes;
  key.registration = described.registration;
  key.validated = absl::Now();
  key.last_use = tick_;
  Key& stored = peer->keys[at.shard_id] = std::move(key);
  return std::make_pair(peer, &stored);
}

absl::Status UcxTransport::Lane::WithKey(
    const RemoteShard& shard, const std::string& where,
    const std::function<absl::Status(Peer&, Key&)>& body) {
  const ShardLocation& at = shard.location;
  absl::Status last;
  bool fresh = false;
  // Once more on a fresh key (and, after a link failure, a fresh endpoint).
  for (int attempt = 0; attempt < 2; ++attempt) {
    absl::StatusOr<std::pair<Peer*, Key*>> found = KeyFor(shard, fresh);
    if (!found.ok()) return Annotate(found.status(), where);
    Peer& peer = *found->first;
    Key& key = *found->second;
    if (key.item_bytes != shard.item_bytes) {
      return absl::FailedPreconditionError(
          absl::StrCat(where, ": the worker holds ", key.item_bytes,
                       "-byte elements, not ", shard.item_bytes));
    }
    if (!shard.shape.empty() && shard.shape != key.shape) {
      return absl::FailedPreconditionError(absl::StrCat(
          where, ": the worker's shard is ", ShapeToString(key.shape), ", not ",
          ShapeToString(shard.shape)));
    }
    absl::Status status = body(peer, key);
    if (status.ok()) {
      auto p = peers_.find(at.address);
      if (p != peers_.end()) {
        auto k = p->second->keys.find(at.shard_id);
        if (k != p->second->keys.end()) k->second.validated = absl::Now();
      }
      return status;
    }
    fresh = true;
    last = status;
    if (absl::IsAborted(status) || absl::IsNotFound(status)) {
      // A withdrawn key: ask for a new one. A freed shard: the caller's.
      auto p = peers_.find(at.address);
      if (p != peers_.end()) p->second->keys.erase(at.shard_id);
      if (absl::IsAborted(status)) continue;
      return status;
    }
    if (!IsPeerFailure(status)) return Annotate(status, where);
    // Whatever the link had (endpoint, keys) is suspect: start afresh.
    DropPeer(at.address);
  }
  // The worker answers gRPC (it handed out keys) but UCX cannot reach it
  // from here: another transport can.
  owner_->MarkNoUcx(at.address);
  return absl::FailedPreconditionError(
      absl::StrCat(where, ": UCX cannot reach the worker: ", last.message()));
}

absl::Status UcxTransport::Lane::Read(const RemoteShard& shard, const Box& box,
                                      const ReadTarget& target) {
  deadline_ = absl::Now() + CallTimeout(options_.timeout);
  const ShardLocation& at = shard.location;
  const std::string where = OverUcx("reading", at, "from");
  return WithKey(shard, where, [&](Peer& peer, Key& key) -> absl::Status {
    TESSERA_RETURN_IF_ERROR(CheckWithin(box, key.shape, "region"));
    const uint64_t registration = key.registration;
    TESSERA_RETURN_IF_ERROR(Ranges(peer, key, shard, box, target));
    // `peer` may be gone after a failure; Ranges returned then.
    return StillHeld(peer, at.shard_id, registration);
  });
}

absl::Status UcxTransport::Lane::ReadRows(absl::Span<const ShardRows> entries,
                                          const RowSink& sink) {
  deadline_ = absl::Now() + CallTimeout(options_.timeout);
  for (size_t e = 0; e < entries.size(); ++e) {
    const RemoteShard& shard = entries[e].shard;
    const ShardLocation& at = shard.location;
    const std::vector<int64_t>& rows = entries[e].rows;
    if (shard.shape.empty()) {
      return absl::FailedPreconditionError("a 0-d shard has no rows");
    }
    for (int64_t row : rows) {
      // Out of range: the worker's own answer comes from gRPC.
      if (row < 0 || row >= shard.shape[0]) {
        return absl::FailedPreconditionError(
            absl::StrCat("row ", row, " is outside shard ", at.shard_id));
      }
    }
    if (rows.empty()) continue;
    const std::string where = OverUcx("reading rows of", at, "from");
    TESSERA_RETURN_IF_ERROR(
        WithKey(shard, where, [&](Peer& peer, Key& key) -> absl::Status {
          const int64_t row_bytes = RowBytes(key.shape, key.item_bytes);
          if (row_bytes == 0) {
            for (size_t k = 0; k < rows.size(); ++k) sink(e, k, nullptr);
            return StillHeld(peer, at.shard_id, key.registration);
          }
          const size_t per = static_cast<size_t>(
              std::max<int64_t>(1, options_.stage_bytes / row_bytes));
          const BufferPool::Lease stage = Buffer(
              std::min(per, rows.size()) * static_cast<size_t>(row_bytes));
          for (size_t k0 = 0; k0 < rows.size(); k0 += per) {
            const size_t n = std::min(per, rows.size() - k0);
            std::vector<Range> ranges(n);
            for (size_t j = 0; j < n; ++j) {
              ranges[j] = Range{static_cast<uint64_t>(rows[k0 + j] * row_bytes),
                                stage.data() + j * row_bytes, row_bytes};
            }
            TESSERA_RETURN_IF_ERROR(ReceiveRanges(
                peer, key.registration, at.shard_id, std::move(ranges)));
            // The rows are the shard's only if it is still held now.
            TESSERA_RETURN_IF_ERROR(
                StillHeld(peer, at.shard_id, key.registration));
            for (size_t j = 0; j < n; ++j) {
              sink(e, k0 + j, stage.data() + j * row_bytes);
            }
          }
          return absl::OkStatus();
        }));
  }
  return absl::OkStatus();
}

absl::Status UcxTransport::Lane::Write(const RemoteShard& shard,
                                       const WriteSource& source) {
  deadline_ = absl::Now() + CallTimeout(options_.timeout);
  const ShardLocation& at = shard.location;
  const std::string where = OverUcx("writing", at, "to");
  absl::StatusOr<DescribedKey> described = Describe(shard, true);
  if (!described.ok()) return Annotate(described.status(), where);
  if (described->item_bytes != shard.item_bytes ||
      described->shape != shard.shape) {
    return absl::FailedPreconditionError(absl::StrCat(
        where, ": the worker's shard is ", ShapeToString(described->shape),
        " of ", described->item_bytes, "-byte elements"));
  }
  absl::StatusOr<Peer*> connected =
      PeerFor(at.address, described->worker_address);
  if (!connected.ok()) return Annotate(connected.status(), where);
  Peer& peer = **connected;
  const int64_t item = shard.item_bytes;
  const int64_t total = described->bytes / item;
  const std::vector<int64_t> zeros(shard.shape.size(), 0);
  const RunPlan plan(shard.shape, source.shape, source.offsets, shard.shape,
                     zeros);
  // One message per piece: [shard offset, +bytes) from `data`, each
  // answered once its bytes are in. Headers stay put while in flight.
  struct Piece {
    UcxWriteRequest header;
    const char* data = nullptr;
    int64_t bytes = 0;
  };
  std::deque<Piece> pieces;  // in flight
  Ops ops;
  absl::Status status;
  int64_t answered = 0;
  // Waits until at most `most` pieces are unanswered; fails on a refusal.
  auto settle = [&](size_t most) -> absl::Status {
    while (!pieces.empty()) {
      const uint64_t id = pieces.front().header.request_id;
      if (!Answer(id).has_value()) {
        if (pieces.size() <= most) return absl::OkStatus();
        TESSERA_RETURN_IF_ERROR(
            Wait([&] { return Answer(id).has_value(); }, peer, &answered));
      }
      const UcxCheckAnswer answer = *Answer(id);
      awaited_.erase(id);
      const int64_t piece_bytes = pieces.front().bytes;
      pieces.pop_front();
      ++answered;
      if (answer == UcxCheckAnswer::kSealed) {
        return absl::PermissionDeniedError(
            absl::StrCat("permission denied: shard ", at.shard_id,
                         " is sealed (a committed shard never changes)"));
      }
      if (answer != UcxCheckAnswer::kHeld) {
        return Refusal(
            answer, at.shard_id, peer, "write key",
            absl::InternalError(absl::StrCat(
                "the worker refused a write of shard ", at.shard_id)));
      }
      source.Sent(piece_bytes);
    }
    return absl::OkStatus();
  };
  auto post = [&](uint64_t offset, const char* data,
                  int64_t bytes) -> absl::Status {
    for (int64_t done = 0; done < bytes;) {
      TESSERA_RETURN_IF_ERROR(
          settle(static_cast<size_t>(options_.max_in_flight - 1)));
      const int64_t n = std::min(bytes - done, options_.max_write_bytes);
      Piece& piece = pieces.emplace_back();
      piece.header.peer = peer.id;
      piece.header.request_id = ++next_request_;
      piece.header.shard_id = at.shard_id;
      piece.header.registration = described->registration;
      piece.header.offset = offset + static_cast<uint64_t>(done);
      piece.data = data + done;
      piece.bytes = n;
      TESSERA_RETURN_IF_ERROR(Ask(
          peer, kUcxWriteAm, &piece.header, sizeof(piece.header), piece.data,
          static_cast<size_t>(n), piece.header.request_id, ops));
      done += n;
    }
    return absl::OkStatus();
  };
  BufferPool::Lease stage;
  if (total > 0 && plan.runs() > 1 &&
      plan.run() * item < options_.min_run_bytes) {
    // Short runs: packed into a buffer first, one piece per buffer.
    const int64_t chunk = std::max<int64_t>(1, options_.stage_bytes / item);
    stage = Buffer(static_cast<size_t>(std::min(chunk, total) * item));
    for (int64_t f = 0; f < total && status.ok(); f += chunk) {
      const int64_t count = std::min(chunk, total - f);
      CopyBoxToFlatRange(source.data, source.shape, source.offsets, shard.shape,
                         f, count, stage.data(), static_cast<size_t>(item));
      status =
          post(static_cast<uint64_t>(f * item), stage.data(), count * item);
      // The buffer is reused: every piece from it must be in first.
      if (status.ok()) status = settle(0);
    }
  } else if (total > 0) {
    plan.ForEach(0, total, [&](int64_t src, int64_t dst, int64_t, int64_t n) {
      if (!status.ok()) return;
      status = post(static_cast<uint64_t>(dst * item), source.data + src * item,
                    n * item);
    });
  }
  if (status.ok()) status = settle(0);
  if (status.ok()) {
    status = Wait([&] { return ops.pending == 0; }, peer, &ops.completed);
  }
  for (const Piece& piece : pieces) awaited_.erase(piece.header.request_id);
  if (!status.ok()) {
    // Sends of `pieces` may be in flight: dropping the peer ends them.
    Abandon(at.address, ops);
    if (!IsPeerFailure(status)) return Annotate(status, where);
    // The worker answered gRPC: another transport can write the shard.
    owner_->MarkNoUcx(at.address);
    return absl::FailedPreconditionError(absl::StrCat(
        where, ": UCX cannot reach the worker: ", status.message()));
  }
  v1::UcxFinishWriteRequest request;
  request.set_shard_id(at.shard_id);
  request.set_bytes_written(described->bytes);
  v1::UcxFinishWriteResponse reply;
  const absl::Status rpc =
      DataCall(CallTimeout(options_.timeout), at.capability,
               [&](grpc::ClientContext* context) {
                 return v1::UcxData::NewStub(channels_->Get(at.address))
                     ->FinishWrite(context, request, &reply);
               });
  if (!rpc.ok()) return Annotate(rpc, where);
  return absl::OkStatus();
}

// ------------------------------------------------------------ UcxTransport

UcxTransport::UcxTransport(ChannelCache* channels, UcxTransportOptions options)
    : channels_(channels), options_(options) {}

UcxTransport::~UcxTransport() {
  absl::MutexLock lock(&mu_);
  idle_.clear();  // every lane is idle once no call runs
  if (context_ != nullptr) ucp_cleanup(static_cast<ucp_context_h>(context_));
}

const std::string& UcxTransport::name() const {
  static const std::string* name = new std::string("ucx");
  return *name;
}

bool UcxTransport::started() const {
  absl::MutexLock lock(&mu_);
  return context_ != nullptr;
}

void UcxTransport::CloseIdle() {
  std::vector<std::unique_ptr<Lane>> lanes;
  {
    absl::MutexLock lock(&mu_);
    lanes.swap(idle_);
    lanes_made_ -= static_cast<int>(lanes.size());
  }
  // `lanes` close their endpoints here, outside the lock.
}

absl::Status UcxTransport::EnsureStarted() {
  absl::MutexLock lock(&mu_);
  if (start_tried_) return start_status_;
  start_tried_ = true;
  if (!UcxAllowedByEnvironment()) {
    start_status_ = absl::FailedPreconditionError(
        "the UCX transport is turned off (TESSERA_UCX)");
    spdlog::info(
        "UCX transport off (TESSERA_UCX); data moves over the other "
        "transports");
    return start_status_;
  }
  // On a trusted fabric the workers connect back to this reader on its
  // network devices (UCX_NET_DEVICES may narrow them).
  UcxReach reach;
  reach.trusted_fabric =
      options_.trusted_fabric || TrustedFabricByEnvironment();
  absl::StatusOr<ucp_context_h> context = MakeUcpContext("tessera", reach);
  if (!context.ok()) {
    start_status_ = absl::FailedPreconditionError(absl::StrCat(
        "the UCX transport cannot start here: ", context.status().message()));
    spdlog::warn("{}; data moves over the other transports",
                 std::string(start_status_.message()));
    return start_status_;
  }
  context_ = *context;
  return absl::OkStatus();
}

bool UcxTransport::NoUcxAt(const std::string& address) {
  absl::MutexLock lock(&mu_);
  auto it = no_ucx_until_.find(address);
  if (it == no_ucx_until_.end()) return false;
  if (absl::Now() < it->second) return true;
  no_ucx_until_.erase(it);
  return false;
}

void UcxTransport::MarkNoUcx(const std::string& address) {
  absl::MutexLock lock(&mu_);
  if (no_ucx_until_.size() >= 4096) no_ucx_until_.clear();
  no_ucx_until_[address] = absl::Now() + options_.no_ucx_ttl;
}

absl::Status UcxTransport::CheckShard(const RemoteShard& shard) {
  if (shard.item_bytes < 1 || shard.item_bytes > kMaxItemBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("element size ", shard.item_bytes, " is not in [1, ",
                     kMaxItemBytes, "]"));
  }
  if (NoUcxAt(shard.location.address)) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", shard.location.worker, " at ",
                     shard.location.address, " offers no UCX transport"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<UcxTransport::Lane>>
UcxTransport::AcquireLane() {
  void* context = nullptr;
  {
    absl::MutexLock lock(&mu_);
    auto available = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !idle_.empty() || lanes_made_ < options_.max_lanes;
    };
    mu_.Await(absl::Condition(&available));
    if (!idle_.empty()) {
      std::unique_ptr<Lane> lane = std::move(idle_.back());
      idle_.pop_back();
      // Endpoints that sat idle in the pool too: the worker may have
      // closed its side of them.
      lane->DropIdlePeers();
      return lane;
    }
    ++lanes_made_;
    context = context_;
  }
  absl::StatusOr<UcpWorker> worker =
      MakeUcpWorker(static_cast<ucp_context_h>(context), kUcxLastMessageId);
  absl::Status status = worker.status();
  std::unique_ptr<Lane> lane;
  if (status.ok()) {
    lane = std::make_unique<Lane>(*worker, options_, channels_, this);
    status = lane->SetHandler();
  }
  if (!status.ok()) {
    lane.reset();
    {
      absl::MutexLock lock(&mu_);
      --lanes_made_;
    }
    // UCX cannot run here now (e.g. the host's shared-memory segments are
    // exhausted): this transport is unavailable, another one moves the
    // bytes.
    spdlog::warn(
        "UCX cannot start a worker here ({}); data moves over the "
        "other transports",
        std::string(status.message()));
    return absl::FailedPreconditionError(absl::StrCat(
        "the UCX transport cannot start here: ", status.message()));
  }
  return lane;
}

void UcxTransport::ReleaseLane(std::unique_ptr<Lane> lane) {
  if (lane->broken()) {
    lane.reset();
    absl::MutexLock lock(&mu_);
    --lanes_made_;
    return;
  }
  lane->DropIdlePeers();
  absl::MutexLock lock(&mu_);
  idle_.push_back(std::move(lane));
}

absl::Status UcxTransport::Read(const RemoteShard& shard, const Box& box,
                                const ReadTarget& target) {
  TESSERA_RETURN_IF_ERROR(EnsureStarted());
  TESSERA_RETURN_IF_ERROR(CheckShard(shard));
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Lane> lane, AcquireLane());
  absl::Status status = lane->Read(shard, box, target);
  ReleaseLane(std::move(lane));
  return status;
}

absl::Status UcxTransport::ReadRows(absl::Span<const ShardRows> entries,
                                    const RowSink& sink) {
  TESSERA_RETURN_IF_ERROR(EnsureStarted());
  for (const ShardRows& entry : entries) {
    TESSERA_RETURN_IF_ERROR(CheckShard(entry.shard));
  }
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Lane> lane, AcquireLane());
  absl::Status status = lane->ReadRows(entries, sink);
  ReleaseLane(std::move(lane));
  return status;
}

absl::Status UcxTransport::Write(const RemoteShard& shard,
                                 const WriteSource& source) {
  TESSERA_RETURN_IF_ERROR(EnsureStarted());
  if (shard.shape.empty()) {
    return absl::FailedPreconditionError(
        "writing through UCX needs the shard's shape");
  }
  TESSERA_RETURN_IF_ERROR(CheckShard(shard));
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Lane> lane, AcquireLane());
  absl::Status status = lane->Write(shard, source);
  ReleaseLane(std::move(lane));
  return status;
}

}  // namespace tessera
