#include "transport/ucx_server.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

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

}  // namespace

absl::StatusOr<std::unique_ptr<UcxServer>> UcxServer::Start(
    UcxServerOptions options) {
  if (options.pin == nullptr || options.held == nullptr) {
    return absl::InvalidArgumentError("UcxServer needs `pin` and `held`");
  }
  absl::StatusOr<ucp_context_h> context =
      MakeUcpContext("tessera-worker", options.loopback_only);
  if (!context.ok()) return context.status();
  absl::StatusOr<UcpWorker> worker = MakeUcpWorker(*context);
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
  ucp_am_handler_param_t handler{};
  handler.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID |
                       UCP_AM_HANDLER_PARAM_FIELD_CB |
                       UCP_AM_HANDLER_PARAM_FIELD_ARG;
  handler.id = kUcxCheckAm;
  handler.cb = &UcxServer::OnCheck;
  handler.arg = server.get();
  ucs_status_t set =
      ucp_worker_set_am_recv_handler(server->worker_.worker, &handler);
  if (set != UCS_OK) return UcxError("setting the UCX check handler", set);
  handler.id = kUcxCheckReleaseAm;
  handler.cb = &UcxServer::OnCheckRelease;
  set = ucp_worker_set_am_recv_handler(server->worker_.worker, &handler);
  if (set != UCS_OK) return UcxError("setting the UCX release handler", set);
  handler.id = kUcxSendAm;
  handler.cb = &UcxServer::OnSend;
  set = ucp_worker_set_am_recv_handler(server->worker_.worker, &handler);
  if (set != UCS_OK) return UcxError("setting the UCX send handler", set);
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
  std::vector<std::shared_ptr<Registration>> all;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [key, r] : live_) all.push_back(r);
    for (auto& [nonce, r] : dead_) all.push_back(r);
    live_.clear();
    by_nonce_.clear();
    dead_.clear();
    leases_.clear();
    DropStaging();
  }
  for (auto& r : all) Unmap(*r);
  ucp_worker_destroy(worker_.worker);
  ucp_cleanup(context_);
  close(epoll_fd_);
  close(wake_fd_);
}

