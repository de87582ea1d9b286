#include "rpc/standby_service.h"

#include "absl/strings/str_cat.h"
#include "rpc/leader_channels.h"
#include "rpc/status.h"

namespace tessera {
namespace {

// Answers at once, without reading the request.
class StandbyAnswer : public grpc::ServerGenericBidiReactor {
 public:
  explicit StandbyAnswer(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace

void StandbyService::SetLeader(std::string leader) {
  absl::MutexLock lock(&mu_);
  leader_ = std::move(leader);
}

grpc::ServerGenericBidiReactor* StandbyService::CreateReactor(
    grpc::GenericCallbackServerContext* context) {
  std::string leader;
  {
    absl::MutexLock lock(&mu_);
    leader = leader_;
  }
  context->AddTrailingMetadata(kStandbyTrailer, self_);
  if (!leader.empty()) context->AddTrailingMetadata(kLeaderTrailer, leader);
  return new StandbyAnswer(ToGrpcStatus(absl::UnavailableError(
      leader.empty()
          ? absl::StrCat("the coordinator at ", self_,
                         " stands by and no coordinator leads yet (a "
                         "failover is under way): try again in a moment")
          : absl::StrCat("the coordinator at ", self_,
                         " stands by; the leader is at ", leader))));
}

}  // namespace tessera
