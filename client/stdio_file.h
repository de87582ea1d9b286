// `-` as a file name: stdin for an input, stdout for an output (.npy and
// safetensors alike), so that the CLI composes in shell pipes.
//
// A pipe cannot be mapped, sized ahead or renamed into, and the CLI's file
// paths rely on all three. So the bytes pass through an unnamed file under
// $TMPDIR (default /tmp), on disk rather than in memory, so that a get
// larger than memory still works and nothing is left there however the
// CLI ends: an input is copied there before it is read (SpooledInput); an
// output is written there whole and then to stdout (MappedOutputFile takes
// "-" as stdout), so a failed get writes nothing to stdout.
#ifndef TESSERA_CLIENT_STDIO_FILE_H_
#define TESSERA_CLIENT_STDIO_FILE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
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

// How much of a stream to take, from its first bytes `head`: the whole
// size once its header says (nullopt before), or the header's error as soon
// as the bytes cannot start the format (NpyStreamBytes,
// SafetensorsStreamBytes).
using StreamBytes = std::function<absl::StatusOr<std::optional<int64_t>>(
    absl::string_view head)>;

// An unnamed file under $TMPDIR (default /tmp), open read-write: nothing
// is left of it however the process ends (Ctrl-C included). -1 with errno
// set when none can be made.
int OpenUnnamedTemporaryFile();

// stdin as an input file: copied into an unnamed temporary file, as many
// bytes as its header says. Bytes that cannot start the format, or more
// than the header says, are an error at once (so `cat /dev/zero | tessera
// put ... --input=-` fills no disk); fewer are left for the file's reader
// to report.
class SpooledInput {
 public:
  static absl::StatusOr<std::unique_ptr<SpooledInput>> Copy(
      int fd, const StreamBytes& stream_bytes);
  ~SpooledInput();
  SpooledInput(const SpooledInput&) = delete;
  SpooledInput& operator=(const SpooledInput&) = delete;

  // A path that opens the copy (/proc/self/fd/N) while this lives.
  const std::string& path() const { return path_; }

 private:
  explicit SpooledInput(int fd);
  const int fd_;
  const std::string path_;
};

}  // namespace tessera

#endif  // TESSERA_CLIENT_STDIO_FILE_H_
