// The lines of the small text files operators write for the coordinator
// (--tokens, --quotas): `#` starts a comment, fields are separated by
// spaces or tabs, blank lines are skipped. One reading for every such file.
#ifndef TESSERA_CORE_CONFIG_LINES_H_
#define TESSERA_CORE_CONFIG_LINES_H_

#include <vector>

#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace tessera {

struct ConfigLine {
  int number = 0;                         // 1-based, for errors
  std::vector<absl::string_view> fields;  // views into the text
};

// The lines of `text` that hold a field, in order.
inline std::vector<ConfigLine> ConfigLines(absl::string_view text) {
  std::vector<ConfigLine> out;
  int number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++number;
    if (size_t hash = line.find('#'); hash != absl::string_view::npos) {
      line = line.substr(0, hash);
    }
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (!fields.empty()) out.push_back({number, std::move(fields)});
  }
  return out;
}

}  // namespace tessera

#endif  // TESSERA_CORE_CONFIG_LINES_H_
