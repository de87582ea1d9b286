#include "worker/staging_pool.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace tessera {
namespace {

// Blocks come in whole 2 MiB steps, so that reads of similar sizes share.
constexpr int64_t kBlockStep = int64_t{2} << 20;

}  // namespace

StagingPool::StagingPool(std::shared_ptr<SharedMemoryArena> arena,
                         ShardStore* store, int64_t max_bytes,
                         int64_t max_idle_bytes)
    : arena_(std::move(arena)),
      store_(store),
      max_bytes_(max_bytes),
      state_(std::make_shared<State>()) {
  state_->max_idle_bytes = max_idle_bytes;
}

int64_t StagingPool::total_bytes() const {
  absl::MutexLock lock(&state_->mu);
  return state_->total;
}

void StagingPool::GiveBack(const std::shared_ptr<State>& state, Block* block) {
  // Declared before the lock: a block not kept goes after it is released.
  std::unique_ptr<Block> owned(block);
  const int64_t bytes = owned->shared->bytes();
  absl::MutexLock lock(&state->mu);
  if (state->idle_bytes + bytes <= state->max_idle_bytes) {
    state->idle_bytes += bytes;
    state->idle.push_back(std::move(owned));
    return;
  }
  state->total -= bytes;
  // `owned` goes here: unregistered, unmapped and unlinked.
}

absl::StatusOr<StagingPool::Lease> StagingPool::Acquire(int64_t bytes) {
  if (bytes <= 0) {
    return absl::InvalidArgumentError("a staging block needs some bytes");
  }
  const int64_t rounded = (bytes + kBlockStep - 1) / kBlockStep * kBlockStep;
  const std::shared_ptr<State> state = state_;
  const auto lease = [state](Block* block) { GiveBack(state, block); };
  // Idle blocks given up for room: unregistered and unlinked after the lock.
  std::vector<std::unique_ptr<Block>> dropped;
  {
    absl::MutexLock lock(&state_->mu);
    auto best = state_->idle.end();
    for (auto it = state_->idle.begin(); it != state_->idle.end(); ++it) {
      const int64_t have = (*it)->shared->bytes();
      if (have >= rounded && have <= 2 * rounded &&
          (best == state_->idle.end() || have < (*best)->shared->bytes())) {
        best = it;
      }
    }
    if (best != state_->idle.end()) {
      Block* block = best->release();
      state_->idle.erase(best);
      state_->idle_bytes -= block->shared->bytes();
      return Lease(block, lease);
    }
    // Room for a new block: drop idle ones that do not fit this read first.
    while (state_->total + rounded > max_bytes_ && !state_->idle.empty()) {
      state_->total -= state_->idle.back()->shared->bytes();
      state_->idle_bytes -= state_->idle.back()->shared->bytes();
      dropped.push_back(std::move(state_->idle.back()));
      state_->idle.pop_back();
    }
    if (state_->total + rounded > max_bytes_) {
      return absl::ResourceExhaustedError(
          absl::StrCat("this worker's staging memory (", max_bytes_,
                       " bytes) is in use; read over gRPC or try again"));
    }
    state_->total += rounded;
  }
  auto block = std::make_unique<Block>();
  absl::Status made = [&]() -> absl::Status {
    if (arena_ != nullptr) block->shared = arena_->Allocate(rounded, 0);
    std::optional<SegmentInfo> segment;
    if (block->shared != nullptr) segment = arena_->Find(block->shared->data());
    if (!segment.has_value()) {
      return absl::ResourceExhaustedError(
          absl::StrCat("no shared memory for ", rounded, " bytes of staging"));
    }
    block->segment = *std::move(segment);
    TESSERA_ASSIGN_OR_RETURN(
        block->registration,
        store_->RegisterStaging(block->shared->data(), rounded));
    return absl::OkStatus();
  }();
  if (!made.ok()) {
    absl::MutexLock lock(&state_->mu);
    state_->total -= rounded;
    return made;
  }
  return Lease(block.release(), lease);
}

}  // namespace tessera
