// Raw TCP connections to a server on 127.0.0.1, for tests that send exactly
// the bytes they say (or nothing at all). Test-only; thread-safe.
#ifndef TESSERA_RPC_TESTING_LOOPBACK_H_
#define TESSERA_RPC_TESTING_LOOPBACK_H_

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdint>

#include "absl/time/time.h"

namespace tessera {
namespace testing {

// A connected TCP socket (blocking, close-on-exec) to 127.0.0.1:`port`, or
// -1 when it could not connect. The caller closes it. A `send_timeout`
// above zero becomes the socket's SO_SNDTIMEO, which also bounds connect: a
// listener whose backlog is full lets it wait that long, not forever.
inline int ConnectToLoopback(
    int port, absl::Duration send_timeout = absl::ZeroDuration()) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (send_timeout > absl::ZeroDuration()) {
    const timeval timeout = absl::ToTimeval(send_timeout);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

}  // namespace testing
}  // namespace tessera

#endif  // TESSERA_RPC_TESTING_LOOPBACK_H_
