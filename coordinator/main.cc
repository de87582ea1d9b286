// tessera-coordinator: worker membership and the global metadata of every
// sharded tensor.
#include <malloc.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <string>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "coordinator/coordinator_daemon.h"
#include "coordinator/coordinator_flags.h"
#include "ops/daemon_help.h"
#include "ops/daemon_security.h"
#include "ops/logging.h"
#include "ops/version.h"
#include "rpc/signals.h"
#include "spdlog/spdlog.h"

namespace tessera {
namespace {

int Run() {
  if (CoordinatorVersionFlag()) {
    PrintVersion("tessera-coordinator");
    return 0;
  }
  if (absl::Status s =
          ConfigureLogging(CoordinatorLogFormatFlag(), "tessera-coordinator");
      !s.ok()) {
    spdlog::error("{}", std::string(s.message()));
    return 2;
  }
  absl::StatusOr<CoordinatorDaemonOptions> options =
      CoordinatorDaemonOptionsFromFlags();
  if (!options.ok()) {
    spdlog::error("{}", std::string(options.status().message()));
    return 2;
  }
  absl::StatusOr<DaemonSecurity> security =
      DaemonSecurityFromFlags(options->listen, !options->tokens.empty());
  if (!security.ok()) {
    spdlog::error("{}", std::string(security.status().message()));
    return 1;
  }
  options->security = *std::move(security);
  // A daemon that fails for good wakes the signal wait below.
  options->on_fatal = [] { kill(getpid(), SIGTERM); };
  const absl::Duration grace = options->shutdown_grace;
  absl::StatusOr<std::unique_ptr<CoordinatorDaemon>> daemon =
      CoordinatorDaemon::Start(*std::move(options));
  if (!daemon.ok()) {
    spdlog::error("{}", std::string(daemon.status().message()));
    return 1;
  }
  const int sig = WaitForTerminationSignal();
  if (!(*daemon)->failure().ok()) {
    // Every acknowledged change is durable already.
    if (!(*daemon)->Stop(absl::ZeroDuration())) std::_Exit(1);
    return 1;
  }
  spdlog::info("signal {} received; shutting down", sig);
  if (!(*daemon)->Stop(grace)) {
    // A handler ignores its cancellation: the grace bounds the exit, and
    // what the handlers use must not be destroyed under them. Every
    // acknowledged change is durable already.
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
  return tessera::Run();
}