absl::StatusOr<UcxKey> UcxServer::Register(uint64_t id, bool write) {
  auto key_of = [](const Registration& r) {
    UcxKey key;
    key.shard_id = r.shard_id;
    key.base = reinterpret_cast<uint64_t>(r.pinned.data);
    key.bytes = r.pinned.bytes;
    key.rkey = r.rkey;
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
  absl::StatusOr<UcxPinnedShard> pinned = options_.pin(id);
  if (!pinned.ok()) {
    if (absl::IsUnimplemented(pinned.status())) {
      return absl::FailedPreconditionError(absl::StrCat(
          "shard ", id, " is not in host memory: UCX cannot reach it"));
    }
    return pinned.status();
  }
  auto r = std::make_shared<Registration>();
  r->shard_id = id;
  r->write = write;
  r->nonce = RandomId();
  r->pinned = *std::move(pinned);
  if (r->pinned.bytes > 0) {
    ucp_mem_map_params_t params{};
    params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
                        UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                        UCP_MEM_MAP_PARAM_FIELD_PROT;
    params.address = r->pinned.data;
    params.length = static_cast<size_t>(r->pinned.bytes);
    params.prot = UCP_MEM_MAP_PROT_LOCAL_READ | UCP_MEM_MAP_PROT_LOCAL_WRITE |
                  UCP_MEM_MAP_PROT_REMOTE_READ |
                  (write ? UCP_MEM_MAP_PROT_REMOTE_WRITE : 0);
    ucs_status_t status = ucp_mem_map(context_, &params, &r->memh);
    if (status != UCS_OK) {
      return UcxError(absl::StrCat("registering shard ", id), status);
    }
    void* packed = nullptr;
    size_t packed_size = 0;
    status = ucp_rkey_pack(context_, r->memh, &packed, &packed_size);
    if (status != UCS_OK) {
      Unmap(*r);
      return UcxError(absl::StrCat("packing the key of shard ", id), status);
    }
    r->rkey.assign(static_cast<const char*>(packed), packed_size);
    ucp_rkey_buffer_release(packed);
  }
  std::shared_ptr<Registration> evicted, duplicate;
  UcxKey key;
  {
    absl::MutexLock lock(&mu_);
    auto [it, inserted] = live_.emplace(std::make_pair(id, write), r);
    if (!inserted) {
      duplicate = r;  // another call registered it meanwhile
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
  if (duplicate != nullptr) Unmap(*duplicate);
  LetGo();
  return key;
}

absl::Status UcxServer::EnsureStaging() {
  if (staging_ != nullptr) return absl::OkStatus();
  const size_t bytes = static_cast<size_t>(options_.staging_bytes);
  const unsigned prot = UCP_MEM_MAP_PROT_LOCAL_READ |
                        UCP_MEM_MAP_PROT_LOCAL_WRITE |
                        UCP_MEM_MAP_PROT_REMOTE_READ;
  // Allocated by UCX first: on one host that is shared memory a reader
  // attaches and copies from itself, where memory UCX did not allocate is
  // read through this worker's progress thread (UCX emulates the gets).
  ucp_mem_map_params_t params{};
  params.field_mask =
      UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
      UCP_MEM_MAP_PARAM_FIELD_FLAGS | UCP_MEM_MAP_PARAM_FIELD_PROT;
  params.address = nullptr;
  params.length = bytes;
  params.flags = UCP_MEM_MAP_ALLOCATE;
  params.prot = prot;
  ucp_mem_h memh = nullptr;
  void* map = nullptr;
  bool ours = false;  // mapped here rather than by UCX
  ucs_status_t status = ucp_mem_map(context_, &params, &memh);
  if (status == UCS_OK) {
    ucp_mem_attr_t attr{};
    attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
    status = ucp_mem_query(memh, &attr);
    if (status == UCS_OK && attr.address != nullptr && attr.length >= bytes) {
      map = attr.address;
    } else {
      ucp_mem_unmap(context_, memh);
      memh = nullptr;
    }
  }
  if (map == nullptr) {
    map = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
               MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (map == MAP_FAILED) {
      return absl::ResourceExhaustedError(
          absl::StrCat("mapping ", bytes,
                       " bytes of UCX staging memory: ", std::strerror(errno)));
    }
    ours = true;
    params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
                        UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                        UCP_MEM_MAP_PARAM_FIELD_PROT;
    params.address = map;
    status = ucp_mem_map(context_, &params, &memh);
    if (status != UCS_OK) {
      munmap(map, bytes);
      return UcxError("registering the UCX staging memory", status);
    }
  }
  void* packed = nullptr;
  size_t packed_size = 0;
  status = ucp_rkey_pack(context_, memh, &packed, &packed_size);
  if (status != UCS_OK) {
    ucp_mem_unmap(context_, memh);
    if (ours) munmap(map, bytes);
    return UcxError("packing the key of the UCX staging memory", status);
  }
  staging_rkey_.assign(static_cast<const char*>(packed), packed_size);
  ucp_rkey_buffer_release(packed);
  staging_ = static_cast<char*>(map);
  staging_memh_ = memh;
  staging_mapped_here_ = ours;
  slot_taken_.assign(
      static_cast<size_t>(options_.staging_bytes / options_.staging_slot_bytes),
      false);
  return absl::OkStatus();
}

void UcxServer::DropStaging() {
  if (staging_ == nullptr) return;
  // Memory UCX allocated goes with its registration.
  ucp_mem_unmap(context_, staging_memh_);
  if (staging_mapped_here_) {
    munmap(staging_, static_cast<size_t>(options_.staging_bytes));
  }
  staging_ = nullptr;
  staging_memh_ = nullptr;
  staging_rkey_.clear();
  slot_taken_.clear();
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

absl::StatusOr<UcxStaged> UcxServer::Stage(uint64_t id, const Box& box,
                                           int64_t first, int64_t count) {
  if (options_.staging_bytes <= 0 || options_.staging_slot_bytes <= 0 ||
      options_.staging_bytes < options_.staging_slot_bytes) {
    return absl::FailedPreconditionError("this worker stages nothing");
  }
  absl::StatusOr<UcxPinnedShard> pinned = options_.pin(id);
  if (!pinned.ok()) {
    if (absl::IsUnimplemented(pinned.status())) {
      return absl::FailedPreconditionError(absl::StrCat(
          "shard ", id, " is not in host memory: UCX cannot reach it"));
    }
    return pinned.status();
  }
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
    dst = staging_ + start * static_cast<size_t>(options_.staging_slot_bytes);
    staged.lease = nonce;
    staged.base = reinterpret_cast<uint64_t>(dst);
    staged.bytes = *bytes;
    staged.rkey = staging_rkey_;
  }
  // Outside the lock: the slots are this lease's, and the region stays
  // mapped while any lease is held.
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
  absl::MutexLock lock(&mu_);
  auto it = live_.find({id, true});
  if (it != live_.end()) Kill(*it->second, /*freed=*/false);
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
  // Keep the pages mapped for stale gets, but let the shard go (see the top
  // of ucx_server.h); dropped by LetGo outside the lock.
  if (!r.write && r.pinned.keep_mapped != nullptr &&
      r.pinned.keep_alive != nullptr) {
    let_go_.push_back(std::move(r.pinned.keep_alive));
  }
}

void UcxServer::LetGo() {
  std::vector<std::shared_ptr<void>> shards;
  {
    absl::MutexLock lock(&mu_);
    shards.swap(let_go_);
  }
  // `shards` drops here, outside the lock.
}

void UcxServer::Unmap(Registration& r) {
  if (r.memh != nullptr) ucp_mem_unmap(context_, r.memh);
  r.memh = nullptr;
  r.pinned.keep_alive.reset();
  r.pinned.keep_mapped.reset();
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
  std::vector<std::shared_ptr<Registration>> expired;
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
        sends_in_flight_.load() == 0 && now - staging_used_ >= options_.grace) {
      DropStaging();
    }
    for (auto it = dead_.begin(); it != dead_.end();) {
      if (now - it->second->dead_since >= options_.grace) {
        expired.push_back(it->second);
        dead_.erase(it++);
      } else {
        ++it;
      }
    }
  }
  for (auto& r : expired) Unmap(*r);
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

ucs_status_t UcxServer::OnCheck(void* arg, const void* header,
                                size_t header_length, void* /*data*/,
                                size_t /*length*/,
                                const ucp_am_recv_param_t* param) {
  static_cast<UcxServer*>(arg)->AnswerCheck(header, header_length, param,
                                            /*release=*/false);
  return UCS_OK;
}

ucs_status_t UcxServer::OnCheckRelease(void* arg, const void* header,
                                       size_t header_length, void* /*data*/,
                                       size_t /*length*/,
                                       const ucp_am_recv_param_t* param) {
  static_cast<UcxServer*>(arg)->AnswerCheck(header, header_length, param,
                                            /*release=*/true);
  return UCS_OK;
}

namespace {

// A send request's range: non-empty and inside `size` bytes.
bool RangeInside(const UcxSendRequest& request, uint64_t size) {
  return request.bytes > 0 && request.offset <= size &&
         request.bytes <= size - request.offset;
}

// `header` as a request of type T with a way to answer it. Anything else is
// dropped (false): the peer's request then times out.
template <typename T>
bool ParseRequest(const void* header, size_t header_length,
                  const ucp_am_recv_param_t* param, T* request) {
  if (header_length != sizeof(T) ||
      (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) == 0 ||
      param->reply_ep == nullptr) {
    return false;
  }
  std::memcpy(request, header, sizeof(T));
  return request->magic == kUcxCheckMagic;
}

}  // namespace

void UcxServer::AnswerCheck(const void* header, size_t header_length,
                            const ucp_am_recv_param_t* param, bool release) {
  UcxCheckRequest request;
  if (!ParseRequest(header, header_length, param, &request)) return;
  Reply reply{param->reply_ep, {}};
  reply.body.request_id = request.request_id;
  reply.body.answer = static_cast<uint32_t>(
      Check(request.shard_id, request.registration, release));
  // Sent once the progress call returns, not from inside it.
  replies_.push_back(reply);
}

ucs_status_t UcxServer::OnSend(void* arg, const void* header,
                               size_t header_length, void* /*data*/,
                               size_t /*length*/,
                               const ucp_am_recv_param_t* param) {
  static_cast<UcxServer*>(arg)->AnswerSend(header, header_length, param);
  return UCS_OK;
}

void UcxServer::AnswerSend(const void* header, size_t header_length,
                           const ucp_am_recv_param_t* param) {
  UcxSendRequest request;
  if (!ParseRequest(header, header_length, param, &request)) return;
  std::shared_ptr<Registration> r;
  UcxCheckAnswer refusal = UcxCheckAnswer::kStale;
  const bool room = sends_in_flight_.load() + static_cast<int>(sends_.size()) <
                    options_.max_sends_in_flight;
  {
    absl::MutexLock lock(&mu_);
    auto it = by_nonce_.find(request.registration);
    auto lease = leases_.find(request.registration);
    if (it != by_nonce_.end()) {
      if (!it->second->write && it->second->shard_id == request.shard_id) {
        r = it->second;
      }
    } else if (lease != leases_.end() &&
               lease->second.shard_id == request.shard_id) {
      // A staging lease: its slots, packed while the shard was held. The
      // reader's check-and-release after says whether they still are its.
      if (!RangeInside(request, static_cast<uint64_t>(lease->second.slots) *
                                    static_cast<uint64_t>(
                                        options_.staging_slot_bytes))) {
        return;  // outside the lease: the reader knows its size
      }
      if (room) {
        sends_.push_back(PendingSend{
            param->reply_ep, nullptr,
            staging_ +
                lease->second.first_slot *
                    static_cast<size_t>(options_.staging_slot_bytes) +
                request.offset,
            request.bytes, request.request_id});
        return;
      }
    } else if (FreedKey(request.registration, request.shard_id)) {
      refusal = UcxCheckAnswer::kFreed;
    }
  }
  if (r != nullptr) {
    if (!RangeInside(request, static_cast<uint64_t>(r->pinned.bytes))) {
      return;  // outside the shard: the reader knows its size
    }
    if (!StillHeld(*r)) {
      r = nullptr;
      refusal = UcxCheckAnswer::kFreed;
    }
  }
  // Bounded: a reader that never takes its bytes holds a send (and the
  // pages under it) until its link fails. Past the bound, refused: the
  // reader gets the range instead.
  if (r != nullptr && room) {
    const char* data = r->pinned.data + request.offset;
    sends_.push_back(PendingSend{param->reply_ep, std::move(r), data,
                                 request.bytes, request.request_id});
    return;
  }
  Reply reply{param->reply_ep, {}};
  reply.body.request_id = request.request_id;
  reply.body.answer = static_cast<uint32_t>(refusal);
  replies_.push_back(reply);
}

void UcxServer::SendDone(void* request, ucs_status_t, void* user_data) {
  auto* sending = static_cast<Sending*>(user_data);
  --sending->server->sends_in_flight_;
  delete sending;
  ucp_request_free(request);
}

void UcxServer::PostSends() {
  std::vector<PendingSend> sends;
  sends.swap(sends_);
  for (PendingSend& send : sends) {
    // The pages stay mapped for the send even if the registration dies and
    // its grace ends meanwhile; the reader's check after refuses bytes of a
    // shard freed during the send.
    std::shared_ptr<const void> pages;
    if (send.registration != nullptr) {
      pages = send.registration->pinned.keep_mapped != nullptr
                  ? send.registration->pinned.keep_mapped
                  : send.registration->pinned.keep_alive;
    }
    auto* sending = new Sending{send.registration, std::move(pages), this};
    ucp_request_param_t param{};
    param.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    param.cb.send = &SendDone;
    param.user_data = sending;
    ucs_status_ptr_t request = ucp_tag_send_nbx(
        send.ep, send.data, static_cast<size_t>(send.bytes), send.tag, &param);
    ranges_sent_.fetch_add(1);
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
    auto* body = new UcxCheckReply(reply.body);
    ucp_request_param_t param{};
    param.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    param.cb.send = &ReplySent;
    param.user_data = body;
    ucs_status_ptr_t request = ucp_am_send_nbx(
        reply.ep, kUcxCheckReplyAm, body, sizeof(*body), nullptr, 0, &param);
    // Done at once (or failed: the reader times out and retries).
    if (!UCS_PTR_IS_PTR(request)) delete body;
  }
}

void UcxServer::Progress() {
  for (;;) {
    while (ucp_worker_progress(worker_.worker) != 0) {
    }
    if (!replies_.empty() || !sends_.empty()) {
      SendReplies();
      PostSends();
      continue;
    }
    if (stop_.HasBeenNotified()) return;
    const ucs_status_t armed = ucp_worker_arm(worker_.worker);
    if (armed == UCS_ERR_BUSY) continue;
    epoll_event events[2];
    const int n = epoll_wait(epoll_fd_, events, 2, armed == UCS_OK ? -1 : 10);
    for (int i = 0; i < n; ++i) {
      if (events[i].data.fd == wake_fd_) {
        uint64_t value;
        if (read(wake_fd_, &value, sizeof(value)) < 0) {
          // Nonblocking: nothing to drain.
        }
      }
    }
  }
}

}  // namespace tessera
