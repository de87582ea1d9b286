// A daemon's --help: its own flags, one line each.
#ifndef TESSERA_OPS_DAEMON_HELP_H_
#define TESSERA_OPS_DAEMON_HELP_H_

#include <string>

namespace tessera {

// When argv asks for help (--help, -h, --helpfull, or --help=TEXT to keep
// the flags whose name or help holds TEXT), prints `usage` and then the
// daemon's flags (those defined in `main_file`, e.g. "worker/main.cc", or
// in ops/, shared by both daemons), sorted, one line each with its
// default, and returns true: the caller exits 0. Abseil's own --help picks
// flags by the program's file name and found none of them.
bool PrintDaemonHelp(int argc, char** argv, const std::string& usage,
                     const std::string& main_file);

}  // namespace tessera

#endif  // TESSERA_OPS_DAEMON_HELP_H_
