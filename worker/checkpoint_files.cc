#include "worker/checkpoint_files.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/safetensors_file.h"
#include "core/errors.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"

namespace tessera {
namespace {

constexpr char kIndexName[] = "model.safetensors.index.json";
// Runs shorter than this on average are copied from a mapping.
constexpr int64_t kSmallRunBytes = 64 << 10;

// An open file descriptor, closed when it goes.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) {
      if (fd_ >= 0) close(fd_);
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

absl::Status RootError(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("checkpoint_root: ", what));
}

absl::Status CheckpointError(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("checkpoint: ", what));
}

// `path` opened beneath `dir_fd`: the kernel refuses anything that leaves
// it (absolute paths, "..", symlinks out).
absl::StatusOr<Fd> OpenBeneath(int dir_fd, absl::string_view path, int flags,
                               absl::string_view shown) {
  open_how how{};
  how.flags = static_cast<uint64_t>(flags | O_CLOEXEC);
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
  const std::string p(path);
  const long fd = syscall(SYS_openat2, dir_fd, p.c_str(), &how, sizeof(how));
  if (fd >= 0) return Fd(static_cast<int>(fd));
  const int err = errno;
  if (err == EXDEV) {
    return RootError(absl::StrCat("'", shown,
                                  "' leaves the checkpoint root (a symlink or "
                                  "'..' out of it)"));
  }
  if (err == ENOENT) {
    return absl::NotFoundError(
        absl::StrCat("checkpoint: '", shown, "' does not exist"));
  }
  if (err == ENOSYS) {
    return absl::FailedPreconditionError(
        "checkpoint_root: this kernel has no openat2 (Linux 5.6 or later "
        "reads checkpoints)");
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "checkpoint: cannot open '", shown, "': ", std::strerror(err)));
}

// A directory name relative to the root: not empty, not absolute, no "..".
absl::Status CheckRelative(absl::string_view dir) {
  if (dir.empty()) return RootError("the directory is empty");
  if (dir.front() == '/') {
    return RootError(absl::StrCat("'", dir,
                                  "' is absolute; give a directory relative "
                                  "to the workers' --checkpoint_root"));
  }
  for (absl::string_view part : absl::StrSplit(dir, '/')) {
    if (part == "..") {
      return RootError(absl::StrCat("'", dir, "' climbs out with '..'"));
    }
  }
  if (dir.size() > 4096) return RootError("the directory name is too long");
  return absl::OkStatus();
}

