#include "worker/checkpoint_files.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "core/errors.h"
#include "core/safetensors.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace tessera {
namespace {

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
  return CheckpointRootError(what);
}

// `path` opened beneath `dir_fd`: the kernel refuses anything that leaves
// it (absolute paths, "..", symlinks out). Never blocks (a FIFO in a
// checkpoint directory opens at once, and is then refused as no file); a
// file made is 0644 (readers of a checkpoint may run as other users than
// the worker that saved it), less the umask.
absl::StatusOr<Fd> OpenBeneath(int dir_fd, absl::string_view path, int flags,
                               absl::string_view shown) {
  open_how how{};
  how.flags = static_cast<uint64_t>(flags | O_CLOEXEC | O_NONBLOCK);
  if ((flags & O_CREAT) != 0) how.mode = 0644;
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

// The header of checkpoint file `fd`, by pread (client/safetensors_file).
absl::StatusOr<SafetensorsHeader> HeaderOf(const Fd& fd,
                                           absl::string_view shown) {
  absl::StatusOr<SafetensorsHeader> header = ReadSafetensorsHeader(fd.get());
  if (!header.ok()) {
    return CheckpointError(
        absl::StrCat("'", shown, "': ", header.status().message()));
  }
  return header;
}

// The "__metadata__" kSavePartKey of the safetensors file `fd` (empty when
// it has none).
absl::StatusOr<std::string> SavePartOf(const Fd& fd, absl::string_view shown) {
  TESSERA_ASSIGN_OR_RETURN(SafetensorsHeader header, HeaderOf(fd, shown));
  for (const auto& [key, value] : header.metadata) {
    if (key == kSavePartKey) return value;
  }
  return std::string();
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

absl::StatusOr<Fd> OpenRoot(const std::string& root, absl::string_view dir) {
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
  return root_fd;
}

absl::StatusOr<Fd> OpenDir(const std::string& root, absl::string_view dir) {
  TESSERA_ASSIGN_OR_RETURN(Fd root_fd, OpenRoot(root, dir));
  return OpenBeneath(root_fd.get(), dir, O_RDONLY | O_DIRECTORY, dir);
}

// `dir` opened, made first (with its parents) where missing: one component
// at a time, each beneath the one before, so no step leaves the root.
absl::StatusOr<Fd> MakeDir(const std::string& root, absl::string_view dir) {
  TESSERA_ASSIGN_OR_RETURN(Fd at, OpenRoot(root, dir));
  for (absl::string_view part : absl::StrSplit(dir, '/', absl::SkipEmpty())) {
    const std::string name(part);
    if (mkdirat(at.get(), name.c_str(), 0755) != 0 && errno != EEXIST) {
      return absl::PermissionDeniedError(absl::StrCat(
          "checkpoint: cannot make '", dir, "': ", std::strerror(errno)));
    }
    TESSERA_ASSIGN_OR_RETURN(
        at, OpenBeneath(at.get(), name, O_RDONLY | O_DIRECTORY, dir));
  }
  return at;
}

// An index file's text, read whole by pread: never mapped, so a file cut
// short while it is read (a training job saving over the same path) is an
// error here, not a SIGBUS that takes the worker and its shards with it.
absl::StatusOr<std::string> ReadIndexText(const Fd& fd,
                                          absl::string_view name) {
  struct stat st {};
  if (fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return CheckpointError(absl::StrCat("'", name, "' is not a file"));
  }
  if (st.st_size > kMaxCheckpointIndexBytes) {
    return CheckpointError(absl::StrCat("'", name, "' has ", st.st_size,
                                        " bytes, more than an index may (",
                                        kMaxCheckpointIndexBytes, ")"));
  }
  std::string text(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = pread(fd.get(), text.data() + got, text.size() - got,
                            static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return CheckpointError(
          absl::StrCat("reading '", name, "': ", std::strerror(errno)));
    }
    if (n == 0) break;  // cut short meanwhile: the parse says what is wrong
    got += static_cast<size_t>(n);
  }
  text.resize(got);
  return text;
}

// The files of the directory: those the index names, in its order of first
// mention, or the one .safetensors file.
absl::StatusOr<std::vector<std::string>> FilesOf(const Fd& dir,
                                                 absl::string_view shown) {
  absl::StatusOr<Fd> index =
      OpenBeneath(dir.get(), kHfIndexName, O_RDONLY,
                  absl::StrCat(shown, "/", kHfIndexName));
  if (index.ok()) {
    TESSERA_ASSIGN_OR_RETURN(std::string text,
                             ReadIndexText(*index, kHfIndexName));
    return ParseHfIndex(text);
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
  if (files.empty()) {
    // Nothing here yet: a save may write into it without replacing anyone's.
    return absl::NotFoundError(
        absl::StrCat("checkpoint: '", shown,
                     "' holds no .safetensors file and no ", kHfIndexName));
  }
  // Files of a save that never wrote its index (its coordinator died) are
  // no checkpoint: loading one would make some of its tensors only, and a
  // save again may write over them.
  const bool unfinished_save =
      static_cast<int64_t>(files.size()) <= kMaxCheckpointFiles &&
      std::all_of(files.begin(), files.end(), [&](const std::string& file) {
        const std::string path = absl::StrCat(shown, "/", file);
        absl::StatusOr<Fd> fd = OpenBeneath(dir.get(), file, O_RDONLY, path);
        if (!fd.ok()) return false;
        absl::StatusOr<std::string> part = SavePartOf(*fd, path);
        return part.ok() && !part->empty();
      });
  if (unfinished_save) {
    return absl::NotFoundError(
        absl::StrCat("checkpoint: '", shown,
                     "' holds only files of a save that did not "
                     "finish (no ",
                     kTesseraIndexName, "); save again"));
  }
  if (files.size() != 1) {
    return CheckpointError(absl::StrCat(
        "'", shown, "' holds ", files.size(), " .safetensors files and no ",
        kHfIndexName,
        " (a model directory has one file, or an index naming several)"));
  }
  return files;
}

// A checkpoint `tessera save` wrote: its tessera.json, each piece checked
// against the header of the file that holds it (an entry of the piece's
// name, dtype and shape, at its offset), so a lying index cannot send a
// read past a file's data.
absl::StatusOr<CheckpointListing> ListSaved(const Fd& dir_fd, const Fd& index,
                                            absl::string_view dir) {
  TESSERA_ASSIGN_OR_RETURN(std::string text,
                           ReadIndexText(index, kTesseraIndexName));
  absl::StatusOr<CheckpointListing> listing = ParseTesseraIndex(text);
  if (!listing.ok()) {
    return Annotate(listing.status(), absl::StrCat("in '", dir, "'"));
  }
  struct Stored {
    SafetensorsHeader header;
    absl::flat_hash_map<std::string, size_t> entry_index;
  };
  absl::flat_hash_map<std::string, Stored> headers;
  for (const CheckpointEntry& entry : listing->entries) {
    for (const StoredPiece& piece : entry.pieces) {
      auto it = headers.find(piece.file);
      if (it == headers.end()) {
        const std::string shown = absl::StrCat(dir, "/", piece.file);
        TESSERA_ASSIGN_OR_RETURN(
            Fd fd, OpenBeneath(dir_fd.get(), piece.file, O_RDONLY, shown));
        TESSERA_ASSIGN_OR_RETURN(SafetensorsHeader header, HeaderOf(fd, shown));
        Stored stored{std::move(header), {}};
        for (size_t i = 0; i < stored.header.entries.size(); ++i)
          stored.entry_index.emplace(stored.header.entries[i].name, i);
        it = headers.emplace(piece.file, std::move(stored)).first;
      }
      const SafetensorsHeader& header = it->second.header;
      auto at = it->second.entry_index.find(piece.entry);
      const SafetensorsEntry* found = at == it->second.entry_index.end()
                                          ? nullptr
                                          : &header.entries[at->second];
      const Shape sizes(piece.box.sizes.begin(), piece.box.sizes.end());
      if (found == nullptr || found->dtype != entry.dtype ||
          found->shape != sizes ||
          header.data_offset + found->begin != piece.data_offset ||
          found->num_bytes() != piece.bytes) {
        return CheckpointError(absl::StrCat(
            "'", dir, "/", piece.file, "' does not hold piece '", piece.entry,
            "' of '", entry.name, "' where ", kTesseraIndexName, " says"));
      }
    }
  }
  return listing;
}

}  // namespace

absl::StatusOr<CheckpointListing> CheckpointRoot::List(
    absl::string_view dir) const {
  TESSERA_ASSIGN_OR_RETURN(Fd dir_fd, OpenDir(root_, dir));
  absl::StatusOr<Fd> saved =
      OpenBeneath(dir_fd.get(), kTesseraIndexName, O_RDONLY,
                  absl::StrCat(dir, "/", kTesseraIndexName));
  if (saved.ok()) return ListSaved(dir_fd, *saved, dir);
  if (!absl::IsNotFound(saved.status())) return saved.status();
  TESSERA_ASSIGN_OR_RETURN(std::vector<std::string> files,
                           FilesOf(dir_fd, dir));
  CheckpointListing listing;
  absl::flat_hash_set<std::string> names;
  for (size_t f = 0; f < files.size(); ++f) {
    const std::string& file = files[f];
    TESSERA_ASSIGN_OR_RETURN(Fd fd, OpenBeneath(dir_fd.get(), file, O_RDONLY,
                                                absl::StrCat(dir, "/", file)));
    TESSERA_ASSIGN_OR_RETURN(SafetensorsHeader header_read,
                             HeaderOf(fd, absl::StrCat(dir, "/", file)));
    SafetensorsHeader* header = &header_read;
    if (f == 0) {
      // The tensors' metadata; an export's mark is the files' own.
      for (auto& pair : header->metadata) {
        if (pair.first != kSavePartKey) listing.metadata.push_back(pair);
      }
    }
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
    const std::function<absl::Status(const FileRun&, absl::string_view)>& land)
    const {
  TESSERA_RETURN_IF_ERROR(CheckCheckpointFileName(file));
  TESSERA_ASSIGN_OR_RETURN(Fd dir_fd, OpenDir(root_, dir));
  TESSERA_ASSIGN_OR_RETURN(Fd fd, OpenBeneath(dir_fd.get(), file, O_RDONLY,
                                              absl::StrCat(dir, "/", file)));
  // Every run by pread, none through a mapping: a file cut short while it
  // is read fails the read ("shorter than") instead of faulting the worker.
  // Small runs close together (a column layout: a piece of every row) are
  // joined into one read by CoalesceRuns.
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
          land(run, absl::string_view(
                        buffer.data() + (run.file_offset - span.file_offset),
                        static_cast<size_t>(run.length))));
    }
  }
  return read_bytes;
}

