// The safetensors file format, read and written with every size checked:
//
//   [N: 8 bytes, little-endian uint64][N bytes: JSON header][data section]
//
//   header = {"NAME": {"dtype": "F32", "shape": [2, 3], "data_offsets": [B,
//             E]}, ..., "__metadata__": {"key": "value", ...}}
//
// (metadata optional). Offsets are relative to the data section, entries
// are row-major and little-endian, and they tile the data section exactly:
// no overlap, no hole, nothing after the last (as the reference
// implementation requires). Every problem is INVALID_ARGUMENT with
// "safetensors" in its message.
//
// The format alone, for every floor: bytes parsed (the fuzzer drives
// ParseSafetensors), a header read by pread from an open file, a file laid
// out for writing. Mapping files (client/safetensors_file.h) is the
// client's. Pure functions, thread-safe.
#ifndef TESSERA_CORE_SAFETENSORS_H_
#define TESSERA_CORE_SAFETENSORS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/box.h"
#include "core/dtype.h"

namespace tessera {

// Largest JSON header accepted (the reference implementation's limit).
inline constexpr int64_t kSafetensorsMaxHeaderBytes = 100'000'000;
// Most entries in one file (a model has thousands; this bounds the
// bookkeeping a hostile header can make us build).
inline constexpr int64_t kSafetensorsMaxEntries = 1 << 20;
// Most dims of one entry.
inline constexpr int64_t kSafetensorsMaxRank = 64;
// Most "__metadata__" pairs.
inline constexpr int64_t kSafetensorsMaxMetadata = 1 << 16;

// The reserved key of the header's string-to-string metadata.
inline constexpr char kSafetensorsMetadataKey[] = "__metadata__";

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kFloat32;
  Shape shape;  // may be empty (a 0-d scalar)
  // [begin, end) in the data section.
  int64_t begin = 0;
  int64_t end = 0;

  int64_t num_bytes() const { return end - begin; }
};

using SafetensorsMetadata = std::vector<std::pair<std::string, std::string>>;

struct SafetensorsHeader {
  // In data order (ascending `begin`; entries of 0 bytes by name among
  // those at the same offset).
  std::vector<SafetensorsEntry> entries;
  SafetensorsMetadata metadata;  // in the header's order
  int64_t data_offset = 0;       // 8 + N: where the data section starts
  int64_t data_bytes = 0;        // the data section's size
};

// The safetensors dtype code ("F32", "BF16", "BOOL", ...) of a tessera
// dtype, and back. F32 F64 F16 BF16 I8 U8 I16 I32 I64 BOOL map one to one;
// other codes (U16, U32, U64, F8_*) are refused with a message naming them.
absl::string_view SafetensorsDTypeCode(DType dtype);
absl::StatusOr<DType> DTypeFromSafetensors(absl::string_view code);

// Parses and validates a whole file held in `file` (header and data).
// Checks: the 8-byte length (<= kSafetensorsMaxHeaderBytes and within the
// file), well-formed JSON (an object, valid UTF-8, no duplicate keys, no
// unknown fields), each entry's dtype, shape (<= kSafetensorsMaxRank dims,
// each >= 0, element count x item size without overflow) and data_offsets
// (begin <= end, size equal to the shape's bytes), names unique and
// non-empty, at most kSafetensorsMaxEntries entries, and that the entries
// cover the data section exactly (no overlap, no hole, no trailing bytes).
absl::StatusOr<SafetensorsHeader> ParseSafetensors(absl::string_view file);
// The same checks from the file's first bytes alone: `head` holds at least
// the 8-byte length and the header (the whole file will do), `file_bytes`
// is the file's size.
absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::string_view head,
                                                         int64_t file_bytes);
// For a file read as a stream (stdin), from its first bytes `head`: its
// whole size once `head` holds the header (8 + N + the data its entries
// tile), nullopt before; the header's error as soon as the bytes cannot
// start a safetensors file.
absl::StatusOr<std::optional<int64_t>> SafetensorsStreamBytes(
    absl::string_view head);
// The header of the safetensors file open as `fd`, read by pread (never
// mapped: a file cut short meanwhile is an error, not a fault).
absl::StatusOr<SafetensorsHeader> ReadSafetensorsHeader(int fd);

// What a writer is given for each entry.
struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::kFloat32;
  Shape shape;
};

// A file laid out for writing: the header bytes (length prefix included,
// JSON padded with spaces so the data starts at a multiple of 8) and each
// entry's place in the data section.
struct SafetensorsLayout {
  std::string header;
  // In file order: larger items first, then by name, so every entry's data
  // is aligned to its item size.
  std::vector<SafetensorsEntry> entries;
  int64_t file_bytes = 0;
};

// Lays out `tensors` (names unique, non-empty, not "__metadata__"; at most
// kSafetensorsMaxEntries; sizes without overflow) with optional metadata
// (in its order). The same input always gives the same bytes. With
// `keep_order`, entries go in the order given (as the file they came from
// had them), not the aligned order.
absl::StatusOr<SafetensorsLayout> LayoutSafetensors(
    std::vector<SafetensorsTensor> tensors,
    const SafetensorsMetadata& metadata = {}, bool keep_order = false);

}  // namespace tessera

#endif  // TESSERA_CORE_SAFETENSORS_H_
