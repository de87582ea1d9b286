#include "transport/ucx_server.h"

#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "core/capability.h"
#include "core/checked_math.h"
#include "core/strided_copy.h"

namespace tessera {
namespace {

void ReplySent(void* request, ucs_status_t /*status*/, void* user_data) {
  delete static_cast<UcxCheckReply*>(user_data);
  ucp_request_free(request);
}

// `header` as a request of type T. Anything else is dropped (false). Answers
// go on the worker's own endpoint to the peer the request names, never on a
// reply endpoint: UCX resolves those from ids in the message, which a peer
// whose endpoint was closed can still send.
template <typename T>
bool ParseRequest(const void* header, size_t header_length, T* request) {
  if (header_length != sizeof(T)) return false;
  std::memcpy(request, header, sizeof(T));
  return request->magic == kUcxCheckMagic;
}

bool Rendezvous(const ucp_am_recv_param_t* param) {
  return (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
}

// [offset, offset + bytes): non-empty and inside `size` bytes.
bool RangeInside(uint64_t offset, uint64_t bytes, uint64_t size) {
  return bytes > 0 && offset <= size && bytes <= size - offset;
}

}  // namespace

absl::StatusOr<std::unique_ptr<UcxServer>> UcxServer::Start(
    UcxServerOptions options) {
  if (options.pin == nullptr || options.held == nullptr) {
    return absl::InvalidArgumentError("UcxServer needs `pin` and `held`");
  }
  // A request of the most ranges always fits an empty queue.
  options.max_queued_sends =
      std::max<size_t>(options.max_queued_sends, kMaxUcxSendRanges);
  options.max_sends_in_flight = std::max(options.max_sends_in_flight, 1);
  options.max_peers = std::max<size_t>(options.max_peers, 1);
  absl::StatusOr<ucp_context_h> context =
      MakeUcpContext("tessera-worker", options.reach);
  if (!context.ok()) return context.status();
  // Any id: readers of any version, and anything else that reaches UCX.
  absl::StatusOr<UcpWorker> worker =
      MakeUcpWorker(*context, std::numeric_limits<uint16_t>::max());
  if (!worker.ok()) {
    ucp_cleanup(*context);
    return worker.status();
  }
  absl::StatusOr<std::string> address = UcpWorkerAddress(worker->worker);
  const int epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  const int wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  absl::Status status = address.status();
  if (status.ok() && (epoll_fd < 0 || wake_fd < 0)) {
    status = absl::InternalError(
        absl::StrCat("epoll/eventfd: ", std::strerror(errno)));
  }
  if (status.ok()) {
    for (int fd : {worker->efd, wake_fd}) {
      epoll_event event{};
      event.events = EPOLLIN;
      event.data.fd = fd;
      if (epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &event) != 0) {
        status = absl::InternalError(
            absl::StrCat("epoll_ctl: ", std::strerror(errno)));
      }
    }
  }
  if (!status.ok()) {
    if (epoll_fd >= 0) close(epoll_fd);
    if (wake_fd >= 0) close(wake_fd);
    ucp_worker_destroy(worker->worker);
    ucp_cleanup(*context);
    return status;
  }
  std::unique_ptr<UcxServer> server(new UcxServer(std::move(options), *context,
                                                  *worker, *std::move(address),
                                                  epoll_fd, wake_fd));
  const std::pair<unsigned, ucp_am_recv_callback_t> handlers[] = {
      {kUcxCheckAm, &UcxServer::OnCheck</*kRelease=*/false>},
      {kUcxCheckReleaseAm, &UcxServer::OnCheck</*kRelease=*/true>},
      {kUcxSendAm, &UcxServer::OnSend},
      {kUcxWriteAm, &UcxServer::OnWrite},
      {kUcxGoodbyeAm, &UcxServer::OnGoodbye},
      {kUcxHelloAm, &UcxServer::OnHello},
  };
  for (const auto& [id, cb] : handlers) {
    ucp_am_handler_param_t handler{};
    handler.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID |
                         UCP_AM_HANDLER_PARAM_FIELD_CB |
                         UCP_AM_HANDLER_PARAM_FIELD_ARG;
    handler.id = id;
    handler.cb = cb;
    handler.arg = server.get();
    const ucs_status_t set =
        ucp_worker_set_am_recv_handler(server->worker_.worker, &handler);
    if (set != UCS_OK) {
      return UcxError(absl::StrCat("setting UCX handler ", id), set);
    }
  }
  server->progress_ = std::thread([s = server.get()] { s->Progress(); });
  server->sweeper_ = std::thread([s = server.get()] {
    while (!s->stop_.WaitForNotificationWithTimeout(s->options_.sweep_interval))
      s->Sweep();
  });
  return server;
}

UcxServer::UcxServer(UcxServerOptions options, ucp_context_h context,
                     UcpWorker worker, std::string address, int epoll_fd,
                     int wake_fd)
    : options_(std::move(options)),
      context_(context),
      worker_(worker),
      address_(std::move(address)),
      epoll_fd_(epoll_fd),
      wake_fd_(wake_fd) {}

UcxServer::~UcxServer() {
  stop_.Notify();
  const uint64_t one = 1;
  if (write(wake_fd_, &one, sizeof(one)) < 0) {
    // The eventfd cannot be full here; the thread also polls stop_.
  }
  if (progress_.joinable()) progress_.join();
  if (sweeper_.joinable()) sweeper_.join();
  {
    absl::MutexLock lock(&mu_);
    live_.clear();
    by_nonce_.clear();
    dead_.clear();
    leases_.clear();
    staging_.reset();
  }
  LetGo();
  ucp_worker_destroy(worker_.worker);
  ucp_cleanup(context_);
  close(epoll_fd_);
  close(wake_fd_);
}

absl::StatusOr<UcxKey> UcxServer::Register(uint64_t id, bool write) {
  auto key_of = [](const Registration& r) {
    UcxKey key;
    key.shard_id = r.shard_id;
    key.bytes = r.pinned.bytes;
    key.registration = r.nonce;
    key.shape = r.pinned.shape;
    key.item_bytes = r.pinned.item_bytes;
    return key;
  };
  {
    absl::MutexLock lock(&mu_);
    auto it = live_.find({id, write});
    if (it != live_.end()) {
      it->second->last_use = ++tick_;
      return key_of(*it->second);
    }
  }
  absl::StatusOr<UcxPinnedShard> pinned = PinHostShard(id);
  if (!pinned.ok()) return pinned.status();
  auto r = std::make_shared<Registration>();
  r->shard_id = id;
  r->write = write;
  r->pinned = *std::move(pinned);
  UcxKey key;
  {
    absl::MutexLock lock(&mu_);
    r->nonce = RandomId();
    while (by_nonce_.contains(r->nonce) || dead_.contains(r->nonce) ||
           leases_.contains(r->nonce)) {
      r->nonce = RandomId();
    }
    auto [it, inserted] = live_.emplace(std::make_pair(id, write), r);
    if (!inserted) {
      // Another call registered it meanwhile; ours lets go of its pin.
      let_go_.push_back(std::move(r->pinned.keep_alive));
    } else {
      by_nonce_[r->nonce] = r;
      if (live_.size() > options_.max_registrations) {
        auto oldest = live_.end();
        for (auto i = live_.begin(); i != live_.end(); ++i) {
          if (i->second != r &&
              (oldest == live_.end() ||
               i->second->last_use < oldest->second->last_use))
            oldest = i;
        }
        if (oldest != live_.end()) Kill(*oldest->second, /*freed=*/false);
      }
    }
    it->second->last_use = ++tick_;
    key = key_of(*it->second);
  }
  LetGo();
  return key;
}

absl::Status UcxServer::EnsureStaging() {
  if (staging_ != nullptr) return absl::OkStatus();
  const size_t bytes = static_cast<size_t>(options_.staging_bytes);
  void* map = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (map == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("mapping ", bytes,
                     " bytes of UCX staging memory: ", std::strerror(errno)));
  }
  // Sends in flight from it hold it too: unmapped after the last.
  staging_.reset(static_cast<char*>(map),
                 [bytes](char* p) { munmap(p, bytes); });
  slot_taken_.assign(
      static_cast<size_t>(options_.staging_bytes / options_.staging_slot_bytes),
      false);
  return absl::OkStatus();
}

