#include "ops/metrics_http.h"

#include <httplib.h>

#include "core/metrics.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;
using ::testing::HasSubstr;

TEST(MetricsHttpTest, ServesTheRegistryAtMetrics) {
  MetricsRegistry registry;
  registry.Counter("tessera_test_total", "A test counter.")->Add(5);
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server =
      MetricsHttpServer::Start("127.0.0.1:0", &registry);
  ASSERT_THAT(server.status(), IsOk());
  httplib::Client client("127.0.0.1", (*server)->port());
  httplib::Result got = client.Get("/metrics");
  ASSERT_TRUE(got);
  EXPECT_EQ(got->status, 200);
  EXPECT_THAT(got->get_header_value("Content-Type"),
              HasSubstr("text/plain; version=0.0.4"));
  EXPECT_THAT(got->body, HasSubstr("tessera_test_total 5\n"));
  httplib::Result other = client.Get("/other");
  ASSERT_TRUE(other);
  EXPECT_EQ(other->status, 404);
}

TEST(MetricsHttpTest, BadOrTakenAddressIsAClearError) {
  MetricsRegistry registry;
  EXPECT_THAT(
      MetricsHttpServer::Start("nonsense", &registry).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not HOST:PORT")));
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> first =
      MetricsHttpServer::Start("127.0.0.1:0", &registry);
  ASSERT_THAT(first.status(), IsOk());
  EXPECT_THAT(
      MetricsHttpServer::Start("127.0.0.1:" + std::to_string((*first)->port()),
                               &registry)
          .status(),
      StatusIs(absl::StatusCode::kUnavailable, HasSubstr("cannot serve")));
}

}  // namespace
}  // namespace tessera
