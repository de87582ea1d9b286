#include "client/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tessera {
namespace {

std::string DirName(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// Faults in [data, data + size) of a writable shared mapping, split over
// the machine's cores. Best effort: a range the kernel will not populate is
// faulted in as the bytes are written instead.
void PopulateInParallel(char* data, int64_t size) {
#ifdef MADV_POPULATE_WRITE
  constexpr int64_t kMinSlice = int64_t{32} << 20;
  const int64_t page = sysconf(_SC_PAGESIZE);
  const int64_t cores = std::max<long>(1, sysconf(_SC_NPROCESSORS_ONLN));
  const int64_t threads =
      std::max<int64_t>(1, std::min<int64_t>(cores, size / kMinSlice));
  const int64_t slice = (size / threads + page - 1) / page * page;
  auto populate = [data, size, slice](int64_t i) {
    const int64_t begin = i * slice;
    const int64_t end = std::min(size, begin + slice);
    if (begin < end) {
      madvise(data + begin, static_cast<size_t>(end - begin),
              MADV_POPULATE_WRITE);
    }
  };
  std::vector<std::thread> workers;
  for (int64_t i = 1; i < threads; ++i) workers.emplace_back(populate, i);
  populate(0);
  for (std::thread& t : workers) t.join();
#else
  (void)data;
  (void)size;
#endif
}

}  // namespace

absl::Status MappedFileError(absl::string_view kind, const std::string& path,
                             absl::string_view what, int err) {
  const std::string message = absl::StrCat(kind, " '", path, "': cannot ", what,
                                           ": ", std::strerror(err));
  switch (err) {
    case ENOENT:
      return absl::NotFoundError(message);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    case ENOSPC:
    case EDQUOT:
    case ENOMEM:
      return absl::ResourceExhaustedError(message);
    default:
      return absl::InvalidArgumentError(message);
  }
}

absl::StatusOr<std::unique_ptr<MappedInputFile>> MappedInputFile::Open(
    const std::string& path, absl::string_view kind) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return MappedFileError(kind, path, "open it", errno);
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return MappedFileError(kind, path, "stat it", err);
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat(kind, " '", path, "' is not a regular file"));
  }
  std::unique_ptr<MappedInputFile> file(new MappedInputFile());
  file->size_ = st.st_size;
  if (st.st_size > 0) {
    void* base = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ,
                      MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
      const int err = errno;
      close(fd);
      return MappedFileError(kind, path, "map it", err);
    }
    file->data_ = static_cast<const char*>(base);
    // Read front to back, once.
    madvise(base, static_cast<size_t>(st.st_size), MADV_SEQUENTIAL);
  }
  close(fd);  // the mapping keeps the file
  return file;
}

MappedInputFile::~MappedInputFile() {
  if (data_ != nullptr) {
    munmap(const_cast<char*>(data_), static_cast<size_t>(size_));
  }
}

absl::StatusOr<std::unique_ptr<MappedOutputFile>> MappedOutputFile::Create(
    const std::string& path, int64_t size, absl::string_view kind) {
  if (size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(kind, " '", path, "': cannot map ", size, " bytes"));
  }
  std::unique_ptr<MappedOutputFile> file(new MappedOutputFile());
  file->path_ = path;
  file->kind_ = std::string(kind);
  file->size_ = size;
  // A fresh name next to `path`, created with O_EXCL and mode 0666 so the
  // umask applies as usual.
  static std::atomic<uint64_t> counter{0};
  const size_t slash = path.rfind('/');
  const std::string base =
      absl::StrCat(DirName(path), "/.",
                   path.substr(slash == std::string::npos ? 0 : slash + 1),
                   ".tmp.", getpid());
  for (int attempt = 0; attempt < 100 && file->fd_ < 0; ++attempt) {
    file->temp_path_ = absl::StrCat(base, ".", counter.fetch_add(1));
    file->fd_ = open(file->temp_path_.c_str(),
                     O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (file->fd_ < 0 && errno != EEXIST) break;
  }
  if (file->fd_ < 0) {
    const int err = errno;
    file->temp_path_.clear();
    return MappedFileError(kind, path, "create it", err);
  }
  // Reserve the blocks now: a full disk fails here, not as a SIGBUS later.
  int rc = posix_fallocate(file->fd_, 0, size);
  if (rc == EOPNOTSUPP || rc == EINVAL) {
    rc = ftruncate(file->fd_, size) == 0 ? 0 : errno;
  }
  if (rc != 0) return MappedFileError(kind, path, "reserve its size", rc);
  // Faulting the pages in up front costs a fraction of taking a fault per
  // page as the bytes land, but one thread doing it for the whole file
  // serialises the provisioning of every new page-cache page (bench/ figure
  // 11: about 1 s per GiB on one core of a VM). So it is done here in
  // parallel, one slice per core, with MADV_POPULATE_WRITE. Not for outputs
  // that are a large part of the machine's memory, whose pages must come and
  // go as they are written.
  const int64_t memory =
      static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
  void* mapped = mmap(nullptr, static_cast<size_t>(size),
                      PROT_READ | PROT_WRITE, MAP_SHARED, file->fd_, 0);
  if (mapped == MAP_FAILED) return MappedFileError(kind, path, "map it", errno);
  if (size <= memory / 4) PopulateInParallel(static_cast<char*>(mapped), size);
  file->data_ = static_cast<char*>(mapped);
  return file;
}

absl::Status MappedOutputFile::Commit() {
  if (committed_) return absl::FailedPreconditionError("already committed");
  if (data_ != nullptr) {
    munmap(data_, static_cast<size_t>(size_));
    data_ = nullptr;
  }
  const int fd = fd_;
  fd_ = -1;
  if (close(fd) != 0) return MappedFileError(kind_, path_, "write it", errno);
  if (rename(temp_path_.c_str(), path_.c_str()) != 0) {
    return MappedFileError(kind_, path_, "rename it into place", errno);
  }
  committed_ = true;
  return absl::OkStatus();
}

MappedOutputFile::~MappedOutputFile() {
  if (data_ != nullptr) munmap(data_, static_cast<size_t>(size_));
  if (fd_ >= 0) close(fd_);
  if (!committed_ && !temp_path_.empty()) unlink(temp_path_.c_str());
}

}  // namespace tessera