void UcxServer::EndLease(uint64_t lease) {
  auto it = leases_.find(lease);
  if (it == leases_.end()) return;
  for (size_t i = 0; i < it->second.slots; ++i) {
    slot_taken_[it->second.first_slot + i] = false;
  }
  leased_bytes_ -=
      static_cast<int64_t>(it->second.slots) * options_.staging_slot_bytes;
  leases_.erase(it);
}

absl::StatusOr<UcxPinnedShard> UcxServer::PinHostShard(uint64_t id) const {
  absl::StatusOr<UcxPinnedShard> pinned = options_.pin(id);
  if (absl::IsUnimplemented(pinned.status())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard ", id, " is not in host memory: UCX cannot reach it"));
  }
  return pinned;
}

absl::StatusOr<UcxStaged> UcxServer::Stage(uint64_t id, const Box& box,
                                           int64_t first, int64_t count) {
  if (options_.staging_bytes <= 0 || options_.staging_slot_bytes <= 0 ||
      options_.staging_bytes < options_.staging_slot_bytes) {
    return absl::FailedPreconditionError("this worker stages nothing");
  }
  absl::StatusOr<UcxPinnedShard> pinned = PinHostShard(id);
  if (!pinned.ok()) return pinned.status();
  const Shape& shape = pinned->shape;
  const int64_t item = pinned->item_bytes;
  if (box.rank() != shape.size() || shape.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("a box of rank ", box.rank(), " for shard ", id,
                     " of shape ", ShapeToString(shape)));
  }
  if (absl::Status within = CheckWithin(box, shape, "staged box");
      !within.ok()) {
    return absl::OutOfRangeError(within.message());
  }
  const int64_t total = box.NumElements();
  if (first < 0 || count < 1 || first > total || count > total - first) {
    return absl::OutOfRangeError(
        absl::StrCat("elements [", first, ", +", count, ") are not inside box ",
                     box.ToString(), " (", total, " elements)"));
  }
  absl::StatusOr<int64_t> bytes = CheckedMul(count, item);
  const int64_t most =
      std::min(options_.max_stage_bytes, options_.staging_bytes);
  if (!bytes.ok() || *bytes > most) {
    return absl::InvalidArgumentError(
        absl::StrCat("staging ", count, " elements of ", item,
                     " bytes: at most ", most, " bytes a lease"));
  }
  const size_t want = static_cast<size_t>(
      (*bytes + options_.staging_slot_bytes - 1) / options_.staging_slot_bytes);
  UcxStaged staged;
  char* dst = nullptr;
  std::shared_ptr<char> region;
  {
    absl::MutexLock lock(&mu_);
    absl::Status ready = EnsureStaging();
    if (!ready.ok()) return ready;
    // First fit: `want` free slots in a row.
    size_t run = 0, start = 0;
    bool found = false;
    for (size_t i = 0; i < slot_taken_.size(); ++i) {
      if (slot_taken_[i]) {
        run = 0;
        continue;
      }
      if (run++ == 0) start = i;
      if (run == want) {
        found = true;
        break;
      }
    }
    if (!found) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the worker's UCX staging memory is leased (", leased_bytes_, " of ",
          options_.staging_bytes, " bytes)"));
    }
    for (size_t i = start; i < start + want; ++i) slot_taken_[i] = true;
    Lease lease;
    lease.shard_id = id;
    lease.first_slot = start;
    lease.slots = want;
    lease.expires = absl::Now() + options_.staging_ttl;
    uint64_t nonce = RandomId();
    while (nonce == 0 || leases_.contains(nonce) || by_nonce_.contains(nonce) ||
           dead_.contains(nonce)) {
      nonce = RandomId();
    }
    leases_[nonce] = lease;
    leased_bytes_ += static_cast<int64_t>(want) * options_.staging_slot_bytes;
    staging_used_ = absl::Now();
    region = staging_;
    dst = staging_.get() +
          start * static_cast<size_t>(options_.staging_slot_bytes);
    staged.lease = nonce;
    staged.bytes = *bytes;
  }
  // Outside the lock: the slots are this lease's, and `region` keeps the
  // memory mapped.
  CopyBoxToFlatRange(pinned->data, shape, box.offsets, box.sizes, first, count,
                     dst, static_cast<size_t>(item));
  ranges_staged_.fetch_add(1);
  return staged;
}

