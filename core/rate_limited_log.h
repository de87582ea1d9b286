// A log line for events a peer can repeat at will (refused connections,
// rejected requests), so that the log does not grow with them.
#ifndef TESSERA_CORE_RATE_LIMITED_LOG_H_
#define TESSERA_CORE_RATE_LIMITED_LOG_H_

#include <atomic>
#include <cstdint>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace tessera {

// Logs at most once per `every`, saying how many events it stands for:
// for events an attacker can repeat at will (refused connections), so the
// log does not grow with them. Thread-safe.
class RateLimitedLog {
 public:
  explicit RateLimitedLog(absl::Duration every = absl::Seconds(10))
      : every_ms_(absl::ToInt64Milliseconds(every)) {}
  // True when this event should be logged; `*events` is then the number of
  // events since the last log, this one included.
  bool Due(int64_t* events) {
    const int64_t now = absl::ToUnixMillis(absl::Now());
    int64_t due = next_ms_.load();
    pending_.fetch_add(1);
    if (now < due || !next_ms_.compare_exchange_strong(due, now + every_ms_)) {
      return false;
    }
    *events = pending_.exchange(0);
    return true;
  }

 private:
  const int64_t every_ms_;
  std::atomic<int64_t> next_ms_{0};
  std::atomic<int64_t> pending_{0};
};

}  // namespace tessera

#endif  // TESSERA_CORE_RATE_LIMITED_LOG_H_
