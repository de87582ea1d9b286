#include "client/npy_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/checked_math.h"
#include "core/npy.h"
#include "core/status_macros.h"

namespace tessera {
namespace {

absl::Status FileError(const std::string& path, absl::string_view what,
                       int err) {
  const std::string message =
      absl::StrCat("cannot ", what, " '", path, "': ", std::strerror(err));
  switch (err) {
    case ENOENT:
      return absl::NotFoundError(message);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    default:
      return absl::InvalidArgumentError(message);
  }
}

// Closes the descriptor when it goes out of scope.
class ScopedFd {
 public:
  explicit ScopedFd(int fd) : fd_(fd) {}
  ~ScopedFd() {
    if (fd_ >= 0) close(fd_);
  }
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// Reads up to `n` bytes; returns how many were read (fewer only at the end
// of the file), or -1 with errno set.
int64_t ReadFully(int fd, char* out, int64_t n) {
  int64_t done = 0;
  while (done < n) {
    const ssize_t got = read(fd, out + done, static_cast<size_t>(n - done));
    if (got < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    if (got == 0) break;
    done += got;
  }
  return done;
}

// RESOURCE_EXHAUSTED: the array does not fit in this process's memory.
absl::Status OutOfMemory(const std::string& path, int64_t bytes) {
  return absl::ResourceExhaustedError(
      absl::StrCat("out of memory: reading '", path, "' needs ", bytes,
                   " bytes for its data, more than this machine can give"));
}

// Whether the file's dtype may be read as `as_dtype` (see ReadNpyFile).
absl::Status CheckDType(const std::string& path, const NpyArray& header,
                        std::optional<DType> as_dtype) {
  if (!as_dtype.has_value() || NpyFileDType(*as_dtype) == header.dtype) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "'", path, "' holds ", DTypeName(header.dtype), " data ('", header.descr,
      "') but --dtype=", DTypeName(*as_dtype),
      " was chosen (without --dtype, put takes the file's dtype; a '<u2' "
      "file can also be read as bfloat16 and a '|u1' file as float8_e4m3fn "
      "or float8_e5m2 bits)"));
}

}  // namespace

absl::StatusOr<HostArray> ReadNpyFile(const std::string& path,
                                      std::optional<DType> as_dtype) {
  ScopedFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return FileError(path, "open", errno);
  struct stat st {};
  const bool stat_ok = fstat(fd.get(), &st) == 0;
  if (stat_ok && S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", path, "' is a directory, not a .npy file"));
  }
  const bool regular = stat_ok && S_ISREG(st.st_mode);

  // The fixed prefix: magic, version, header length (2 or 4 bytes).
  std::string prefix(12, '\0');
  int64_t got = ReadFully(fd.get(), prefix.data(), 10);
  if (got < 0) return FileError(path, "read", errno);
  prefix.resize(got);
  auto annotate = [&path](const absl::Status& s) {
    return Annotate(s, absl::StrCat("reading '", path, "'"));
  };
  if (got < 10) {
    // Let the header parser say what is wrong (not .npy, or truncated).
    return annotate(ParseNpyHeader(prefix).status());
  }
  const int major = static_cast<unsigned char>(prefix[6]);
  if (prefix.compare(0, 6, "\x93NUMPY") != 0 || major < 1 || major > 3 ||
      prefix[7] != 0) {
    // Not .npy, or a version we do not read: the parser says which.
    return annotate(ParseNpyHeader(prefix).status());
  }
  size_t header_end;
  if (major == 1) {
    header_end =
        10 +
        (static_cast<unsigned char>(prefix[8]) |
         (static_cast<size_t>(static_cast<unsigned char>(prefix[9])) << 8));
  } else {
    prefix.resize(12);
    const int64_t more = ReadFully(fd.get(), prefix.data() + 10, 2);
    if (more < 0) return FileError(path, "read", errno);
    prefix.resize(10 + more);
    if (more < 2) return annotate(ParseNpyHeader(prefix).status());
    size_t len = 0;
    for (int i = 3; i >= 0; --i) {
      len = (len << 8) | static_cast<unsigned char>(prefix[8 + i]);
    }
    header_end = 12 + len;
  }
  // The header is small (NumPy caps it); refuse absurd declared lengths
  // before allocating for them.
  constexpr size_t kMaxHeader = size_t{64} << 20;
  if (header_end > kMaxHeader) {
    return absl::InvalidArgumentError(
        absl::StrCat("reading '", path, "': the .npy header declares ",
                     header_end, " bytes, which is not plausible"));
  }
  const size_t have = prefix.size();
  prefix.resize(header_end);
  if (header_end > have) {
    got = ReadFully(fd.get(), prefix.data() + have,
                    static_cast<int64_t>(header_end - have));
    if (got < 0) return FileError(path, "read", errno);
    prefix.resize(have + got);
  }
  absl::StatusOr<NpyArray> header = ParseNpyHeader(prefix);
  if (!header.ok()) return annotate(header.status());

  // Which dtype the caller gets.
  const DType file_dtype = as_dtype.value_or(header->dtype);
  TESSERA_RETURN_IF_ERROR(CheckDType(path, *header, as_dtype));

  // A regular file's size is known: a header that promises more (or less)
  // data than the file holds is refused before anything is allocated for
  // it. Other files (pipes) are read in steps, so memory follows the bytes
  // that actually arrive, not what the header claims.
  absl::StatusOr<int64_t> bytes =
      regular ? NpyDataBytesInFile(*header, st.st_size) : NpyDataBytes(*header);
  if (!bytes.ok()) return annotate(bytes.status());
  std::string staged;  // a non-regular file's data, read before allocating
  if (!regular) {
    constexpr int64_t kStep = int64_t{64} << 20;
    while (true) {
      const int64_t want = std::min<int64_t>(
          kStep, *bytes + 1 - static_cast<int64_t>(staged.size()));
      if (want <= 0) break;
      const size_t have_now = staged.size();
      try {
        staged.resize(have_now + static_cast<size_t>(want));
      } catch (const std::bad_alloc&) {
        return OutOfMemory(path, *bytes);
      }
      got = ReadFully(fd.get(), staged.data() + have_now, want);
      if (got < 0) return FileError(path, "read", errno);
      staged.resize(have_now + static_cast<size_t>(got));
      if (got < want) break;
    }
    const int64_t follow = static_cast<int64_t>(staged.size());
    if (follow != *bytes) {
      return annotate(
          NpyDataBytesInFile(*header,
                             static_cast<int64_t>(header->data_offset) + follow)
              .status());
    }
  }
  HostArray array;
  try {
    array = HostArray::Allocate(file_dtype, header->shape);
  } catch (const std::bad_alloc&) {
    return OutOfMemory(path, *bytes);
  }
  if (array.num_bytes != *bytes) {
    return absl::InternalError(absl::StrCat("reading '", path,
                                            "': inconsistent data size ",
                                            array.num_bytes, " vs ", *bytes));
  }
  if (!regular) {
    if (*bytes > 0) std::memcpy(array.data(), staged.data(), staged.size());
  } else {
    got = ReadFully(fd.get(), array.data(), *bytes);
    if (got < 0) return FileError(path, "read", errno);
    if (got < *bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "'", path, "' is truncated: its header promises ", *bytes,
          " data bytes for shape ", ShapeToString(header->shape), " of ",
          header->descr, " but only ", got, " follow"));
    }
    char extra;
    got = ReadFully(fd.get(), &extra, 1);
    if (got < 0) return FileError(path, "read", errno);
    if (got > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", path, "' is longer than its header says: shape ",
                       ShapeToString(header->shape), " of ", header->descr,
                       " needs ", *bytes, " data bytes, but more follow"));
    }
  }
  absl::Status normalized = NormalizeNpyData(
      *header, absl::Span<char>(array.data(), static_cast<size_t>(*bytes)));
  if (!normalized.ok()) return annotate(normalized);
  return array;
}

