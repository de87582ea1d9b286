#include "ops/version.h"

#include <cstdio>

#include "absl/strings/str_cat.h"

namespace tessera {

std::string VersionLine(const std::string& program) {
  return absl::StrCat(program, " ", kVersion, " (wire protocol ", kWireProtocol,
                      ")");
}

void PrintVersion(const std::string& program) {
  std::printf("%s\n", VersionLine(program).c_str());
}

}  // namespace tessera
