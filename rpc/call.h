// One way to make a unary (or whole-stream) gRPC call: a deadline, retries
// decided on status codes, and the mapping of the result to absl::Status
// with the peer named when it cannot be reached. Every client of a tessera
// service — the SDK, the coordinator's worker control, a worker's
// registration, the transports' data-plane calls (DataCall) — goes through
// Call.
#ifndef TESSERA_RPC_CALL_H_
#define TESSERA_RPC_CALL_H_

#include <grpcpp/client_context.h>
#include <grpcpp/support/status.h>

#include <functional>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "core/stop.h"
#include "rpc/leader_channels.h"
#include "rpc/status.h"

namespace tessera {

struct CallOptions {
  // Deadline of each attempt.
  absl::Duration timeout = absl::Seconds(30);
  // An idempotent call is tried again, up to `attempts` times in all with
  // backoff doubling from `backoff`, when it fails in transport (gRPC could
  // not reach a tessera server: see IsTransportFailure in rpc/status.h). Other
  // calls are tried once: they may have taken effect before the connection
  // broke.
  bool idempotent = false;
  int attempts = 3;
  absl::Duration backoff = absl::Milliseconds(50);
  // Wait for the connection until the deadline instead of failing at once
  // while the peer cannot be reached.
  bool wait_for_ready = false;
  // Who is called, for errors: a transport failure or gRPC's own expired
  // deadline becomes UNAVAILABLE "`peer` is unavailable (<gRPC's words>)".
  // Empty: the status as gRPC gave it.
  std::string peer;
  // Replaces the `peer` wording when set (the CLI's "cannot reach the
  // coordinator at ..." message).
  std::function<absl::Status(const grpc::Status&)> unreachable;
  // Several coordinators, one leading (rpc/leader_channels.h): each attempt
  // goes to a connected one, after `connect_wait` at most per address, and
  // one a standby answered goes to the leader it names, all within
  // `timeout`. The attempt must call leaders->current()'s address. Not
  // owned.
  LeaderChannels* leaders = nullptr;
  absl::Duration connect_wait = absl::Milliseconds(300);
  // Not owned; gives the call up (gRPC CANCELLED) when cancelled, before or
  // while it runs. Null: only the deadline ends it.
  Cancellation* cancellation = nullptr;
};

// Runs `attempt` with a fresh ClientContext per try, as `options` say, and
// returns the result as an absl::Status.
absl::Status Call(
    const CallOptions& options,
    absl::FunctionRef<grpc::Status(grpc::ClientContext*)> attempt);

// A data-plane call to a worker (a transport's read, write, map or staging
// stream; unary or streaming): one try, since the transports and the data
// plane above them decide retries; `timeout` from now at most (within the
// process's deadline; the channel adds the thread's ScopedCallDeadline and
// cancellation); `capability` presented; the result as Call gives it. An
// attempt that ends a stream for a reason of its own keeps that reason
// itself.
absl::Status DataCall(
    absl::Duration timeout, absl::string_view capability,
    absl::FunctionRef<grpc::Status(grpc::ClientContext*)> attempt);

}  // namespace tessera

#endif  // TESSERA_RPC_CALL_H_
