#include "core/read_pacer.h"

#include <algorithm>

namespace tessera {
namespace {

// The delays of at most this many principals are kept for the metrics.
constexpr size_t kMaxDelays = 4096;

int64_t BurstOf(const ReadPacer::Options& options) {
  if (options.burst > 0) return options.burst;
  return std::max<int64_t>(options.rate / 10, int64_t{1} << 20);
}

}  // namespace

ReadPacer::ReadPacer(Options options)
    : options_(std::move(options)),
      burst_(BurstOf(options_)),
      forget_above_(kForgetAbove) {}

absl::Duration ReadPacer::Reserve(absl::string_view principal, int64_t bytes) {
  if (!enabled() || principal.empty() || bytes <= 0) {
    return absl::ZeroDuration();
  }
  const absl::Time now = options_.clock();
  absl::MutexLock lock(&mu_);
  if (buckets_.size() > forget_above_) {
    ForgetIdle(now);
    // Not again until the map has doubled: with many principals reading at
    // once, a read does not walk them all.
    forget_above_ = std::max(kForgetAbove, 2 * buckets_.size());
  }
  auto [it, added] = buckets_.try_emplace(principal);
  Bucket& bucket = it->second;
  if (added) {
    bucket.tokens = static_cast<double>(burst_);
  } else {
    const double refill = absl::ToDoubleSeconds(now - bucket.refilled) *
                          static_cast<double>(options_.rate);
    bucket.tokens =
        std::min(static_cast<double>(burst_), bucket.tokens + refill);
  }
  bucket.refilled = now;
  bucket.tokens -= static_cast<double>(bytes);
  if (bucket.tokens >= 0) return absl::ZeroDuration();
  const double wait = -bucket.tokens / static_cast<double>(options_.rate);
  auto delay = delays_.find(principal);
  if (delay != delays_.end()) {
    delay->second += wait;
  } else if (delays_.size() < kMaxDelays) {
    delays_.emplace(std::string(principal), wait);
  }
  return absl::Seconds(wait);
}

void ReadPacer::Pace(absl::string_view principal, int64_t bytes) {
  const absl::Duration wait = Reserve(principal, bytes);
  if (wait > absl::ZeroDuration()) absl::SleepFor(wait);
}

std::map<std::string, double> ReadPacer::Delays() const {
  absl::MutexLock lock(&mu_);
  return std::map<std::string, double>(delays_.begin(), delays_.end());
}

void ReadPacer::ForgetIdle(absl::Time now) {
  const double rate = static_cast<double>(options_.rate);
  for (auto it = buckets_.begin(); it != buckets_.end();) {
    const double tokens =
        it->second.tokens +
        absl::ToDoubleSeconds(now - it->second.refilled) * rate;
    if (tokens >= static_cast<double>(burst_)) {
      buckets_.erase(it++);
    } else {
      ++it;
    }
  }
}

}  // namespace tessera
