#include "core/metrics.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tessera {
namespace {

std::string Escape(const std::string& value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string FormatValue(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (std::isnan(v)) return "NaN";
  if (v == std::floor(v) && std::fabs(v) < 1e15) {
    return absl::StrCat(static_cast<int64_t>(v));
  }
  return absl::StrFormat("%.15g", v);
}

// {a="x",le="0.5"}: `labels` (already rendered, maybe empty) plus one more.
std::string WithLabel(const std::string& labels, const std::string& name,
                      const std::string& value) {
  const std::string extra = absl::StrCat(name, "=\"", value, "\"");
  if (labels.empty()) return absl::StrCat("{", extra, "}");
  return absl::StrCat(labels.substr(0, labels.size() - 1), ",", extra, "}");
}

}  // namespace

void MetricValue::Add(double delta) {
  double current = value_.load(std::memory_order_relaxed);
  while (!value_.compare_exchange_weak(current, current + delta,
                                       std::memory_order_relaxed)) {
  }
}

MetricHistogram::MetricHistogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)),
      buckets_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  for (size_t i = 0; i <= bounds_.size(); ++i) buckets_[i] = 0;
}

void MetricHistogram::Observe(double value) {
  const size_t i = static_cast<size_t>(
      std::lower_bound(bounds_.begin(), bounds_.end(), value) -
      bounds_.begin());
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  sum_.Add(value);
}

std::vector<double> LatencyBuckets() {
  return {0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
          0.01,    0.025,  0.05,    0.1,    0.25,  0.5,    1,
          2.5,     5,      10,      30,     60};
}

std::string RenderLabels(const MetricLabels& labels) {
  if (labels.empty()) return "";
  std::string out = "{";
  for (size_t i = 0; i < labels.size(); ++i) {
    if (i > 0) out += ",";
    absl::StrAppend(&out, labels[i].first, "=\"", Escape(labels[i].second),
                    "\"");
  }
  return out + "}";
}

MetricsRegistry::Family& MetricsRegistry::FamilyFor(const std::string& name,
                                                    Type type,
                                                    const std::string& help) {
  auto [it, inserted] = families_.try_emplace(name);
  if (inserted) {
    it->second.type = type;
    it->second.help = help;
  }
  return it->second;
}

MetricValue* MetricsRegistry::Counter(const std::string& name,
                                      const std::string& help,
                                      const MetricLabels& labels) {
  absl::MutexLock lock(&mu_);
  auto& slot =
      FamilyFor(name, Type::kCounter, help).values[RenderLabels(labels)];
  if (slot == nullptr) slot = std::make_unique<MetricValue>();
  return slot.get();
}

MetricValue* MetricsRegistry::Gauge(const std::string& name,
                                    const std::string& help,
                                    const MetricLabels& labels) {
  absl::MutexLock lock(&mu_);
  auto& slot = FamilyFor(name, Type::kGauge, help).values[RenderLabels(labels)];
  if (slot == nullptr) slot = std::make_unique<MetricValue>();
  return slot.get();
}

MetricHistogram* MetricsRegistry::Histogram(const std::string& name,
                                            const std::string& help,
                                            const MetricLabels& labels,
                                            std::vector<double> bounds) {
  absl::MutexLock lock(&mu_);
  auto& slot =
      FamilyFor(name, Type::kHistogram, help).histograms[RenderLabels(labels)];
  if (slot == nullptr)
    slot = std::make_unique<MetricHistogram>(std::move(bounds));
  return slot.get();
}

void MetricsRegistry::AddCollector(
    std::function<void(MetricsRegistry&)> collector) {
  absl::MutexLock lock(&mu_);
  collectors_.push_back(std::move(collector));
}

std::string MetricsRegistry::Render() {
  std::vector<std::function<void(MetricsRegistry&)>> collectors;
  {
    absl::MutexLock lock(&mu_);
    collectors = collectors_;
  }
  // Collectors set gauges through the public methods, which lock.
  for (const auto& collect : collectors) collect(*this);

  absl::MutexLock lock(&mu_);
  std::string out;
  for (const auto& [name, family] : families_) {
    const char* type = family.type == Type::kCounter ? "counter"
                       : family.type == Type::kGauge ? "gauge"
                                                     : "histogram";
    absl::StrAppend(&out, "# HELP ", name, " ", family.help, "\n# TYPE ", name,
                    " ", type, "\n");
    for (const auto& [labels, value] : family.values) {
      absl::StrAppend(&out, name, labels, " ", FormatValue(value->value()),
                      "\n");
    }
    for (const auto& [labels, h] : family.histograms) {
      uint64_t cumulative = 0;
      for (size_t i = 0; i < h->bounds().size(); ++i) {
        cumulative += h->bucket(i);
        absl::StrAppend(&out, name, "_bucket",
                        WithLabel(labels, "le", FormatValue(h->bounds()[i])),
                        " ", cumulative, "\n");
      }
      cumulative += h->bucket(h->bounds().size());
      absl::StrAppend(&out, name, "_bucket", WithLabel(labels, "le", "+Inf"),
                      " ", cumulative, "\n");
      absl::StrAppend(&out, name, "_sum", labels, " ", FormatValue(h->sum()),
                      "\n", name, "_count", labels, " ", cumulative, "\n");
    }
  }
  return out;
}

}  // namespace tessera
