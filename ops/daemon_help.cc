#include "ops/daemon_help.h"

#include <algorithm>
#include <cstdio>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/string_view.h"

namespace tessera {

bool PrintDaemonHelp(int argc, char** argv, const std::string& usage,
                     const std::string& main_file) {
  bool asked = false;
  std::string filter;
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (arg == "--help" || arg == "-h" || arg == "--helpfull" ||
        arg == "-help") {
      asked = true;
    } else if (absl::StartsWith(arg, "--help=")) {
      asked = true;
      filter = std::string(arg.substr(7));
    }
  }
  if (!asked) return false;
  std::vector<const absl::CommandLineFlag*> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    const std::string file = flag->Filename();
    const bool ours =
        absl::EndsWith(file, main_file) || absl::StrContains(file, "ops/");
    if (!ours) continue;
    if (!filter.empty() && !absl::StrContains(flag->Name(), filter) &&
        !absl::StrContains(flag->Help(), filter)) {
      continue;
    }
    flags.push_back(flag);
  }
  std::sort(flags.begin(), flags.end(),
            [](const auto* a, const auto* b) { return a->Name() < b->Name(); });
  std::printf("usage: %s\n\nflags (--flag=VALUE; default after '='):\n",
              usage.c_str());
  for (const absl::CommandLineFlag* flag : flags) {
    std::string value = flag->DefaultValue();
    if (value.empty()) value = "\"\"";
    const std::string help =
        absl::StrReplaceAll(flag->Help(), {{"\n", " "}, {"  ", " "}});
    std::printf("  --%s=%s  %s\n", std::string(flag->Name()).c_str(),
                value.c_str(), help.c_str());
  }
  return true;
}

}  // namespace tessera
