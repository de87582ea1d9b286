// Worker labels and the selectors that pick workers by them (CLI.md
// "Mirrors (v4)"): `tessera-worker --labels=KEY=VALUE[,KEY=VALUE...]`, and a
// SELECTOR that is `KEY=VALUE[,KEY=VALUE...]` (every pair must match) or
// `all`. The syntax and its bounds are written only here. Pure functions.
#ifndef TESSERA_CORE_LABELS_H_
#define TESSERA_CORE_LABELS_H_

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tessera {

// A worker's labels, by key.
using Labels = std::map<std::string, std::string>;

// Bounds: at most kMaxLabels pairs; a key is 1 to 63 of letters, digits,
// `_ . - /` starting with a letter or digit (Kubernetes' names, with an
// optional `prefix/`, fit); a value is 0 to 63 of letters, digits, `_ . -`.
inline constexpr size_t kMaxLabels = 32;
inline constexpr size_t kMaxLabelKeyBytes = 63;
inline constexpr size_t kMaxLabelValueBytes = 63;

// OK when `labels` keeps the bounds above; INVALID_ARGUMENT naming the
// offending key or value (also for labels from a peer or a stored record).
absl::Status CheckLabels(const Labels& labels);

// Parses "KEY=VALUE[,KEY=VALUE...]" (empty text: no labels).
// INVALID_ARGUMENT naming what is malformed or repeated.
absl::StatusOr<Labels> ParseLabels(absl::string_view text);

// "KEY=VALUE,..." in key order (empty for none): what ParseLabels reads.
std::string LabelsString(const Labels& labels);

// Which workers a mirror group takes.
struct LabelSelector {
  bool all = false;  // every worker
  Labels match;      // otherwise: workers carrying every one of these

  bool Matches(const Labels& labels) const;
  // "all" or "KEY=VALUE,..." in key order.
  std::string ToString() const;
  bool operator==(const LabelSelector& other) const {
    return all == other.all && match == other.match;
  }
};

// Parses `all` or "KEY=VALUE[,KEY=VALUE...]" (at least one pair).
absl::StatusOr<LabelSelector> ParseLabelSelector(absl::string_view text);

}  // namespace tessera

#endif  // TESSERA_CORE_LABELS_H_
