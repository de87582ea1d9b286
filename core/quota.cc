#include "core/quota.h"

#include <algorithm>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/config_lines.h"
#include "core/small_file.h"

namespace tessera {

// A quota file of more principals than this is refused: its lines are
// looked up on every admission.
constexpr size_t kMaxQuotaLines = 100000;
constexpr int64_t kMaxQuotaFileBytes = int64_t{16} << 20;

absl::StatusOr<int64_t> ParseQuotaBytes(absl::string_view text) {
  if (absl::AsciiStrToLower(text) == "unlimited") return QuotaLimit::kUnlimited;
  int shift = 0;
  absl::string_view digits = text;
  if (!digits.empty()) {
    switch (absl::ascii_toupper(digits.back())) {
      case 'K':
        shift = 10;
        break;
      case 'M':
        shift = 20;
        break;
      case 'G':
        shift = 30;
        break;
      case 'T':
        shift = 40;
        break;
      default:
        break;
    }
    if (shift != 0) digits.remove_suffix(1);
  }
  uint64_t value = 0;
  // Digits only (SimpleAtoi alone would take signs and spaces).
  const bool all_digits =
      !digits.empty() && std::all_of(digits.begin(), digits.end(), [](char c) {
        return absl::ascii_isdigit(static_cast<unsigned char>(c));
      });
  if (!all_digits || !absl::SimpleAtoi(digits, &value) ||
      value > (static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) >>
               shift)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", text,
                     "' is not a byte count (a number, with K, M, G or T, or "
                     "'unlimited')"));
  }
  return static_cast<int64_t>(value << shift);
}

absl::StatusOr<QuotaTable> QuotaTable::Parse(absl::string_view text) {
  QuotaTable table;
  size_t lines = 0;
  for (const auto& [line_number, fields] : ConfigLines(text)) {
    auto bad = [&, line_number = line_number](absl::string_view why) {
      return absl::InvalidArgumentError(
          absl::StrCat("quotas line ", line_number, ": ", why));
    };
    if (fields.size() != 2 && fields.size() != 3) {
      return bad(absl::StrCat("expected PRINCIPAL BYTES [NAMES], got ",
                              fields.size(), " fields"));
    }
    if (++lines > kMaxQuotaLines) {
      return bad(absl::StrCat("more than ", kMaxQuotaLines, " principals"));
    }
    QuotaLimit limit;
    absl::StatusOr<int64_t> bytes = ParseQuotaBytes(fields[1]);
    if (!bytes.ok()) return bad(bytes.status().message());
    limit.bytes = *bytes;
    if (fields.size() == 3 && absl::AsciiStrToLower(fields[2]) != "unlimited") {
      int64_t names = 0;
      if (!absl::ascii_isdigit(static_cast<unsigned char>(fields[2].front())) ||
          !absl::SimpleAtoi(fields[2], &names) || names < 0) {
        return bad(absl::StrCat("'", fields[2],
                                "' is not a count of names (a number or "
                                "'unlimited')"));
      }
      limit.names = names;
    }
    const absl::string_view principal = fields[0];
    const bool repeated = principal == "*" ? table.default_.has_value()
                                           : table.limits_.count(principal) > 0;
    if (repeated) {
      return bad(absl::StrCat("principal '", principal, "' is listed twice"));
    }
    if (principal == "*") {
      table.default_ = limit;
    } else {
      table.limits_.emplace(std::string(principal), limit);
    }
  }
  return table;
}

absl::StatusOr<QuotaTable> QuotaTable::Load(const std::string& path) {
  absl::StatusOr<std::string> text =
      ReadSmallFile(path, kMaxQuotaFileBytes, "quotas file");
  if (!text.ok()) return text.status();
  absl::StatusOr<QuotaTable> table = Parse(*text);
  if (!table.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", table.status().message()));
  }
  return table;
}

QuotaLimit QuotaTable::For(absl::string_view principal) const {
  if (auto it = limits_.find(principal); it != limits_.end()) return it->second;
  return default_.value_or(QuotaLimit{});
}

std::vector<std::string> QuotaTable::Listed() const {
  std::vector<std::string> out;
  for (const auto& [name, limit] : limits_) out.push_back(name);
  return out;
}

std::string PrincipalLabel(absl::string_view principal) {
  return principal.empty() ? std::string("anonymous") : std::string(principal);
}

absl::Status CheckQuota(absl::string_view principal, const QuotaUse& use,
                        const QuotaUse& more, const QuotaLimit& limit,
                        absl::string_view what) {
  // Sums saturate: a use past int64 is over any limit anyway.
  auto add = [](int64_t a, int64_t b) {
    return a > std::numeric_limits<int64_t>::max() - b
               ? std::numeric_limits<int64_t>::max()
               : a + b;
  };
  if (limit.bytes >= 0 && more.bytes > 0 &&
      add(use.bytes, more.bytes) > limit.bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("quota: principal '", PrincipalLabel(principal), "' uses ",
                     use.bytes, " of its ", limit.bytes, " bytes; ", what,
                     " needs ", more.bytes, " more"));
  }
  if (limit.names >= 0 && more.names > 0 &&
      add(use.names, more.names) > limit.names) {
    return absl::ResourceExhaustedError(
        absl::StrCat("quota: principal '", PrincipalLabel(principal),
                     "' holds ", use.names, " of its ", limit.names,
                     " tensor names; ", what, " needs ", more.names, " more"));
  }
  return absl::OkStatus();
}

}  // namespace tessera