std::pair<size_t, int64_t> UcxServer::StagingCounts() const {
  absl::MutexLock lock(&mu_);
  return {leases_.size(), leased_bytes_};
}

void UcxServer::FinishWrite(uint64_t id) {
  {
    absl::MutexLock lock(&mu_);
    auto it = live_.find({id, true});
    if (it != live_.end()) Kill(*it->second, /*freed=*/false);
  }
  LetGo();
}

std::pair<size_t, size_t> UcxServer::Counts() const {
  absl::MutexLock lock(&mu_);
  return {live_.size(), dead_.size()};
}

void UcxServer::Kill(Registration& r, bool freed) {
  if (r.dead) return;
  r.dead = true;
  r.freed = freed;
  r.dead_since = absl::Now();
  auto it = by_nonce_.find(r.nonce);
  if (it == by_nonce_.end()) return;
  std::shared_ptr<Registration> keep = it->second;
  by_nonce_.erase(it);
  live_.erase({r.shard_id, r.write});
  dead_[r.nonce] = std::move(keep);
  // Sends and writes in flight hold what they need; the key holds nothing
  // more (dropped by LetGo outside the lock).
  let_go_.push_back(std::move(r.pinned.keep_alive));
  r.pinned.keep_mapped.reset();
  r.pinned.data = nullptr;
}

void UcxServer::LetGo() {
  std::vector<std::shared_ptr<void>> shards;
  {
    absl::MutexLock lock(&mu_);
    shards.swap(let_go_);
  }
  // `shards` drops here, outside the lock.
}

