// How a daemon's log lines look: "text" (spdlog's default, for people) or
// "json" (one object per line, for log pipelines):
//   {"time":"2026-11-23T01:02:03.456789Z","level":"info","process":"tessera-worker","pid":4242,"thread":4250,"msg":"..."}
// and which of them are written (--log_level).
#ifndef TESSERA_OPS_LOGGING_H_
#define TESSERA_OPS_LOGGING_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace tessera {

// Sets the default logger's format and level ("trace", "debug", "info",
// "warn", "error" or "off": lines below it are not written);
// INVALID_ARGUMENT names the accepted values for anything else, and
// changes nothing.
absl::Status ConfigureLogging(absl::string_view format,
                              const std::string& process,
                              absl::string_view level = "info");

}  // namespace tessera

#endif  // TESSERA_OPS_LOGGING_H_
