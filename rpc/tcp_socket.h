// Plain TCP sockets for the daemons' own ports and probes (the data port,
// the TLS probe): addresses split as gRPC writes them, a connect bounded in
// time, a listening socket. Pure functions over the OS; thread-safe.
#ifndef TESSERA_RPC_TCP_SOCKET_H_
#define TESSERA_RPC_TCP_SOCKET_H_

#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tessera {

// Splits "HOST:PORT" ("[V6]:PORT" too, brackets dropped). False when there
// is no host or no port.
bool SplitHostPort(const std::string& address, std::string* host,
                   std::string* port);

// A blocking socket connected to `address` (HOST:PORT) before `deadline`,
// with TCP_NODELAY. INVALID_ARGUMENT for an address that is not HOST:PORT;
// UNAVAILABLE (naming the address and why) when it cannot be resolved or
// reached in time.
absl::StatusOr<int> ConnectTcp(const std::string& address, absl::Time deadline);

// A blocking socket listening on `address` (HOST:PORT, port 0 picks one;
// an empty host: every address), and the port it is bound to.
// INVALID_ARGUMENT for an address that is not HOST:PORT or does not
// resolve; UNAVAILABLE when it cannot be bound.
absl::StatusOr<std::pair<int, int>> ListenTcp(const std::string& address);

}  // namespace tessera

#endif  // TESSERA_RPC_TCP_SOCKET_H_
