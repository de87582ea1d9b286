// ReadPacer: a worker's bandwidth limit on reads, one token bucket per
// principal, enforced by delaying the reply as Kafka's client quotas do,
// never by failing it. One tenant's bulk gather is held to its rate, so
// another's small reads, which draw on buckets of their own, are not
// queued behind it.
//
// Reads are paced by the principal their capability names: the empty
// principal (the coordinator's own moves: reshard pulls, repairs; callers
// of a cluster without identities) is never paced. A reservation takes its
// bytes at once and may leave the bucket in debt; the caller sleeps until
// the debt would be paid, so concurrent readers of one principal queue
// behind each other and together keep to the rate (plus one burst).
// Thread-safe.
#ifndef TESSERA_CORE_READ_PACER_H_
#define TESSERA_CORE_READ_PACER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace tessera {

class ReadPacer {
 public:
  struct Options {
    // Bytes per second each principal's reads are served at, at most; 0:
    // no limit.
    int64_t rate = 0;
    // Bytes a principal idle for a while may read at once; 0: a tenth of a
    // second's worth, at least 1 MiB.
    int64_t burst = 0;
    std::function<absl::Time()> clock = [] { return absl::Now(); };
  };

  explicit ReadPacer(Options options);

  bool enabled() const { return options_.rate > 0; }
  int64_t burst() const { return burst_; }

  // How long a read of `bytes` for `principal` must wait before it is
  // served: zero while the principal is within its rate (and always for
  // the empty principal or without a limit). The bytes count at once.
  absl::Duration Reserve(absl::string_view principal, int64_t bytes)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Reserve, then sleeps that long.
  void Pace(absl::string_view principal, int64_t bytes)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Seconds each principal's reads were held back so far (principals never
  // held back are absent).
  std::map<std::string, double> Delays() const ABSL_LOCKS_EXCLUDED(mu_);

  // Buckets kept before idle ones are forgotten (principals come from
  // verified capabilities; this bounds the walk, not an outsider).
  static constexpr size_t kForgetAbove = 4096;

 private:
  struct Bucket {
    double tokens = 0;  // bytes; negative: a debt readers are sleeping off
    absl::Time refilled;
  };
  // Forgets buckets that are full again (their principals idle), so that
  // the map holds the principals reading now.
  void ForgetIdle(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  const int64_t burst_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Bucket> buckets_ ABSL_GUARDED_BY(mu_);
  // ForgetIdle runs when buckets_ grows past this.
  size_t forget_above_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, double, std::less<>> delays_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera

#endif  // TESSERA_CORE_READ_PACER_H_
