#include "core/fan_out.h"

#include <algorithm>
#include <atomic>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "core/threads.h"

namespace tessera {

absl::Status FanOut(size_t count, size_t limit,
                    const std::function<absl::Status(size_t)>& fn,
                    const StopCondition& stop) {
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  absl::Mutex mu;
  absl::Status first;
  auto record = [&](absl::Status status) {
    absl::MutexLock lock(&mu);
    if (first.ok()) first = std::move(status);
    failed.store(true);
  };
  auto work = [&] {
    while (!failed.load()) {
      const size_t i = next.fetch_add(1);
      if (i >= count) return;
      if (absl::Status s = stop.Check("starting the next item"); !s.ok()) {
        record(std::move(s));
        return;
      }
      if (absl::Status s = fn(i); !s.ok()) record(std::move(s));
    }
  };
  const size_t helpers = std::min(count, std::max<size_t>(limit, 1));
  std::vector<std::thread> threads;
  threads.reserve(helpers > 0 ? helpers - 1 : 0);
  for (size_t t = 1; t < helpers; ++t) {
    // With no thread to be had, the items are shared by fewer: every one
    // still runs, since each thread takes the next until none is left.
    std::optional<std::thread> helper = TryStartThread(work);
    if (!helper.has_value()) break;
    threads.push_back(std::move(*helper));
  }
  work();
  for (std::thread& t : threads) t.join();
  absl::MutexLock lock(&mu);
  return first;
}

}  // namespace tessera