absl::StatusOr<int64_t> CheckpointRoot::WriteFile(
    absl::string_view dir, absl::string_view name,
    const std::function<absl::Status(int fd)>& fill) const {
  TESSERA_RETURN_IF_ERROR(CheckCheckpointFileName(name));
  TESSERA_ASSIGN_OR_RETURN(Fd dir_fd, MakeDir(root_, dir));
  // A name no reader looks for, unique to this write.
  const std::string temp = absl::StrCat(".", name, ".", getpid(), ".",
                                        absl::ToUnixNanos(absl::Now()), ".tmp");
  const std::string shown = absl::StrCat(dir, "/", name);
  TESSERA_ASSIGN_OR_RETURN(
      Fd fd, OpenBeneath(dir_fd.get(), temp,
                         O_WRONLY | O_CREAT | O_EXCL | O_TRUNC, shown));
  auto drop =
      absl::MakeCleanup([&] { unlinkat(dir_fd.get(), temp.c_str(), 0); });
  TESSERA_RETURN_IF_ERROR(
      Annotate(fill(fd.get()), absl::StrCat("writing '", shown, "'")));
  struct stat st {};
  if (fsync(fd.get()) != 0 || fstat(fd.get(), &st) != 0) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "checkpoint: syncing '", shown, "': ", std::strerror(errno)));
  }
  const std::string final_name(name);
  if (renameat(dir_fd.get(), temp.c_str(), dir_fd.get(), final_name.c_str()) !=
      0) {
    return absl::PermissionDeniedError(absl::StrCat(
        "checkpoint: renaming into '", shown, "': ", std::strerror(errno)));
  }
  std::move(drop).Cancel();
  // The rename itself durable: the directory synced.
  if (fsync(dir_fd.get()) != 0) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "checkpoint: syncing '", dir, "': ", std::strerror(errno)));
  }
  return static_cast<int64_t>(st.st_size);
}

