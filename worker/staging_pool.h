// StagingPool: page-locked shared-memory blocks that stage device reads for
// clients on the same host (Worker.StageRead). Making a block costs
// milliseconds (a segment, its pages, page-locking them for the GPU), more
// than copying several MiB through it, so blocks are lent out and taken back
// rather than made per read. At most `max_bytes` of blocks exist, lent or
// idle; idle blocks past `max_idle_bytes` are dropped (unlinked). A reused
// block keeps its segment name: a same-host reader of the worker's uid could
// open it anyway, as it could any of the worker's segments. Thread-safe; a
// lease may outlive the pool.
#ifndef TESSERA_WORKER_STAGING_POOL_H_
#define TESSERA_WORKER_STAGING_POOL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "transport/shared_memory_arena.h"
#include "worker/shard_store.h"

namespace tessera {

class StagingPool {
 public:
  struct Block {
    std::unique_ptr<SharedBlock> shared;
    std::shared_ptr<void> registration;  // declared after: released first
    SegmentInfo segment;
  };
  // A lent block; destroying the lease gives it back.
  using Lease = std::unique_ptr<Block, std::function<void(Block*)>>;

  // `store` (not owned, outlives every lease) page-locks the blocks.
  StagingPool(std::shared_ptr<SharedMemoryArena> arena, ShardStore* store,
              int64_t max_bytes, int64_t max_idle_bytes);

  // A block of at least `bytes` (an idle one of at most twice that, else a
  // new one). RESOURCE_EXHAUSTED past max_bytes or without shared memory.
  absl::StatusOr<Lease> Acquire(int64_t bytes);

  int64_t total_bytes() const;  // lent and idle

 private:
  struct State {
    mutable absl::Mutex mu;
    std::vector<std::unique_ptr<Block>> idle ABSL_GUARDED_BY(mu);
    int64_t total ABSL_GUARDED_BY(mu) = 0;
    int64_t idle_bytes ABSL_GUARDED_BY(mu) = 0;
    int64_t max_idle_bytes = 0;
  };
  static void GiveBack(const std::shared_ptr<State>& state, Block* block);

  const std::shared_ptr<SharedMemoryArena> arena_;
  ShardStore* const store_;
  const int64_t max_bytes_;
  const std::shared_ptr<State> state_;
};

}  // namespace tessera

#endif  // TESSERA_WORKER_STAGING_POOL_H_