// A file name from an index: a plain name in the directory.
absl::Status CheckPlainName(absl::string_view name) {
  if (name.empty() || name.size() > 255 || absl::StrContains(name, '/') ||
      name == "." || name == "..") {
    return CheckpointError(
        absl::StrCat("the index names file '", name,
                     "', which is not a plain file name in the directory"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Fd> OpenDir(const std::string& root, absl::string_view dir) {
  if (root.empty()) {
    return RootError(
        "this worker has no --checkpoint_root; start it with one to save or "
        "load checkpoints");
  }
  TESSERA_RETURN_IF_ERROR(CheckRelative(dir));
  Fd root_fd(open(root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (root_fd.get() < 0) {
    return RootError(absl::StrCat("cannot open the root '", root,
                                  "': ", std::strerror(errno)));
  }
  return OpenBeneath(root_fd.get(), dir, O_RDONLY | O_DIRECTORY, dir);
}

// A file's bytes mapped read-only (its header is parsed in place; its data
// pages are never touched here).
class Mapping {
 public:
  static absl::StatusOr<Mapping> Of(const Fd& fd, absl::string_view name) {
    struct stat st {};
    if (fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
      return CheckpointError(absl::StrCat("'", name, "' is not a file"));
    }
    Mapping m;
    m.size_ = static_cast<size_t>(st.st_size);
    if (m.size_ == 0) return m;
    void* p = mmap(nullptr, m.size_, PROT_READ, MAP_SHARED, fd.get(), 0);
    if (p == MAP_FAILED) {
      return CheckpointError(
          absl::StrCat("cannot map '", name, "': ", std::strerror(errno)));
    }
    m.data_ = static_cast<const char*>(p);
    return m;
  }
  Mapping() = default;
  Mapping(Mapping&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(o.size_) {}
  ~Mapping() {
    if (data_ != nullptr) munmap(const_cast<char*>(data_), size_);
  }
  absl::string_view bytes() const {
    return data_ == nullptr ? absl::string_view()
                            : absl::string_view(data_, size_);
  }

 private:
  const char* data_ = nullptr;
  size_t size_ = 0;
};

// The files of the directory: those the index names, in its order of first
// mention, or the one .safetensors file.
absl::StatusOr<std::vector<std::string>> FilesOf(const Fd& dir,
                                                 absl::string_view shown) {
  absl::StatusOr<Fd> index = OpenBeneath(dir.get(), kIndexName, O_RDONLY,
                                         absl::StrCat(shown, "/", kIndexName));
  if (index.ok()) {
    TESSERA_ASSIGN_OR_RETURN(Mapping text, Mapping::Of(*index, kIndexName));
    if (text.bytes().size() > static_cast<size_t>(kMaxCheckpointIndexBytes)) {
      return CheckpointError(absl::StrCat(kIndexName, " is larger than ",
                                          kMaxCheckpointIndexBytes, " bytes"));
    }
    nlohmann::json json =
        nlohmann::json::parse(text.bytes().begin(), text.bytes().end(), nullptr,
                              /*allow_exceptions=*/false);
    if (json.is_discarded() || !json.is_object() ||
        !json.contains("weight_map") || !json["weight_map"].is_object()) {
      return CheckpointError(absl::StrCat(
          kIndexName, " is not JSON with a \"weight_map\" object"));
    }
    std::vector<std::string> files;
    absl::flat_hash_set<std::string> seen;
    for (const auto& [name, file] : json["weight_map"].items()) {
      if (!file.is_string()) {
        return CheckpointError(absl::StrCat(kIndexName, " maps '", name,
                                            "' to something not a file name"));
      }
      const std::string f = file.get<std::string>();
      TESSERA_RETURN_IF_ERROR(CheckPlainName(f));
      if (seen.insert(f).second) files.push_back(f);
      if (static_cast<int64_t>(files.size()) > kMaxCheckpointFiles) {
        return CheckpointError(absl::StrCat(kIndexName, " names more than ",
                                            kMaxCheckpointFiles, " files"));
      }
    }
    std::sort(files.begin(), files.end());
    return files;
  }
  if (!absl::IsNotFound(index.status())) return index.status();
  // No index: the directory's one .safetensors file (fdopendir takes the
  // descriptor it is given: a copy of ours).
  const int listing = fcntl(dir.get(), F_DUPFD_CLOEXEC, 0);
  DIR* d = listing >= 0 ? fdopendir(listing) : nullptr;
  if (d == nullptr) {
    if (listing >= 0) close(listing);
    return CheckpointError(absl::StrCat("cannot list '", shown, "'"));
  }
  std::vector<std::string> files;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (absl::EndsWith(name, ".safetensors")) files.push_back(name);
  }
  closedir(d);
  if (files.size() != 1) {
    return CheckpointError(absl::StrCat(
        "'", shown, "' holds ", files.size(), " .safetensors files and no ",
        kIndexName,
        " (a model directory has one file, or an index naming several)"));
  }
  return files;
}

}  // namespace

absl::StatusOr<CheckpointListing> CheckpointRoot::List(
    absl::string_view dir) const {
  TESSERA_ASSIGN_OR_RETURN(Fd dir_fd, OpenDir(root_, dir));
  TESSERA_ASSIGN_OR_RETURN(std::vector<std::string> files,
                           FilesOf(dir_fd, dir));
  CheckpointListing listing;
  absl::flat_hash_set<std::string> names;
  for (size_t f = 0; f < files.size(); ++f) {
    const std::string& file = files[f];
    TESSERA_ASSIGN_OR_RETURN(Fd fd, OpenBeneath(dir_fd.get(), file, O_RDONLY,
                                                absl::StrCat(dir, "/", file)));
    TESSERA_ASSIGN_OR_RETURN(Mapping bytes, Mapping::Of(fd, file));
    absl::StatusOr<SafetensorsHeader> header = ParseSafetensors(bytes.bytes());
    if (!header.ok()) {
      return CheckpointError(
          absl::StrCat("'", dir, "/", file, "': ", header.status().message()));
    }
    if (f == 0) listing.metadata = header->metadata;
    for (SafetensorsEntry& e : header->entries) {
      if (!names.insert(e.name).second) {
        return CheckpointError(absl::StrCat(
            "entry '", e.name, "' is in more than one file of '", dir, "'"));
      }
      CheckpointEntry& out = listing.entries.emplace_back();
      out.name = std::move(e.name);
      out.dtype = e.dtype;
      out.shape = std::move(e.shape);
      out.file = file;
      out.data_offset = header->data_offset + e.begin;
      out.bytes = e.num_bytes();
      if (static_cast<int64_t>(listing.entries.size()) >
          kMaxCheckpointEntries) {
        return CheckpointError(absl::StrCat("'", dir, "' holds more than ",
                                            kMaxCheckpointEntries, " tensors"));
      }
    }
  }
  return listing;
}

absl::StatusOr<int64_t> CheckpointRoot::ReadRuns(
    absl::string_view dir, absl::string_view file,
    absl::Span<const FileRun> runs, int64_t max_gap, int64_t max_span,
    const std::function<absl::Status(int64_t, absl::string_view)>& land) const {
  TESSERA_RETURN_IF_ERROR(CheckPlainName(file));
  TESSERA_ASSIGN_OR_RETURN(Fd dir_fd, OpenDir(root_, dir));
  TESSERA_ASSIGN_OR_RETURN(Fd fd, OpenBeneath(dir_fd.get(), file, O_RDONLY,
                                              absl::StrCat(dir, "/", file)));
  // Many small runs (a column layout: a piece of every row): one syscall
  // each would cost more than the bytes, so they are copied from a
  // read-only mapping of the file instead, touching only their pages.
  int64_t run_bytes = 0;
  for (const FileRun& run : runs) run_bytes += run.length;
  if (runs.size() > 64 &&
      run_bytes / static_cast<int64_t>(runs.size()) < kSmallRunBytes) {
    TESSERA_ASSIGN_OR_RETURN(Mapping mapping, Mapping::Of(fd, file));
    const absl::string_view all = mapping.bytes();
    for (const FileRun& run : runs) {
      if (run.file_offset < 0 || run.length < 0 ||
          run.file_offset > static_cast<int64_t>(all.size()) - run.length) {
        return CheckpointError(absl::StrCat(
            "'", dir, "/", file, "' is shorter than its header says (",
            run.file_offset + run.length, " bytes)"));
      }
      TESSERA_RETURN_IF_ERROR(land(
          run.shard_offset, all.substr(static_cast<size_t>(run.file_offset),
                                       static_cast<size_t>(run.length))));
    }
    return run_bytes;
  }
  // A run longer than a read is cut: memory stays within max_span.
  std::vector<FileRun> pieces;
  pieces.reserve(runs.size());
  for (const FileRun& run : runs) {
    for (int64_t at = 0; at < run.length; at += max_span) {
      const int64_t n = std::min(max_span, run.length - at);
      pieces.push_back({run.file_offset + at, n, run.shard_offset + at});
    }
  }
  int64_t read_bytes = 0;
  std::string buffer;
  for (const ReadSpan& span : CoalesceRuns(pieces, max_gap, max_span)) {
    if (span.file_offset < 0 || span.length < 0) {
      return CheckpointError("a negative offset or length");
    }
    buffer.resize(static_cast<size_t>(span.length));
    int64_t got = 0;
    while (got < span.length) {
      const ssize_t n =
          pread(fd.get(), buffer.data() + got,
                static_cast<size_t>(span.length - got), span.file_offset + got);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        return CheckpointError(absl::StrCat("reading '", dir, "/", file,
                                            "': ", std::strerror(errno)));
      }
      if (n == 0) {
        return CheckpointError(absl::StrCat(
            "'", dir, "/", file, "' is shorter than its header says (",
            span.file_offset + got, " bytes)"));
      }
      got += n;
    }
    read_bytes += got;
    for (size_t i = 0; i < span.num_runs; ++i) {
      const FileRun& run = pieces[span.first_run + i];
      TESSERA_RETURN_IF_ERROR(
          land(run.shard_offset,
               absl::string_view(
                   buffer.data() + (run.file_offset - span.file_offset),
                   static_cast<size_t>(run.length))));
    }
  }
  return read_bytes;
}

}  // namespace tessera