void UcxServer::Sweep() {
  std::vector<uint64_t> ids;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [key, r] : live_) {
      if (ids.empty() || ids.back() != key.first) ids.push_back(key.first);
    }
  }
  std::vector<uint64_t> freed;
  for (uint64_t id : ids) {
    if (!options_.held(id)) freed.push_back(id);
  }
  std::shared_ptr<char> unmapped;  // dropped outside the lock
  {
    absl::MutexLock lock(&mu_);
    for (uint64_t id : freed) {
      for (bool write : {false, true}) {
        auto it = live_.find({id, write});
        if (it != live_.end()) Kill(*it->second, /*freed=*/true);
      }
    }
    const absl::Time now = absl::Now();
    std::vector<uint64_t> lapsed;
    for (const auto& [nonce, lease] : leases_) {
      if (now >= lease.expires) lapsed.push_back(nonce);
    }
    for (uint64_t nonce : lapsed) EndLease(nonce);
    if (staging_ != nullptr && leases_.empty() &&
        now - staging_used_ >= options_.grace) {
      unmapped = std::move(staging_);
      slot_taken_.clear();
    }
    for (auto it = dead_.begin(); it != dead_.end();) {
      if (now - it->second->dead_since >= options_.grace) {
        dead_.erase(it++);
      } else {
        ++it;
      }
    }
  }
  LetGo();
}

UcxCheckAnswer UcxServer::Check(uint64_t shard_id, uint64_t nonce,
                                bool release) {
  bool leased = false;
  {
    absl::MutexLock lock(&mu_);
    auto lease = leases_.find(nonce);
    leased = lease != leases_.end() && lease->second.shard_id == shard_id;
  }
  if (leased) {
    // The bytes were staged while the shard was held; they are its bytes
    // only if it still is. (`held` is called outside the lock.)
    const bool held = options_.held(shard_id);
    absl::MutexLock lock(&mu_);
    // Lapsed meanwhile: its slots may hold another lease's bytes now.
    if (!leases_.contains(nonce)) return UcxCheckAnswer::kStale;
    if (release) EndLease(nonce);
    return held ? UcxCheckAnswer::kHeld : UcxCheckAnswer::kFreed;
  }
  // A release names a lease: anything else is stale.
  if (release) return UcxCheckAnswer::kStale;
  std::shared_ptr<Registration> r;
  {
    absl::MutexLock lock(&mu_);
    auto it = by_nonce_.find(nonce);
    if (it == by_nonce_.end()) {
      return FreedKey(nonce, shard_id) ? UcxCheckAnswer::kFreed
                                       : UcxCheckAnswer::kStale;
    }
    r = it->second;
  }
  if (r->shard_id != shard_id) return UcxCheckAnswer::kStale;
  return StillHeld(*r) ? UcxCheckAnswer::kHeld : UcxCheckAnswer::kFreed;
}

bool UcxServer::FreedKey(uint64_t nonce, uint64_t shard_id) const {
  auto dead = dead_.find(nonce);
  return dead != dead_.end() && dead->second->shard_id == shard_id &&
         dead->second->freed;
}

bool UcxServer::StillHeld(Registration& r) {
  if (options_.held(r.shard_id)) return true;
  {
    absl::MutexLock lock(&mu_);
    Kill(r, /*freed=*/true);
  }
  LetGo();
  return false;
}

// ------------------------------------------------- the progress thread

ucs_status_t UcxServer::OnHello(void* arg, const void* header,
                                size_t header_length, void* data, size_t length,
                                const ucp_am_recv_param_t* param) {
  auto* server = static_cast<UcxServer*>(arg);
  UcxHello hello;
  if (header_length != sizeof(hello) || Rendezvous(param) || data == nullptr ||
      !PlausibleUcpAddress(
          absl::string_view(static_cast<const char*>(data), length))) {
    return UCS_OK;  // dropped: the reader times out
  }
  std::memcpy(&hello, header, sizeof(hello));
  if (hello.magic != kUcxCheckMagic) return UCS_OK;
  // Connected once the progress call returns, not from inside it.
  server->hellos_.push_back(Hello{
      std::string(static_cast<const char*>(data), length), hello.request_id});
  return UCS_OK;
}

void UcxServer::OnPeerFailure(void* arg, ucp_ep_h ep, ucs_status_t) {
  auto* server = static_cast<UcxServer*>(arg);
  auto it = server->peer_of_.find(ep);
  // Closed once the progress call returns.
  if (it != server->peer_of_.end()) server->to_close_.push_back(it->second);
}

template <bool kRelease>
ucs_status_t UcxServer::OnCheck(void* arg, const void* header,
                                size_t header_length, void* /*data*/,
                                size_t /*length*/,
                                const ucp_am_recv_param_t* param) {
  static_cast<UcxServer*>(arg)->AnswerCheck(header, header_length, param,
                                            kRelease);
  return UCS_OK;
}

ucs_status_t UcxServer::OnSend(void* arg, const void* header,
                               size_t header_length, void* data, size_t length,
                               const ucp_am_recv_param_t* param) {
  static_cast<UcxServer*>(arg)->AnswerSend(header, header_length, data, length,
                                           param);
  // A rendezvous descriptor not received is dropped.
  return UCS_OK;
}

ucs_status_t UcxServer::OnWrite(void* arg, const void* header,
                                size_t header_length, void* data, size_t length,
                                const ucp_am_recv_param_t* param) {
  return static_cast<UcxServer*>(arg)->AnswerWrite(header, header_length, data,
                                                   length, param);
}

