// SmallReadCoalescer: the small reads that callers make of one worker at
// once, sent as fewer calls. Reads of one kind (one key: the capability and
// element size, so one tensor version) form a lane. A read goes out alone
// while its lane has fewer than `max_in_flight` calls out; past that it
// waits. When a call returns, its place goes to the first waiting read of
// the lane, which takes every read waiting there by then into one call, up
// to kMaxRegionsPerSmallRead reads and kMaxChunkBytes. Under concurrency
// each call then carries several reads, so the per-call cost of gRPC (tens
// of microseconds of CPU on each side, bench/ figure 2) is paid once for
// all of them; one caller at a time never waits, and reads of other tensors
// never wait behind a lane. Only the threads that a returned call or a
// place concerns wake up.
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
#include "absl/container/node_hash_map.h"
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
  bool lead = false;   // given a place: sends the next call of its lane
  bool taken = false;  // in a call being made
  bool done = false;   // that call returned
  bool alone = false;  // that call failed: send this read by itself
};

class SmallReadCoalescer {
 public:
  // Sends `reads` (one, or several of one key) as one call. Returns the
  // call's status; when it is OK, sets each read's `status`. Called from
  // the callers' threads, up to max_in_flight at once per key.
  using Send = std::function<absl::Status(absl::Span<SmallRead* const>)>;

  // max_in_flight >= 1.
  SmallReadCoalescer(int max_in_flight, Send send);

  // Reads `read` (through one call or as part of another caller's), and
  // returns its status; DEADLINE_EXCEEDED when its deadline passes while
  // it waits for a place.
  absl::Status Read(SmallRead& read);

  // Calls made, calls that carried more than one read, reads waiting for a
  // place now, and lanes with reads out or waiting (for tests).
  int64_t calls() const;
  int64_t coalesced_calls() const;
  int waiting() const;
  int lanes() const;

 private:
  // The reads of one key; kept while it has calls out or reads waiting.
  struct Lane {
    int in_flight = 0;
    std::deque<SmallRead*> waiting;
  };

  // `first` (given a place) and the reads waiting in its lane, removed
  // from the queue, up to the limits of one call.
  std::vector<SmallRead*> TakeBatch(Lane& lane, SmallRead* first)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes one call for `batch` (its place already counted in the lane)
  // with mu_ released, marks it done, and hands the place on.
  void SendBatch(const std::string& key, const std::vector<SmallRead*>& batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives the lane's free places to its first waiting reads (each sends the
  // next call), or drops the lane when nothing is left in it.
  void HandOutPlaces(const std::string& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int max_in_flight_;
  const Send send_;
  mutable absl::Mutex mu_;
  bool coalesce_ ABSL_GUARDED_BY(mu_) = true;
  // Node-based: a Lane stays put while others come and go.
  absl::node_hash_map<std::string, Lane> lanes_ ABSL_GUARDED_BY(mu_);
  int64_t calls_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t coalesced_calls_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tessera

#endif  // TESSERA_TRANSPORT_SMALL_READ_COALESCER_H_
