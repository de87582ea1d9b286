// tessera-worker: holds shards in memory and serves them.
#include <string>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "ops/daemon_help.h"
#include "ops/daemon_main.h"
#include "ops/heap.h"
#include "rpc/signals.h"
#include "worker/worker_daemon.h"
#include "worker/worker_flags.h"

int main(int argc, char** argv) {
  tessera::RetainFreedBuffers();
  tessera::BlockTerminationSignals();
  absl::SetProgramUsageMessage(
      "tessera-worker --coordinator=HOST:PORT --listen=HOST:PORT --name=NAME");
  if (tessera::PrintDaemonHelp(argc, argv,
                               std::string(absl::ProgramUsageMessage()),
                               "worker/worker_flags.cc")) {
    return 0;
  }
  absl::ParseCommandLine(argc, argv);
  return tessera::RunDaemonProcess<tessera::WorkerDaemon>(
      "tessera-worker", &tessera::WorkerDaemonOptionsFromFlags,
      +[](const tessera::WorkerDaemonOptions& o) {
        return !o.token_file.empty();
      });
}
