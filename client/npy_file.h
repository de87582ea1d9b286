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

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/host_array.h"
#include "core/dtype.h"

namespace tessera {

// Reads the whole .npy file at `path`. Without `as_dtype` the array takes the
// file's dtype (a '<u2' file is then refused: tessera has no uint16). With
// `as_dtype`, the file must hold that dtype, except that bfloat16 reads a
// '<u2' file as raw bfloat16 bits. The data must have exactly the size the
// header promises (truncated or trailing bytes are INVALID_ARGUMENT).
absl::StatusOr<HostArray> ReadNpyFile(const std::string& path,
                                      std::optional<DType> as_dtype);

// Writes `array` to `path` through a temporary file in the same directory
// that is renamed into place, so `path` never holds a partial file.
absl::Status WriteNpyFile(const std::string& path, const HostArray& array);

}  // namespace tessera

#endif  // TESSERA_CLIENT_NPY_FILE_H_
