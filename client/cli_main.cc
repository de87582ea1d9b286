// `tessera`: the command-line client (see shared/CLI.md and cli_commands.h).
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "client/cli_commands.h"

int main(int argc, char** argv) {
  // gRPC's own logging would add lines to stderr; the CLI reports errors
  // itself, in one line. GRPC_VERBOSITY set by the user still wins.
  setenv("GRPC_VERBOSITY", "NONE", /*overwrite=*/0);
  std::vector<std::string> args(argv + 1, argv + argc);
  return tessera::cli::RunCli(args, std::getenv("TESSERA_COORDINATOR"),
                              std::cout, std::cerr);
}
