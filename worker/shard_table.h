// ShardTable: the bookkeeping every ShardStore shares — shards by id, bytes
// in use against a capacity, and reservations for allocations in progress —
// so that stores only differ in where the bytes live. Thread-safe; the lock
// is never held while memory is allocated, filled or freed.
#ifndef TESSERA_WORKER_SHARD_TABLE_H_
#define TESSERA_WORKER_SHARD_TABLE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/errors.h"
#include "core/status_macros.h"
#include "worker/shard_store.h"

namespace tessera {

// OK when elements [flat_begin, flat_begin + count) of the row-major sub-box
// `box` lie inside a shard described by `desc`.
inline absl::Status CheckShardRange(const ShardDesc& desc, const Box& box,
                                    int64_t flat_begin, int64_t count) {
  TESSERA_RETURN_IF_ERROR(
      CheckWithin(box, desc.box.sizes, "region of the shard"));
  const int64_t n = box.NumElements();
  if (flat_begin < 0 || count < 0 || flat_begin > n || count > n - flat_begin) {
    return OutOfBoundsError(absl::StrCat("elements [", flat_begin, ", ",
                                         flat_begin + count,
                                         ") of a region of ", n, " elements"));
  }
  return absl::OkStatus();
}

// OK when a write of `size` bytes at `byte_offset` fits a shard of
// `shard_bytes` bytes.
inline absl::Status CheckShardWrite(int64_t shard_bytes, int64_t byte_offset,
                                    int64_t size) {
  if (byte_offset < 0 || byte_offset > shard_bytes ||
      size > shard_bytes - byte_offset) {
    return OutOfBoundsError(absl::StrCat("write of ", size, " bytes at byte ",
                                         byte_offset, " into a shard of ",
                                         shard_bytes, " bytes"));
  }
  return absl::OkStatus();
}

// `Shard` must have an `int64_t bytes` member.
template <typename Shard>
class ShardTable {
 public:
  // capacity_bytes = 0: no limit. `where` names the memory in errors
  // ("cuda:0").
  ShardTable(int64_t capacity_bytes, std::string where)
      : capacity_bytes_(capacity_bytes), where_(std::move(where)) {}

  // Sets `bytes` aside for shard `id` before its memory is allocated.
  // ALREADY_EXISTS if the id is taken, RESOURCE_EXHAUSTED past the capacity.
  absl::Status Reserve(uint64_t id, int64_t bytes) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (shards_.contains(id))
      return AlreadyExistsError("shard id", absl::StrCat(id));
    if (capacity_bytes_ > 0 && bytes_used_ + bytes > capacity_bytes_) {
      return absl::ResourceExhaustedError(
          absl::StrCat("shard of ", bytes, " bytes does not fit: ", bytes_used_,
                       " of ", capacity_bytes_, " bytes in use", where_));
    }
    bytes_used_ += bytes;
    return absl::OkStatus();
  }

  // Gives back a reservation whose allocation failed.
  void Unreserve(int64_t bytes) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    bytes_used_ -= bytes;
  }

  // Publishes a reserved shard.
  absl::Status Insert(uint64_t id, std::shared_ptr<Shard> shard)
      ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (!shards_.emplace(id, std::move(shard)).second) {
      return AlreadyExistsError("shard id", absl::StrCat(id));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::shared_ptr<Shard>> Find(uint64_t id) const
      ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto it = shards_.find(id);
    if (it == shards_.end()) {
      return absl::NotFoundError(absl::StrCat(
          "shard ", id,
          " is not held by this worker (freed or never allocated)"));
    }
    return it->second;
  }

  // Takes shard `id` out (null if unknown). Its memory goes when the last
  // reader drops the returned pointer — outside the lock.
  std::shared_ptr<Shard> Remove(uint64_t id) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto it = shards_.find(id);
    if (it == shards_.end()) return nullptr;
    std::shared_ptr<Shard> shard = std::move(it->second);
    shards_.erase(it);
    bytes_used_ -= shard->bytes;
    return shard;
  }

  int64_t BytesUsed() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return bytes_used_;
  }

  std::vector<uint64_t> Ids() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    std::vector<uint64_t> ids;
    ids.reserve(shards_.size());
    for (const auto& [id, shard] : shards_) ids.push_back(id);
    return ids;
  }

 private:
  const int64_t capacity_bytes_;
  const std::string where_;
  // Invariant: bytes_used_ == sum of `bytes` over shards_ plus reservations
  // of allocations in progress.
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, std::shared_ptr<Shard>> shards_
      ABSL_GUARDED_BY(mu_);
  int64_t bytes_used_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tessera

#endif  // TESSERA_WORKER_SHARD_TABLE_H_
