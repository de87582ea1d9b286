#include "bench/loopback.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <functional>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tessera {
namespace {

// Runs `fn` in this thread, or in a thread of its own that first enters the
// network namespace at `netns` (setns is per thread).
absl::Status InNetns(const std::string& netns,
                     const std::function<absl::Status()>& fn) {
  if (netns.empty()) return fn();
  absl::Status status;
  std::thread([&] {
    const int fd = open(netns.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 || setns(fd, CLONE_NEWNET) != 0) {
      status = absl::UnavailableError(
          absl::StrCat("cannot enter the network namespace ", netns));
    } else {
      status = fn();
    }
    if (fd >= 0) close(fd);
  }).join();
  return status;
}

}  // namespace

absl::StatusOr<std::pair<int, int>> TcpPair(const std::string& listen_ip,
                                            const std::string& listen_netns,
                                            const std::string& connect_netns) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  if (inet_pton(AF_INET, listen_ip.c_str(), &addr.sin_addr) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("not an IPv4 address: ", listen_ip));
  }
  int listener = -1;
  absl::Status listening = InNetns(listen_netns, [&]() -> absl::Status {
    listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    socklen_t len = sizeof(addr);
    if (listener < 0 ||
        bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0 ||
        listen(listener, 1) != 0) {
      return absl::InternalError(absl::StrCat("cannot listen on ", listen_ip));
    }
    return absl::OkStatus();
  });
  if (!listening.ok()) {
    if (listener >= 0) close(listener);
    return listening;
  }
  int client = -1;
  absl::Status connected = InNetns(connect_netns, [&]() -> absl::Status {
    client = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (client < 0 || connect(client, reinterpret_cast<sockaddr*>(&addr),
                              sizeof(addr)) != 0) {
      return absl::InternalError(absl::StrCat("cannot connect to ", listen_ip));
    }
    return absl::OkStatus();
  });
  if (!connected.ok()) {
    if (client >= 0) close(client);
    close(listener);
    return connected;
  }
  const int server = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
  close(listener);
  if (server < 0) {
    close(client);
    return absl::InternalError(absl::StrCat("cannot accept on ", listen_ip));
  }
  return std::make_pair(server, client);
}

absl::StatusOr<std::pair<int, int>> LoopbackPair() {
  return TcpPair("127.0.0.1", "", "");
}

}  // namespace tessera
