// MoveProgressBoard: how far each running move of bytes (a reshard, a
// repair, a load, a save) has got, by the name of each tensor it makes or
// moves; GetMoveProgress reads it.
#ifndef TESSERA_COORDINATOR_MOVE_PROGRESS_H_
#define TESSERA_COORDINATOR_MOVE_PROGRESS_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "core/transfer.h"

namespace tessera {

// Bytes a running move has landed, counted as each of its steps returns
// (a step that fails takes its bytes back off).
struct MoveTally {
  std::atomic<int64_t> total{0};
  std::atomic<int64_t> done{0};
};

// Thread-safe.
class MoveProgressBoard {
 public:
  // `tally` counts the move of each of `names`, never over another move's
  // count (a name already tracked keeps its own).
  void Track(const std::vector<std::string>& names,
             const std::shared_ptr<MoveTally>& tally) ABSL_LOCKS_EXCLUDED(mu_);
  // `tally` counts `name`'s move, in place of any other (a reshard's move
  // replaces whatever was counted before).
  void Replace(const std::string& name, const std::shared_ptr<MoveTally>& tally)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Ends the count of each of `names` if it is still `tally`'s.
  void Untrack(const std::vector<std::string>& names,
               const std::shared_ptr<MoveTally>& tally)
      ABSL_LOCKS_EXCLUDED(mu_);
  // How far `name`'s move has got (not running: none is counted).
  MoveProgress Progress(const std::string& name) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<MoveTally>> tallies_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera

#endif  // TESSERA_COORDINATOR_MOVE_PROGRESS_H_
