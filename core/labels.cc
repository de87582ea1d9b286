#include "core/labels.h"

#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace tessera {
namespace {

bool IsLabelChar(char c, bool key) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_' ||
         c == '.' || c == '-' || (key && c == '/');
}

absl::Status CheckKey(absl::string_view key) {
  if (key.empty() || key.size() > kMaxLabelKeyBytes ||
      !absl::ascii_isalnum(static_cast<unsigned char>(key.front()))) {
    return absl::InvalidArgumentError(
        absl::StrCat("label key '", key, "' must be 1 to ", kMaxLabelKeyBytes,
                     " characters starting with a letter or digit"));
  }
  for (char c : key) {
    if (!IsLabelChar(c, /*key=*/true)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "label key '", key, "' may hold only letters, digits, _ . - and /"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckValue(absl::string_view key, absl::string_view value) {
  if (value.size() > kMaxLabelValueBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("the value of label '", key, "' is longer than ",
                     kMaxLabelValueBytes, " characters"));
  }
  for (char c : value) {
    if (!IsLabelChar(c, /*key=*/false)) {
      return absl::InvalidArgumentError(
          absl::StrCat("the value of label '", key,
                       "' may hold only letters, digits, _ . and -"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckLabels(const Labels& labels) {
  if (labels.size() > kMaxLabels) {
    return absl::InvalidArgumentError(
        absl::StrCat(labels.size(), " labels (at most ", kMaxLabels, ")"));
  }
  for (const auto& [key, value] : labels) {
    if (absl::Status s = CheckKey(key); !s.ok()) return s;
    if (absl::Status s = CheckValue(key, value); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<Labels> ParseLabels(absl::string_view text) {
  Labels labels;
  if (text.empty()) return labels;
  for (absl::string_view pair : absl::StrSplit(text, ',')) {
    const size_t eq = pair.find('=');
    if (eq == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          "'", pair, "' is not KEY=VALUE (labels are KEY=VALUE,KEY=VALUE...)"));
    }
    const std::string key(pair.substr(0, eq));
    if (labels.count(key) > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("label '", key, "' is given twice"));
    }
    labels[key] = std::string(pair.substr(eq + 1));
    if (labels.size() > kMaxLabels) break;  // CheckLabels names the count
  }
  if (absl::Status s = CheckLabels(labels); !s.ok()) return s;
  return labels;
}

std::string LabelsString(const Labels& labels) {
  return absl::StrJoin(labels, ",", absl::PairFormatter("="));
}

bool LabelSelector::Matches(const Labels& labels) const {
  if (all) return true;
  for (const auto& [key, value] : match) {
    auto it = labels.find(key);
    if (it == labels.end() || it->second != value) return false;
  }
  return true;
}

std::string LabelSelector::ToString() const {
  return all ? std::string("all") : LabelsString(match);
}

absl::StatusOr<LabelSelector> ParseLabelSelector(absl::string_view text) {
  LabelSelector selector;
  if (text == "all") {
    selector.all = true;
    return selector;
  }
  if (text.empty()) {
    return absl::InvalidArgumentError(
        "an empty selector (give KEY=VALUE[,KEY=VALUE...] or all)");
  }
  absl::StatusOr<Labels> labels = ParseLabels(text);
  if (!labels.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("selector '", text, "': ", labels.status().message()));
  }
  selector.match = *std::move(labels);
  return selector;
}

}  // namespace tessera
