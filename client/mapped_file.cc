#include "client/mapped_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/stdio_file.h"
#include "core/fan_out.h"
#include "core/no_sigpipe.h"

namespace tessera {
namespace {

std::string DirName(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// Whether the kernel would refuse to follow the link `link` (lstat `st`)
// under fs.protected_symlinks: a link in a sticky, world-writable directory
// (/tmp) made by someone who owns neither it nor the directory. A link
// followed by hand must obey the same rule, or a link planted in /tmp would
// aim a root user's output at any file.
bool PlantedLink(const std::string& link, const struct stat& st) {
  struct stat dir {};
  if (stat(DirName(link).c_str(), &dir) != 0) return false;
  const bool shared = (dir.st_mode & S_ISVTX) != 0 && (dir.st_mode & S_IWOTH);
  return shared && st.st_uid != geteuid() && st.st_uid != dir.st_uid;
}

// Where an output named `path` goes, with `*special` set when it is an
// existing device, pipe or socket (opened by `path` itself, so that links
// like /dev/stdout -> /proc/self/fd/1 -> pipe:[N] work). Otherwise its
// links are followed as the kernel would (relative ones from the link's
// directory): a regular file at their end is replaced (the links stay),
// and a name that does not exist yet is created there.
absl::StatusOr<std::string> ResolveOutput(const std::string& path,
                                          absl::string_view kind,
                                          bool* special) {
  struct stat st {};
  if (stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) {
      return MappedFileError(kind, path, "write it", EISDIR);
    }
    if (!S_ISREG(st.st_mode)) {
      *special = true;
      return path;
    }
  } else if (errno != ENOENT) {
    return MappedFileError(kind, path, "look it up", errno);
  }
  constexpr int kMaxLinks = 40;  // as the kernel's own path walk
  std::string at = path;
  for (int links = 0;; ++links) {
    if (lstat(at.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return at;
    if (links == kMaxLinks) {
      return MappedFileError(kind, path, "follow it", ELOOP);
    }
    if (PlantedLink(at, st)) {
      return MappedFileError(
          kind, path,
          absl::StrCat("follow the link ", at,
                       " (another user's, in a shared directory)"),
          EACCES);
    }
    std::vector<char> target(PATH_MAX + 1);
    const ssize_t got = readlink(at.c_str(), target.data(), target.size());
    if (got < 0) return MappedFileError(kind, path, "follow it", errno);
    if (got == 0 || static_cast<size_t>(got) == target.size()) {
      return MappedFileError(kind, path, "follow it", ENAMETOOLONG);
    }
    const std::string next(target.data(), static_cast<size_t>(got));
    at = next.front() == '/' ? next : absl::StrCat(DirName(at), "/", next);
  }
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
  FanOut(static_cast<size_t>(threads), static_cast<size_t>(threads),
         [data, size, slice](size_t i) {
           const int64_t begin = static_cast<int64_t>(i) * slice;
           const int64_t end = std::min(size, begin + slice);
           if (begin < end) {
             madvise(data + begin, static_cast<size_t>(end - begin),
                     MADV_POPULATE_WRITE);
           }
           return absl::OkStatus();
         })
      .IgnoreError();
#else
  (void)data;
  (void)size;
#endif
}

// ---- The SIGBUS guard of input mappings.
//
// One slot per live MappedInputFile, in a fixed array that the handler can
// scan without locks or allocation. A slot is claimed (kClaimed) by Open,
// filled, then published (kLive); the destructor frees it (kFree) before
// unmapping.
enum SlotState : int { kFree = 0, kClaimed = 1, kLive = 2 };

struct GuardSlot {
  std::atomic<int> state{kFree};
  std::atomic<uintptr_t> begin{0};
  std::atomic<uintptr_t> end{0};  // page-aligned
  std::atomic<bool> faulted{false};
  std::atomic<const MappedInputFile*> owner{nullptr};
};

GuardSlot g_slots[MappedInputFile::kMaxOpen];
uintptr_t g_page_size = 4096;
struct sigaction g_previous_sigbus;

void OnSigbus(int sig, siginfo_t* info, void* context) {
  const int saved_errno = errno;
  // Only a fault (si_code > 0: from the kernel), not a SIGBUS sent by kill.
  if (info != nullptr && info->si_code > 0) {
    const uintptr_t address = reinterpret_cast<uintptr_t>(info->si_addr);
    for (GuardSlot& slot : g_slots) {
      if (slot.state.load(std::memory_order_acquire) != kLive) continue;
      const uintptr_t begin = slot.begin.load(std::memory_order_relaxed);
      const uintptr_t end = slot.end.load(std::memory_order_relaxed);
      if (address < begin || address >= end) continue;
      // The file shrank under the mapping: zero pages from the faulting
      // one to the end of the mapping, so the read in progress goes on
      // (and the file is marked, so its bytes are not used). The system
      // call itself, which is safe here, not mmap(3), which libraries
      // such as UCX hook with code that takes locks.
      const uintptr_t page = address & ~(g_page_size - 1);
      if (syscall(SYS_mmap, page, end - page, PROT_READ,
                  MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != -1) {
        slot.faulted.store(true, std::memory_order_release);
        errno = saved_errno;
        return;
      }
      break;
    }
  }
  errno = saved_errno;
  // Not ours: whatever was there before us.
  if (g_previous_sigbus.sa_flags & SA_SIGINFO) {
    g_previous_sigbus.sa_sigaction(sig, info, context);
    return;
  }
  if (g_previous_sigbus.sa_handler != SIG_DFL &&
      g_previous_sigbus.sa_handler != SIG_IGN) {
    g_previous_sigbus.sa_handler(sig);
    return;
  }
  // The default action: the faulting access runs again and ends the
  // process as it would have without us; a sent SIGBUS is sent again.
  signal(SIGBUS, SIG_DFL);
  if (info == nullptr || info->si_code <= 0) raise(SIGBUS);
}

void InstallSigbusGuardOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    g_page_size = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    struct sigaction action {};
    action.sa_sigaction = OnSigbus;
    action.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
    sigemptyset(&action.sa_mask);
    // The old handler is read first, so that a fault on another thread
    // never finds it unset.
    sigaction(SIGBUS, nullptr, &g_previous_sigbus);
    sigaction(SIGBUS, &action, nullptr);
  });
}

int ClaimSlot() {
  for (int i = 0; i < MappedInputFile::kMaxOpen; ++i) {
    int expected = kFree;
    if (g_slots[i].state.compare_exchange_strong(expected, kClaimed)) return i;
  }
  return -1;
}

void PublishSlot(int i, const MappedInputFile* owner, const char* data,
                 int64_t size) {
  GuardSlot& slot = g_slots[i];
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data);
  slot.begin.store(begin, std::memory_order_relaxed);
  slot.end.store((begin + static_cast<uintptr_t>(size) + g_page_size - 1) &
                     ~(g_page_size - 1),
                 std::memory_order_relaxed);
  slot.faulted.store(false, std::memory_order_relaxed);
  slot.owner.store(owner, std::memory_order_relaxed);
  slot.state.store(kLive, std::memory_order_release);
}

void FreeSlot(int i) {
  g_slots[i].owner.store(nullptr, std::memory_order_relaxed);
  g_slots[i].state.store(kFree, std::memory_order_release);
}

int64_t MtimeNanos(const struct stat& st) {
  return int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
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
  file->path_ = path;
  file->kind_ = std::string(kind);
  file->fd_ = fd;  // closed by the destructor from here on
  file->size_ = st.st_size;
  file->mtime_ns_ = MtimeNanos(st);
  if (st.st_size > 0) {
    InstallSigbusGuardOnce();
    file->slot_ = ClaimSlot();
    if (file->slot_ < 0) {
      return absl::ResourceExhaustedError(
          absl::StrCat(kind, " '", path, "': more than ", kMaxOpen,
                       " input files are mapped at once in this process"));
    }
    void* base = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ,
                      MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) return MappedFileError(kind, path, "map it", errno);
    file->data_ = static_cast<const char*>(base);
    PublishSlot(file->slot_, file.get(), file->data_, file->size_);
    // Read front to back, once.
    madvise(base, static_cast<size_t>(st.st_size), MADV_SEQUENTIAL);
  }
  return file;
}

