// Small files that operators and users name (a token, the tokens and quotas
// tables, PEM certificates and keys), read whole up to a bound: a wrong
// path (/dev/zero, a disk image, a FIFO no one writes to) is then an error,
// not a daemon or CLI that hangs or fills its memory. Pipes are read
// (`--token_file=/dev/stdin` with the token piped in).
#ifndef TESSERA_CORE_SMALL_FILE_H_
#define TESSERA_CORE_SMALL_FILE_H_

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tessera {

// The bytes of `path`, at most `max_bytes` of them. Errors name it as
// "<what> <path>": NOT_FOUND (or PERMISSION_DENIED) when it cannot be opened
// or read, INVALID_ARGUMENT when it holds more than `max_bytes`. A FIFO with
// no writer reads as empty instead of waiting for one. `mode`, when given,
// gets the mode of the file read (fstat of the open file).
absl::StatusOr<std::string> ReadSmallFile(const std::string& path,
                                          int64_t max_bytes,
                                          absl::string_view what,
                                          mode_t* mode = nullptr);

}  // namespace tessera

#endif  // TESSERA_CORE_SMALL_FILE_H_
