#include "ops/metrics_http.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <list>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "spdlog/spdlog.h"

namespace tessera {
namespace {

constexpr char kContentType[] = "text/plain; version=0.0.4; charset=utf-8";

struct Connection {
  int fd = -1;
  absl::Time deadline;
  std::string in;   // the request so far
  std::string out;  // the response, once there is one
  size_t sent = 0;
  bool responding = false;
};

std::string Response(int code, absl::string_view reason,
                     absl::string_view content_type, const std::string& body,
                     bool head, absl::string_view extra_headers = "") {
  return absl::StrCat(
      "HTTP/1.1 ", code, " ", reason, "\r\nContent-Type: ", content_type,
      "\r\nContent-Length: ", body.size(), "\r\n", extra_headers,
      "Connection: close\r\n\r\n", head ? std::string() : body);
}

// The response to a whole request (line and headers).
std::string Answer(absl::string_view request, MetricsRegistry* registry) {
  const size_t eol = request.find('\n');
  absl::string_view line = request.substr(0, eol);
  if (absl::EndsWith(line, "\r")) line.remove_suffix(1);
  std::vector<absl::string_view> parts = absl::StrSplit(line, ' ');
  if (parts.size() != 3 || !absl::StartsWith(parts[2], "HTTP/1.")) {
    return Response(400, "Bad Request", "text/plain", "bad request\n", false);
  }
  const bool head = parts[0] == "HEAD";
  if (parts[0] != "GET" && !head) {
    return Response(405, "Method Not Allowed", "text/plain",
                    "only GET and HEAD\n", false, "Allow: GET, HEAD\r\n");
  }
  absl::string_view path = parts[1];
  path = path.substr(0, path.find('?'));
  if (path != "/metrics") {
    return Response(404, "Not Found", "text/plain", "metrics are at /metrics\n",
                    head);
  }
  return Response(200, "OK", kContentType, registry->Render(), head);
}

bool HasWholeRequest(const std::string& in) {
  return in.find("\r\n\r\n") != std::string::npos ||
         in.find("\n\n") != std::string::npos;
}

}  // namespace

absl::StatusOr<std::pair<std::string, int>> ParseMetricsListen(
    const std::string& listen) {
  const size_t colon = listen.rfind(':');
  std::string host =
      colon == std::string::npos ? std::string() : listen.substr(0, colon);
  const std::string port_text =
      colon == std::string::npos ? listen : listen.substr(colon + 1);
  int port = -1;
  if (!absl::SimpleAtoi(port_text, &port) || port < 0 || port > 65535 ||
      (host.find(':') != std::string::npos &&
       !(host.size() > 2 && host.front() == '[' && host.back() == ']'))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--metrics_listen '", listen,
        "' is not HOST:PORT, :PORT or PORT (IPv6 hosts in brackets)"));
  }
  if (host.size() > 2 && host.front() == '[') {
    host = host.substr(1, host.size() - 2);
  }
  // No host: loopback, so that metrics stay private unless asked.
  if (host.empty()) host = "127.0.0.1";
  return std::make_pair(host, port);
}

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& listen, MetricsRegistry* registry,
    MetricsHttpOptions options) {
  absl::StatusOr<std::pair<std::string, int>> where =
      ParseMetricsListen(listen);
  if (!where.ok()) return where.status();
  const auto& [host, port] = *where;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) !=
          0 ||
      found == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics_listen '", listen, "': unknown host ", host));
  }
  const int fd = socket(found->ai_family,
                        found->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  // SO_REUSEADDR only: SO_REUSEPORT would let a second daemon bind the same
  // port without an error.
  int yes = 1;
  const bool bound =
      fd >= 0 &&
      setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes)) == 0 &&
      bind(fd, found->ai_addr, found->ai_addrlen) == 0 && ::listen(fd, 64) == 0;
  freeaddrinfo(found);
  if (!bound) {
    const std::string why = std::strerror(errno);
    if (fd >= 0) close(fd);
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", listen, " (", why, ")"));
  }
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  auto out = std::unique_ptr<MetricsHttpServer>(
      new MetricsHttpServer(registry, options));
  out->listen_fd_ = fd;
  out->host_ = host;
  out->port_ = ntohs(addr.ss_family == AF_INET6
                         ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                         : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  out->wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (out->wake_fd_ < 0) {
    return absl::InternalError(
        absl::StrCat("metrics: eventfd: ", std::strerror(errno)));
  }
  MetricsHttpServer* server = out.get();
  out->thread_ = std::thread([server] { server->Serve(); });
  return out;
}

