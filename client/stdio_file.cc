#include "client/stdio_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tessera {
namespace {

constexpr size_t kStep = size_t{8} << 20;

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

absl::StatusOr<std::unique_ptr<SpoolDir>> SpoolDir::Create() {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = absl::StrCat(
      tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/tessera-stdio-XXXXXX");
  std::vector<char> buffer(pattern.begin(), pattern.end());
  buffer.push_back('\0');
  if (mkdtemp(buffer.data()) == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot make a directory for '-' under ",
        pattern.substr(0, pattern.rfind('/')),
        " (set TMPDIR to a writable directory): ", std::strerror(errno)));
  }
  return std::unique_ptr<SpoolDir>(new SpoolDir(buffer.data()));
}

SpoolDir::~SpoolDir() {
  if (DIR* dir = opendir(path_.c_str())) {
    while (dirent* entry = readdir(dir)) {
      const std::string name = entry->d_name;
      if (name != "." && name != "..") unlink(File(name).c_str());
    }
    closedir(dir);
  }
  rmdir(path_.c_str());
}

std::string SpoolDir::File(absl::string_view name) const {
  return absl::StrCat(path_, "/", name);
}

absl::Status CopyFdToFile(int fd, const std::string& path) {
  const int out =
      open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (out < 0) return Failed("cannot create", path);
  std::vector<char> buffer(kStep);
  absl::Status status;
  while (status.ok()) {
    const ssize_t got = read(fd, buffer.data(), buffer.size());
    if (got == 0) break;
    if (got < 0) {
      if (errno == EINTR) continue;
      status = absl::InternalError(
          absl::StrCat("reading stdin: ", std::strerror(errno)));
      break;
    }
    for (ssize_t done = 0; done < got && status.ok();) {
      const ssize_t put = write(out, buffer.data() + done, got - done);
      if (put < 0 && errno == EINTR) continue;
      if (put <= 0) {
        status = Failed("writing", path);
      } else {
        done += put;
      }
    }
  }
  if (close(out) != 0 && status.ok()) status = Failed("writing", path);
  return status;
}

absl::Status CopyFileToStream(const std::string& path, std::ostream& out) {
  const int in = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (in < 0) return Failed("cannot open", path);
  std::vector<char> buffer(kStep);
  absl::Status status;
  while (status.ok()) {
    const ssize_t got = read(in, buffer.data(), buffer.size());
    if (got == 0) break;
    if (got < 0) {
      if (errno == EINTR) continue;
      status = Failed("reading", path);
      break;
    }
    out.write(buffer.data(), got);
    if (!out) {
      status = absl::UnavailableError(
          "writing stdout failed (the reading end of the pipe closed?)");
    }
  }
  close(in);
  if (status.ok() && !out.flush()) {
    status = absl::UnavailableError("writing stdout failed");
  }
  return status;
}

}  // namespace tessera
