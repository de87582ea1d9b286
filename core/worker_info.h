// WorkerInfo: what the cluster knows of one worker — identity, where it is
// reached, its device, and its memory. The coordinator's registry, its
// durable metadata and the SDK's `workers` listing all use this one type.
#ifndef TESSERA_CORE_WORKER_INFO_H_
#define TESSERA_CORE_WORKER_INFO_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"
#include "core/labels.h"
#include "core/placement.h"

namespace tessera {

// What a worker may be given (CLI.md "Replicas (v3)"). Only a ready worker
// gets new shards.
enum class WorkerState { kReady, kCordoned, kDraining, kDead };

// "ready", "cordoned", "draining", "dead".
inline absl::string_view WorkerStateName(WorkerState state) {
  switch (state) {
    case WorkerState::kReady:
      return "ready";
    case WorkerState::kCordoned:
      return "cordoned";
    case WorkerState::kDraining:
      return "draining";
    case WorkerState::kDead:
      return "dead";
  }
  return "dead";
}

// The state WorkerStateName names; nullopt for any other text.
inline std::optional<WorkerState> ParseWorkerState(absl::string_view name) {
  for (WorkerState state : {WorkerState::kReady, WorkerState::kCordoned,
                            WorkerState::kDraining, WorkerState::kDead}) {
    if (WorkerStateName(state) == name) return state;
  }
  return std::nullopt;
}

// A worker's bytes_used as read at one moment. Heartbeats and the answers to
// allocations and frees reach the coordinator in any order; `seq` orders the
// readings of one worker process (a later reading has a larger one), so a
// heartbeat sampled before a free never undoes the free's newer figure, and
// a restarted worker's numbers are larger than its previous process's. 0: a
// worker that does not number its readings (always taken).
struct BytesUsedReading {
  int64_t bytes = 0;
  uint64_t seq = 0;
};

struct WorkerInfo {
  std::string name;
  int32_t rank = 0;
  std::string address;         // the gRPC address clients and peers dial
  Device device;               // the worker's default device
  int64_t capacity_bytes = 0;  // 0: unlimited
  int64_t bytes_used = 0;      // element bytes of the shards it holds
  // The reading bytes_used came from (BytesUsedReading; not durable).
  uint64_t bytes_used_seq = 0;
  bool alive = false;  // its lease is current (not durable)
  // Its failure domain (--zone, by default its host; core/replica_placement
  // CheckZone). Not durable: empty until it registers.
  std::string zone;
  // Its data port for bulk bytes over TCP (CLI.md "Bulk bytes over TCP");
  // empty: none. Not durable: empty until it registers.
  std::string data_address;
  // Its --labels (CLI.md "Mirrors (v4)"; mirror groups select workers by
  // them). Not durable: empty until it registers.
  Labels labels;
  WorkerState state = WorkerState::kDead;  // not durable
  // Shards it keeps for another cluster (quarantined; not durable).
  int64_t quarantined_shards = 0;
  int64_t quarantined_bytes = 0;
  // A GPU worker's device memory: its size and what is free on it (not
  // durable; 0 for host workers).
  int64_t device_total_bytes = 0;
  int64_t device_free_bytes = 0;
  // A GPU worker's device UUID (core/placement.h CheckGpuUuid; not
  // durable, empty until it registers).
  std::string gpu_uuid;
};

// Takes `reading` into `worker` unless it is older than what `worker` holds.
inline void TakeBytesUsed(const BytesUsedReading& reading, WorkerInfo& worker) {
  if (reading.seq != 0 && reading.seq < worker.bytes_used_seq) return;
  worker.bytes_used = reading.bytes;
  worker.bytes_used_seq = reading.seq;
}

}  // namespace tessera

#endif  // TESSERA_CORE_WORKER_INFO_H_
