// Metrics in Prometheus' model: counters, gauges and histograms, each a
// family with a name, help text and labelled series, rendered in the text
// exposition format (version 0.0.4). Pure: no I/O; ops/metrics_http serves
// Render() and the daemons feed the series.
//
// Thread-safe. Series are created on first use and never removed, so the
// pointers handed out stay valid for the registry's life; updates are
// atomic and take no lock. Names follow Prometheus' conventions: base units
// (_bytes, _seconds) and _total for counters.
#ifndef TESSERA_CORE_METRICS_H_
#define TESSERA_CORE_METRICS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace tessera {

// Label name/value pairs, in the order they are printed.
using MetricLabels = std::vector<std::pair<std::string, std::string>>;

// A value that only grows (or a gauge's current value).
class MetricValue {
 public:
  void Add(double delta);
  void Set(double value) { value_.store(value, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// Counts observations into fixed buckets (upper bounds, ascending).
class MetricHistogram {
 public:
  explicit MetricHistogram(std::vector<double> bounds);
  void Observe(double value);

  const std::vector<double>& bounds() const { return bounds_; }
  // Count of observations <= bounds()[i] (not cumulative), then the overflow.
  uint64_t bucket(size_t i) const {
    return buckets_[i].load(std::memory_order_relaxed);
  }
  uint64_t count() const { return count_.load(std::memory_order_relaxed); }
  double sum() const { return sum_.value(); }

 private:
  const std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // bounds_.size() + 1
  std::atomic<uint64_t> count_{0};
  MetricValue sum_;
};

// Latency buckets in seconds, 50 µs to 60 s.
std::vector<double> LatencyBuckets();

class MetricsRegistry {
 public:
  // The series of a family with these labels, created on first use. A
  // family's type and help are fixed by its first use.
  MetricValue* Counter(const std::string& name, const std::string& help,
                       const MetricLabels& labels = {})
      ABSL_LOCKS_EXCLUDED(mu_);
  MetricValue* Gauge(const std::string& name, const std::string& help,
                     const MetricLabels& labels = {}) ABSL_LOCKS_EXCLUDED(mu_);
  MetricHistogram* Histogram(const std::string& name, const std::string& help,
                             const MetricLabels& labels = {},
                             std::vector<double> bounds = LatencyBuckets())
      ABSL_LOCKS_EXCLUDED(mu_);

  // Runs before every Render, to set gauges whose value is read from
  // elsewhere (bytes held, workers alive).
  void AddCollector(std::function<void(MetricsRegistry&)> collector)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Every family, sorted by name, in the text exposition format.
  std::string Render() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  enum class Type { kCounter, kGauge, kHistogram };
  struct Family {
    Type type = Type::kCounter;
    std::string help;
    // By rendered label set ({a="x",b="y"}).
    std::map<std::string, std::unique_ptr<MetricValue>> values;
    std::map<std::string, std::unique_ptr<MetricHistogram>> histograms;
  };
  Family& FamilyFor(const std::string& name, Type type, const std::string& help)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  std::map<std::string, Family> families_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void(MetricsRegistry&)>> collectors_
      ABSL_GUARDED_BY(mu_);
};

// Renders labels as {a="x",b="y"} with Prometheus' escaping ("" for none).
std::string RenderLabels(const MetricLabels& labels);

}  // namespace tessera

#endif  // TESSERA_CORE_METRICS_H_
