// Test helpers for the coordinator's parts: a clock advanced by hand, a
// store wrapper that holds appends until released or fails them on demand,
// and small builders for registrations, specs and tensors. Test-only.
#ifndef TESSERA_COORDINATOR_COORDINATOR_TESTUTIL_H_
#define TESSERA_COORDINATOR_COORDINATOR_TESTUTIL_H_

#include <stdlib.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/metadata_store.h"
#include "coordinator/worker_registry.h"
#include "core/layout_spec.h"
#include "core/placement.h"

namespace tessera {
namespace testing {

// A clock the test advances by hand. Thread-safe.
class FakeClock {
 public:
  absl::Time Now() const {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }
  Clock AsClock() {
    return [this] { return Now(); };
  }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_) = absl::FromUnixSeconds(1000);
};

// Wraps a store. While held, Append blocks (as a slow fsync would) until
// Release; FailAppends makes the next appends fail. Counts appends and the
// records they carried. Thread-safe.
class ControlledStore : public MetadataStore {
 public:
  using MetadataStore::Append;
  explicit ControlledStore(std::unique_ptr<MetadataStore> inner)
      : inner_(std::move(inner)) {}

  void Hold() {
    absl::MutexLock lock(&mu_);
    held_ = true;
  }
  void Release() {
    absl::MutexLock lock(&mu_);
    held_ = false;
  }
  // Blocks until an Append is waiting in Hold.
  void WaitUntilBlocked() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&blocked_));
  }
  // The next `n` appends fail with `status`.
  void FailAppends(int n, absl::Status status) {
    absl::MutexLock lock(&mu_);
    failures_left_ = n;
    failure_ = std::move(status);
  }
  int64_t appends() const {
    absl::MutexLock lock(&mu_);
    return appends_;
  }
  int64_t records() const {
    absl::MutexLock lock(&mu_);
    return records_;
  }
  int64_t snapshots() const {
    absl::MutexLock lock(&mu_);
    return snapshots_;
  }

  absl::StatusOr<MetadataState> Load() override { return inner_->Load(); }
  absl::Status Append(absl::Span<const MetadataChange> changes) override {
    {
      absl::MutexLock lock(&mu_);
      blocked_ = held_;
      auto released = [this]()
                          ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !held_; };
      mu_.Await(absl::Condition(&released));
      blocked_ = false;
      ++appends_;
      if (failures_left_ > 0) {
        --failures_left_;
        return failure_;
      }
      records_ += static_cast<int64_t>(changes.size());
    }
    return inner_->Append(changes);
  }
  absl::Status Snapshot(const MetadataState& state) override {
    {
      absl::MutexLock lock(&mu_);
      ++snapshots_;
    }
    return inner_->Snapshot(state);
  }
  std::string Describe() const override { return inner_->Describe(); }

 private:
  const std::unique_ptr<MetadataStore> inner_;
  mutable absl::Mutex mu_;
  bool held_ ABSL_GUARDED_BY(mu_) = false;
  bool blocked_ ABSL_GUARDED_BY(mu_) = false;
  int failures_left_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  int64_t appends_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t records_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t snapshots_ ABSL_GUARDED_BY(mu_) = 0;
};

// Worker i of a test: named "w<i>", rank i, at address "fake:<7000+i>".
inline std::string WorkerAddress(int i) {
  return absl::StrCat("fake:", 7000 + i);
}
inline WorkerRegistration TestWorker(int i, int64_t capacity_bytes = 0) {
  WorkerRegistration r;
  r.worker.name = absl::StrCat("w", i);
  r.worker.address = WorkerAddress(i);
  r.worker.capacity_bytes = capacity_bytes;
  r.rank = i;
  return r;
}

// A chunk spec over `ranks` along dim 0.
inline LayoutSpec ChunkOver(const std::vector<int32_t>& ranks) {
  std::vector<Placement> placements;
  for (int32_t rank : ranks) {
    Placement p;
    p.rank = rank;
    placements.push_back(p);
  }
  return LayoutSpec::Chunk(0, placements);
}

// A fresh directory under the test's temp dir.
inline std::string TempDir() {
  const char* base = getenv("TEST_TMPDIR");
  std::string pattern =
      std::string(base != nullptr ? base : "/tmp") + "/coord_XXXXXX";
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  return mkdtemp(buf.data());
}

}  // namespace testing
}  // namespace tessera

#endif  // TESSERA_COORDINATOR_COORDINATOR_TESTUTIL_H_
