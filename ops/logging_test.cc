#include "ops/logging.h"

#include <memory>
#include <sstream>

#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "spdlog/sinks/ostream_sink.h"
#include "spdlog/spdlog.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;
using ::testing::ContainsRegex;
using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

TEST(LoggingTest, JsonLinesAreOneEscapedObject) {
  std::ostringstream out;
  auto logger = std::make_shared<spdlog::logger>(
      "test", std::make_shared<spdlog::sinks::ostream_sink_mt>(out));
  spdlog::set_default_logger(logger);
  ASSERT_THAT(ConfigureLogging("json", "tessera-worker"), IsOk());
  spdlog::warn("shard \"a\\b\"\nnext\x01");
  const std::string line = out.str();
  EXPECT_THAT(line, StartsWith(R"({"time":")"));
  EXPECT_THAT(line,
              ContainsRegex("\"time\":\"[0-9]+-[0-9]+-[0-9]+T[0-9:.]+Z\""));
  EXPECT_THAT(line,
              HasSubstr(R"("level":"warning","process":"tessera-worker",)"));
  EXPECT_THAT(line, ContainsRegex(R"("pid":[0-9]+,"thread":[0-9]+,"msg":)"));
  EXPECT_THAT(line, EndsWith("\"}\n"));
  EXPECT_EQ(line.find('\n'), line.size() - 1);  // one line
  EXPECT_THAT(line, HasSubstr(R"("msg":"shard \"a\\b\"\nnext\u0001"})"));
}

TEST(LoggingTest, UnknownFormatIsRefused) {
  EXPECT_THAT(
      ConfigureLogging("xml", "p"),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("text or json")));
}

TEST(LoggingTest, TheLevelDropsLessSevereLines) {
  std::ostringstream out;
  auto logger = std::make_shared<spdlog::logger>(
      "test", std::make_shared<spdlog::sinks::ostream_sink_mt>(out));
  spdlog::set_default_logger(logger);
  ASSERT_THAT(ConfigureLogging("text", "p", "warn"), IsOk());
  spdlog::info("quiet");
  spdlog::warn("loud");
  EXPECT_THAT(out.str(), Not(HasSubstr("quiet")));
  EXPECT_THAT(out.str(), HasSubstr("loud"));
  ASSERT_THAT(ConfigureLogging("text", "p", "debug"), IsOk());
  spdlog::debug("detail");
  EXPECT_THAT(out.str(), HasSubstr("detail"));
  // A bad level changes nothing.
  EXPECT_THAT(
      ConfigureLogging("text", "p", "verbose"),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--log_level")));
  spdlog::debug("still");
  EXPECT_THAT(out.str(), HasSubstr("still"));
  ASSERT_THAT(ConfigureLogging("text", "p"), IsOk());  // back to info
}

}  // namespace
}  // namespace tessera
