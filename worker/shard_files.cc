#include "worker/shard_files.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "core/crc32.h"
#include "core/status_macros.h"
#include "spdlog/spdlog.h"
#include "worker/write_fully.h"

namespace tessera {
namespace {

constexpr char kData[] = ".data";
constexpr char kRecord[] = ".record";
constexpr char kTemp[] = ".tmp";

std::string Hex(uint64_t id) { return absl::StrFormat("%016x", id); }

absl::Status Errno(absl::string_view what) {
  const int err = errno;
  const std::string text =
      absl::StrCat("store_dir: ", what, ": ", std::strerror(err));
  return err == ENOSPC || err == EDQUOT ? absl::ResourceExhaustedError(text)
                                        : absl::InternalError(text);
}

absl::StatusOr<std::shared_ptr<MappedShardFile>> Map(int fd, int64_t bytes,
                                                     absl::string_view what,
                                                     std::string path) {
  const int64_t mapped = std::max<int64_t>(bytes, 1);
  void* p = mmap(nullptr, static_cast<size_t>(mapped), PROT_READ | PROT_WRITE,
                 MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return Errno(absl::StrCat("mapping ", what));
  return std::make_shared<MappedShardFile>(static_cast<char*>(p), bytes, mapped,
                                           std::move(path));
}

}  // namespace

MappedShardFile::~MappedShardFile() {
  munmap(data_, static_cast<size_t>(mapped_));
}

absl::StatusOr<std::shared_ptr<ShardFiles>> ShardFiles::Open(
    const std::string& dir) {
  if (dir.empty()) {
    return absl::InvalidArgumentError("store_dir: the directory is empty");
  }
  const std::string shards = dir + "/shards";
  // With its parents, as mkdir -p.
  std::error_code error;
  std::filesystem::create_directories(shards, error);
  if (error) {
    return absl::InternalError(
        absl::StrCat("store_dir: making ", shards, ": ", error.message()));
  }
  // Readers on this host open shard files by this path.
  const std::filesystem::path absolute =
      std::filesystem::canonical(shards, error);
  if (error) {
    return absl::InternalError(
        absl::StrCat("store_dir: resolving ", shards, ": ", error.message()));
  }
  const int lock_fd =
      open((dir + "/lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock_fd < 0) return Errno(absl::StrCat("opening ", dir, "/lock"));
  if (flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
    close(lock_fd);
    return absl::FailedPreconditionError(absl::StrCat(
        "store_dir: another worker uses ", dir, " (its lock is held)"));
  }
  const int shards_fd =
      open(shards.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (shards_fd < 0) {
    close(lock_fd);
    return Errno(absl::StrCat("opening ", shards));
  }
  return std::shared_ptr<ShardFiles>(
      new ShardFiles(dir, absolute.string(), lock_fd, shards_fd));
}

ShardFiles::~ShardFiles() {
  close(shards_fd_);
  close(lock_fd_);
}

absl::StatusOr<std::shared_ptr<MappedShardFile>> ShardFiles::Create(
    uint64_t id, int64_t bytes) {
  const std::string name = Hex(id);
  unlinkat(shards_fd_, (name + kRecord).c_str(), 0);
  const int fd = openat(shards_fd_, (name + kData).c_str(),
                        O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return Errno(absl::StrCat("creating the file of shard ", id));
  absl::StatusOr<std::shared_ptr<MappedShardFile>> file;
  // Every block reserved before the first write through the mapping: a
  // sparse file on a file system that fills would fault (SIGBUS) on the
  // write instead of failing here.
  const int reserved = posix_fallocate(fd, 0, std::max<int64_t>(bytes, 1));
  if (reserved != 0) {
    errno = reserved;
    file = Errno(
        absl::StrCat("reserving ", bytes, " bytes for the file of shard ", id));
  } else {
    file = Map(fd, bytes, absl::StrCat("the file of shard ", id),
               absl::StrCat(shards_, "/", name, kData));
  }
  close(fd);
  if (!file.ok()) unlinkat(shards_fd_, (name + kData).c_str(), 0);
  return file;
}

absl::Status ShardFiles::Seal(const ShardRecord& record,
                              const MappedShardFile& file) {
  if (msync(file.data(),
            static_cast<size_t>(std::max<int64_t>(file.bytes(), 1)),
            MS_SYNC) != 0) {
    return Errno(absl::StrCat("syncing shard ", record.shard_id));
  }
  const std::string name = Hex(record.shard_id);
  const std::string temp = name + kRecord + kTemp;
  const int fd = openat(shards_fd_, temp.c_str(),
                        O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0)
    return Errno(absl::StrCat("writing the record of shard ", record.shard_id));
  absl::Status written =
      WriteFully(fd, ShardRecordJson(record), "store_dir: writing a record");
  if (written.ok() && fsync(fd) != 0) written = Errno("syncing a record");
  close(fd);
  if (written.ok() && renameat(shards_fd_, temp.c_str(), shards_fd_,
                               (name + kRecord).c_str()) != 0) {
    written = Errno("renaming a record");
  }
  if (!written.ok()) {
    unlinkat(shards_fd_, temp.c_str(), 0);
    return written;
  }
  if (fsync(shards_fd_) != 0) return Errno("syncing the store directory");
  return absl::OkStatus();
}

void ShardFiles::Remove(uint64_t id) {
  const std::string name = Hex(id);
  // The record first: a crash in between leaves bytes without a record,
  // which the next scan removes.
  unlinkat(shards_fd_, (name + kRecord).c_str(), 0);
  unlinkat(shards_fd_, (name + kData).c_str(), 0);
}

std::string ShardFiles::SetAside(uint64_t id) { return MoveAside(Hex(id)); }

std::string ShardFiles::MoveAside(const std::string& base) {
  const std::string aside = dir_ + "/damaged";
  if (mkdir(aside.c_str(), 0700) != 0 && errno != EEXIST) {
    spdlog::error("store_dir: cannot make {}: {}; shard file {} stays", aside,
                  std::strerror(errno), base);
    return std::string();
  }
  const int aside_fd =
      open(aside.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (aside_fd < 0) return std::string();
  // A name of its own each time: a shard damaged twice keeps both.
  const std::string stamp = absl::StrCat(".", absl::ToUnixMillis(absl::Now()));
  std::string kept;
  // The bytes first: a crash in between leaves a record without bytes,
  // which the next scan moves aside too (bytes without a record would be
  // taken for an uncommitted shard and removed).
  for (const char* suffix : {kData, kRecord}) {
    const std::string name = base + suffix;
    if (renameat(shards_fd_, name.c_str(), aside_fd, (name + stamp).c_str()) ==
        0) {
      kept = aside;
    } else if (errno != ENOENT) {
      spdlog::error("store_dir: cannot move {} into {}: {}", name, aside,
                    std::strerror(errno));
    }
  }
  fsync(aside_fd);
  fsync(shards_fd_);
  close(aside_fd);
  return kept;
}

ShardFiles::ScanResult ShardFiles::Scan() {
  ScanResult result;
  std::vector<std::string> names;
  const int listing = fcntl(shards_fd_, F_DUPFD_CLOEXEC, 0);
  if (DIR* d = listing >= 0 ? fdopendir(listing) : nullptr) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] != '.') names.push_back(e->d_name);
    }
    closedir(d);
  } else if (listing >= 0) {
    close(listing);
  }
  std::sort(names.begin(), names.end());
  auto has = [&](const std::string& n) {
    return std::binary_search(names.begin(), names.end(), n);
  };
  // A shard that fails a check is moved aside (DIR/damaged), never
  // deleted: its bytes may be all there is of it (two files swapped, one
  // bit flipped), for an operator to look at.
  auto damaged = [&](const std::string& base, const std::string& why) {
    ++result.damaged;
    const std::string kept = MoveAside(base);
    result.problems.push_back(absl::StrCat("shard file ", base, ": ", why,
                                           kept.empty() ? "" : "; kept in ",
                                           kept));
  };
  for (const std::string& n : names) {
    if (absl::EndsWith(n, kTemp)) {  // a record never renamed into place
      unlinkat(shards_fd_, n.c_str(), 0);
      continue;
    }
    if (absl::EndsWith(n, kData)) {
      const std::string base = n.substr(0, n.size() - strlen(kData));
      if (!has(base + kRecord)) {  // never sealed: a change not committed
        ++result.unsealed;
        unlinkat(shards_fd_, n.c_str(), 0);
      }
      continue;
    }
    if (!absl::EndsWith(n, kRecord)) continue;  // not ours: left alone
    const std::string base = n.substr(0, n.size() - strlen(kRecord));
    // The record: small, read whole, checked field by field.
    std::string text;
    {
      const int fd = openat(shards_fd_, n.c_str(),
                            O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
      struct stat rst {};
      if (fd < 0 || fstat(fd, &rst) != 0 || !S_ISREG(rst.st_mode)) {
        if (fd >= 0) close(fd);
        damaged(base, "its record is not a file this worker can read");
        continue;
      }
      char buffer[4096];
      ssize_t got;
      while ((got = read(fd, buffer, sizeof(buffer))) > 0 &&
             static_cast<int64_t>(text.size()) <= kMaxShardRecordBytes) {
        text.append(buffer, static_cast<size_t>(got));
      }
      close(fd);
    }
    absl::StatusOr<ShardRecord> record = ParseShardRecord(text);
    if (!record.ok()) {
      damaged(base, std::string(record.status().message()));
      continue;
    }
    if (Hex(record->shard_id) != base) {
      damaged(base, "its record names another shard");
      continue;
    }
    // Only a regular file in DIR/shards itself: no symlink to elsewhere.
    const int fd = openat(shards_fd_, (base + kData).c_str(),
                          O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    struct stat st {};
    if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
        st.st_size != std::max<int64_t>(record->bytes, 1)) {
      if (fd >= 0) close(fd);
      damaged(base, "its bytes are missing or of the wrong size");
      continue;
    }
    absl::StatusOr<std::shared_ptr<MappedShardFile>> file =
        Map(fd, record->bytes, base, absl::StrCat(shards_, "/", base, kData));
    close(fd);
    if (!file.ok()) {
      damaged(base, std::string(file.status().message()));
      continue;
    }
    const uint32_t crc = ExtendCrc32(
        0,
        absl::string_view((*file)->data(), static_cast<size_t>(record->bytes)));
    if (crc != record->crc32) {
      damaged(base, absl::StrCat("its bytes fail their checksum (CRC-32 ", crc,
                                 ", sealed with ", record->crc32, ")"));
      continue;
    }
    result.intact_bytes += record->bytes;
    result.intact.push_back({*std::move(record), *std::move(file)});
  }
  return result;
}

}  // namespace tessera