absl::StatusOr<int64_t> CheckpointRoot::WriteRuns(
    absl::string_view dir, absl::string_view file, absl::string_view save_id,
    absl::Span<const FileRun> runs, int64_t max_span,
    const std::function<absl::StatusOr<absl::string_view>(
        const FileRun& run, std::string* scratch)>& source) const {
  if (save_id.empty())
    return CheckpointError("the file to write names no save");
  TESSERA_RETURN_IF_ERROR(CheckCheckpointFileName(file));
  const std::string shown = absl::StrCat(dir, "/", file);
  TESSERA_ASSIGN_OR_RETURN(Fd dir_fd, OpenDir(root_, dir));
  TESSERA_ASSIGN_OR_RETURN(
      Fd fd, OpenBeneath(dir_fd.get(), file, O_RDWR | O_NOFOLLOW, shown));
  TESSERA_ASSIGN_OR_RETURN(SafetensorsHeader header, HeaderOf(fd, shown));
  const auto mark =
      std::find_if(header.metadata.begin(), header.metadata.end(),
                   [](const auto& pair) { return pair.first == kSavePartKey; });
  if (mark == header.metadata.end() || mark->second != save_id) {
    return CheckpointError(absl::StrCat("'", shown, "' is not a file of save ",
                                        save_id, ": it is not written into"));
  }
  // Every run inside the data section (the header said how long it is, and
  // the file was checked to be that long), in file order.
  const int64_t end = header.data_offset + header.data_bytes;
  int64_t last_end = header.data_offset;
  for (const FileRun& r : runs) {
    if (r.length < 0 || r.file_offset < last_end ||
        r.file_offset > end - r.length) {
      return CheckpointError(
          absl::StrCat("a run of ", r.length, " bytes at ", r.file_offset,
                       " is not inside the data of '", shown, "' (bytes ",
                       header.data_offset, " to ", end, ") in file order"));
    }
    last_end = r.file_offset + r.length;
  }
  int64_t written = 0;
  std::string scratch;
  for (const FileRun& run : runs) {
    for (int64_t at = 0; at < run.length; at += max_span) {
      const FileRun part{run.file_offset + at,
                         std::min(max_span, run.length - at),
                         run.shard_offset + at};
      TESSERA_ASSIGN_OR_RETURN(absl::string_view bytes, source(part, &scratch));
      if (static_cast<int64_t>(bytes.size()) != part.length) {
        return absl::InternalError("a run's bytes are not its length");
      }
      size_t done = 0;
      while (done < bytes.size()) {
        const ssize_t n =
            pwrite(fd.get(), bytes.data() + done, bytes.size() - done,
                   part.file_offset + static_cast<int64_t>(done));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
          return absl::ResourceExhaustedError(absl::StrCat(
              "checkpoint: writing '", shown, "': ", std::strerror(errno)));
        }
        done += static_cast<size_t>(n);
      }
      written += part.length;
    }
  }
  if (fdatasync(fd.get()) != 0) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "checkpoint: syncing '", shown, "': ", std::strerror(errno)));
  }
  return written;
}

