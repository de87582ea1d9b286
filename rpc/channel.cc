#include "rpc/channel.h"

#include <arpa/inet.h>
#include <grpcpp/resource_quota.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <optional>
#include <vector>

#include "absl/base/call_once.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "rpc/metrics_interceptor.h"
#include "rpc/status.h"

namespace tessera {
namespace {

int Millis(absl::Duration d) {
  return static_cast<int>(absl::ToInt64Milliseconds(d));
}

thread_local absl::Time current_call_deadline = absl::InfiniteFuture();
thread_local Cancellation* current_cancellation = nullptr;

using grpc::experimental::InterceptionHookPoints;

// Cancels its call when it makes no progress (no message sent or received)
// for `idle`, or at the deadline of the ScopedCallDeadline it started under.
// gRPC may run the hooks of one call from two threads (a read and a write).
class IdleCallInterceptor : public grpc::experimental::Interceptor {
 public:
  IdleCallInterceptor(grpc::ClientContext* context, absl::Duration idle,
                      absl::Time deadline)
      : context_(context), idle_(idle), deadline_(deadline) {}
  ~IdleCallInterceptor() override { Stop(); }

  void Intercept(
      grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            InterceptionHookPoints::POST_RECV_STATUS)) {
      Stop();
    } else if (methods->QueryInterceptionHookPoint(
                   InterceptionHookPoints::PRE_SEND_INITIAL_METADATA) ||
               methods->QueryInterceptionHookPoint(
                   InterceptionHookPoints::PRE_SEND_MESSAGE) ||
               methods->QueryInterceptionHookPoint(
                   InterceptionHookPoints::POST_RECV_INITIAL_METADATA) ||
               methods->QueryInterceptionHookPoint(
                   InterceptionHookPoints::POST_RECV_MESSAGE)) {
      Rearm();
    }
    methods->Proceed();
  }

 private:
  void Rearm() {
    absl::MutexLock lock(&mu_);
    if (done_) return;
    if (alarm_ != 0) Watchdog::Default().Disarm(alarm_);
    grpc::ClientContext* context = context_;
    alarm_ = Watchdog::Default().Arm(std::min(absl::Now() + idle_, deadline_),
                                     [context] { context->TryCancel(); });
  }

  // The call ended: its context may go once this returns.
  void Stop() {
    absl::MutexLock lock(&mu_);
    done_ = true;
    if (alarm_ != 0) Watchdog::Default().Disarm(alarm_);
    alarm_ = 0;
  }

  grpc::ClientContext* const context_;
  const absl::Duration idle_;
  const absl::Time deadline_;
  absl::Mutex mu_;
  uint64_t alarm_ ABSL_GUARDED_BY(mu_) = 0;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
};

// Cancels its call when the ScopedCancellation it started under is
// cancelled (at once, if it already was).
class CancelCallInterceptor : public grpc::experimental::Interceptor {
 public:
  CancelCallInterceptor(grpc::ClientContext* context,
                        Cancellation* cancellation) {
    registration_.emplace(
        cancellation->OnCancel([context] { context->TryCancel(); }));
  }

  void Intercept(
      grpc::experimental::InterceptorBatchMethods* methods) override {
    // The call ended: its context may go, so the registration goes first.
    if (methods->QueryInterceptionHookPoint(
            InterceptionHookPoints::POST_RECV_STATUS)) {
      registration_.reset();
    }
    methods->Proceed();
  }

 private:
  std::optional<Cancellation::Registration> registration_;
};

class CancelCallInterceptorFactory
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo* info) override {
    Cancellation* cancellation = ScopedCancellation::Current();
    if (cancellation == nullptr) return nullptr;  // nothing to watch
    return new CancelCallInterceptor(info->client_context(), cancellation);
  }
};

class IdleCallInterceptorFactory
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit IdleCallInterceptorFactory(absl::Duration idle) : idle_(idle) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo* info) override {
    // Made on the thread that starts the call: its scope's deadline.
    return new IdleCallInterceptor(info->client_context(), idle_,
                                   ScopedCallDeadline::Current());
  }

 private:
  const absl::Duration idle_;
};

}  // namespace

Watchdog::Watchdog() : thread_([this] { Loop(); }) {}

Watchdog::~Watchdog() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

Watchdog& Watchdog::Default() {
  static Watchdog* const watchdog = new Watchdog();
  return *watchdog;
}

uint64_t Watchdog::Arm(absl::Time deadline, std::function<void()> fire) {
  absl::MutexLock lock(&mu_);
  const uint64_t id = next_id_++;
  alarms_.emplace(std::make_pair(deadline, id), std::move(fire));
  deadlines_.emplace(id, deadline);
  return id;
}

