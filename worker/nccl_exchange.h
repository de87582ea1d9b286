// NcclExchange: DeviceExchange over NCCL for a worker whose shards are in
// one GPU's memory (CudaShardStore). Only built with --config=cuda.
//
// Communicators are non-blocking and kept by id (at most kMaxCommunicators;
// the least recently used idle one is destroyed beyond), one exchange at a
// time each. Every wait polls the communicator's asynchronous error, the
// deadline and the caller's cancellation, and aborts the communicator
// (ncclCommAbort) on any of them: a peer that died or never joined fails
// the call within its deadline instead of hanging the worker. An aborted
// communicator is dropped; the coordinator makes a fresh one next time.
//
// A piece whose box is one range of its shard is sent from, or received
// into, the shard itself; other pieces go through one device buffer per
// exchange, packed before the group and unpacked after it with pitched
// copies (core/box_runs.h blocks) on the exchange's stream.
#ifndef TESSERA_WORKER_NCCL_EXCHANGE_H_
#define TESSERA_WORKER_NCCL_EXCHANGE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
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
  // The communicator of `plan`'s id, joined now if it is not kept.
  absl::StatusOr<std::shared_ptr<Comm>> Join(const ExchangePlan& plan,
                                             const StopCondition& stop)
      ABSL_LOCKS_EXCLUDED(join_mu_, mu_);
  void Drop(const std::string& id) ABSL_LOCKS_EXCLUDED(mu_);

  CudaShardStore* const store_;
  absl::Mutex join_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<Comm>> comms_ ABSL_GUARDED_BY(mu_);
  uint64_t tick_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tessera

#endif  // TESSERA_WORKER_NCCL_EXCHANGE_H_
