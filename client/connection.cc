#include "client/connection.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "rpc/status.h"

namespace tessera {

Connection::Connection(std::string coordinator_address, ClientOptions options)
    : coordinator_address_(std::move(coordinator_address)),
      options_(options),
      coordinator_(v1::Coordinator::NewStub(MakeChannel(coordinator_address_))),
      data_plane_(TransportChain::Make(&workers_, [&] {
        DataPlaneOptions data;
        data.timeout = options_.data_timeout;
        data.shared_memory = options_.shared_memory;
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
