#include "rpc/listener_probe.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "proto/health.grpc.pb.h"
#include "rpc/security.h"

namespace tessera {

ListenerProbe::ListenerProbe(
    std::string address, ListenerProbeOptions options,
    std::function<void(const std::string& why)> on_dead)
    : address_(std::move(address)),
      options_(std::move(options)),
      on_dead_(std::move(on_dead)) {
  thread_ = std::thread([this] { Run(); });
}

ListenerProbe::~ListenerProbe() {
  {
    absl::MutexLock lock(&mu_);
    stop_.Notify();
    if (in_flight_ != nullptr) in_flight_->TryCancel();
  }
  if (thread_.joinable()) thread_.join();
}

absl::Status ListenerProbe::ProbeOnce(
    const std::string& address,
    const std::shared_ptr<grpc::ChannelCredentials>& credentials,
    absl::Duration timeout) {
  grpc::ClientContext context;
  return Probe(address, credentials, timeout, &context);
}

absl::Status ListenerProbe::Probe(
    const std::string& address,
    const std::shared_ptr<grpc::ChannelCredentials>& credentials,
    absl::Duration timeout, grpc::ClientContext* context) {
  grpc::ChannelArguments args;
  // A connection of its own: a channel sharing the process's subchannels
  // could ride on one opened before the listener stopped.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  auto channel = grpc::CreateCustomChannel(
      address,
      credentials != nullptr ? credentials : grpc::InsecureChannelCredentials(),
      args);
  auto stub = grpc::health::v1::Health::NewStub(channel);
  context->set_deadline(std::chrono::system_clock::now() +
                        absl::ToChronoMilliseconds(timeout));
  grpc::health::v1::HealthCheckRequest request;
  grpc::health::v1::HealthCheckResponse response;
  const grpc::Status status = stub->Check(context, request, &response);
  const grpc::StatusCode code = status.error_code();
  if (code != grpc::StatusCode::UNAVAILABLE &&
      code != grpc::StatusCode::DEADLINE_EXCEEDED) {
    return absl::OkStatus();
  }
  // The server accepted the connection and spoke TLS, whatever it thought
  // of the certificates.
  if (code == grpc::StatusCode::UNAVAILABLE &&
      IsTlsHandshakeFailure(status.error_message())) {
    return absl::OkStatus();
  }
  return absl::UnavailableError(absl::StrCat(
      "a new connection to ", address, " got no answer within ",
      absl::FormatDuration(timeout), ": ", status.error_message()));
}

void ListenerProbe::Run() {
  int failed = 0;
  while (!stop_.WaitForNotificationWithTimeout(options_.interval)) {
    grpc::ClientContext context;
    {
      absl::MutexLock lock(&mu_);
      if (stop_.HasBeenNotified()) return;
      in_flight_ = &context;
    }
    const int64_t taken_before =
        options_.connections_taken ? options_.connections_taken() : 0;
    absl::Status probe =
        Probe(address_, options_.credentials, options_.timeout, &context);
    if (!probe.ok() && options_.connections_taken &&
        options_.connections_taken() > taken_before) {
      probe = absl::OkStatus();  // taken, then closed at a bound: alive
    }
    {
      absl::MutexLock lock(&mu_);
      in_flight_ = nullptr;
    }
    if (stop_.HasBeenNotified()) return;
    if (probe.ok()) {
      failed = 0;
      continue;
    }
    if (++failed < options_.failures) continue;
    on_dead_(absl::StrCat(
        failed, " probes in a row failed; the last: ", probe.message()));
    return;
  }
}

std::string SelfAddress(const std::string& listen, int port) {
  const size_t colon = listen.rfind(':');
  std::string host = colon == std::string::npos ? "" : listen.substr(0, colon);
  if (host.empty() || host == "0.0.0.0") host = "127.0.0.1";
  if (host == "[::]" || host == "::") host = "[::1]";
  return absl::StrCat(host, ":", port);
}

}  // namespace tessera
