// Reading and writing .npy files, on top of core/npy (which works on bytes).
//
// ReadNpyFile accepts what NumPy writes for the dtypes tessera knows, in C or
// Fortran order and either byte order, and returns a C-order little-endian
// HostArray. A '<u2' file is accepted only when bfloat16 is asked for (its
// words are then bfloat16 bits). WriteNpyFile writes format 1.0 (2.0 when
// the header needs it), C order, little-endian; bfloat16 as '<u2'.
//
// Errors name the file. Free functions with no shared state; safe to call
// from any thread (on different paths).
#ifndef TESSERA_CLIENT_NPY_FILE_H_
#define TESSERA_CLIENT_NPY_FILE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/host_array.h"
#include "client/mapped_file.h"
#include "core/box.h"
#include "core/dtype.h"

namespace tessera {

// Reads the whole .npy file at `path`. Without `as_dtype` the array takes the
// file's dtype (a '<u2' file is then refused: tessera has no uint16). With
// `as_dtype`, the file must hold that dtype, except that bfloat16 reads a
// '<u2' file as raw bfloat16 bits. The data must have exactly the size the
// header promises (truncated or trailing bytes are INVALID_ARGUMENT).
absl::StatusOr<HostArray> ReadNpyFile(const std::string& path,
                                      std::optional<DType> as_dtype);

// Writes `array` to `path` as NpyFileWriter does (renamed into place, so
// `path` never holds a partial file; a device or pipe is written into).
absl::Status WriteNpyFile(const std::string& path, const HostArray& array);

// An array from a .npy file, for use where it lies: a regular file in C
// order and little-endian (what NumPy writes by default) is mapped and
// data() points into the mapping, so the file's bytes are never copied into
// this process's memory; any other file (Fortran order, big-endian, a pipe)
// is read and converted as ReadNpyFile does. Same checks and errors as
// ReadNpyFile. Move-only; data() stays valid while the NpyInput lives.
struct NpyInput {
  DType dtype = DType::kFloat32;
  Shape shape;
  int64_t num_bytes = 0;
  bool mapped = false;  // data() is in the file's mapping

  const char* data() const {
    return mapped ? mapping->data() + offset : array.data();
  }

  std::unique_ptr<MappedInputFile> mapping;
  int64_t offset = 0;  // of the data in the mapping
  HostArray array;     // when not mapped
};
// With `words_of` (and no `as_dtype`), a file holding the raw words of that
// dtype (NpyFileDType: '<u2' for bfloat16, '|u1' for float8) is taken as
// it (for an update of a tensor of that dtype, where the file has only that
// one meaning); any other file keeps its dtype.
absl::StatusOr<NpyInput> OpenNpyFile(
    const std::string& path, std::optional<DType> as_dtype,
    std::optional<DType> words_of = std::nullopt);

// A new .npy file (format 1.0, or 2.0 when the header needs it; C order,
// little-endian; bfloat16 as '<u2', float8 as '|u1') written through a mapping
// of a temporary file in the destination's directory: the header is in place,
// the caller fills data() with data_bytes() bytes and calls Commit(), which
// renames it to `path`. Without Commit() no file is left (a failed get
// leaves no file). The size is known before any byte moves, so arrays
// larger than memory go straight to disk.
class NpyFileWriter {
 public:
  static absl::StatusOr<std::unique_ptr<NpyFileWriter>> Create(
      const std::string& path, DType dtype, const Shape& shape);

  char* data() { return file_->data() + header_bytes_; }
  int64_t data_bytes() const { return file_->size() - header_bytes_; }
  absl::Status Commit() { return file_->Commit(); }

 private:
  NpyFileWriter() = default;
  std::unique_ptr<MappedOutputFile> file_;
  int64_t header_bytes_ = 0;
};

}  // namespace tessera

#endif  // TESSERA_CLIENT_NPY_FILE_H_
