// Runs a check in a child process that can start no thread: the state of a
// daemon, or its container, at its limit of tasks. Root is bound by no
// such limit, so as root the child first becomes an otherwise unused user.
#ifndef TESSERA_CORE_TESTING_WITHOUT_THREADS_H_
#define TESSERA_CORE_TESTING_WITHOUT_THREADS_H_

#include <grp.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <functional>

namespace tessera::testing {

// Runs `body` in a forked child whose user may have one task (it has
// that one: every clone fails with EAGAIN) and returns its exit status:
// body's return value, 97 if it threw, 100 + signal if it died of one,
// or 99 when the child could not drop root or set the limit.
inline int RunWithoutThreads(const std::function<int()>& body) {
  std::fflush(nullptr);
  const pid_t child = fork();
  if (child < 0) return 98;
  if (child == 0) {
    // An unused uid: its task count is this child's alone.
    constexpr uid_t kNobodyElse = 10097;
    if (geteuid() == 0 &&
        (setgroups(0, nullptr) != 0 ||
         setresgid(kNobodyElse, kNobodyElse, kNobodyElse) != 0 ||
         setresuid(kNobodyElse, kNobodyElse, kNobodyElse) != 0)) {
      _exit(99);
    }
    const rlimit one{1, 1};
    if (setrlimit(RLIMIT_NPROC, &one) != 0) _exit(99);
    // Nothing may leave the child but its exit: the test framework it
    // forked from would go on running tests in it.
    int code = 97;
    try {
      code = body();
    } catch (...) {
    }
    std::fflush(nullptr);
    _exit(code);
  }
  int status = 0;
  if (waitpid(child, &status, 0) != child) return 98;
  if (WIFSIGNALED(status)) return 100 + WTERMSIG(status);
  return WEXITSTATUS(status);
}

}  // namespace tessera::testing

#endif  // TESSERA_CORE_TESTING_WITHOUT_THREADS_H_