ucs_status_t UcxServer::OnGoodbye(void* arg, const void* header,
                                  size_t header_length, void* /*data*/,
                                  size_t /*length*/,
                                  const ucp_am_recv_param_t* /*param*/) {
  auto* server = static_cast<UcxServer*>(arg);
  UcxGoodbye goodbye;
  if (header_length != sizeof(goodbye)) return UCS_OK;
  std::memcpy(&goodbye, header, sizeof(goodbye));
  // Closed once the progress call returns, not from inside it.
  if (goodbye.magic == kUcxCheckMagic &&
      server->peers_.contains(goodbye.peer)) {
    server->to_close_.push_back(goodbye.peer);
  }
  return UCS_OK;
}

UcxServer::Peer* UcxServer::Known(uint64_t peer) {
  auto it = peers_.find(peer);
  if (it == peers_.end()) {
    // No endpoint to answer on: dropped. The reader's wait for an answer
    // times out and it says hello again.
    return nullptr;
  }
  it->second.last_use = absl::Now();
  it->second.tick = ++peer_tick_;
  return &it->second;
}

void UcxServer::Refuse(uint64_t peer, uint64_t request_id,
                       UcxCheckAnswer answer) {
  Reply reply{peer, {}};
  reply.body.request_id = request_id;
  reply.body.answer = static_cast<uint32_t>(answer);
  replies_.push_back(reply);
}

void UcxServer::AnswerCheck(const void* header, size_t header_length,
                            const ucp_am_recv_param_t* param, bool release) {
  UcxCheckRequest request;
  if (!ParseRequest(header, header_length, &request)) return;
  if (Known(request.peer) == nullptr) return;
  // Sent once the progress call returns, not from inside it.
  Refuse(request.peer, request.request_id,
         Check(request.shard_id, request.registration, release));
}

void UcxServer::AnswerSend(const void* header, size_t header_length,
                           const void* data, size_t length,
                           const ucp_am_recv_param_t* param) {
  UcxSendRequest request;
  if (!ParseRequest(header, header_length, &request)) return;
  if (Known(request.peer) == nullptr) return;
  const uint64_t peer = request.peer;
  if (Rendezvous(param) || request.count < 1 ||
      request.count > kMaxUcxSendRanges ||
      length != request.count * sizeof(UcxRange) || data == nullptr) {
    Refuse(peer, request.request_id, UcxCheckAnswer::kRefused);
    return;
  }
  std::vector<UcxRange> ranges(request.count);
  std::memcpy(ranges.data(), data, length);
  // What the name reaches: a read key's shard, or a lease's staged bytes.
  std::shared_ptr<Registration> r;
  std::shared_ptr<const void> pages;
  const char* base = nullptr;
  uint64_t size = 0;
  UcxCheckAnswer refusal = UcxCheckAnswer::kStale;
  {
    absl::MutexLock lock(&mu_);
    auto key = by_nonce_.find(request.registration);
    auto lease = leases_.find(request.registration);
    if (key != by_nonce_.end()) {
      if (!key->second->write && key->second->shard_id == request.shard_id) {
        r = key->second;
        const UcxPinnedShard& pinned = r->pinned;
        pages = pinned.keep_mapped != nullptr ? pinned.keep_mapped
                                              : pinned.keep_alive;
        base = pinned.data;
        size = static_cast<uint64_t>(pinned.bytes);
      }
    } else if (lease != leases_.end() &&
               lease->second.shard_id == request.shard_id &&
               staging_ != nullptr) {
      // A staging lease: its slots, packed while the shard was held. The
      // reader's check-and-release after says whether they still are its.
      pages = staging_;
      base =
          staging_.get() + lease->second.first_slot *
                               static_cast<size_t>(options_.staging_slot_bytes);
      size = static_cast<uint64_t>(lease->second.slots) *
             static_cast<uint64_t>(options_.staging_slot_bytes);
    } else if (FreedKey(request.registration, request.shard_id)) {
      refusal = UcxCheckAnswer::kFreed;
    }
  }
  if (pages == nullptr) {
    Refuse(peer, request.request_id, refusal);
    return;
  }
  for (const UcxRange& range : ranges) {
    if (!RangeInside(range.offset, range.bytes, size)) {
      Refuse(peer, request.request_id, UcxCheckAnswer::kRefused);
      return;
    }
  }
  if (r != nullptr && !StillHeld(*r)) {
    Refuse(peer, request.request_id, UcxCheckAnswer::kFreed);
    return;
  }
  // Bounded: a reader that never takes its bytes holds its sends (and the
  // pages under them) until its endpoint is closed.
  if (queued_.size() + ranges.size() > options_.max_queued_sends) {
    Refuse(peer, request.request_id, UcxCheckAnswer::kBusy);
    return;
  }
  for (uint32_t i = 0; i < request.count; ++i) {
    queued_.push_back(PendingSend{peer, pages, base + ranges[i].offset,
                                  ranges[i].bytes, request.request_id + i});
  }
}

