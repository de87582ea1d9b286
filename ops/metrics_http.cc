#include "ops/metrics_http.h"

#include <httplib.h>
#include <sys/socket.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "spdlog/spdlog.h"

namespace tessera {

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& listen, MetricsRegistry* registry) {
  const size_t colon = listen.rfind(':');
  int port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(listen.substr(colon + 1), &port) || port < 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics_listen '", listen, "' is not HOST:PORT"));
  }
  std::string host = listen.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);

  auto out = std::unique_ptr<MetricsHttpServer>(new MetricsHttpServer());
  out->server_ = std::make_unique<httplib::Server>();
  httplib::Server& server = *out->server_;
  server.set_payload_max_length(4096);
  server.set_read_timeout(5, 0);
  server.set_write_timeout(5, 0);
  server.set_keep_alive_max_count(16);
  // httplib's default also sets SO_REUSEPORT, which would let a second
  // daemon bind the same port without an error.
  server.set_socket_options([](int sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  server.Get("/metrics",
             [registry](const httplib::Request&, httplib::Response& response) {
               response.set_content(registry->Render(),
                                    "text/plain; version=0.0.4; charset=utf-8");
             });
  if (port == 0) {
    out->port_ = server.bind_to_any_port(host);
  } else if (server.bind_to_port(host, port)) {
    out->port_ = port;
  }
  if (out->port_ <= 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot serve metrics on ", listen, " (address in use or invalid)"));
  }
  out->thread_ = std::thread([&server] { server.listen_after_bind(); });
  // Return only once it serves, so that a stop right after Start is not
  // lost (stop() before the loop runs would leave the thread listening).
  for (int i = 0; i < 5000 && !server.is_running(); ++i)
    absl::SleepFor(absl::Milliseconds(1));
  return out;
}

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> ServeMetricsIfAsked(
    const std::string& listen, MetricsRegistry* registry) {
  if (listen.empty()) return nullptr;
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server =
      MetricsHttpServer::Start(listen, registry);
  if (server.ok()) {
    spdlog::info("metrics at http://{}:{}/metrics",
                 listen.substr(0, listen.rfind(':')), (*server)->port());
  }
  return server;
}

MetricsHttpServer::~MetricsHttpServer() {
  if (server_ != nullptr) server_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace tessera
