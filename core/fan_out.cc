#include "core/fan_out.h"

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"

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
  for (size_t t = 1; t < helpers; ++t) threads.emplace_back(work);
  work();
  for (std::thread& t : threads) t.join();
  absl::MutexLock lock(&mu);
  return first;
}

}  // namespace tessera
