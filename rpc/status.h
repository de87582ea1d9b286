// Maps between absl::Status (used everywhere inside tessera) and grpc::Status
// (used only at the service edge). The canonical codes are identical, so the
// mapping is 1:1 and checked at compile time in status.cc.
#ifndef TESSERA_RPC_STATUS_H_
#define TESSERA_RPC_STATUS_H_

#include <grpcpp/client_context.h>
#include <grpcpp/support/status.h>

#include <functional>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace tessera {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// Sets the deadline of a call `timeout` from now.
void SetDeadline(grpc::ClientContext* context, absl::Duration timeout);

// True for gRPC's own transport failures (no connection, peer gone), as
// opposed to UNAVAILABLE raised by a tessera service: those messages say
// "unavailable" (core/errors.h).
bool IsTransportFailure(const grpc::Status& status);

// Runs `call`, and runs it again up to twice (after 50 and 150 ms) while it
// failed to connect at all: a fresh channel's first connect can fail
// transiently, and a call that never reached its server is safe to repeat.
absl::Status RetryConnectFailures(const std::function<absl::Status()>& call);

}  // namespace tessera

#endif  // TESSERA_RPC_STATUS_H_
