#include "tests/processes.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

namespace tessera {

pid_t SpawnDaemon(const std::vector<std::string>& argv,
                  const std::string& log_path, uint64_t open_files) {
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid == 0) {
    if (open_files > 0) {
      const struct rlimit limit = {open_files, open_files};
      if (setrlimit(RLIMIT_NOFILE, &limit) != 0) _exit(126);
    }
    // A test or benchmark killed midway (a timeout) takes its daemons along
    // instead of leaving them running. (Spawned from the main thread, which
    // lives as long as the process.)
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
    int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    ExecOrExit(argv);
  }
  return pid;
}

void ExecOrExit(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const std::string& a : argv)
    args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  execv(args[0], args.data());
  _exit(127);
}

int PickFreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  int port = ntohs(addr.sin_port);
  close(fd);
  return port;
}

}  // namespace tessera
