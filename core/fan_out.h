// FanOut: the one way tessera runs many independent items (a worker each,
// a shard each, an entry each) at once. At most `limit` run together, the
// calling thread among them; once an item fails or `stop` says to stop, no
// further item starts, and the items running finish (each checks the stop
// itself where it can wait long). When the system gives no more threads,
// fewer run the items: all of them still run.
#ifndef TESSERA_CORE_FAN_OUT_H_
#define TESSERA_CORE_FAN_OUT_H_

#include <cstddef>
#include <functional>

#include "absl/status/status.h"
#include "core/stop.h"

namespace tessera {

// Most items one fan-out runs at once unless its caller says otherwise:
// enough to keep every worker of a large cluster busy, few enough that a
// million-shard tensor does not start a million threads.
inline constexpr size_t kDefaultFanOut = 64;

// Runs fn(0) .. fn(count - 1), at most `limit` (at least 1) at a time.
// Returns the first failure in time, or, when items were left unstarted
// because `stop` fired, its status; OK when every item ran and succeeded.
absl::Status FanOut(size_t count, size_t limit,
                    const std::function<absl::Status(size_t)>& fn,
                    const StopCondition& stop = {});

}  // namespace tessera

#endif  // TESSERA_CORE_FAN_OUT_H_
