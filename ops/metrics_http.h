// Serves a MetricsRegistry over HTTP at /metrics in Prometheus' text format
// (cpp-httplib from Debian; no HTTP parsing of our own). Bounded: requests
// larger than a few KiB are refused, slow clients time out, and a small
// fixed pool answers. Any other path is 404.
#ifndef TESSERA_OPS_METRICS_HTTP_H_
#define TESSERA_OPS_METRICS_HTTP_H_

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "core/metrics.h"

namespace httplib {
class Server;
}

namespace tessera {

class MetricsHttpServer {
 public:
  // `listen` is HOST:PORT (port 0 picks a free one). `registry` must outlive
  // the server.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      const std::string& listen, MetricsRegistry* registry);
  ~MetricsHttpServer();  // stops serving and joins

  int port() const { return port_; }

 private:
  MetricsHttpServer() = default;

  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

// The daemons' --metrics_listen: serves `registry` at `listen` and logs
// where; null (metrics off) when `listen` is empty.
absl::StatusOr<std::unique_ptr<MetricsHttpServer>> ServeMetricsIfAsked(
    const std::string& listen, MetricsRegistry* registry);

}  // namespace tessera

#endif  // TESSERA_OPS_METRICS_HTTP_H_
