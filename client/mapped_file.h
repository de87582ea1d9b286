// Whole files through mappings, for the CLI's and SDK's file formats
// (.npy, .safetensors), so that arrays larger than the client's memory go
// between the cluster and a file without a copy in between:
//
//  * MappedInputFile: a regular file mapped read-only, guarded against the
//    file shrinking while it is read. Touching a page of a mapping past
//    its file's end raises SIGBUS, which would kill the reader (the CLI, or
//    the whole Python process of an SDK user) wherever it reads: a copy
//    into a worker's shared memory, a gRPC message, UCX. So the process
//    takes SIGBUS (one handler, installed at the first Open and passing
//    every other SIGBUS on to the handler it replaced): a fault inside a
//    live input mapping maps zero pages over the rest of that mapping, so
//    the read goes on, and marks the file damaged. CheckUnchanged (or
//    CheckMappedInput, from where only the bytes are known) then fails
//    before anything read from the file is committed.
//  * MappedOutputFile: a new file of a size known up front, written through
//    a shared mapping of a temporary file next to its destination (same
//    directory, so the rename is atomic) and renamed into place by Commit().
//    Its blocks are reserved at creation, so a full disk is an error there
//    rather than a SIGBUS while the mapping is written. Without Commit()
//    nothing is left behind. A destination that is a symbolic link is
//    written where the link points (the link stays); one that is a device,
//    a pipe or a socket (/dev/null, /dev/stdout, a FIFO) is written into,
//    from an unnamed temporary file under $TMPDIR, never replaced; and so
//    is `-`, this process's stdout.
//
// Errors name the file and say what failed, prefixed with `kind` (".npy
// file", "safetensors file"). A file rewritten in place by another
// process while mapped, without changing its size or modification time,
// is the caller's risk (as with any mapping). Neither class is thread-safe
// for mutation; the bytes of a mapping may be read (input) or filled in
// disjoint ranges (output) from any thread.
#ifndef TESSERA_CLIENT_MAPPED_FILE_H_
#define TESSERA_CLIENT_MAPPED_FILE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tessera {

class MappedInputFile {
 public:
  // Most input files mapped at once in one process (RESOURCE_EXHAUSTED
  // beyond: each takes a slot the SIGBUS handler looks through).
  static constexpr int kMaxOpen = 1024;

  // Maps the regular file at `path` (a 0-byte file maps to no bytes).
  static absl::StatusOr<std::unique_ptr<MappedInputFile>> Open(
      const std::string& path, absl::string_view kind);
  ~MappedInputFile();
  MappedInputFile(const MappedInputFile&) = delete;
  MappedInputFile& operator=(const MappedInputFile&) = delete;

  const char* data() const { return data_ != nullptr ? data_ : ""; }
  int64_t size() const { return size_; }
  absl::string_view bytes() const {
    return absl::string_view(data(), static_cast<size_t>(size_));
  }

  // OK while the file has the size and modification time it had when it
  // was mapped and no read ran past its end; else FAILED_PRECONDITION
  // saying that it changed while it was read (its bytes read since are not
  // to be trusted: pages past a new end read as zeros).
  absl::Status CheckUnchanged() const;

 private:
  MappedInputFile() = default;
  std::string path_;
  std::string kind_;
  int fd_ = -1;  // kept for fstat
  int slot_ = -1;
  const char* data_ = nullptr;
  int64_t size_ = 0;
  int64_t mtime_ns_ = 0;
};

// For bytes known only by address (Client::Put's `data`): when [data, data
// + size) lies in a live MappedInputFile, its CheckUnchanged(); else OK.
absl::Status CheckMappedInput(const void* data, int64_t size);

class MappedOutputFile {
 public:
  // A temporary file of `size` bytes (> 0) next to `path` (or, for a
  // device or pipe, under $TMPDIR, unlinked at once), mapped read-write. A
  // directory at `path` is refused here, before any byte is written.
  static absl::StatusOr<std::unique_ptr<MappedOutputFile>> Create(
      const std::string& path, int64_t size, absl::string_view kind);
  // Unmaps and, unless committed, removes the temporary file.
  ~MappedOutputFile();
  MappedOutputFile(const MappedOutputFile&) = delete;
  MappedOutputFile& operator=(const MappedOutputFile&) = delete;

  char* data() { return data_; }
  int64_t size() const { return size_; }

  // Unmaps, closes and renames the file to its destination (replacing a
  // file there), or writes its bytes into the device or pipe.
  absl::Status Commit();

 private:
  MappedOutputFile() = default;
  absl::Status WriteIntoSpecialFile();

  std::string path_;
  int special_fd_ = -1;  // the device or pipe written at Commit, if any
  std::string kind_;
  std::string temp_path_;
  int fd_ = -1;
  char* data_ = nullptr;
  int64_t size_ = 0;
  bool committed_ = false;
};

// INVALID_ARGUMENT etc. for errno `err`: "<kind> '<path>': cannot <what>:
// <strerror>" (NOT_FOUND for ENOENT, PERMISSION_DENIED for EACCES/EPERM,
// RESOURCE_EXHAUSTED for ENOSPC/EDQUOT/ENOMEM).
absl::Status MappedFileError(absl::string_view kind, const std::string& path,
                             absl::string_view what, int err);

}  // namespace tessera

#endif  // TESSERA_CLIENT_MAPPED_FILE_H_
