// Connected TCP pairs for the benchmarks' raw references: on 127.0.0.1, or
// between network namespaces (bench/hosts.h).
#ifndef TESSERA_BENCH_LOOPBACK_H_
#define TESSERA_BENCH_LOOPBACK_H_

#include <string>
#include <utility>

#include "absl/status/statusor.h"

namespace tessera {

// A connected TCP pair: {accepted end, connecting end}. The listening end is
// bound to `listen_ip` inside the network namespace `listen_netns`, the
// connecting end is made inside `connect_netns` (paths such as
// /run/netns/NAME; "": this process's own). A socket keeps the namespace it
// was made in, so both ends serve any thread. The caller closes both.
absl::StatusOr<std::pair<int, int>> TcpPair(const std::string& listen_ip,
                                            const std::string& listen_netns,
                                            const std::string& connect_netns);

// The same on 127.0.0.1 in this process's namespace.
absl::StatusOr<std::pair<int, int>> LoopbackPair();

}  // namespace tessera

#endif  // TESSERA_BENCH_LOOPBACK_H_