bool Watchdog::Disarm(uint64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = deadlines_.find(id);
  if (it != deadlines_.end()) {
    alarms_.erase(std::make_pair(it->second, id));
    deadlines_.erase(it);
    return true;
  }
  // Firing now: wait it out (unless this is the firing callback itself).
  if (std::this_thread::get_id() != thread_.get_id()) {
    auto done = [this, id]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return firing_ != id;
    };
    mu_.Await(absl::Condition(&done));
  }
  return false;
}

void Watchdog::Loop() {
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    // Sleep until the earliest alarm, an earlier one, or stop.
    if (alarms_.empty()) {
      auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || !alarms_.empty();
      };
      mu_.Await(absl::Condition(&woken));
      continue;
    }
    const absl::Time next = alarms_.begin()->first.first;
    if (next > absl::Now()) {
      auto woken = [this, next]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || alarms_.empty() || alarms_.begin()->first.first < next;
      };
      mu_.AwaitWithDeadline(absl::Condition(&woken), next);
      continue;
    }
    auto first = alarms_.begin();
    const uint64_t id = first->first.second;
    std::function<void()> fire = std::move(first->second);
    alarms_.erase(first);
    deadlines_.erase(id);
    firing_ = id;
    mu_.Unlock();
    fire();
    mu_.Lock();
    firing_ = 0;
  }
}

ScopedCallDeadline::ScopedCallDeadline(absl::Time deadline)
    : previous_(current_call_deadline) {
  current_call_deadline = std::min(previous_, deadline);
}

ScopedCallDeadline::~ScopedCallDeadline() { current_call_deadline = previous_; }

ScopedCancellation::ScopedCancellation(Cancellation* cancellation)
    : previous_(current_cancellation) {
  if (cancellation != nullptr) current_cancellation = cancellation;
}

ScopedCancellation::~ScopedCancellation() { current_cancellation = previous_; }

Cancellation* ScopedCancellation::Current() { return current_cancellation; }

absl::Time ScopedCallDeadline::Current() {
  return std::min(current_call_deadline, ProcessDeadline());
}

absl::Duration CallTimeout(absl::Duration timeout) {
  const absl::Time deadline = ScopedCallDeadline::Current();
  if (deadline == absl::InfiniteFuture()) return timeout;
  return std::max(absl::ZeroDuration(),
                  std::min(timeout, deadline - absl::Now()));
}

void DisableLockDebuggingOnce() {
  static absl::once_flag once;
  absl::call_once(once, [] {
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  });
}

bool IsHostPort(absl::string_view endpoint) {
  const size_t colon = endpoint.rfind(':');
  if (colon == absl::string_view::npos || colon == 0 || endpoint.size() > 255) {
    return false;
  }
  uint32_t port = 0;
  if (!absl::SimpleAtoi(endpoint.substr(colon + 1), &port) || port == 0 ||
      port > 65535) {
    return false;
  }
  for (char c : endpoint.substr(0, colon)) {
    if (!absl::ascii_isalnum(c) && c != '.' && c != '-' && c != '[' &&
        c != ']' && c != ':') {
      return false;
    }
  }
  return true;
}

