// The `tessera` command-line tool (contract: shared/CLI.md): argument
// parsing, one function per command, and the mapping of errors to exit
// codes (0 ok, 1 error, 2 usage) and a single `error: ...` line on stderr.
//
// Everything that can be checked locally (flags, names, shapes, dtypes,
// ranges, placements, init modes) is parsed before the coordinator is
// contacted, so usage errors exit 2 even with no cluster. Flags accept both
// `--flag=value` and `--flag value`; global flags come before COMMAND.
//
// No global state besides what the functions are given; RunCli may be
// called more than once in a process (tests do).
#ifndef TESSERA_CLIENT_CLI_COMMANDS_H_
#define TESSERA_CLIENT_CLI_COMMANDS_H_

#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace tessera {
namespace cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitError = 1;
inline constexpr int kExitUsage = 2;

// A usage error (exit 2): INVALID_ARGUMENT with a marker payload. The second
// form marks an existing status, keeping its message.
absl::Status UsageError(absl::string_view message);
absl::Status UsageError(const absl::Status& status);
bool IsUsageError(const absl::Status& status);

struct GlobalOptions {
  // HOST:PORT; from --coordinator, else $TESSERA_COORDINATOR, else
  // 127.0.0.1:7070.
  std::string coordinator = "127.0.0.1:7070";
  // Print detail after the error line.
  bool verbose = false;
  // CLI.md "Security": from the flags, else $TESSERA_TLS_CA,
  // $TESSERA_TLS_CERT, $TESSERA_TLS_KEY and $TESSERA_TOKEN_FILE.
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
  std::string token_file;
  // CLI.md "Data plane and output": from --transport, else
  // $TESSERA_TRANSPORT, else auto; one of auto shm ucx grpc.
  std::string transport = "auto";
  // --timeout=SECONDS: the whole command fails with "timed out" once this
  // long has passed (every call it makes is cut to it); 0: no limit.
  double timeout_s = 0;
};

// One parsed command line: COMMAND, its positional arguments and its flags
// (names without "--"; boolean flags hold "true" or "false").
struct Invocation {
  GlobalOptions global;
  std::string command;
  std::vector<std::string> positional;
  std::map<std::string, std::string> flags;
  // Where messages go when stdout carries data (`--output=-`).
  std::ostream* err = nullptr;

  bool Has(const std::string& flag) const { return flags.count(flag) > 0; }
  std::optional<std::string> Get(const std::string& flag) const;
  bool GetBool(const std::string& flag) const;
};

// The commands. Each validates its flags first (usage errors), then talks
// to the cluster and prints its result to `out`.
absl::Status RunWorkers(const Invocation& inv, std::ostream& out);
absl::Status RunCoordinators(const Invocation& inv, std::ostream& out);
absl::Status RunQuota(const Invocation& inv, std::ostream& out);
absl::Status RunCreate(const Invocation& inv, std::ostream& out);
absl::Status RunPut(const Invocation& inv, std::ostream& out);
absl::Status RunGet(const Invocation& inv, std::ostream& out);
absl::Status RunDescribe(const Invocation& inv, std::ostream& out);
absl::Status RunList(const Invocation& inv, std::ostream& out);
absl::Status RunReshard(const Invocation& inv, std::ostream& out);
absl::Status RunRemove(const Invocation& inv, std::ostream& out);
absl::Status RunImport(const Invocation& inv, std::ostream& out);
absl::Status RunLoad(const Invocation& inv, std::ostream& out);
absl::Status RunSave(const Invocation& inv, std::ostream& out);
absl::Status RunWorker(const Invocation& inv, std::ostream& out);
absl::Status RunWait(const Invocation& inv, std::ostream& out);
absl::Status RunExport(const Invocation& inv, std::ostream& out);
absl::Status RunCompletion(const Invocation& inv, std::ostream& out);

// Runs the CLI on `args` (argv without the program name). `env_coordinator`
// is $TESSERA_COORDINATOR (null or empty when unset). Returns the exit code.
int RunCli(const std::vector<std::string>& args, const char* env_coordinator,
           std::ostream& out, std::ostream& err);

}  // namespace cli
}  // namespace tessera

#endif  // TESSERA_CLIENT_CLI_COMMANDS_H_
