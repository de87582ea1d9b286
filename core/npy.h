// NumPy .npy format on bytes (no files): header parsing (versions 1.0, 2.0,
// 3.0; either byte order; C or Fortran order), header encoding (1.0, or 2.0
// when needed; C order, little-endian; data aligned to 64 bytes as NumPy
// writes it) and conversion of read data to C order little-endian. Pure
// functions; safe to call from any thread.
#ifndef TESSERA_CORE_NPY_H_
#define TESSERA_CORE_NPY_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/box.h"
#include "core/dtype.h"

namespace tessera {

struct NpyArray {
  DType dtype = DType::kFloat32;
  Shape shape;
  bool fortran_order = false;
  bool byte_swapped = false;  // the data is big-endian (multi-byte items)
  size_t data_offset = 0;     // bytes before the data
  std::string descr;          // as written, e.g. "<f4"
};

// The dtype a .npy file holds `dtype` in: NumPy has no bfloat16 or float8,
// so those travel as their raw words (uint16, uint8); any other dtype is
// itself.
DType NpyFileDType(DType dtype);

// Parses the header at the start of a .npy file. `file_prefix` must hold at
// least the whole header (more is fine). Errors are INVALID_ARGUMENT: "not a
// .npy file", "truncated", unsupported descr (named), 0-d arrays, sizes that
// overflow.
absl::StatusOr<NpyArray> ParseNpyHeader(absl::string_view file_prefix);

// For a .npy file read as a stream (stdin), from its first bytes `head`: its
// whole size once `head` holds the header, nullopt before; the header's
// error as soon as the bytes cannot start a .npy file (or its header is
// longer than kMaxNpyStreamHeaderBytes, far more than NumPy writes).
inline constexpr size_t kMaxNpyStreamHeaderBytes = size_t{1} << 20;
absl::StatusOr<std::optional<int64_t>> NpyStreamBytes(absl::string_view head);

// The number of data bytes after the header.
absl::StatusOr<int64_t> NpyDataBytes(const NpyArray& header);

// The number of data bytes after the header, checked against the size of
// the whole file (`file_bytes`, header included) so that a reader allocates
// nothing for a header that promises more than the file holds (a 118-byte
// file may declare 2^47 elements). INVALID_ARGUMENT: "truncated" when fewer
// bytes follow the header than it promises, "longer than its header says"
// when more do.
absl::StatusOr<int64_t> NpyDataBytesInFile(const NpyArray& header,
                                           int64_t file_bytes);

// A header for a C-order little-endian array, as NumPy writes it: version
// 1.0 (2.0 only when the header exceeds 65535 bytes), padded with spaces and
// ending in '\n' so that the data start at a multiple of 64 bytes.
// bfloat16 is written as '<u2'.
std::string EncodeNpyHeader(DType dtype, const Shape& shape);

// Converts data read after `header` in place to C order, little-endian:
// swaps bytes of big-endian data and transposes Fortran-order data.
// `data` must hold at least NpyDataBytes(header) bytes.
absl::Status NormalizeNpyData(const NpyArray& header, absl::Span<char> data);

}  // namespace tessera

#endif  // TESSERA_CORE_NPY_H_