absl::StatusOr<std::string> ChannelTarget(const std::string& addresses) {
  if (addresses.find(',') == std::string::npos) return addresses;
  std::vector<std::string> v4, v6;
  for (absl::string_view entry : absl::StrSplit(addresses, ',')) {
    if (!IsHostPort(entry)) {
      return absl::InvalidArgumentError(
          absl::StrCat("address '", entry, "' is not HOST:PORT"));
    }
    const size_t colon = entry.rfind(':');
    std::string host(entry.substr(0, colon));
    const std::string port(entry.substr(colon + 1));
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
      host = host.substr(1, host.size() - 2);
    }
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    if (getaddrinfo(host.c_str(), port.c_str(), &hints, &found) != 0 ||
        found == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("address '", entry, "' does not resolve"));
    }
    char text[INET6_ADDRSTRLEN] = {};
    if (found->ai_family == AF_INET) {
      inet_ntop(AF_INET,
                &reinterpret_cast<sockaddr_in*>(found->ai_addr)->sin_addr, text,
                sizeof(text));
      v4.push_back(absl::StrCat(text, ":", port));
    } else {
      inet_ntop(AF_INET6,
                &reinterpret_cast<sockaddr_in6*>(found->ai_addr)->sin6_addr,
                text, sizeof(text));
      v6.push_back(absl::StrCat("[", text, "]:", port));
    }
    freeaddrinfo(found);
  }
  if (!v4.empty() && !v6.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "addresses '", addresses, "' mix IPv4 and IPv6: give one kind"));
  }
  return v4.empty() ? absl::StrCat("ipv6:", absl::StrJoin(v6, ","))
                    : absl::StrCat("ipv4:", absl::StrJoin(v4, ","));
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address,
                                           const ChannelOptions& options) {
  DisableLockDebuggingOnce();
  grpc::ChannelArguments args;
  const std::string& target = address;
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
  args.SetMaxSendMessageSize(options.max_message_bytes);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, Millis(options.keepalive_time));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, Millis(options.keepalive_timeout));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS,
              Millis(options.max_reconnect_backoff));
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS,
              Millis(options.initial_reconnect_backoff));
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS,
              Millis(options.connect_timeout));
  // Each channel gets its own TCP connection (no sharing between channels).
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  // Bulk streams: a large fixed flow-control window instead of growing it
  // from 64 KiB by BDP probes, and big reads off the socket.
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, kStreamWindowBytes);
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, kMaxFrameBytes);
  args.SetInt(GRPC_ARG_TCP_MIN_READ_CHUNK_SIZE, 64 << 10);
  args.SetInt(GRPC_ARG_TCP_MAX_READ_CHUNK_SIZE, 8 << 20);
  std::shared_ptr<grpc::ChannelCredentials> credentials =
      options.credentials != nullptr ? options.credentials
                                     : grpc::InsecureChannelCredentials();
  ClientInterceptorFactories interceptors;
  if (options.interceptors) interceptors = options.interceptors();
  if (options.idle_timeout != absl::InfiniteDuration()) {
    interceptors.push_back(
        std::make_unique<IdleCallInterceptorFactory>(options.idle_timeout));
  }
  interceptors.push_back(std::make_unique<CancelCallInterceptorFactory>());
  if (!interceptors.empty()) {
    return grpc::experimental::CreateCustomChannelWithInterceptors(
        target, credentials, args, std::move(interceptors));
  }
  return grpc::CreateCustomChannel(target, credentials, args);
}

void ConfigureServerBuilder(grpc::ServerBuilder* builder,
                            const ServerOptions& options) {
  DisableLockDebuggingOnce();
  builder->SetMaxReceiveMessageSize(options.max_message_bytes);
  builder->SetMaxSendMessageSize(options.max_message_bytes);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES,
                              kStreamWindowBytes);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, kMaxFrameBytes);
  builder->AddChannelArgument(GRPC_ARG_TCP_MIN_READ_CHUNK_SIZE, 64 << 10);
  builder->AddChannelArgument(GRPC_ARG_TCP_MAX_READ_CHUNK_SIZE, 8 << 20);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS,
                              Millis(options.keepalive_time));
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
                              Millis(options.keepalive_timeout));
  // Clients ping idle connections every keepalive_time: allow it.
  builder->AddChannelArgument(
      GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
      Millis(options.keepalive_time) / 2);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder->AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
                              Millis(options.handshake_timeout));
  if (options.max_concurrent_streams > 0) {
    builder->AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                                options.max_concurrent_streams);
  }
  if (options.max_threads > 0) {
    grpc::ResourceQuota quota("tessera-server");
    quota.SetMaxThreads(options.max_threads);
    builder->SetResourceQuota(quota);
  }
  std::vector<
      std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
      interceptors;
  if (options.interceptors) interceptors = options.interceptors();
  if (options.metrics != nullptr) {
    interceptors.push_back(MakeRpcMetricsInterceptorFactory(options.metrics));
  }
  if (!interceptors.empty()) {
    builder->experimental().SetInterceptorCreators(std::move(interceptors));
  }
}

std::shared_ptr<grpc::Channel> ChannelCache::Get(const std::string& address) {
  std::shared_ptr<grpc::Channel> evicted;  // released outside the lock
  absl::MutexLock lock(&mu_);
  auto it = channels_.find(address);
  if (it != channels_.end()) {
    uses_.splice(uses_.begin(), uses_, it->second.use);
    return it->second.channel;
  }
  if (max_channels_ > 0 && channels_.size() >= max_channels_) {
    auto oldest = channels_.find(uses_.back());
    evicted = std::move(oldest->second.channel);
    channels_.erase(oldest);
    uses_.pop_back();
  }
  uses_.push_front(address);
  Entry& entry = channels_[address];
  entry.channel = MakeChannel(address, options_);
  entry.use = uses_.begin();
  return entry.channel;
}

void ChannelCache::Forget(const std::string& address) {
  std::shared_ptr<grpc::Channel> forgotten;  // released outside the lock
  absl::MutexLock lock(&mu_);
  auto it = channels_.find(address);
  if (it == channels_.end()) return;
  forgotten = std::move(it->second.channel);
  uses_.erase(it->second.use);
  channels_.erase(it);
}

size_t ChannelCache::size() const {
  absl::MutexLock lock(&mu_);
  return channels_.size();
}

}  // namespace tessera
