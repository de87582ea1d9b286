// `-` as a file name: stdin for an input, stdout for an output (.npy and
// safetensors alike), so that the CLI composes in shell pipes.
//
// A pipe cannot be mapped, sized ahead or renamed into, and the CLI's file
// paths rely on all three. So the bytes pass through a private directory
// under $TMPDIR (default /tmp), on disk rather than in memory, and a get
// larger than memory still works: an input is copied there before it is
// read; an output is written there whole (a failed get writes nothing to
// stdout) and then copied to stdout.
#ifndef TESSERA_CLIENT_STDIO_FILE_H_
#define TESSERA_CLIENT_STDIO_FILE_H_

#include <memory>
#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tessera {

inline bool IsStdio(absl::string_view path) { return path == "-"; }

// `-`, or a name of what this process's stdout is open on (/dev/stdout,
// /dev/fd/1, the file or FIFO it was redirected to): an output that goes to
// stdout as `-` does, with the command's report on stderr instead of
// after the bytes (or lost with a file renamed over).
bool IsStdoutOutput(const std::string& path);

// A directory of this process's own (mode 0700), removed with its files
// when the SpoolDir goes.
class SpoolDir {
 public:
  static absl::StatusOr<std::unique_ptr<SpoolDir>> Create();
  ~SpoolDir();
  SpoolDir(const SpoolDir&) = delete;
  SpoolDir& operator=(const SpoolDir&) = delete;

  // The path of `name` in it.
  std::string File(absl::string_view name) const;

 private:
  explicit SpoolDir(std::string path) : path_(std::move(path)) {}
  const std::string path_;
};

// Copies everything readable from `fd` (stdin) into a new file at `path`.
absl::Status CopyFdToFile(int fd, const std::string& path);

// Writes the whole file at `path` to `out`, flushed.
absl::Status CopyFileToStream(const std::string& path, std::ostream& out);

}  // namespace tessera

#endif  // TESSERA_CLIENT_STDIO_FILE_H_
