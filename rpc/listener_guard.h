// Keeps a daemon's gRPC listeners accepting, and bounds the connections
// each one holds.
//
// Debian's gRPC (1.51) stops accepting on a listening port for good after
// one accept4() fails with anything but EAGAIN (grpc/grpc#20418): a stranger
// who opens connections until the process runs out of file descriptors
// (EMFILE) leaves the port deaf after the connections close, while
// connections already open (heartbeats) keep the daemon looking alive. gRPC
// 1.51 also has no bound on incoming connections.
//
// The guard is this process's accept4(): it takes the place of libc's for
// every caller (symbol interposition; the daemons link this library
// whole), and acts only on the listening ports registered here, passing
// every other call straight to libc. On a guarded port:
//  * a connection beyond the port's `max_connections`, or beyond
//    `max_per_peer` from one peer host, is accepted and closed at once (the
//    client sees the connection reset and retries): one host cannot take
//    every connection of the port;
//  * when the process is out of descriptors, one held in reserve is freed
//    to accept and close the pending connections, and gRPC is told EAGAIN,
//    so it keeps listening; the port serves again once descriptors are
//    free;
//  * other transient errors (ECONNABORTED, ENOBUFS, ENOMEM, ...) are told
//    as EAGAIN too.
// Refusals are counted and logged (at most once per 10 s per port).
//
// Open connections are counted from the descriptors accepted on the port
// that are still open (checked by inode, at most every 100 ms while the
// port is at its bound). Thread-safe.
#ifndef TESSERA_RPC_LISTENER_GUARD_H_
#define TESSERA_RPC_LISTENER_GUARD_H_

#include <cstdint>

#include "absl/status/statusor.h"

namespace tessera {

// What happened on one guarded port since it was guarded.
struct ListenerStats {
  int64_t accepted = 0;                // connections handed to gRPC
  int64_t refused_over_limit = 0;      // closed at once: max_connections open
  int64_t refused_no_descriptors = 0;  // closed at once: out of descriptors
  int64_t refused_per_peer = 0;  // closed at once: max_per_peer from its host
  int64_t open = 0;              // accepted ones still open

  // Connections the listener took from its backlog, kept or not: while
  // this grows, the port's listener is alive (gRPC calls accept).
  int64_t taken() const {
    return accepted + refused_over_limit + refused_no_descriptors +
           refused_per_peer;
  }
};

// Guards the TCP listening port `port` (any address) of this process,
// allowing `max_connections` open at once, at most `max_per_peer` of them
// from one peer IP address (0: no bound; out-of-descriptor errors are
// handled either way). Replaces an earlier guard of the port. `what` names
// the port in logs ("gRPC", "health").
void GuardListener(int port, int max_connections, int max_per_peer,
                   const char* what);
// Stops guarding `port` (its server stopped); unknown ports are fine.
void ReleaseListener(int port);
// Zeros when `port` is not guarded.
ListenerStats GuardedListenerStats(int port);
// False when the accept4() of this process is not the guard's (e.g. a
// static link that bound libc's): ports are then unguarded.
bool ListenerGuardActive();

// The process's limit on open descriptors (RLIMIT_NOFILE), before and after
// RaiseOpenFileLimit.
struct OpenFileLimit {
  uint64_t before = 0;
  uint64_t now = 0;  // the soft limit in force
  uint64_t hard = 0;
};
// Raises the soft limit on open descriptors to the hard limit (the
// default soft limit, 1024, is a few hundred connections).
absl::StatusOr<OpenFileLimit> RaiseOpenFileLimit();

// The connections a port may hold, given the flag's `max_connections` (0:
// no bound of its own) and the descriptor limit: at most three quarters of
// the descriptors, so that files, peers, the metrics port and the other
// ports keep the rest.
int ConnectionBudget(int max_connections, uint64_t open_file_limit);

}  // namespace tessera

#endif  // TESSERA_RPC_LISTENER_GUARD_H_
