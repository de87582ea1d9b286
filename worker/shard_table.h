// ShardTable: the bookkeeping every ShardStore shares — shards by id, and
// what they cost against a capacity (each shard's element bytes, at least a
// fixed per-shard charge; reservations of allocations in progress; freed
// shards until their last reader lets go) — so that stores only differ in
// where the bytes live. Thread-safe; the lock
// is never held while memory is allocated, filled or freed.
#ifndef TESSERA_WORKER_SHARD_TABLE_H_
#define TESSERA_WORKER_SHARD_TABLE_H_

#include <algorithm>
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

// What one shard costs against a store's capacity, from reservation until
// its memory is gone: a ShardCharge lives inside the shard (see ShardTable),
// so the charge is released when the last reader drops the shard, not when
// the shard is freed. Move-only; destroying it gives the bytes back.
class ShardCharge {
 public:
  // The capacity accounting the charges of one store draw on.
  struct Ledger {
    absl::Mutex mu;
    // Charges of reservations, shards held and freed shards still pinned.
    int64_t charged ABSL_GUARDED_BY(mu) = 0;
    // The part of `charged` of freed shards still pinned by readers.
    int64_t pinned ABSL_GUARDED_BY(mu) = 0;
  };

  ShardCharge() = default;
  ShardCharge(std::shared_ptr<Ledger> ledger, int64_t bytes)
      : ledger_(std::move(ledger)), bytes_(bytes) {}
  ShardCharge(ShardCharge&& other) noexcept { *this = std::move(other); }
  ShardCharge& operator=(ShardCharge&& other) noexcept {
    if (this != &other) {
      Release();
      ledger_ = std::move(other.ledger_);
      bytes_ = other.bytes_;
      freed_ = other.freed_;
      other.ledger_ = nullptr;
    }
    return *this;
  }
  ~ShardCharge() { Release(); }

  int64_t bytes() const { return bytes_; }

  // The shard left its table; its memory may still be pinned by readers.
  void MarkFreed() {
    if (ledger_ == nullptr || freed_) return;
    absl::MutexLock lock(&ledger_->mu);
    ledger_->pinned += bytes_;
    freed_ = true;
  }

 private:
  void Release() {
    if (ledger_ == nullptr) return;
    absl::MutexLock lock(&ledger_->mu);
    ledger_->charged -= bytes_;
    if (freed_) ledger_->pinned -= bytes_;
    ledger_ = nullptr;
  }

  std::shared_ptr<Ledger> ledger_;
  int64_t bytes_ = 0;
  bool freed_ = false;
};

// Each shard is charged at least this against the capacity: what its
// bookkeeping (descriptor, table entry, smallest allocation) costs, up to
// about 1 KiB at rank 32, so that empty or tiny shards are not free. A
// shard's real footprint stays within about twice its charge.
inline constexpr int64_t kShardChargeBytes = 1024;

// `Shard` must have an `int64_t bytes` member (its element bytes) and a
// `ShardCharge charge` member, set from Reserve before Insert.
template <typename Shard>
class ShardTable {
 public:
  // capacity_bytes = 0: no limit. `where` names the memory in errors
  // ("cuda:0"). Every shard is charged at least `min_charge_bytes`.
  ShardTable(int64_t capacity_bytes, std::string where,
             int64_t min_charge_bytes = kShardChargeBytes)
      : capacity_bytes_(capacity_bytes),
        where_(std::move(where)),
        min_charge_bytes_(min_charge_bytes) {}

  // Charges a shard of `bytes` element bytes for id `id` before its memory
  // is allocated; the returned charge goes into the shard (dropping it
  // gives the bytes back). ALREADY_EXISTS if the id is taken,
  // RESOURCE_EXHAUSTED past the capacity.
  absl::StatusOr<ShardCharge> Reserve(uint64_t id, int64_t bytes)
      ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::MutexLock lock(&mu_);
      if (shards_.contains(id))
        return AlreadyExistsError("shard id", absl::StrCat(id));
    }
    const int64_t charge = std::max(bytes, min_charge_bytes_);
    absl::MutexLock lock(&ledger_->mu);
    if (capacity_bytes_ > 0 && ledger_->charged + charge > capacity_bytes_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "shard of ", bytes, " bytes (charged ", charge, ") does not fit: ",
          ledger_->charged, " of ", capacity_bytes_, " bytes in use", where_,
          ledger_->pinned > 0
              ? absl::StrCat(" (", ledger_->pinned,
                             " of them pinned by readers of freed shards)")
              : std::string()));
    }
    ledger_->charged += charge;
    return ShardCharge(ledger_, charge);
  }

  // Publishes a reserved shard.
  absl::Status Insert(uint64_t id, std::shared_ptr<Shard> shard)
      ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    const int64_t bytes = shard->bytes;
    if (!shards_.emplace(id, std::move(shard)).second) {
      return AlreadyExistsError("shard id", absl::StrCat(id));
    }
    bytes_used_ += bytes;
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
  // reader drops the returned pointer — outside the lock — and its charge
  // with it: until then it counts as pinned.
  std::shared_ptr<Shard> Remove(uint64_t id) ABSL_LOCKS_EXCLUDED(mu_) {
    std::shared_ptr<Shard> shard;
    {
      absl::MutexLock lock(&mu_);
      auto it = shards_.find(id);
      if (it == shards_.end()) return nullptr;
      shard = std::move(it->second);
      shards_.erase(it);
      bytes_used_ -= shard->bytes;
    }
    shard->charge.MarkFreed();
    return shard;
  }

  // Element bytes of the shards held.
  int64_t BytesUsed() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return bytes_used_;
  }

  // What counts against the capacity (ShardStore::ChargedBytes).
  int64_t ChargedBytes() const {
    absl::MutexLock lock(&ledger_->mu);
    return ledger_->charged;
  }

  // Charges of freed shards still pinned by readers.
  int64_t PinnedBytes() const {
    absl::MutexLock lock(&ledger_->mu);
    return ledger_->pinned;
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
  const int64_t min_charge_bytes_;
  // Shared with every ShardCharge, which may outlive the table (a reader's
  // pin released after the store is gone).
  const std::shared_ptr<ShardCharge::Ledger> ledger_ =
      std::make_shared<ShardCharge::Ledger>();
  // Invariant: bytes_used_ == sum of `bytes` over shards_.
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, std::shared_ptr<Shard>> shards_
      ABSL_GUARDED_BY(mu_);
  int64_t bytes_used_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tessera

#endif  // TESSERA_WORKER_SHARD_TABLE_H_
