// SmallReadCoalescer: the small reads that callers make of one worker at
// once, sent as fewer calls. A read goes out alone while the worker has
// fewer than `max_in_flight` of this client's calls; past that it waits, and
// the first waiter to find a free place takes every waiting read of its kind
// (same key: the capability and element size) into one call, up to
// kMaxRegionsPerSmallRead reads and kMaxChunkBytes. Under concurrency each
// call then carries several reads, so the per-call cost of gRPC (about
// 60 us of CPU on each side, bench/ figure 2) is paid once for all of them;
// one caller at a time never waits.
//
// A call of several reads that fails is not the answer for any of them:
// each is then sent alone by its own caller, which gets its own answer. A
// worker that does not know coalesced reads (UNIMPLEMENTED) is sent reads
// one at a time from then on.
#ifndef TESSERA_TRANSPORT_SMALL_READ_COALESCER_H_
#define TESSERA_TRANSPORT_SMALL_READ_COALESCER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace tessera {

// One caller's read. Callers derive from it to carry what their send
// function needs.
struct SmallRead {
  std::string key;    // reads coalesce only with reads of the same key
  int64_t bytes = 0;  // the reply's bytes for this read
  absl::Time deadline = absl::InfiniteFuture();
  // Set by the send function: this read's own answer once its call
  // succeeded (its bytes delivered, or why not).
  absl::Status status;

 private:
  friend class SmallReadCoalescer;
  bool taken = false;  // in a call being made
  bool done = false;   // that call returned
  bool alone = false;  // that call failed: send this read by itself
};

class SmallReadCoalescer {
 public:
  // Sends `reads` (one, or several of one key) as one call. Returns the
  // call's status; when it is OK, sets each read's `status`. Called from
  // the callers' threads, up to max_in_flight at once.
  using Send = std::function<absl::Status(absl::Span<SmallRead* const>)>;

  // max_in_flight >= 1.
  SmallReadCoalescer(int max_in_flight, Send send);

  // Reads `read` (through one call or as part of another caller's), and
  // returns its status; DEADLINE_EXCEEDED when its deadline passes while
  // it waits for a place.
  absl::Status Read(SmallRead& read);

  // Calls made, calls that carried more than one read, and reads waiting
  // for a place now (for tests).
  int64_t calls() const;
  int64_t coalesced_calls() const;
  int waiting() const;

 private:
  // Removes `first` and the waiting reads of its key from the queue, up to
  // the limits of one call.
  std::vector<SmallRead*> TakeBatch(SmallRead* first)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes one call for `batch` with mu_ released, then marks it done.
  void SendBatch(const std::vector<SmallRead*>& batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int max_in_flight_;
  const Send send_;
  mutable absl::Mutex mu_;
  absl::CondVar changed_;  // a place freed up or a call returned
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  bool coalesce_ ABSL_GUARDED_BY(mu_) = true;
  std::deque<SmallRead*> waiting_ ABSL_GUARDED_BY(mu_);
  int64_t calls_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t coalesced_calls_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tessera

#endif  // TESSERA_TRANSPORT_SMALL_READ_COALESCER_H_
