// Serves a MetricsRegistry over HTTP at /metrics in Prometheus' text
// format: GET (or HEAD) /metrics, any query ignored; other paths 404, other
// methods 405. One response per connection (HTTP/1.1 with "Connection:
// close"; HTTP/1.0 clients work too).
//
// The port is outside input, so everything is bounded (MetricsHttpOptions):
// one thread polls every connection, none of which can hold it up; a
// request (line and headers) larger than `max_request_bytes` is answered
// 431 and closed before more is read; each connection gets
// `request_timeout` from accept to the last byte of its response, however
// slowly its client trickles bytes in (slowloris) or reads them out; and
// at most `max_connections` are open, the oldest closed to admit a new
// one. (cpp-httplib, used before, could do neither: eight slow clients
// held its whole thread pool, and it buffered a header line of any length
// before checking it.)
#ifndef TESSERA_OPS_METRICS_HTTP_H_
#define TESSERA_OPS_METRICS_HTTP_H_

#include <cstddef>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/metrics.h"

namespace tessera {

struct MetricsHttpOptions {
  // Connections open at once; a new one beyond closes the oldest.
  int max_connections = 32;
  // The request line and headers together.
  size_t max_request_bytes = 8192;
  // From accept to the end of the response.
  absl::Duration request_timeout = absl::Seconds(10);
};

// `listen` is HOST:PORT, :PORT or PORT; without a host it is loopback
// (127.0.0.1), so that metrics are private unless an address is named.
// INVALID_ARGUMENT names the forms accepted. Returns {host, port}.
absl::StatusOr<std::pair<std::string, int>> ParseMetricsListen(
    const std::string& listen);

class MetricsHttpServer {
 public:
  // `listen` as ParseMetricsListen takes it (port 0 picks a free one).
  // `registry` must outlive the server.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      const std::string& listen, MetricsRegistry* registry,
      MetricsHttpOptions options = {});
  ~MetricsHttpServer();  // stops serving, closes every connection, joins

  int port() const { return port_; }
  // The host it listens on (loopback when none was given).
  const std::string& host() const { return host_; }

 private:
  MetricsHttpServer(MetricsRegistry* registry, MetricsHttpOptions options)
      : registry_(registry), options_(options) {}
  void Serve();

  MetricsRegistry* const registry_;
  const MetricsHttpOptions options_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // an eventfd: written to stop Serve
  std::thread thread_;
  std::string host_;
  int port_ = 0;
};

// The daemons' --metrics_listen: serves `registry` at `listen` and logs
// where; null (metrics off) when `listen` is empty.
absl::StatusOr<std::unique_ptr<MetricsHttpServer>> ServeMetricsIfAsked(
    const std::string& listen, MetricsRegistry* registry);

}  // namespace tessera

#endif  // TESSERA_OPS_METRICS_HTTP_H_
