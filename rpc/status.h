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

// Errors leave with their code and message, plus error details (a
// google.rpc.Status of the same code and message) that mark them as raised
// by a tessera service rather than by gRPC's transport (IsTransportFailure).
grpc::Status ToGrpcStatus(const absl::Status& status);
// A transport failure (IsTransportFailure below) comes back marked with a
// payload, so that layers which only see absl::Status can still tell it
// from a service's own UNAVAILABLE (IsTransportFailure on absl::Status).
absl::Status FromGrpcStatus(const grpc::Status& status);

// Sets the deadline of a call `timeout` from now, or the process's
// deadline when that comes first.
void SetDeadline(grpc::ClientContext* context, absl::Duration timeout);

// A deadline for every call this process makes from now on, from any
// thread (a CLI's --timeout): each call's timeout is cut to it, so that
// the work fails as DEADLINE_EXCEEDED through its usual error paths.
// Infinite future: none (the default).
void SetProcessDeadline(absl::Time deadline);
absl::Time ProcessDeadline();

// True for failures gRPC raised itself because no tessera server answered
// (no connection, peer gone, gRPC's own deadline): such statuses carry no
// error details, while every error a tessera service returns does
// (ToGrpcStatus). Decided on the code and the details, never the text.
bool IsTransportFailure(const grpc::Status& status);

// The same question for a status converted by FromGrpcStatus (and
// annotated on the way up: payloads survive Annotate).
bool IsTransportFailure(const absl::Status& status);

// Runs `call` (an idempotent operation that returns absl::Status, such as a
// whole data stream) up to three times, after 50 and 150 ms, while it fails
// with UNAVAILABLE because gRPC could not reach the peer. Unary calls use
// Call (rpc/call.h) instead.
absl::Status RetryTransportFailures(const std::function<absl::Status()>& call);

}  // namespace tessera

#endif  // TESSERA_RPC_STATUS_H_
