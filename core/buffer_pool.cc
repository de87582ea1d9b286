#include "core/buffer_pool.h"

#include <utility>

#include "absl/time/clock.h"

namespace tessera {

struct BufferPool::Lease::State {
  struct Idle {
    std::unique_ptr<char[]> data;
    size_t size = 0;
    absl::Time since;
  };
  int64_t max_idle_bytes = 0;
  absl::Duration max_idle;
  mutable absl::Mutex mu;
  std::vector<Idle> idle ABSL_GUARDED_BY(mu);  // oldest first
  int64_t idle_bytes ABSL_GUARDED_BY(mu) = 0;

  // Frees idle buffers past max_idle; returns them so the caller frees them
  // outside the lock.
  std::vector<Idle> Expire(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::vector<Idle> expired;
    size_t stale = 0;
    while (stale < idle.size() && now - idle[stale].since > max_idle) ++stale;
    for (size_t i = 0; i < stale; ++i) {
      idle_bytes -= static_cast<int64_t>(idle[i].size);
      expired.push_back(std::move(idle[i]));
    }
    idle.erase(idle.begin(), idle.begin() + static_cast<ptrdiff_t>(stale));
    return expired;
  }
};

BufferPool::BufferPool(int64_t max_idle_bytes, absl::Duration max_idle)
    : state_(std::make_shared<Lease::State>()) {
  state_->max_idle_bytes = max_idle_bytes;
  state_->max_idle = max_idle;
}

BufferPool::Lease BufferPool::Take(size_t bytes) {
  Lease lease;
  lease.pool_ = state_;
  std::vector<Lease::State::Idle> expired;
  {
    absl::MutexLock lock(&state_->mu);
    expired = state_->Expire(absl::Now());
    auto& idle = state_->idle;
    // The most recently used fit: its pages are the likeliest resident.
    for (size_t i = idle.size(); i-- > 0;) {
      if (idle[i].size >= bytes && idle[i].size / 2 <= bytes) {
        lease.data_ = std::move(idle[i].data);
        lease.size_ = idle[i].size;
        state_->idle_bytes -= static_cast<int64_t>(idle[i].size);
        idle.erase(idle.begin() + static_cast<ptrdiff_t>(i));
        return lease;
      }
    }
  }
  lease.data_.reset(new char[bytes]);
  lease.size_ = bytes;
  return lease;
}

int64_t BufferPool::idle_bytes() const {
  absl::MutexLock lock(&state_->mu);
  return state_->idle_bytes;
}

BufferPool::Lease::Lease(Lease&& other) noexcept
    : pool_(std::move(other.pool_)),
      data_(std::move(other.data_)),
      size_(std::exchange(other.size_, 0)) {}

BufferPool::Lease& BufferPool::Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    Lease gone(std::move(*this));
    pool_ = std::move(other.pool_);
    data_ = std::move(other.data_);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

BufferPool::Lease::~Lease() {
  if (pool_ == nullptr || data_ == nullptr) return;
  std::vector<State::Idle> dropped;
  {
    absl::MutexLock lock(&pool_->mu);
    const absl::Time now = absl::Now();
    dropped = pool_->Expire(now);
    pool_->idle.push_back({std::move(data_), size_, now});
    pool_->idle_bytes += static_cast<int64_t>(size_);
    // Over the bound: the oldest go first.
    while (pool_->idle_bytes > pool_->max_idle_bytes) {
      pool_->idle_bytes -= static_cast<int64_t>(pool_->idle.front().size);
      dropped.push_back(std::move(pool_->idle.front()));
      pool_->idle.erase(pool_->idle.begin());
    }
  }
}

}  // namespace tessera
