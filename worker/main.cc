// tessera-worker: holds shards in memory and serves them.
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "ops/daemon_help.h"
#include "ops/daemon_security.h"
#include "ops/heap.h"
#include "ops/logging.h"
#include "ops/version.h"
#include "rpc/signals.h"
#include "spdlog/spdlog.h"
#include "worker/worker_daemon.h"
#include "worker/worker_flags.h"

namespace tessera {
namespace {

int Run() {
  if (WorkerVersionFlag()) {
    PrintVersion("tessera-worker");
    return 0;
  }
  if (absl::Status s =
          ConfigureLogging(WorkerLogFormatFlag(), "tessera-worker");
      !s.ok()) {
    spdlog::error("{}", std::string(s.message()));
    return 2;
  }
  absl::StatusOr<WorkerDaemonOptions> options = WorkerDaemonOptionsFromFlags();
  if (!options.ok()) {
    spdlog::error("{}", std::string(options.status().message()));
    return 2;
  }
  absl::StatusOr<DaemonSecurity> security =
      DaemonSecurityFromFlags(options->listen, !options->token_file.empty());
  if (!security.ok()) {
    spdlog::error("{}", std::string(security.status().message()));
    return 1;
  }
  options->security = *std::move(security);
  // A daemon that fails for good wakes the signal wait below.
  options->on_fatal = [] { kill(getpid(), SIGTERM); };
  const absl::Duration grace = options->shutdown_grace;
  absl::StatusOr<std::unique_ptr<WorkerDaemon>> daemon =
      WorkerDaemon::Start(*std::move(options));
  if (!daemon.ok()) {
    spdlog::error("{}", std::string(daemon.status().message()));
    return 1;
  }
  const int sig = WaitForTerminationSignal();
  if (!(*daemon)->failure().ok()) {
    if (!(*daemon)->Stop(absl::ZeroDuration())) std::_Exit(1);
    return 1;
  }
  spdlog::info("signal {} received; shutting down", sig);
  if (!(*daemon)->Stop(grace)) {
    // A handler ignores its cancellation: the grace bounds the exit, and
    // what the handlers use must not be destroyed under them.
    spdlog::warn("calls still running after the shutdown grace; exiting");
    spdlog::default_logger()->flush();
    std::_Exit(0);
  }
  spdlog::info("stopped");
  return 0;
}

}  // namespace
}  // namespace tessera

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
  return tessera::Run();
}
