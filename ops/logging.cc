#include "ops/logging.h"

#include <memory>

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
                              const std::string& process) {
  if (format == "text") return absl::OkStatus();
  if (format != "json") {
    return absl::InvalidArgumentError(
        absl::StrCat("--log_format must be text or json, got '", format, "'"));
  }
  auto formatter = std::make_unique<spdlog::pattern_formatter>(
      spdlog::pattern_time_type::utc, std::string("\n"));
  formatter->add_flag<JsonMessageFlag>('*').set_pattern(absl::StrCat(
      R"({"time":"%Y-%m-%dT%H:%M:%S.%fZ","level":"%l","process":")",
      JsonEscape(process), R"(","msg":"%*"})"));
  spdlog::set_formatter(std::move(formatter));
  return absl::OkStatus();
}

}  // namespace tessera
