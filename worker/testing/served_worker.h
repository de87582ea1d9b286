// ServedWorker: a WorkerService over a WorkerNode, served in this process on
// a free port of 127.0.0.1 as the worker daemon serves it, for tests that
// talk to a worker over gRPC. Tests only.
#ifndef TESSERA_WORKER_TESTING_SERVED_WORKER_H_
#define TESSERA_WORKER_TESTING_SERVED_WORKER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "rpc/server.h"
#include "worker/worker_node.h"
#include "worker/worker_service.h"

namespace tessera {

struct ServedWorker {
  std::unique_ptr<WorkerService> service;
  RunningServer server;
  std::string address;  // "127.0.0.1:<port>"

  // Shuts the server down, when one was started (a fixture's TearDown).
  void Shutdown() {
    if (server.server != nullptr) server.server->Shutdown();
  }
};

// Serves `node`, which must outlive the result, beside `more` services
// (UCX's, a test's own; not owned, they outlive it too).
absl::StatusOr<ServedWorker> ServeWorker(
    WorkerNode* node, const std::vector<grpc::Service*>& more = {});

}  // namespace tessera

#endif  // TESSERA_WORKER_TESTING_SERVED_WORKER_H_
