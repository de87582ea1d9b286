#include "client/connection.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "rpc/security.h"
#include "rpc/status.h"

namespace tessera {

absl::StatusOr<std::shared_ptr<Connection>> Connection::Make(
    std::string coordinator_address, ClientOptions options) {
  ChannelOptions coordinator_channel;
  ChannelOptions worker_channels;
  if (absl::Status s = CheckTransportName(options.transport); !s.ok()) {
    return s;
  }
  const TlsFiles files{options.tls_ca, options.tls_cert, options.tls_key};
  if (files.enabled()) {
    absl::StatusOr<TlsMaterial> tls = LoadTls(files, /*need_cert=*/false);
    if (!tls.ok()) return tls.status();
    coordinator_channel.credentials = ChannelCredentialsFor(*tls);
    worker_channels.credentials = coordinator_channel.credentials;
  }
  // Only the coordinator sees the secret; workers take capabilities.
  if (!options.token.empty()) {
    coordinator_channel.interceptors = BearerTokenInterceptors(options.token);
  }
  return std::make_shared<Connection>(
      std::move(coordinator_address), std::move(options),
      std::move(coordinator_channel), std::move(worker_channels));
}

Connection::Connection(std::string coordinator_address, ClientOptions options,
                       ChannelOptions coordinator_channel,
                       ChannelOptions worker_channels)
    : coordinator_address_(std::move(coordinator_address)),
      options_(options),
      coordinator_(v1::Coordinator::NewStub(
          MakeChannel(coordinator_address_, coordinator_channel))),
      workers_(std::move(worker_channels)),
      data_plane_(TransportChain::Make(&workers_, [&] {
        DataPlaneOptions data;
        data.timeout = options_.data_timeout;
        data.shared_memory = options_.shared_memory;
        data.transport = options_.transport;
        data.ucx_trusted_fabric = options_.trusted_fabric;
        return data;
      }())) {}

std::unique_ptr<v1::Worker::Stub> Connection::WorkerStub(
    const std::string& address) {
  return v1::Worker::NewStub(workers_.Get(address));
}

std::shared_ptr<grpc::Channel> Connection::WorkerChannel(
    const std::string& address) {
  return workers_.Get(address);
}

}  // namespace tessera
