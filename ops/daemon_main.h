// The life of a daemon process, the same for both daemons: --version,
// logging, the options its flags give, its TLS, Start, a termination
// signal (or the daemon failing for good), Stop within --shutdown_grace.
// Exit codes: 0 stopped, 1 failed (files, TLS, ports, a refusal), 2 a flag
// at fault.
#ifndef TESSERA_OPS_DAEMON_MAIN_H_
#define TESSERA_OPS_DAEMON_MAIN_H_

#include <cstdlib>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "ops/daemon_security.h"
#include "rpc/signals.h"
#include "spdlog/spdlog.h"

namespace tessera {

// --metrics_listen, which both daemons have.
std::string MetricsListenFlag();

// What a flag's text gave (`parsed`), or why not as INVALID_ARGUMENT naming
// `flag`: "--device: <why>" (a flag at fault: exit 2).
template <typename T>
absl::StatusOr<T> FlagValue(absl::string_view flag, absl::StatusOr<T> parsed) {
  if (parsed.ok()) return parsed;
  return absl::InvalidArgumentError(
      absl::StrCat(flag, ": ", parsed.status().message()));
}

// --version (prints it: exit 0) and --log_format (exit 2 when it is not
// one); nullopt to go on.
std::optional<int> BeginDaemonProcess(const std::string& program);
// Logs `status`, returns `exit_code`.
int DaemonExit(const absl::Status& status, int exit_code);
// What a daemon's on_fatal does in a process: wakes its signal wait.
void WakeSignalWait();
// The end of a stop that outlived the grace: handlers still run on what
// the daemon holds, which must not be destroyed under them.
[[noreturn]] void ExitPastGrace();

// `Daemon` has Start(Options), failure() and Stop(grace); `Options` has
// listen, security, on_fatal and shutdown_grace.
template <typename Daemon, typename Options>
int RunDaemonProcess(const std::string& program,
                     absl::StatusOr<Options> (*options_from_flags)(),
                     bool (*uses_tokens)(const Options&)) {
  if (std::optional<int> exit = BeginDaemonProcess(program)) return *exit;
  absl::StatusOr<Options> options = options_from_flags();
  if (!options.ok()) return DaemonExit(options.status(), 2);
  absl::StatusOr<DaemonSecurity> security =
      DaemonSecurityFromFlags(options->listen, uses_tokens(*options));
  if (!security.ok()) return DaemonExit(security.status(), 1);
  options->security = *std::move(security);
  options->on_fatal = WakeSignalWait;
  const absl::Duration grace = options->shutdown_grace;
  absl::StatusOr<std::unique_ptr<Daemon>> daemon =
      Daemon::Start(*std::move(options));
  if (!daemon.ok()) return DaemonExit(daemon.status(), 1);
  const int sig = WaitForTerminationSignal();
  if (!(*daemon)->failure().ok()) {
    // Every acknowledged change is durable already.
    if (!(*daemon)->Stop(absl::ZeroDuration())) std::_Exit(1);
    return 1;
  }
  spdlog::info("signal {} received; shutting down", sig);
  if (!(*daemon)->Stop(grace)) ExitPastGrace();
  spdlog::info("stopped");
  return 0;
}

}  // namespace tessera

#endif  // TESSERA_OPS_DAEMON_MAIN_H_
