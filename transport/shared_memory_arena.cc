#include "transport/shared_memory_arena.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <random>

#include "absl/strings/str_cat.h"

namespace tessera {

const std::string& LocalHostId() {
  static const std::string* id = [] {
    std::ifstream in("/proc/sys/kernel/random/boot_id");
    std::string boot;
    std::getline(in, boot);
    struct stat st {};
    if (boot.empty() || stat("/dev/shm", &st) != 0)
      return new std::string();  // never matches
    return new std::string(absl::StrCat(boot, "/", st.st_dev, ":", st.st_ino));
  }();
  return *id;
}

// The names of the blocks still linked, by their first byte.
struct SharedBlock::Index {
  mutable absl::Mutex mu;
  // Invariant: one entry per block whose segment is linked.
  absl::flat_hash_map<const void*, SegmentInfo> blocks ABSL_GUARDED_BY(mu);
  std::string liveness;  // set before any block exists
};

namespace {

constexpr char kSegmentPrefix[] = "tessera-";

// "tessera-<pid namespace inode>-": pids are only comparable within one pid
// namespace, and /dev/shm is often shared across them (sandboxes, containers
// on one host).
const std::string& SegmentOwnerPrefix() {
  static const std::string* prefix = [] {
    struct stat st {};
    const unsigned long long ns =
        stat("/proc/self/ns/pid", &st) == 0 ? st.st_ino : 0;
    return new std::string(absl::StrCat(kSegmentPrefix, ns, "-"));
  }();
  return *prefix;
}

// Removes segments left by workers of this pid namespace that died without
// freeing them (their pid no longer runs).
void RemoveStaleSegments() {
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return;
  const std::string& mine = SegmentOwnerPrefix();
  while (dirent* entry = readdir(dir)) {
    const std::string name = entry->d_name;
    if (name.rfind(mine, 0) != 0) continue;
    const pid_t pid = static_cast<pid_t>(std::atol(name.c_str() + mine.size()));
    if (pid > 0 && kill(pid, 0) != 0 && errno == ESRCH)
      shm_unlink(("/" + name).c_str());
  }
  closedir(dir);
}

}  // namespace

SharedBlock::SharedBlock(std::shared_ptr<Index> index, std::string name,
                         char* data, int64_t bytes)
    : index_(std::move(index)),
      name_(std::move(name)),
      data_(data),
      bytes_(bytes) {}

SharedBlock::~SharedBlock() {
  Unlink();
  munmap(data_, static_cast<size_t>(bytes_));
}

void SharedBlock::Unlink() {
  {
    absl::MutexLock lock(&index_->mu);
    if (index_->blocks.erase(data_) == 0) return;  // already unlinked
  }
  shm_unlink(name_.c_str());
}

SharedMemoryArena::SharedMemoryArena()
    : index_(std::make_shared<SharedBlock::Index>()) {
  RemoveStaleSegments();
  // Held locked for the life of the arena: the kernel drops the lock when
  // the process dies, however it dies.
  liveness_ = absl::StrCat("/", SegmentOwnerPrefix(), getpid(), "-alive");
  liveness_fd_ = shm_open(liveness_.c_str(), O_RDWR | O_CREAT, 0600);
  if (liveness_fd_ < 0 || flock(liveness_fd_, LOCK_EX | LOCK_NB) != 0) {
    // Not ours to unlink: another arena of this process may hold it.
    if (liveness_fd_ >= 0) close(liveness_fd_);
    liveness_fd_ = -1;
    liveness_.clear();
  }
  index_->liveness = liveness_;
}

SharedMemoryArena::~SharedMemoryArena() {
  if (liveness_fd_ >= 0) {
    shm_unlink(liveness_.c_str());
    close(liveness_fd_);
  }
}

std::unique_ptr<SharedBlock> SharedMemoryArena::Allocate(int64_t bytes,
                                                         uint64_t tag) {
  if (bytes <= 0) return nullptr;
  static std::mt19937_64 rng{std::random_device{}()};
  static absl::Mutex rng_mu;
  uint64_t nonce;
  {
    absl::MutexLock lock(&rng_mu);
    nonce = rng();
  }
  std::string name = absl::StrCat("/", SegmentOwnerPrefix(), getpid(), "-",
                                  tag, "-", absl::Hex(nonce));
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) return nullptr;
  // Reserve the pages now: a full /dev/shm then fails here, not later as
  // SIGBUS on first touch.
  void* map = MAP_FAILED;
  if (posix_fallocate(fd, 0, bytes) == 0) {
    map = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE,
               MAP_SHARED, fd, 0);
  }
  close(fd);
  if (map == MAP_FAILED) {
    shm_unlink(name.c_str());
    return nullptr;
  }
  char* data = static_cast<char*>(map);
  {
    absl::MutexLock lock(&index_->mu);
    index_->blocks[data] = SegmentInfo{name, bytes, index_->liveness};
  }
  return std::unique_ptr<SharedBlock>(
      new SharedBlock(index_, std::move(name), data, bytes));
}

std::optional<SegmentInfo> SharedMemoryArena::Find(const void* data) const {
  absl::MutexLock lock(&index_->mu);
  auto it = index_->blocks.find(data);
  if (it == index_->blocks.end()) return std::nullopt;
  return it->second;
}

}  // namespace tessera
