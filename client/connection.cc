#include "client/connection.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "rpc/security.h"
#include "rpc/status.h"
#include "rpc/tls_context.h"

namespace tessera {

absl::StatusOr<std::shared_ptr<Connection>> Connection::Make(
    std::string coordinator_address, ClientOptions options) {
  ChannelOptions coordinator_channel;
  ChannelOptions worker_channels;
  if (absl::Status s = CheckTransportName(options.transport); !s.ok()) {
    return s;
  }
  const TlsFiles files{options.tls_ca, options.tls_cert, options.tls_key};
  std::shared_ptr<TlsContextSource> tcp_tls;
  if (files.enabled()) {
    absl::StatusOr<TlsMaterial> tls = LoadTls(files, /*need_cert=*/false);
    if (!tls.ok()) return tls.status();
    coordinator_channel.credentials = ChannelCredentialsFor(*tls);
    absl::StatusOr<std::shared_ptr<TlsContextSource>> data_tls =
        TlsContextSource::Fixed(*tls, TlsContextSource::Side::kClient);
    if (!data_tls.ok()) return data_tls.status();
    tcp_tls = *std::move(data_tls);
    worker_channels.credentials = coordinator_channel.credentials;
  }
  // Only the coordinator sees the secret; workers take capabilities.
  if (!options.token.empty()) {
    coordinator_channel.interceptors = BearerTokenInterceptors(options.token);
  }
  return std::make_shared<Connection>(
      std::move(coordinator_address), std::move(options),
      std::move(coordinator_channel), std::move(worker_channels),
      std::move(tcp_tls));
}

Connection::Connection(std::string coordinator_address, ClientOptions options,
                       ChannelOptions coordinator_channel,
                       ChannelOptions worker_channels,
                       std::shared_ptr<TlsContextSource> data_tls)
    : coordinator_address_(std::move(coordinator_address)),
      options_(options),
      workers_(std::move(worker_channels)),
      data_plane_(TransportChain::Make(&workers_,
                                       [&] {
                                         DataPlaneOptions data;
                                         data.timeout = options_.data_timeout;
                                         data.shared_memory =
                                             options_.shared_memory;
                                         data.transport = options_.transport;
                                         data.ucx_trusted_fabric =
                                             options_.trusted_fabric;
                                         data.tcp_tls = data_tls;
                                         return data;
                                       }())),
      zone_(!options_.zone.empty() ? options_.zone
            : std::getenv("TESSERA_ZONE") != nullptr
                ? std::getenv("TESSERA_ZONE")
                : "") {
  // A list that is not HOST:PORTs gets one channel as given: its calls
  // fail saying the coordinator cannot be reached there.
  absl::StatusOr<std::unique_ptr<CoordinatorChannel>> made =
      CoordinatorChannel::Make(coordinator_address_, coordinator_channel);
  coordinator_ = made.ok() ? *std::move(made)
                           : CoordinatorChannel::Single(coordinator_address_,
                                                        coordinator_channel);
}

std::shared_ptr<v1::Coordinator::Stub> Connection::coordinator() {
  return coordinator_->stub();
}

namespace {

// The host part of HOST:PORT ("[::1]:7" gives "::1").
std::string HostOf(const std::string& address) {
  std::string host = address.substr(0, address.rfind(':'));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  return host;
}

// This host's names and addresses, once: loopback, its hostname and every
// interface address.
const absl::flat_hash_set<std::string>& LocalHosts() {
  static const auto* hosts = [] {
    auto* out = new absl::flat_hash_set<std::string>{"localhost", "::1"};
    char name[256] = {};
    if (gethostname(name, sizeof(name) - 1) == 0) out->insert(name);
    ifaddrs* list = nullptr;
    if (getifaddrs(&list) == 0) {
      for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
        if (a->ifa_addr == nullptr) continue;
        char text[INET6_ADDRSTRLEN] = {};
        const int family = a->ifa_addr->sa_family;
        const void* raw =
            family == AF_INET
                ? static_cast<const void*>(
                      &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr)
            : family == AF_INET6
                ? static_cast<const void*>(
                      &reinterpret_cast<sockaddr_in6*>(a->ifa_addr)->sin6_addr)
                : nullptr;
        if (raw != nullptr && inet_ntop(family, raw, text, sizeof(text)))
          out->insert(text);
      }
      freeifaddrs(list);
    }
    return out;
  }();
  return *hosts;
}

}  // namespace

ReplicaNearness Connection::NearnessOf(const std::string& address) {
  ReplicaNearness near;
  const std::string host = HostOf(address);
  near.same_host =
      absl::StartsWith(host, "127.") || LocalHosts().contains(host);
  if (!zone_.empty()) {
    absl::MutexLock lock(&mu_);
    auto it = zones_.find(address);
    near.same_zone = it != zones_.end() && it->second == zone_;
  }
  near.bytes_in_flight = data_plane_->InFlight(address);
  return near;
}

void Connection::NoteWorkers(const std::vector<WorkerInfo>& workers) {
  absl::MutexLock lock(&mu_);
  for (const WorkerInfo& w : workers) zones_[w.address] = w.zone;
}

std::unique_ptr<v1::Worker::Stub> Connection::WorkerStub(
    const std::string& address) {
  return v1::Worker::NewStub(workers_.Get(address));
}

std::shared_ptr<grpc::Channel> Connection::WorkerChannel(
    const std::string& address) {
  return workers_.Get(address);
}

}  // namespace tessera
