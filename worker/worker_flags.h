// The flags of tessera-worker, read in one place into WorkerDaemonOptions.
#ifndef TESSERA_WORKER_WORKER_FLAGS_H_
#define TESSERA_WORKER_WORKER_FLAGS_H_

#include <string>

#include "absl/status/statusor.h"
#include "worker/worker_daemon.h"

namespace tessera {

// The options the worker's flags give (the shared TLS and listener flags of
// ops/ included), checked: INVALID_ARGUMENT names the flag at fault (exit
// 2). Reads --token_file's secret and the TLS files only at Start.
absl::StatusOr<WorkerDaemonOptions> WorkerDaemonOptionsFromFlags();

}  // namespace tessera

#endif  // TESSERA_WORKER_WORKER_FLAGS_H_
