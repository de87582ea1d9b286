#include "core/small_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tessera {
namespace {

absl::Status CannotRead(absl::string_view what, const std::string& path,
                        int err) {
  const std::string message =
      absl::StrCat("cannot read ", what, " ", path, ": ", std::strerror(err));
  return err == EACCES || err == EPERM ? absl::PermissionDeniedError(message)
                                       : absl::NotFoundError(message);
}

}  // namespace

absl::StatusOr<std::string> ReadSmallFile(const std::string& path,
                                          int64_t max_bytes,
                                          absl::string_view what,
                                          mode_t* mode) {
  // O_NONBLOCK only for the open: a FIFO with no writer would block it.
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return CannotRead(what, path, errno);
  struct stat st {};
  if (fstat(fd, &st) != 0 ||
      fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0) {
    const int err = errno;
    close(fd);
    return CannotRead(what, path, err);
  }
  if (mode != nullptr) *mode = st.st_mode;
  std::string text;
  char buffer[16384];
  int err = 0;
  while (static_cast<int64_t>(text.size()) <= max_bytes) {
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) err = errno;
    if (n <= 0) break;
    text.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  if (err != 0) return CannotRead(what, path, err);
  if (static_cast<int64_t>(text.size()) > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ", path, " holds more than ", max_bytes,
                     " bytes: is it the right file?"));
  }
  return text;
}

}  // namespace tessera
