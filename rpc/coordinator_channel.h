// CoordinatorChannel: how a client or a worker reaches the coordinator,
// given one address or several (A1,A2,...: one leads and the others stand
// by, rpc/leader_channels.h). Callers take stub() for each call and pass
// leaders() in its CallOptions; nothing else differs between the two.
#ifndef TESSERA_RPC_COORDINATOR_CHANNEL_H_
#define TESSERA_RPC_COORDINATOR_CHANNEL_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "proto/coordinator.grpc.pb.h"
#include "rpc/channel.h"
#include "rpc/leader_channels.h"

namespace tessera {

class CoordinatorChannel {
 public:
  // Several addresses: a coordinator that was down (restarting, moving) is
  // tried again within 200 ms, not after gRPC's minimum connect timeout or
  // a backoff grown to a second. Fails on a list that is not HOST:PORTs.
  static absl::StatusOr<std::unique_ptr<CoordinatorChannel>> Make(
      const std::string& addresses, ChannelOptions options);
  // One channel to `address` as given, whatever it holds.
  static std::unique_ptr<CoordinatorChannel> Single(
      const std::string& address, const ChannelOptions& options);

  // Several coordinators: where calls go (CallOptions::leaders). Null for
  // one.
  LeaderChannels* leaders() const { return leaders_.get(); }
  // The stub of the coordinator calls go to now.
  std::shared_ptr<v1::Coordinator::Stub> stub();

 private:
  CoordinatorChannel() = default;

  std::unique_ptr<LeaderChannels> leaders_;  // several
  std::unique_ptr<LeaderStubs<v1::Coordinator>> leader_stubs_;
  std::shared_ptr<v1::Coordinator::Stub> single_;  // one
};

}  // namespace tessera

#endif  // TESSERA_RPC_COORDINATOR_CHANNEL_H_