ucs_status_t UcxServer::AnswerWrite(const void* header, size_t header_length,
                                    void* data, size_t length,
                                    const ucp_am_recv_param_t* param) {
  UcxWriteRequest request;
  // Not answerable: a rendezvous sender learns of the refusal from its send.
  if (!ParseRequest(header, header_length, &request) ||
      Known(request.peer) == nullptr) {
    return Rendezvous(param) ? UCS_ERR_INVALID_PARAM : UCS_OK;
  }
  const uint64_t peer = request.peer;
  std::shared_ptr<Registration> r;
  UcxCheckAnswer refusal = UcxCheckAnswer::kStale;
  char* dst = nullptr;
  std::shared_ptr<void> shard;
  uint64_t size = 0;
  {
    absl::MutexLock lock(&mu_);
    auto key = by_nonce_.find(request.registration);
    if (key != by_nonce_.end()) {
      if (key->second->write && key->second->shard_id == request.shard_id) {
        r = key->second;
        dst = r->pinned.data;
        shard = r->pinned.keep_alive;
        size = static_cast<uint64_t>(r->pinned.bytes);
      }
    } else if (FreedKey(request.registration, request.shard_id)) {
      refusal = UcxCheckAnswer::kFreed;
    }
  }
  // A rendezvous descriptor not received is dropped (UCS_OK).
  if (r == nullptr || shard == nullptr) {
    Refuse(peer, request.request_id, refusal);
    return UCS_OK;
  }
  if (!RangeInside(request.offset, length, size) ||
      (!Rendezvous(param) && data == nullptr)) {
    Refuse(peer, request.request_id, UcxCheckAnswer::kRefused);
    return UCS_OK;
  }
  if (!StillHeld(*r)) {
    Refuse(peer, request.request_id, UcxCheckAnswer::kFreed);
    return UCS_OK;
  }
  if (options_.writable && !options_.writable(request.shard_id)) {
    Refuse(peer, request.request_id, UcxCheckAnswer::kSealed);
    return UCS_OK;
  }
  dst += request.offset;
  if (!Rendezvous(param)) {
    std::memcpy(dst, data, length);
    writes_received_.fetch_add(1);
    Refuse(peer, request.request_id, UcxCheckAnswer::kHeld);
    return UCS_OK;
  }
  // The bytes come straight into the shard; answered once they are in.
  auto* receiving =
      new Receiving{std::move(shard), peer, request.request_id, this};
  ucp_request_param_t recv{};
  recv.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  recv.cb.recv_am = &UcxServer::WriteDone;
  recv.user_data = receiving;
  ucs_status_ptr_t started =
      ucp_am_recv_data_nbx(worker_.worker, data, dst, length, &recv);
  if (UCS_PTR_IS_PTR(started)) {
    ++receives_in_flight_;
    return UCS_OK;  // WriteDone answers
  }
  const ucs_status_t status = UCS_PTR_STATUS(started);
  if (status == UCS_OK) writes_received_.fetch_add(1);
  Refuse(peer, request.request_id,
         status == UCS_OK ? UcxCheckAnswer::kHeld : UcxCheckAnswer::kRefused);
  delete receiving;
  return UCS_OK;
}

void UcxServer::WriteDone(void* request, ucs_status_t status, size_t,
                          void* user_data) {
  auto* receiving = static_cast<Receiving*>(user_data);
  UcxServer* server = receiving->server;
  --server->receives_in_flight_;
  if (status == UCS_OK) server->writes_received_.fetch_add(1);
  server->Refuse(
      receiving->peer, receiving->request_id,
      status == UCS_OK ? UcxCheckAnswer::kHeld : UcxCheckAnswer::kRefused);
  delete receiving;
  ucp_request_free(request);
}

void UcxServer::SendDone(void* request, ucs_status_t, void* user_data) {
  auto* sending = static_cast<Sending*>(user_data);
  --sending->server->sends_in_flight_;
  delete sending;
  ucp_request_free(request);
}

void UcxServer::PostSends() {
  while (sends_in_flight_ < options_.max_sends_in_flight && !queued_.empty()) {
    PendingSend send = std::move(queued_.front());
    queued_.pop_front();
    auto peer = peers_.find(send.peer);
    if (peer == peers_.end()) continue;  // closed meanwhile
    // The pages stay mapped for the send even if the key dies meanwhile;
    // the reader's check after refuses bytes of a shard freed during it.
    auto* sending = new Sending{std::move(send.pages), this};
    const ucp_request_param_t param = SendParam(&SendDone, sending);
    ucs_status_ptr_t request =
        ucp_tag_send_nbx(peer->second.ep, send.data,
                         static_cast<size_t>(send.bytes), send.tag, &param);
    ranges_sent_.fetch_add(1);
    bytes_sent_.fetch_add(send.bytes);
    if (UCS_PTR_IS_PTR(request)) {
      ++sends_in_flight_;
    } else {
      delete sending;  // sent at once, or failed: the reader times out
    }
  }
}

