// Connected TCP pairs on 127.0.0.1, for the benchmarks' raw references.
#ifndef TESSERA_BENCH_LOOPBACK_H_
#define TESSERA_BENCH_LOOPBACK_H_

#include <utility>

#include "absl/status/statusor.h"

namespace tessera {

// A connected TCP pair on 127.0.0.1: {accepted end, connecting end}. The
// caller closes both.
absl::StatusOr<std::pair<int, int>> LoopbackPair();

}  // namespace tessera

#endif  // TESSERA_BENCH_LOOPBACK_H_
