#include "rpc/metrics_interceptor.h"

#include <string>

#include "absl/time/clock.h"

namespace tessera {
namespace {

using grpc::experimental::InterceptionHookPoints;

class RpcMetricsInterceptor : public grpc::experimental::Interceptor {
 public:
  RpcMetricsInterceptor(grpc::experimental::ServerRpcInfo* info,
                        MetricsRegistry* registry)
      : method_(info->method() != nullptr ? info->method() : "unknown"),
        registry_(registry),
        start_(absl::Now()) {}

  void Intercept(
      grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            InterceptionHookPoints::PRE_SEND_STATUS)) {
      const MetricLabels labels = {
          {"method", method_},
          {"code", GrpcCodeName(methods->GetSendStatus().error_code())}};
      registry_
          ->Counter("tessera_rpc_requests_total",
                    "RPCs served, by method and status code.", labels)
          ->Add(1);
      registry_
          ->Histogram("tessera_rpc_duration_seconds",
                      "Time from a call's start to its status, by method and "
                      "status code.",
                      labels)
          ->Observe(absl::ToDoubleSeconds(absl::Now() - start_));
    }
    methods->Proceed();
  }

 private:
  const std::string method_;
  MetricsRegistry* const registry_;
  const absl::Time start_;
};

class RpcMetricsInterceptorFactory
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit RpcMetricsInterceptorFactory(MetricsRegistry* registry)
      : registry_(registry) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new RpcMetricsInterceptor(info, registry_);
  }

 private:
  MetricsRegistry* const registry_;
};

}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
MakeRpcMetricsInterceptorFactory(MetricsRegistry* registry) {
  return std::make_unique<RpcMetricsInterceptorFactory>(registry);
}

const char* GrpcCodeName(int code) {
  static const char* const kNames[] = {"OK",
                                       "CANCELLED",
                                       "UNKNOWN",
                                       "INVALID_ARGUMENT",
                                       "DEADLINE_EXCEEDED",
                                       "NOT_FOUND",
                                       "ALREADY_EXISTS",
                                       "PERMISSION_DENIED",
                                       "RESOURCE_EXHAUSTED",
                                       "FAILED_PRECONDITION",
                                       "ABORTED",
                                       "OUT_OF_RANGE",
                                       "UNIMPLEMENTED",
                                       "INTERNAL",
                                       "UNAVAILABLE",
                                       "DATA_LOSS",
                                       "UNAUTHENTICATED"};
  if (code < 0 || code >= static_cast<int>(sizeof(kNames) / sizeof(*kNames)))
    return "UNKNOWN";
  return kNames[code];
}

}  // namespace tessera
