#include "bench/loopback.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "absl/status/status.h"

namespace tessera {

absl::StatusOr<std::pair<int, int>> LoopbackPair() {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (listener < 0 ||
      bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0 ||
      listen(listener, 1) != 0) {
    if (listener >= 0) close(listener);
    return absl::InternalError("cannot listen on 127.0.0.1");
  }
  const int client = socket(AF_INET, SOCK_STREAM, 0);
  if (client < 0 ||
      connect(client, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    if (client >= 0) close(client);
    close(listener);
    return absl::InternalError("cannot connect on 127.0.0.1");
  }
  const int server = accept(listener, nullptr, nullptr);
  close(listener);
  if (server < 0) {
    close(client);
    return absl::InternalError("cannot accept on 127.0.0.1");
  }
  return std::make_pair(server, client);
}

}  // namespace tessera