void UcxServer::SendReplies() {
  std::vector<Reply> replies;
  replies.swap(replies_);
  for (const Reply& reply : replies) {
    auto peer = peers_.find(reply.peer);
    if (peer == peers_.end()) continue;  // closed meanwhile: nobody to answer
    auto* body = new UcxCheckReply(reply.body);
    const ucp_request_param_t param = SendParam(&ReplySent, body);
    ucs_status_ptr_t request =
        ucp_am_send_nbx(peer->second.ep, kUcxCheckReplyAm, body, sizeof(*body),
                        nullptr, 0, &param);
    // Done at once (or failed: the reader times out and retries).
    if (!UCS_PTR_IS_PTR(request)) delete body;
  }
}

void UcxServer::Greet() {
  std::vector<Hello> hellos;
  hellos.swap(hellos_);
  for (Hello& hello : hellos) {
    uint64_t id = RandomId();
    while (peers_.contains(id)) id = RandomId();
    // This worker's own endpoint to the reader (UCX pairs it with the one
    // the reader made): used for every answer, and closed for good.
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                        UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                        UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.address =
        reinterpret_cast<const ucp_address_t*>(hello.address.data());
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb = &UcxServer::OnPeerFailure;
    params.err_handler.arg = this;
    ucp_ep_h ep = nullptr;
    if (ucp_ep_create(worker_.worker, &params, &ep) != UCS_OK) continue;
    if (peer_of_.contains(ep)) {
      // The reader's endpoint again (a second hello): one peer for it.
      const uint64_t known = peer_of_[ep];
      peers_[known].last_use = absl::Now();
      Reply reply{known, {}};
      reply.body.request_id = hello.request_id;
      reply.body.peer = known;
      replies_.push_back(reply);
      continue;
    }
    peers_[id] = Peer{ep, absl::Now(), ++peer_tick_};
    peer_of_[ep] = id;
    peers_count_.store(static_cast<int64_t>(peers_.size()));
    Reply reply{id, {}};
    reply.body.request_id = hello.request_id;
    reply.body.answer = static_cast<uint32_t>(UcxCheckAnswer::kHeld);
    reply.body.peer = id;
    replies_.push_back(reply);
    if (peers_.size() > options_.max_peers) {
      // Too many readers: the least recently used goes (it says hello again
      // if it is still there).
      auto oldest = peers_.end();
      for (auto p = peers_.begin(); p != peers_.end(); ++p) {
        if (p->first != id &&
            (oldest == peers_.end() || p->second.tick < oldest->second.tick)) {
          oldest = p;
        }
      }
      if (oldest != peers_.end()) to_forget_.push_back(oldest->first);
    }
  }
}

void UcxServer::ClosePeer(uint64_t id, bool notify) {
  auto it = peers_.find(id);
  if (it == peers_.end()) return;
  const ucp_ep_h ep = it->second.ep;
  peers_.erase(it);
  peer_of_.erase(ep);
  peers_count_.store(static_cast<int64_t>(peers_.size()));
  last_close_ = absl::Now();
  queued_.erase(
      std::remove_if(queued_.begin(), queued_.end(),
                     [id](const PendingSend& s) { return s.peer == id; }),
      queued_.end());
  if (notify) {
    // The notice: an answer to no request (id 0) naming the peer forgotten.
    Forgetting forgetting{ep, std::make_unique<Notice>(),
                          absl::Now() + absl::Milliseconds(200)};
    forgetting.notice->body.answer =
        static_cast<uint32_t>(UcxCheckAnswer::kUnknownPeer);
    forgetting.notice->body.peer = id;
    ucp_request_param_t send{};
    send.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    send.cb.send = &UcxServer::NoticeSent;
    send.user_data = forgetting.notice.get();
    ucs_status_ptr_t request =
        ucp_am_send_nbx(ep, kUcxCheckReplyAm, &forgetting.notice->body,
                        sizeof(UcxCheckReply), nullptr, 0, &send);
    if (UCS_PTR_IS_PTR(request)) {
      forgetting_.push_back(std::move(forgetting));
      return;
    }
  }
  CloseEndpoint(ep);
}

void UcxServer::CloseEndpoint(ucp_ep_h ep) {
  // Forced (the endpoint has peer-failure handling): UCX destroys an
  // endpoint a peer connected to, and detaches what it mapped of the peer's
  // memory, only then; what is in flight to the reader is cancelled.
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_EP_CLOSE_FLAG_FORCE;
  ucs_status_ptr_t request = ucp_ep_close_nbx(ep, &param);
  if (UCS_PTR_IS_PTR(request)) closing_.push_back(request);
}

void UcxServer::NoticeSent(void* request, ucs_status_t /*status*/,
                           void* user_data) {
  static_cast<Notice*>(user_data)->done = true;
  ucp_request_free(request);
}

