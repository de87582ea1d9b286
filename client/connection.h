// Connection: what every SDK object shares — the coordinator stub, one
// channel per worker, the data plane (which moves shard bytes and counts
// them per transport), and the client's options. Thread-safe; shared by the
// Client and the ShardHandles it hands out, so handles outlive nothing.
#ifndef TESSERA_CLIENT_CONNECTION_H_
#define TESSERA_CLIENT_CONNECTION_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/client_options.h"
#include "core/tensor_metadata.h"
#include "core/worker_info.h"
#include "proto/coordinator.grpc.pb.h"
#include "proto/worker.grpc.pb.h"
#include "rpc/channel.h"
#include "rpc/coordinator_channel.h"
#include "rpc/leader_channels.h"
#include "transport/transport_chain.h"

namespace tessera {

class TlsContextSource;  // rpc/tls_context.h

class Connection {
 public:
  // Fails when the TLS files cannot be used (UNAUTHENTICATED for an expired
  // or unreadable certificate), or with INVALID_ARGUMENT for an unknown
  // options.transport.
  static absl::StatusOr<std::shared_ptr<Connection>> Make(
      std::string coordinator_address, ClientOptions options);
  // `data_tls`: mutual TLS to workers' data ports (null: plaintext).
  Connection(std::string coordinator_address, ClientOptions options,
             ChannelOptions coordinator_channel, ChannelOptions worker_channels,
             std::shared_ptr<TlsContextSource> data_tls = nullptr);

  const std::string& coordinator_address() const {
    return coordinator_address_;
  }
  const ClientOptions& options() const { return options_; }
  // The coordinator to call now: the leader, as far as is known, when
  // several were given (leaders()).
  std::shared_ptr<v1::Coordinator::Stub> coordinator();
  // Several coordinators: where calls go (CallOptions::leaders). Null for
  // one.
  LeaderChannels* leaders() const { return coordinator_->leaders(); }
  std::unique_ptr<v1::Worker::Stub> WorkerStub(const std::string& address);
  // The one channel to a worker, shared by every call to it.
  std::shared_ptr<grpc::Channel> WorkerChannel(const std::string& address);
  // Drops the channel to a worker that could not be reached (it may have
  // restarted): the next call connects afresh instead of waiting out
  // gRPC's reconnect backoff.
  void ForgetWorker(const std::string& address) { workers_.Forget(address); }
  // Moves shard bytes to and from workers as options().transport says:
  // same-host shared memory, UCX, workers' data ports, gRPC; counts bytes
  // per transport.
  TransportChain& data_plane() { return *data_plane_; }

  // How near the worker at `address` is to this client (reads go to the
  // nearest replica): on this host, in this client's zone (the workers'
  // zones as last listed, NoteWorkers), and its reads in flight.
  ReplicaNearness NearnessOf(const std::string& address);
  void NoteWorkers(const std::vector<WorkerInfo>& workers);

 private:
  const std::string coordinator_address_;
  const ClientOptions options_;
  std::unique_ptr<CoordinatorChannel> coordinator_;
  ChannelCache workers_;
  const std::unique_ptr<TransportChain> data_plane_;  // uses workers_
  const std::string zone_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::string> zones_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera

#endif  // TESSERA_CLIENT_CONNECTION_H_