absl::Status CheckpointRoot::Publish(
    absl::string_view dir, absl::string_view save_id,
    absl::Span<const std::pair<std::string, std::string>> renames) const {
  if (save_id.empty())
    return CheckpointError("the files to publish name no save");
  for (const auto& [from, to] : renames) {
    TESSERA_RETURN_IF_ERROR(CheckCheckpointFileName(from));
    TESSERA_RETURN_IF_ERROR(CheckCheckpointFileName(to));
    if (!absl::EndsWith(to, ".safetensors")) {
      return CheckpointError(
          absl::StrCat("'", to, "' is not a .safetensors file name"));
    }
  }
  TESSERA_ASSIGN_OR_RETURN(Fd dir_fd, OpenDir(root_, dir));
  // Each file is this save's before anything changes.
  for (const auto& [from, to] : renames) {
    const std::string shown = absl::StrCat(dir, "/", from);
    TESSERA_ASSIGN_OR_RETURN(
        Fd fd, OpenBeneath(dir_fd.get(), from, O_RDONLY | O_NOFOLLOW, shown));
    TESSERA_ASSIGN_OR_RETURN(std::string part, SavePartOf(fd, shown));
    if (part != save_id) {
      return CheckpointError(
          absl::StrCat("'", shown, "' is not a file of save ", save_id));
    }
  }
  for (const char* index : {kHfIndexName, kTesseraIndexName}) {
    if (unlinkat(dir_fd.get(), index, 0) != 0 && errno != ENOENT) {
      return absl::PermissionDeniedError(
          absl::StrCat("checkpoint: removing '", dir, "/", index,
                       "': ", std::strerror(errno)));
    }
  }
  for (const auto& [from, to] : renames) {
    if (renameat(dir_fd.get(), from.c_str(), dir_fd.get(), to.c_str()) != 0) {
      return absl::PermissionDeniedError(
          absl::StrCat("checkpoint: renaming '", dir, "/", from, "' to '", to,
                       "': ", std::strerror(errno)));
    }
  }
  if (fsync(dir_fd.get()) != 0) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "checkpoint: syncing '", dir, "': ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status CheckpointRoot::RemoveFiles(absl::string_view dir,
                                         absl::Span<const std::string> names,
                                         absl::string_view save_id) const {
  if (save_id.empty() || save_id.size() > kMaxSavedByBytes) {
    return CheckpointError("files to remove name no save");
  }
  for (const std::string& name : names) {
    TESSERA_RETURN_IF_ERROR(CheckCheckpointFileName(name));
  }
  TESSERA_ASSIGN_OR_RETURN(Fd dir_fd, OpenDir(root_, dir));
  for (const std::string& name : names) {
    const std::string shown = absl::StrCat(dir, "/", name);
    absl::StatusOr<Fd> fd = OpenBeneath(
        dir_fd.get(), name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK, shown);
    if (absl::IsNotFound(fd.status())) continue;
    TESSERA_RETURN_IF_ERROR(fd.status());
    absl::StatusOr<std::string> part = SavePartOf(*fd, shown);
    if (!part.ok() || *part != save_id) {
      spdlog::warn(
          "checkpoint: '{}' is left alone: not a file of save {} "
          "({})",
          shown, std::string(save_id),
          part.ok() ? absl::StrCat("its save is '", *part, "'")
                    : std::string(part.status().message()));
      continue;
    }
    if (unlinkat(dir_fd.get(), name.c_str(), 0) != 0 && errno != ENOENT) {
      return absl::PermissionDeniedError(
          absl::StrCat("checkpoint: removing '", dir, "/", name,
                       "': ", std::strerror(errno)));
    }
  }
  if (fsync(dir_fd.get()) != 0) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "checkpoint: syncing '", dir, "': ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace tessera
