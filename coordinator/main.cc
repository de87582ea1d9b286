// tessera-coordinator: worker membership and the global metadata of every
// sharded tensor.
#include <malloc.h>

#include <string>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "coordinator/coordinator_daemon.h"
#include "coordinator/coordinator_flags.h"
#include "ops/daemon_help.h"
#include "ops/daemon_main.h"
#include "rpc/signals.h"

int main(int argc, char** argv) {
  tessera::BlockTerminationSignals();
  // Blocks of 1 MiB and up (the shard lists of big tensors, their replies)
  // get their own mappings, returned to the system when freed. By default
  // glibc raises this threshold after the first such free, and later big
  // blocks then stay resident in its arenas.
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  absl::SetProgramUsageMessage(
      "tessera-coordinator --listen=HOST:PORT [--data_dir=DIR]");
  if (tessera::PrintDaemonHelp(argc, argv,
                               std::string(absl::ProgramUsageMessage()),
                               "coordinator/coordinator_flags.cc")) {
    return 0;
  }
  absl::ParseCommandLine(argc, argv);
  return tessera::RunDaemonProcess<tessera::CoordinatorDaemon>(
      "tessera-coordinator", &tessera::CoordinatorDaemonOptionsFromFlags,
      +[](const tessera::CoordinatorDaemonOptions& o) {
        return !o.tokens.empty();
      });
}
