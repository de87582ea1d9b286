#include "rpc/tcp_socket.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace tessera {
namespace {

// getaddrinfo's answers for host:port, freed with the object.
class Resolved {
 public:
  Resolved(const std::string& host, const std::string& port, bool passive) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    if (passive) hints.ai_flags = AI_PASSIVE;
    rc_ = getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(),
                      &hints, &list_);
  }
  ~Resolved() {
    if (list_ != nullptr) freeaddrinfo(list_);
  }
  Resolved(const Resolved&) = delete;
  Resolved& operator=(const Resolved&) = delete;

  // Empty when it did not resolve.
  std::string error() const { return rc_ == 0 ? "" : gai_strerror(rc_); }
  const addrinfo* list() const { return list_; }

 private:
  addrinfo* list_ = nullptr;
  int rc_ = 0;
};

int MillisUntil(absl::Time deadline) {
  const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
  return static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(ms, 60000)));
}

}  // namespace

bool SplitHostPort(const std::string& address, std::string* host,
                   std::string* port) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) return false;
  *host = address.substr(0, colon);
  *port = address.substr(colon + 1);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']')
    *host = host->substr(1, host->size() - 2);
  return !host->empty() && !port->empty();
}

absl::StatusOr<int> ConnectTcp(const std::string& address,
                               absl::Time deadline) {
  std::string host, port;
  if (!SplitHostPort(address, &host, &port)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", address, "' is not HOST:PORT"));
  }
  const Resolved resolved(host, port, /*passive=*/false);
  if (!resolved.error().empty()) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve '", address, "': ", resolved.error()));
  }
  std::string why = "no address to connect to";
  for (const addrinfo* a = resolved.list(); a != nullptr; a = a->ai_next) {
    const int fd =
        socket(a->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC,
               a->ai_protocol);
    if (fd < 0) continue;
    bool connected = connect(fd, a->ai_addr, a->ai_addrlen) == 0;
    int error = errno;
    if (!connected && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      socklen_t size = sizeof(error);
      const int ready = poll(&p, 1, MillisUntil(deadline));
      error = ready == 0 ? ETIMEDOUT : errno;
      connected = ready == 1 &&
                  getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size) == 0 &&
                  error == 0;
    }
    if (connected) {
      fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
      const int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      return fd;
    }
    why = std::strerror(error);
    close(fd);
  }
  return absl::UnavailableError(
      absl::StrCat("connect to ", address, ": ", why));
}

absl::StatusOr<std::pair<int, int>> ListenTcp(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", address, "' is not HOST:PORT"));
  }
  std::string host = address.substr(0, colon);
  const std::string port = address.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  const Resolved resolved(host, port, /*passive=*/true);
  if (!resolved.error().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", address, "' does not resolve: ", resolved.error()));
  }
  std::string why = "no address to listen on";
  for (const addrinfo* a = resolved.list(); a != nullptr; a = a->ai_next) {
    const int fd =
        socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 1024) == 0) {
      sockaddr_storage bound{};
      socklen_t len = sizeof(bound);
      getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
      const int bound_port =
          bound.ss_family == AF_INET6
              ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
              : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
      return std::make_pair(fd, bound_port);
    }
    why = std::strerror(errno);
    close(fd);
  }
  return absl::UnavailableError(
      absl::StrCat("cannot listen on ", address, ": ", why));
}

}  // namespace tessera
