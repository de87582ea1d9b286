// `tessera`: the command-line client (see shared/CLI.md and cli_commands.h).
//
// Running out of memory is an error like any other: one `error: out of
// memory ...` line on stderr and exit 1, never a signal. std::bad_alloc on
// the main thread is caught around the command; on any other thread (the
// data plane's parallel reads) it would reach std::terminate, whose handler
// here says the same and exits 1.
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <exception>
#include <iostream>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "client/cli_commands.h"
#include "ops/heap.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

namespace {

// The handler std::terminate had before ours: other exceptions go there.
std::terminate_handler g_previous_terminate = nullptr;

void ReportOutOfMemory() {
  // write(2) of a constant: nothing here may allocate again.
  static const char kLine[] =
      "error: out of memory (the array, or a buffer it needs, does not fit "
      "in this machine's memory)\n";
  ssize_t unused = write(STDERR_FILENO, kLine, sizeof(kLine) - 1);
  (void)unused;
}

[[noreturn]] void OnTerminate() {
  if (std::exception_ptr current = std::current_exception()) {
    try {
      std::rethrow_exception(current);
    } catch (const std::bad_alloc&) {
      ReportOutOfMemory();
      std::_Exit(tessera::cli::kExitError);
    } catch (...) {
    }
  }
  if (g_previous_terminate != nullptr) g_previous_terminate();
  std::abort();
}

}  // namespace

int main(int argc, char** argv) {
  tessera::RetainFreedBuffers();
  g_previous_terminate = std::set_terminate(OnTerminate);
  // A pipe whose reader has gone (`tessera get x --output=- | head -c 10`)
  // is a write error reported in one line, with the spooled file removed,
  // not a silent death by SIGPIPE.
  signal(SIGPIPE, SIG_IGN);
  // gRPC's own logging would add lines to stderr; the CLI reports errors
  // itself, in one line. GRPC_VERBOSITY set by the user still wins.
  setenv("GRPC_VERBOSITY", "NONE", /*overwrite=*/0);
  // stdout carries only data and --json: what the libraries log (UCX's
  // lines among them) goes to stderr.
  spdlog::set_default_logger(std::make_shared<spdlog::logger>(
      "tessera", std::make_shared<spdlog::sinks::stderr_color_sink_mt>()));
  try {
    std::vector<std::string> args(argv + 1, argv + argc);
    return tessera::cli::RunCli(args, std::getenv("TESSERA_COORDINATOR"),
                                std::cout, std::cerr);
  } catch (const std::bad_alloc&) {
    std::cout.flush();
    ReportOutOfMemory();
    return tessera::cli::kExitError;
  }
}
