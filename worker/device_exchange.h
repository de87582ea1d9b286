// DeviceExchange: pieces moved between GPU workers with both ends acting
// (NCCL send/recv), as the coordinator plans them (core/transfer.h
// ExchangePlan). A worker whose shards are in host memory, or a build
// without CUDA, has none; its NcclExchange calls then fail with
// FAILED_PRECONDITION and the coordinator moves the pieces by pulls.
#ifndef TESSERA_WORKER_DEVICE_EXCHANGE_H_
#define TESSERA_WORKER_DEVICE_EXCHANGE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "core/stop.h"
#include "core/transfer.h"

namespace tessera {

class DeviceExchange {
 public:
  virtual ~DeviceExchange() = default;
  // A fresh communicator id. This process hosts the communicator's
  // bootstrap until every member joined.
  virtual absl::StatusOr<std::string> UniqueId() = 0;
  // Joins the plan's communicator (kept for later plans with the same id),
  // then sends and receives every piece of the plan in one group. Returns
  // the bytes received. A failure, the deadline or the caller's
  // cancellation (`stop`; another member failed) aborts the communicator
  // (it is not reused) and fails the call; pieces received before then are
  // whole or not there, as with pulls. REQUIRES: the caller checked that
  // every shard named is held here and every box lies inside its shard.
  virtual absl::StatusOr<int64_t> Run(const ExchangePlan& plan,
                                      const StopCondition& stop) = 0;
};

}  // namespace tessera

#endif  // TESSERA_WORKER_DEVICE_EXCHANGE_H_