MetricsHttpServer::~MetricsHttpServer() {
  if (wake_fd_ >= 0) {
    const uint64_t one = 1;
    if (write(wake_fd_, &one, sizeof(one)) < 0) {
      // Cannot happen with a fresh eventfd; Serve would not stop.
    }
  }
  if (thread_.joinable()) thread_.join();
  if (wake_fd_ >= 0) close(wake_fd_);
  if (listen_fd_ >= 0) close(listen_fd_);
}

void MetricsHttpServer::Serve() {
  std::list<Connection> connections;  // oldest first
  // Out of descriptors: accepting is paused this long, not spun on.
  absl::Time accept_again = absl::InfinitePast();
  std::vector<pollfd> fds;
  std::vector<std::list<Connection>::iterator> polled;
  auto close_connection = [&](std::list<Connection>::iterator it) {
    close(it->fd);
    return connections.erase(it);
  };
  for (;;) {
    const absl::Time now = absl::Now();
    for (auto it = connections.begin(); it != connections.end();) {
      it = now >= it->deadline ? close_connection(it) : std::next(it);
    }
    absl::Time wake = now + absl::Seconds(1);
    for (const Connection& c : connections) wake = std::min(wake, c.deadline);
    const bool accepting = now >= accept_again;
    if (!accepting) wake = std::min(wake, accept_again);
    fds.clear();
    polled.clear();
    fds.push_back({wake_fd_, POLLIN, 0});
    fds.push_back({accepting ? listen_fd_ : -1, POLLIN, 0});
    for (auto it = connections.begin(); it != connections.end(); ++it) {
      fds.push_back(
          {it->fd, static_cast<short>(it->responding ? POLLOUT : POLLIN), 0});
      polled.push_back(it);
    }
    const int timeout_ms = static_cast<int>(
        std::max<int64_t>(1, absl::ToInt64Milliseconds(wake - now) + 1));
    if (poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) {
      spdlog::error("metrics: poll failed: {}", std::strerror(errno));
      absl::SleepFor(absl::Milliseconds(100));
      continue;
    }
    if (fds[0].revents != 0) break;
    for (size_t i = 0; i < polled.size(); ++i) {
      const short revents = fds[i + 2].revents;
      if (revents == 0) continue;
      Connection& c = *polled[i];
      if (revents & (POLLERR | POLLNVAL)) {
        c.deadline = absl::InfinitePast();  // closed on the next round
        continue;
      }
      if (!c.responding) {
        char buf[4096];
        // Never more than one byte past the bound: a flood is not read.
        const size_t room = options_.max_request_bytes + 1 - c.in.size();
        const ssize_t n =
            recv(c.fd, buf, std::min(sizeof(buf), room), MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
          c.deadline = absl::InfinitePast();
          continue;
        }
        if (n < 0) continue;
        c.in.append(buf, static_cast<size_t>(n));
        if (HasWholeRequest(c.in)) {
          c.out = Answer(c.in, registry_);
        } else if (c.in.size() > options_.max_request_bytes) {
          c.out = Response(431, "Request Header Fields Too Large", "text/plain",
                           "request too large\n", false);
        } else {
          continue;
        }
        c.in.clear();
        c.in.shrink_to_fit();
        c.responding = true;
      }
      const ssize_t n = send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent,
                             MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n < 0 && errno != EAGAIN && errno != EINTR) {
        c.deadline = absl::InfinitePast();
        continue;
      }
      if (n > 0) c.sent += static_cast<size_t>(n);
      if (c.sent == c.out.size()) {
        shutdown(c.fd, SHUT_WR);
        c.deadline = absl::InfinitePast();
      }
    }
    if (accepting && fds[1].revents != 0) {
      for (int i = 0; i < 64; ++i) {
        const int fd =
            accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
          if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
              errno == ENOMEM) {
            accept_again = absl::Now() + absl::Milliseconds(100);
          }
          break;
        }
        // The oldest gives way: a slow client cannot keep a scrape out.
        if (static_cast<int>(connections.size()) >= options_.max_connections) {
          close_connection(connections.begin());
        }
        Connection c;
        c.fd = fd;
        c.deadline = absl::Now() + options_.request_timeout;
        connections.push_back(std::move(c));
      }
    }
  }
  for (Connection& c : connections) close(c.fd);
}

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> ServeMetricsIfAsked(
    const std::string& listen, MetricsRegistry* registry) {
  if (listen.empty()) return nullptr;
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server =
      MetricsHttpServer::Start(listen, registry);
  if (server.ok()) {
    const std::string& host = (*server)->host();
    spdlog::info("metrics at http://{}:{}/metrics",
                 host.find(':') != std::string::npos
                     ? absl::StrCat("[", host, "]")
                     : host,
                 (*server)->port());
  }
  return server;
}

}  // namespace tessera
