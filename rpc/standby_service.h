// StandbyService: what a coordinator standing by answers on its port
// (CLI.md "Highly available coordinator (v3)"): every call, whatever its
// method, UNAVAILABLE naming the leader, with the trailers that send
// clients and workers given several addresses there at once
// (rpc/leader_channels.h). No call is run; health stays NOT_SERVING.
#ifndef TESSERA_RPC_STANDBY_SERVICE_H_
#define TESSERA_RPC_STANDBY_SERVICE_H_

#include <grpcpp/generic/async_generic_service.h>

#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace tessera {

class StandbyService : public grpc::CallbackGenericService {
 public:
  // `self`: this coordinator's advertised address, for the message.
  explicit StandbyService(std::string self) : self_(std::move(self)) {}

  // The address the leader serves at ("" while none does).
  void SetLeader(std::string leader) ABSL_LOCKS_EXCLUDED(mu_);

  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext* context) override
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const std::string self_;
  absl::Mutex mu_;
  std::string leader_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera

#endif  // TESSERA_RPC_STANDBY_SERVICE_H_
