#include "tests/processes.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <mutex>
#include <random>
#include <set>

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

namespace {

// Binds a socket to `port` on 127.0.0.1 (0: one the kernel picks) and
// releases it: the port bound, or 0 when it could not be.
int BindAndRelease(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  socklen_t len = sizeof(addr);
  const bool bound =
      bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  close(fd);
  return bound ? ntohs(addr.sin_port) : 0;
}

// The lowest port of the kernel's range for ports bound to 0 and for
// outgoing connections.
int EphemeralLow() {
  int low = 32768;
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> low;
  return low;
}

}  // namespace

int PickFreePort() {
  // Below the ephemeral range: a port the kernel hands out there (a
  // daemon's data port bound to 0, any outgoing connection) could take the
  // picked port before the daemon given it binds it. Random, so that tests
  // running side by side rarely try the same one; never the same twice in a
  // process.
  static std::mutex mu;
  static std::set<int> handed_out;
  static std::mt19937 random(std::random_device{}());
  std::lock_guard<std::mutex> lock(mu);
  const int below = EphemeralLow();
  if (below > 11024) {
    std::uniform_int_distribution<int> pick(10000, below - 1);
    for (int attempt = 0; attempt < 1000; ++attempt) {
      const int port = pick(random);
      if (handed_out.count(port) == 0 && BindAndRelease(port) == port) {
        handed_out.insert(port);
        return port;
      }
    }
  }
  // A machine with no room below its ephemeral range: one of those.
  return BindAndRelease(0);
}

}  // namespace tessera