MappedInputFile::~MappedInputFile() {
  if (slot_ >= 0) FreeSlot(slot_);
  if (data_ != nullptr) {
    munmap(const_cast<char*>(data_), static_cast<size_t>(size_));
  }
  if (fd_ >= 0) close(fd_);
}

absl::Status MappedInputFile::CheckUnchanged() const {
  const bool faulted =
      slot_ >= 0 && g_slots[slot_].faulted.load(std::memory_order_acquire);
  struct stat st {};
  if (fstat(fd_, &st) != 0) {
    return MappedFileError(kind_, path_, "check it after reading it", errno);
  }
  if (!faulted && st.st_size == size_ && MtimeNanos(st) == mtime_ns_) {
    return absl::OkStatus();
  }
  std::string how;
  if (st.st_size < size_) {
    how = absl::StrCat("it shrank from ", size_, " to ", st.st_size, " bytes");
  } else if (faulted) {
    how = absl::StrCat("it was cut short of its ", size_, " bytes");
  } else if (st.st_size > size_) {
    how = absl::StrCat("it grew from ", size_, " to ", st.st_size, " bytes");
  } else {
    how = "it was written to";
  }
  return absl::FailedPreconditionError(absl::StrCat(
      kind_, " '", path_, "' changed while it was read (", how,
      "), so what was read from it is not used; read it again once nothing "
      "writes to it"));
}