void UcxServer::FinishForgetting() {
  const absl::Time now = absl::Now();
  for (Forgetting& f : forgetting_) {
    if (!f.closed && (f.notice->done || now >= f.until)) {
      // A notice not out by now is cancelled by the close (its callback
      // still runs, so the notice is kept until then).
      CloseEndpoint(f.ep);
      f.closed = true;
    }
  }
  forgetting_.erase(std::remove_if(forgetting_.begin(), forgetting_.end(),
                                   [](const Forgetting& f) {
                                     return f.closed && f.notice->done;
                                   }),
                    forgetting_.end());
}

void UcxServer::ClosePeers() {
  std::vector<uint64_t> close;
  close.swap(to_close_);
  for (uint64_t id : close) ClosePeer(id, /*notify=*/false);
  std::vector<uint64_t> forget;
  forget.swap(to_forget_);
  const absl::Time now = absl::Now();
  for (const auto& [id, peer] : peers_) {
    if (now - peer.last_use >= options_.peer_idle_timeout) forget.push_back(id);
  }
  for (uint64_t id : forget) ClosePeer(id, /*notify=*/true);
}

void UcxServer::FreeClosed() {
  closing_.erase(std::remove_if(closing_.begin(), closing_.end(),
                                [](void* request) {
                                  if (ucp_request_check_status(request) ==
                                      UCS_INPROGRESS) {
                                    return false;
                                  }
                                  ucp_request_free(request);
                                  return true;
                                }),
                 closing_.end());
}

void UcxServer::Progress() {
  absl::Time swept = absl::Now();
  // Arms refused in a row with nothing progressed (see below).
  int busy_idle = 0;
  for (;;) {
    bool progressed = false;
    while (ucp_worker_progress(worker_.worker) != 0) progressed = true;
    if (progressed) busy_idle = 0;
    bool worked = false;
    const absl::Time now = absl::Now();
    if (!hellos_.empty()) {
      Greet();
      worked = true;
    }
    if (!to_close_.empty() || !to_forget_.empty() ||
        now - swept >= options_.sweep_interval) {
      swept = now;
      ClosePeers();
      worked = true;
    }
    if (!replies_.empty()) {
      SendReplies();
      worked = true;
    }
    if (!queued_.empty() && sends_in_flight_ < options_.max_sends_in_flight) {
      PostSends();
      worked = true;
    }
    if (!forgetting_.empty()) FinishForgetting();
    if (!closing_.empty()) FreeClosed();
    if (worked) continue;
    if (stop_.HasBeenNotified()) break;
    const ucs_status_t armed = ucp_worker_arm(worker_.worker);
    // Busy: events came in, or UCX holds sends it cannot make yet. The
    // latter lasts for good when a reader died with its receive queue full
    // (UCX 1.13 keeps flushing the closed endpoint to it): with nothing of
    // this worker's in flight and nothing progressed for a while, wait a
    // millisecond between tries instead of spinning a core. (The worker's
    // event fd stays ready then, so the wait is on the stop event alone.)
    constexpr int kBusySpins = 1000;
    if (armed == UCS_ERR_BUSY) {
      const bool transferring =
          sends_in_flight_ > 0 || receives_in_flight_ > 0 || !queued_.empty();
      if (transferring || ++busy_idle < kBusySpins) continue;
      pollfd stop{wake_fd_, POLLIN, 0};
      poll(&stop, 1, 1);
      continue;
    }
    // Wakes now and then while readers are kept, to close idle ones, and
    // for a while after a close: UCX finishes discarding a closed endpoint
    // (and detaching what it mapped) from its progress calls, which no
    // event wakes.
    const bool timed = !peers_.empty() || !closing_.empty() ||
                       !forgetting_.empty() ||
                       absl::Now() - last_close_ < absl::Seconds(5);
    const int ms =
        armed != UCS_OK ? 10
        : timed
            ? static_cast<int>(std::clamp<int64_t>(
                  absl::ToInt64Milliseconds(options_.sweep_interval), 1, 1000))
            : -1;
    epoll_event events[2];
    const int n = epoll_wait(epoll_fd_, events, 2, ms);
    for (int i = 0; i < n; ++i) {
      if (events[i].data.fd == wake_fd_) {
        uint64_t value;
        if (read(wake_fd_, &value, sizeof(value)) < 0) {
          // Nonblocking: nothing to drain.
        }
      }
    }
  }
  // Stopping: every reader's endpoint goes, and what is in flight with it.
  std::vector<uint64_t> all;
  for (const auto& [id, peer] : peers_) all.push_back(id);
  for (uint64_t id : all) ClosePeer(id, /*notify=*/false);
  queued_.clear();
  for (Forgetting& f : forgetting_) f.until = absl::InfinitePast();
  const absl::Time until = absl::Now() + absl::Seconds(1);
  while ((!closing_.empty() || !forgetting_.empty() || sends_in_flight_ > 0) &&
         absl::Now() < until) {
    ucp_worker_progress(worker_.worker);
    FinishForgetting();
    FreeClosed();
  }
  // A notice whose callback never ran must outlive the UCX worker.
  for (Forgetting& f : forgetting_) static_cast<void>(f.notice.release());
}

}  // namespace tessera
