#include "ops/daemon_main.h"

#include <signal.h>
#include <unistd.h>

#include "absl/flags/flag.h"
#include "ops/logging.h"
#include "ops/version.h"

ABSL_FLAG(std::string, metrics_listen, "",
          "serve Prometheus metrics at http://HOST:PORT/metrics (plaintext, "
          "no authentication); :PORT or PORT alone serves on 127.0.0.1; "
          "empty = off");
ABSL_FLAG(std::string, log_format, "text", "log lines as text or json");
ABSL_FLAG(std::string, log_level, "info",
          "the least severe log lines written: trace, debug, info, warn, "
          "error or off");
ABSL_FLAG(bool, version, false, "print the version and exit");

namespace tessera {

std::string MetricsListenFlag() { return absl::GetFlag(FLAGS_metrics_listen); }

std::optional<int> BeginDaemonProcess(const std::string& program) {
  if (absl::GetFlag(FLAGS_version)) {
    PrintVersion(program);
    return 0;
  }
  if (absl::Status s =
          ConfigureLogging(absl::GetFlag(FLAGS_log_format), program,
                           absl::GetFlag(FLAGS_log_level));
      !s.ok()) {
    return DaemonExit(s, 2);
  }
  return std::nullopt;
}

int DaemonExit(const absl::Status& status, int exit_code) {
  spdlog::error("{}", std::string(status.message()));
  return exit_code;
}

void WakeSignalWait() { kill(getpid(), SIGTERM); }

void ExitPastGrace() {
  spdlog::warn("calls still running after the shutdown grace; exiting");
  spdlog::default_logger()->flush();
  std::_Exit(0);
}

}  // namespace tessera
