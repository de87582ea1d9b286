// The flags of tessera-coordinator, read in one place into
// CoordinatorDaemonOptions.
#ifndef TESSERA_COORDINATOR_COORDINATOR_FLAGS_H_
#define TESSERA_COORDINATOR_COORDINATOR_FLAGS_H_

#include <string>

#include "absl/status/statusor.h"
#include "coordinator/coordinator_daemon.h"

namespace tessera {

// The options the coordinator's flags give (the shared listener flags of
// ops/ included), checked, with etcd's TLS files read: an error names the
// flag at fault (exit 2). The tokens file and the daemon's own TLS files
// are read at Start.
absl::StatusOr<CoordinatorDaemonOptions> CoordinatorDaemonOptionsFromFlags();

}  // namespace tessera

#endif  // TESSERA_COORDINATOR_COORDINATOR_FLAGS_H_