absl::Status WriteNpyFile(const std::string& path, const HostArray& array) {
  TESSERA_ASSIGN_OR_RETURN(
      std::unique_ptr<NpyFileWriter> file,
      NpyFileWriter::Create(path, array.dtype, array.shape));
  if (array.num_bytes > 0) {
    std::memcpy(file->data(), array.data(),
                static_cast<size_t>(array.num_bytes));
  }
  return file->Commit();
}

absl::StatusOr<NpyInput> OpenNpyFile(const std::string& path,
                                     std::optional<DType> as_dtype,
                                     std::optional<DType> words_of) {
  auto read_whole = [&]() -> absl::StatusOr<NpyInput> {
    NpyInput input;
    TESSERA_ASSIGN_OR_RETURN(input.array, ReadNpyFile(path, as_dtype));
    input.dtype = input.array.dtype;
    input.shape = input.array.shape;
    input.num_bytes = input.array.num_bytes;
    return input;
  };
  struct stat st {};
  if (stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return read_whole();  // its errors, or a pipe read in steps
  }
  absl::StatusOr<std::unique_ptr<MappedInputFile>> mapping =
      MappedInputFile::Open(path, ".npy file");
  if (!mapping.ok()) return read_whole();
  // The header lies within its first bytes (ParseNpyHeader bounds it).
  absl::StatusOr<NpyArray> header = ParseNpyHeader((*mapping)->bytes());
  // A header read while the file shrank is no header (zeros past its end).
  TESSERA_RETURN_IF_ERROR((*mapping)->CheckUnchanged());
  if (!header.ok()) return read_whole();  // the same error, from the reader
  if (words_of.has_value() && !as_dtype.has_value() &&
      NpyFileDType(*words_of) == header->dtype) {
    as_dtype = words_of;  // read_whole sees it too
  }
  const bool in_place = !header->byte_swapped &&
                        (!header->fortran_order || header->shape.size() <= 1);
  if (!in_place) return read_whole();
  TESSERA_RETURN_IF_ERROR(CheckDType(path, *header, as_dtype));
  absl::StatusOr<int64_t> bytes =
      NpyDataBytesInFile(*header, (*mapping)->size());
  if (!bytes.ok()) {
    return Annotate(bytes.status(), absl::StrCat("reading '", path, "'"));
  }
  NpyInput input;
  input.dtype = as_dtype.value_or(header->dtype);
  input.shape = header->shape;
  input.num_bytes = *bytes;
  input.mapped = true;
  input.offset = static_cast<int64_t>(header->data_offset);
  input.mapping = *std::move(mapping);
  return input;
}

absl::StatusOr<std::unique_ptr<NpyFileWriter>> NpyFileWriter::Create(
    const std::string& path, DType dtype, const Shape& shape) {
  absl::StatusOr<int64_t> bytes = ByteSize(shape, ItemSize(dtype));
  if (!bytes.ok()) {
    return Annotate(bytes.status(), absl::StrCat("writing '", path, "'"));
  }
  const std::string header = EncodeNpyHeader(dtype, shape);
  std::unique_ptr<NpyFileWriter> writer(new NpyFileWriter());
  writer->header_bytes_ = static_cast<int64_t>(header.size());
  TESSERA_ASSIGN_OR_RETURN(
      writer->file_, MappedOutputFile::Create(
                         path, writer->header_bytes_ + *bytes, ".npy file"));
  std::memcpy(writer->file_->data(), header.data(), header.size());
  return writer;
}

}  // namespace tessera
