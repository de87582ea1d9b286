#include "worker/testing/served_worker.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace tessera {

absl::StatusOr<ServedWorker> ServeWorker(
    WorkerNode* node, const std::vector<grpc::Service*>& more) {
  ServedWorker served;
  served.service = std::make_unique<WorkerService>(node);
  std::vector<grpc::Service*> services = {served.service.get()};
  services.insert(services.end(), more.begin(), more.end());
  TESSERA_ASSIGN_OR_RETURN(served.server, StartServer("127.0.0.1:0", services));
  served.address = absl::StrCat("127.0.0.1:", served.server.port);
  return served;
}

}  // namespace tessera
