// NcclExchange: DeviceExchange over NCCL for a worker whose shards are in
// one GPU's memory (CudaShardStore). Only built with --config=cuda.
//
// Communicators are non-blocking and kept by id in a CommunicatorCache (at
// most kMaxCommunicators; joins under different ids run at once, so that
// workers joining sets in different orders never wait on each other). One
// exchange runs on the GPU at a time, whatever its communicator: NCCL does
// not let several threads issue operations on one device's communicators
// at once, and their kernels can wait on each other. The coordinator
// already runs one exchange per worker at a time (ExchangeGroups); this
// holds for calls it gave up that are still ending. Every wait polls the
// communicator's asynchronous error, the deadline and the caller's
// cancellation, and aborts the communicator (ncclCommAbort) on any of them: a
// peer that died or never joined fails the call within its deadline instead of
// hanging the worker. An aborted communicator is dropped; the coordinator makes
// a fresh one next time.
//
// Where each piece lies (worker/exchange_layout.h): a piece whose box is
// one range of its shard is sent from, or received into, the shard itself;
// other pieces go through one device buffer per exchange, packed before
// the group and unpacked after it with pitched copies (core/box_runs.h
// blocks) on the exchange's stream.
#ifndef TESSERA_WORKER_NCCL_EXCHANGE_H_
#define TESSERA_WORKER_NCCL_EXCHANGE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "core/stop.h"
#include "worker/communicator_cache.h"
#include "worker/cuda_shard_store.h"
#include "worker/device_exchange.h"

namespace tessera {

class NcclExchange : public DeviceExchange {
 public:
  static constexpr size_t kMaxCommunicators = 16;

  // `store` (not owned) outlives the exchange.
  explicit NcclExchange(CudaShardStore* store);
  ~NcclExchange() override;

  absl::StatusOr<std::string> UniqueId() override;
  absl::StatusOr<int64_t> Run(const ExchangePlan& plan,
                              const StopCondition& stop) override;

 private:
  struct Comm;
  // Joins the communicator of `plan`'s id (a fresh one: the cache calls
  // this only for an id it does not keep).
  absl::StatusOr<std::shared_ptr<Comm>> Join(const ExchangePlan& plan,
                                             const StopCondition& stop);

  CudaShardStore* const store_;
  CommunicatorCache<Comm> comms_{kMaxCommunicators};
  OneAtATime gpu_;  // held for a whole exchange, join excluded
};

}  // namespace tessera

#endif  // TESSERA_WORKER_NCCL_EXCHANGE_H_
