// Daemons for tests and benchmarks: started with their output in a log
// file, gone with the process that started them; free loopback ports.
#ifndef TESSERA_TESTS_PROCESSES_H_
#define TESSERA_TESTS_PROCESSES_H_

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace tessera {

// Starts `argv` (argv[0] a path) with stdout and stderr appended to
// `log_path` and, when `open_files` > 0, that RLIMIT_NOFILE. It is killed
// when the calling thread's process dies (call from the main thread).
pid_t SpawnDaemon(const std::vector<std::string>& argv,
                  const std::string& log_path, uint64_t open_files = 0);

// In a forked child: becomes `argv` (argv[0] a path), or exits 127 when it
// cannot be run.
[[noreturn]] void ExecOrExit(const std::vector<std::string>& argv);

// A free TCP port on 127.0.0.1 (bound and released), below the ephemeral
// range so that no port bound to 0 or outgoing connection takes it first.
int PickFreePort();

}  // namespace tessera

#endif  // TESSERA_TESTS_PROCESSES_H_