absl::Status CheckMappedInput(const void* data, int64_t size) {
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data);
  const uintptr_t end =
      begin + static_cast<uintptr_t>(std::max<int64_t>(size, 0));
  for (const GuardSlot& slot : g_slots) {
    if (slot.state.load(std::memory_order_acquire) != kLive) continue;
    if (begin < slot.begin.load(std::memory_order_relaxed) ||
        end > slot.end.load(std::memory_order_relaxed)) {
      continue;
    }
    const MappedInputFile* owner = slot.owner.load(std::memory_order_relaxed);
    if (owner != nullptr) return owner->CheckUnchanged();
  }
  return absl::OkStatus();
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
  const bool stdout_output = path == "-";
  bool special = stdout_output;
  absl::StatusOr<std::string> target =
      stdout_output ? absl::StatusOr<std::string>(path)
                    : ResolveOutput(path, kind, &special);
  if (!target.ok()) return target.status();
  if (special) {
    // Renaming over /dev/null would replace the device for every process;
    // a pipe cannot be mapped. So the bytes gather in a temporary file and
    // are written into it at Commit. Opened now so that a refusal comes
    // before any byte moves (a FIFO waits here for its reader, as a shell's
    // redirection would). Stdout is written where it stands (a `>>` file
    // is appended to).
    file->special_fd_ = stdout_output
                            ? fcntl(STDOUT_FILENO, F_DUPFD_CLOEXEC, 0)
                            : open(target->c_str(), O_WRONLY | O_CLOEXEC);
    if (file->special_fd_ < 0) {
      return MappedFileError(kind, path, "open it for writing", errno);
    }
    file->fd_ = OpenUnnamedTemporaryFile();
    if (file->fd_ < 0) {
      return MappedFileError(
          kind, path, "make a temporary file for it under $TMPDIR", errno);
    }
  } else {
    // A fresh name next to the destination, created with O_EXCL and mode
    // 0666 so the umask applies as usual.
    file->path_ = *target;
    static std::atomic<uint64_t> counter{0};
    const size_t slash = target->rfind('/');
    const std::string base =
        absl::StrCat(DirName(*target), "/.",
                     target->substr(slash == std::string::npos ? 0 : slash + 1),
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
  if (special_fd_ >= 0) {
    absl::Status written = WriteIntoSpecialFile();
    committed_ = written.ok();
    return written;
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

absl::Status MappedOutputFile::WriteIntoSpecialFile() {
  // A pipe whose reader left answers EPIPE (and SIGPIPE, which must not end
  // an SDK user's process).
  ScopedNoSigpipe no_sigpipe;
  std::vector<char> buffer(size_t{8} << 20);
  for (int64_t done = 0; done < size_;) {
    const ssize_t got = pread(
        fd_, buffer.data(),
        static_cast<size_t>(std::min<int64_t>(buffer.size(), size_ - done)),
        done);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      return MappedFileError(kind_, path_, "read back its bytes",
                             got < 0 ? errno : EIO);
    }
    for (ssize_t put = 0; put < got;) {
      const ssize_t wrote = write(special_fd_, buffer.data() + put,
                                  static_cast<size_t>(got - put));
      if (wrote < 0 && errno == EINTR) continue;
      if (wrote <= 0) {
        return MappedFileError(kind_, path_, "write it",
                               wrote < 0 ? errno : EIO);
      }
      put += wrote;
    }
    done += got;
  }
  const int fd = special_fd_;
  special_fd_ = -1;
  if (close(fd) != 0) return MappedFileError(kind_, path_, "write it", errno);
  return absl::OkStatus();
}

MappedOutputFile::~MappedOutputFile() {
  if (data_ != nullptr) munmap(data_, static_cast<size_t>(size_));
  if (fd_ >= 0) close(fd_);
  if (special_fd_ >= 0) close(special_fd_);
  if (!committed_ && !temp_path_.empty()) unlink(temp_path_.c_str());
}

}  // namespace tessera
