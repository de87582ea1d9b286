#include "client/stdio_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tessera {
namespace {

constexpr size_t kStep = size_t{8} << 20;

std::string TemporaryDirectory() {
  const char* tmp = std::getenv("TMPDIR");
  return tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
}

absl::Status Failed(absl::string_view what, const std::string& path) {
  return absl::InternalError(
      absl::StrCat(what, " '", path, "': ", std::strerror(errno)));
}

}  // namespace

bool IsStdoutOutput(const std::string& path) {
  if (IsStdio(path)) return true;
  struct stat named {};
  struct stat out {};
  return stat(path.c_str(), &named) == 0 && fstat(STDOUT_FILENO, &out) == 0 &&
         named.st_dev == out.st_dev && named.st_ino == out.st_ino;
}

int OpenUnnamedTemporaryFile() {
  const std::string dir = TemporaryDirectory();
  const int fd = open(dir.c_str(), O_RDWR | O_TMPFILE | O_CLOEXEC, 0600);
  if (fd >= 0 || (errno != EOPNOTSUPP && errno != EISDIR)) return fd;
  std::string name = absl::StrCat(dir, "/.tessera-spool-XXXXXX");
  const int named = mkostemp(name.data(), O_CLOEXEC);
  if (named >= 0) unlink(name.c_str());
  return named;
}

SpooledInput::SpooledInput(int fd)
    : fd_(fd), path_(absl::StrCat("/proc/self/fd/", fd)) {}

SpooledInput::~SpooledInput() { close(fd_); }

absl::StatusOr<std::unique_ptr<SpooledInput>> SpooledInput::Copy(
    int fd, const StreamBytes& stream_bytes) {
  const int out = OpenUnnamedTemporaryFile();
  if (out < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot make a file for '-' under ", TemporaryDirectory(),
        " (set TMPDIR to a writable directory): ", std::strerror(errno)));
  }
  std::unique_ptr<SpooledInput> spooled(new SpooledInput(out));
  std::vector<char> buffer(kStep);
  std::string head;  // the first bytes, until the header gives the size
  std::optional<int64_t> total;
  int64_t copied = 0;
  absl::Status status;
  while (status.ok()) {
    // Once the size is known, one byte past it tells a longer stream.
    const size_t want =
        total.has_value()
            ? static_cast<size_t>(std::min<int64_t>(
                  static_cast<int64_t>(buffer.size()), *total - copied + 1))
            : buffer.size();
    const ssize_t got = read(fd, buffer.data(), want);
    if (got == 0) break;
    if (got < 0) {
      if (errno == EINTR) continue;
      status = absl::InternalError(
          absl::StrCat("reading stdin: ", std::strerror(errno)));
      break;
    }
    if (!total.has_value()) {
      head.append(buffer.data(), static_cast<size_t>(got));
      absl::StatusOr<std::optional<int64_t>> size = stream_bytes(head);
      if (!size.ok()) {
        status = absl::InvalidArgumentError(
            absl::StrCat("reading stdin: ", size.status().message()));
        break;
      }
      total = *size;
      if (total.has_value()) head.clear();
    }
    if (total.has_value() && copied + got > *total) {
      status = absl::InvalidArgumentError(
          absl::StrCat("reading stdin: more bytes follow than the ", *total,
                       " its header says the file holds"));
      break;
    }
    for (ssize_t done = 0; done < got && status.ok();) {
      const ssize_t put = write(out, buffer.data() + done, got - done);
      if (put < 0 && errno == EINTR) continue;
      if (put <= 0) {
        status = Failed("writing stdin's copy under", TemporaryDirectory());
      } else {
        done += put;
      }
    }
    copied += got;
  }
  if (!status.ok()) return status;
  return spooled;
}

}  // namespace tessera
