// Files for tests: paths in the test's scratch directory ($TEST_TMPDIR,
// which Bazel removes; /tmp outside Bazel) and whole-file reads and writes.
// Test-only. Each function is thread-safe; two tests that use one name in
// the same directory share the file.
#ifndef TESSERA_CORE_TESTING_TEMP_FILES_H_
#define TESSERA_CORE_TESTING_TEMP_FILES_H_

#include <stdlib.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace tessera {
namespace testing {

// $TEST_TMPDIR/`name` (/tmp/`name` outside Bazel). Nothing is created.
inline std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

// A new, empty directory $TEST_TMPDIR/`prefix`XXXXXX (mkdtemp); "" when it
// could not be made.
inline std::string MakeTempDir(const std::string& prefix) {
  const std::string pattern = TempPath(prefix + "XXXXXX");
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  return mkdtemp(buf.data()) != nullptr ? std::string(buf.data()) : "";
}

// The bytes of the file at `path`; "" when it cannot be read.
inline std::string ReadFileToString(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Replaces the file at `path` with `bytes` (creating it); a failure shows
// in what the test reads back.
inline void WriteStringToFile(const std::string& path,
                              const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// Whether `path` names a file or directory that exists (a link is followed).
inline bool PathExists(const std::string& path) {
  return access(path.c_str(), F_OK) == 0;
}

}  // namespace testing
}  // namespace tessera

#endif  // TESSERA_CORE_TESTING_TEMP_FILES_H_
