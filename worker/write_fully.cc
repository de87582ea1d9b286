#include "worker/write_fully.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace tessera {

absl::Status WriteFully(int fd, absl::string_view bytes,
                        absl::string_view what) {
  while (!bytes.empty()) {
    const ssize_t n = write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return errno == ENOSPC || errno == EDQUOT
                 ? absl::ResourceExhaustedError(
                       absl::StrCat(what, ": the disk is full"))
                 : absl::InternalError(
                       absl::StrCat(what, ": write: ", std::strerror(errno)));
    }
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

}  // namespace tessera
