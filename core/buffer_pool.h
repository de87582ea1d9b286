// BufferPool: large heap buffers lent out and taken back, for bytes that
// pass through a bounce buffer (a range received whole, then placed into
// short runs). A fresh buffer of many MiB costs a page fault and the
// kernel's zeroing of each page on first touch: a tenth of the CPU of a
// UCX reshard when each piece made its own. Lent buffers are not zeroed.
// At most `max_idle_bytes` wait idle; one idle longer than `max_idle` is
// freed at the next Take or give-back. Thread-safe; a lease may outlive the
// pool.
#ifndef TESSERA_CORE_BUFFER_POOL_H_
#define TESSERA_CORE_BUFFER_POOL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace tessera {

class BufferPool {
 public:
  BufferPool(int64_t max_idle_bytes, absl::Duration max_idle);

  // A lent buffer; destroying it gives the buffer back.
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& other) noexcept;
    Lease& operator=(Lease&& other) noexcept;
    ~Lease();
    char* data() const { return data_.get(); }
    size_t size() const { return size_; }

   private:
    friend class BufferPool;
    struct State;
    std::shared_ptr<State> pool_;
    std::unique_ptr<char[]> data_;
    size_t size_ = 0;
  };

  // A buffer of at least `bytes`: an idle one of at most twice that, else a
  // new one (uninitialized). Never fails short of the allocator.
  Lease Take(size_t bytes);

  int64_t idle_bytes() const;

 private:
  std::shared_ptr<Lease::State> state_;
};

}  // namespace tessera

#endif  // TESSERA_CORE_BUFFER_POOL_H_
