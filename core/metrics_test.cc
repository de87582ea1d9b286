#include "core/metrics.h"

#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

TEST(MetricsTest, CounterRendersWithTypeHelpAndLabels) {
  MetricsRegistry registry;
  registry.Counter("tessera_rpc_requests_total", "Calls served.",
                   {{"method", "/tessera.v1.Worker/ReadRegion"}, {"code", "OK"}})
      ->Add(3);
  const std::string text = registry.Render();
  EXPECT_THAT(text, HasSubstr("# HELP tessera_rpc_requests_total Calls served.\n"
                              "# TYPE tessera_rpc_requests_total counter\n"));
  EXPECT_THAT(text, HasSubstr("tessera_rpc_requests_total{method=\"/tessera.v1."
                              "Worker/ReadRegion\",code=\"OK\"} 3\n"));
}

TEST(MetricsTest, SameLabelsGiveTheSameSeries) {
  MetricsRegistry registry;
  MetricValue* a = registry.Counter("c_total", "h", {{"k", "v"}});
  MetricValue* b = registry.Counter("c_total", "h", {{"k", "v"}});
  EXPECT_EQ(a, b);
  EXPECT_NE(a, registry.Counter("c_total", "h", {{"k", "w"}}));
}

TEST(MetricsTest, LabelValuesAreEscaped) {
  MetricsRegistry registry;
  registry.Gauge("g", "h", {{"name", "a\"b\\c\nd"}})->Set(1);
  EXPECT_THAT(registry.Render(), HasSubstr("g{name=\"a\\\"b\\\\c\\nd\"} 1\n"));
}

TEST(MetricsTest, HistogramBucketsAreCumulativeWithInfSumAndCount) {
  MetricsRegistry registry;
  MetricHistogram* h =
      registry.Histogram("lat_seconds", "h", {{"m", "x"}}, {0.1, 1});
  h->Observe(0.05);
  h->Observe(0.1);  // on the bound: counted in le="0.1"
  h->Observe(0.5);
  h->Observe(7);
  const std::string text = registry.Render();
  EXPECT_THAT(text, HasSubstr("# TYPE lat_seconds histogram\n"));
  EXPECT_THAT(text, HasSubstr("lat_seconds_bucket{m=\"x\",le=\"0.1\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("lat_seconds_bucket{m=\"x\",le=\"1\"} 3\n"));
  EXPECT_THAT(text, HasSubstr("lat_seconds_bucket{m=\"x\",le=\"+Inf\"} 4\n"));
  EXPECT_THAT(text, HasSubstr("lat_seconds_sum{m=\"x\"} 7.65\n"));
  EXPECT_THAT(text, HasSubstr("lat_seconds_count{m=\"x\"} 4\n"));
}

TEST(MetricsTest, CollectorsRunAtRender) {
  MetricsRegistry registry;
  int64_t held = 10;
  registry.AddCollector([&](MetricsRegistry& r) {
    r.Gauge("tessera_bytes_held", "Bytes held.")->Set(held);
  });
  EXPECT_THAT(registry.Render(), HasSubstr("tessera_bytes_held 10\n"));
  held = 20;
  EXPECT_THAT(registry.Render(), HasSubstr("tessera_bytes_held 20\n"));
}

TEST(MetricsTest, ConcurrentAddsAreNotLost) {
  MetricsRegistry registry;
  MetricValue* c = registry.Counter("n_total", "h");
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) c->Add(1);
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(c->value(), 40000);
}

}  // namespace
}  // namespace tessera
