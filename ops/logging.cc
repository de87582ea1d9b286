#include "ops/logging.h"

#include <algorithm>
#include <iterator>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/json.h"
#include "spdlog/pattern_formatter.h"
#include "spdlog/spdlog.h"

namespace tessera {
namespace {

// %* in a pattern: the message, escaped for a JSON string.
class JsonMessageFlag : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    const std::string escaped =
        JsonEscape(absl::string_view(msg.payload.data(), msg.payload.size()));
    dest.append(escaped.data(), escaped.data() + escaped.size());
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<JsonMessageFlag>();
  }
};

}  // namespace

absl::Status ConfigureLogging(absl::string_view format,
                              const std::string& process,
                              absl::string_view level) {
  if (format != "text" && format != "json") {
    return absl::InvalidArgumentError(
        absl::StrCat("--log_format must be text or json, got '", format, "'"));
  }
  const std::pair<absl::string_view, spdlog::level::level_enum> kLevels[] = {
      {"trace", spdlog::level::trace}, {"debug", spdlog::level::debug},
      {"info", spdlog::level::info},   {"warn", spdlog::level::warn},
      {"error", spdlog::level::err},   {"off", spdlog::level::off}};
  const auto* found =
      std::find_if(std::begin(kLevels), std::end(kLevels),
                   [&](const auto& named) { return named.first == level; });
  if (found == std::end(kLevels)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--log_level must be trace, debug, info, warn, error or "
                     "off, got '",
                     level, "'"));
  }
  spdlog::set_level(found->second);
  if (format == "text") return absl::OkStatus();
  auto formatter = std::make_unique<spdlog::pattern_formatter>(
      spdlog::pattern_time_type::utc, std::string("\n"));
  formatter->add_flag<JsonMessageFlag>('*').set_pattern(absl::StrCat(
      R"({"time":"%Y-%m-%dT%H:%M:%S.%fZ","level":"%l","process":")",
      JsonEscape(process), R"(","pid":%P,"thread":%t,"msg":"%*"})"));
  spdlog::set_formatter(std::move(formatter));
  return absl::OkStatus();
}

}  // namespace tessera
