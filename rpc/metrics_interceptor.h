// A server interceptor that counts every call and its latency per method and
// status code into a MetricsRegistry:
//   tessera_rpc_requests_total{method, code}
//   tessera_rpc_duration_seconds{method, code}  (histogram)
// Installed by StartServer when ServerOptions::metrics is set.
#ifndef TESSERA_RPC_METRICS_INTERCEPTOR_H_
#define TESSERA_RPC_METRICS_INTERCEPTOR_H_

#include <grpcpp/support/server_interceptor.h>

#include <memory>

#include "core/metrics.h"

namespace tessera {

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
MakeRpcMetricsInterceptorFactory(MetricsRegistry* registry);

// "OK", "NOT_FOUND", ... as gRPC names its codes.
const char* GrpcCodeName(int code);

}  // namespace tessera

#endif  // TESSERA_RPC_METRICS_INTERCEPTOR_H_
