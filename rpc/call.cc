#include "rpc/call.h"

#include <algorithm>
#include <optional>

#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "rpc/security.h"
#include "rpc/status.h"

namespace tessera {
namespace {

absl::BitGen& Jitter() {
  thread_local absl::BitGen gen;
  return gen;
}

}  // namespace

absl::Status Call(
    const CallOptions& options,
    absl::FunctionRef<grpc::Status(grpc::ClientContext*)> attempt) {
  absl::Duration backoff = options.backoff;
  grpc::Status status;
  // With several coordinators, redirects and connection waits share the
  // call's one timeout.
  const absl::Time overall = absl::Now() + options.timeout;
  for (int tries = 1;; ++tries) {
    size_t picked = 0;
    if (options.leaders != nullptr) {
      picked = options.leaders->Pick(std::min(overall, ProcessDeadline()),
                                     options.connect_wait);
    }
    grpc::ClientContext context;
    SetDeadline(&context,
                options.leaders != nullptr
                    ? std::max(absl::ZeroDuration(), overall - absl::Now())
                    : options.timeout);
    if (options.wait_for_ready) context.set_wait_for_ready(true);
    std::optional<Cancellation::Registration> cancellable;
    if (options.cancellation != nullptr) {
      cancellable.emplace(
          options.cancellation->OnCancel([&context] { context.TryCancel(); }));
    }
    status = attempt(&context);
    cancellable.reset();
    if (options.leaders != nullptr) {
      const LeaderChannels::Next next = options.leaders->After(
          picked, status, context.GetServerTrailingMetadata(),
          std::min(overall, ProcessDeadline()));
      if (next != LeaderChannels::Next::kDone) {
        --tries;  // a standby's answer: the call did not run
        continue;
      }
    }
    // Only UNAVAILABLE is worth another try: an expired deadline already
    // spent the caller's time.
    const bool retry = options.idempotent && tries < options.attempts &&
                       status.error_code() == grpc::StatusCode::UNAVAILABLE &&
                       IsTransportFailure(status);
    if (!retry) break;
    // Jittered (0.5x to 1.5x), so that many clients refused at once (a
    // coordinator restarting) do not come back in step.
    absl::SleepFor(backoff * absl::Uniform(Jitter(), 0.5, 1.5));
    backoff *= 2;
  }
  if (status.ok() || !IsTransportFailure(status)) return FromGrpcStatus(status);
  // A refused certificate looks like an unreachable peer to gRPC; say what
  // it is.
  if (IsTlsHandshakeFailure(status.error_message())) {
    // OpenSSL's words for a peer that answered a TLS hello in plaintext.
    if (absl::StrContains(status.error_message(), "wrong version number")) {
      return absl::UnauthenticatedError(absl::StrCat(
          "unauthenticated: ",
          options.peer.empty() ? std::string("the peer") : options.peer,
          " speaks plaintext, not TLS, and this client was given TLS "
          "settings: leave out --tls_ca, --tls_cert and --tls_key (and "
          "TESSERA_TLS_CA, TESSERA_TLS_CERT, TESSERA_TLS_KEY) for a plaintext "
          "cluster"));
    }
    return absl::UnauthenticatedError(absl::StrCat(
        "unauthenticated: the TLS handshake with ",
        options.peer.empty() ? std::string("the peer") : options.peer,
        " failed (", status.error_message(),
        "); check --tls_ca, --tls_cert and --tls_key"));
  }
  if (options.unreachable) return options.unreachable(status);
  if (options.peer.empty()) return FromGrpcStatus(status);
  return absl::UnavailableError(absl::StrCat(options.peer, " is unavailable (",
                                             status.error_message(), ")"));
}

absl::Status DataCall(
    absl::Duration timeout, absl::string_view capability,
    absl::FunctionRef<grpc::Status(grpc::ClientContext*)> attempt) {
  CallOptions options;
  options.timeout = std::max(timeout, absl::ZeroDuration());
  return Call(options, [&](grpc::ClientContext* context) {
    PresentCapability(context, capability);
    return attempt(context);
  });
}

}  // namespace tessera
