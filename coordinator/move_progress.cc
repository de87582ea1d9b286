#include "coordinator/move_progress.h"

#include <algorithm>

namespace tessera {

void MoveProgressBoard::Track(const std::vector<std::string>& names,
                              const std::shared_ptr<MoveTally>& tally) {
  absl::MutexLock lock(&mu_);
  for (const std::string& name : names) tallies_.emplace(name, tally);
}

void MoveProgressBoard::Replace(const std::string& name,
                                const std::shared_ptr<MoveTally>& tally) {
  absl::MutexLock lock(&mu_);
  tallies_[name] = tally;
}

void MoveProgressBoard::Untrack(const std::vector<std::string>& names,
                                const std::shared_ptr<MoveTally>& tally) {
  absl::MutexLock lock(&mu_);
  for (const std::string& name : names) {
    auto it = tallies_.find(name);
    if (it != tallies_.end() && it->second == tally) tallies_.erase(it);
  }
}

MoveProgress MoveProgressBoard::Progress(const std::string& name) const {
  MoveProgress progress;
  absl::MutexLock lock(&mu_);
  auto it = tallies_.find(name);
  if (it == tallies_.end()) return progress;
  progress.running = true;
  progress.bytes_total = it->second->total.load();
  progress.bytes_done =
      std::min(progress.bytes_total, std::max<int64_t>(0, it->second->done));
  return progress;
}

}  // namespace tessera
