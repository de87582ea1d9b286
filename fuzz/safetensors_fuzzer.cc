// Fuzzes the safetensors reader: ParseSafetensors on arbitrary bytes (the
// whole file, as the mapped reader hands it over). Invariants checked (trap
// on failure): an accepted file's entries are in data order, have unique
// non-empty names, sizes equal to their shapes' bytes, and tile the data
// section exactly (which starts at 8 + N and runs to the end of the input);
// LayoutSafetensors of what parsed succeeds, and the file it lays out (with
// each entry's bytes copied over) parses back to the same entries, metadata
// and bytes.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/checked_math.h"
#include "core/dtype.h"
#include "core/safetensors.h"
#include "fuzz/fuzz_util.h"

namespace tessera {
namespace {

void Run(const uint8_t* data, size_t size) {
  const absl::string_view file(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<SafetensorsHeader> header = ParseSafetensors(file);
  if (!header.ok()) {
    FUZZ_CHECK(header.status().code() == absl::StatusCode::kInvalidArgument,
               header.status().ToString());
    FUZZ_CHECK(
        absl::string_view(header.status().message()).find("safetensors") !=
            absl::string_view::npos,
        header.status().ToString());
    return;
  }
  // Read as a stream (stdin), a whole valid file is sized as it is.
  absl::StatusOr<std::optional<int64_t>> stream = SafetensorsStreamBytes(file);
  FUZZ_CHECK(stream.ok() && stream->has_value() &&
                 **stream == static_cast<int64_t>(size),
             "a valid file sized otherwise as a stream");
  FUZZ_CHECK(
      header->data_offset >= 8 && header->data_offset + header->data_bytes ==
                                      static_cast<int64_t>(size),
      absl::StrCat(header->data_offset, " ", header->data_bytes));
  std::set<std::string> names;
  int64_t covered = 0;
  for (const SafetensorsEntry& e : header->entries) {
    FUZZ_CHECK(!e.name.empty(), "empty name");
    FUZZ_CHECK(names.insert(e.name).second, e.name);
    FUZZ_CHECK(e.begin == covered, absl::StrCat(e.name, " ", e.begin));
    absl::StatusOr<int64_t> bytes = ByteSize(e.shape, ItemSize(e.dtype));
    FUZZ_CHECK(bytes.ok() && *bytes == e.num_bytes(), e.name);
    covered = e.end;
  }
  FUZZ_CHECK(covered == header->data_bytes, absl::StrCat(covered));

  // Write what was read and read it again.
  std::vector<SafetensorsTensor> tensors;
  for (const SafetensorsEntry& e : header->entries) {
    tensors.push_back({e.name, e.dtype, e.shape});
  }
  absl::StatusOr<SafetensorsLayout> layout =
      LayoutSafetensors(tensors, header->metadata);
  FUZZ_CHECK(layout.ok(), layout.status().ToString());
  FUZZ_CHECK(layout->header.size() % 8 == 0, "unaligned header");
  std::string copy = layout->header;
  copy.resize(static_cast<size_t>(layout->file_bytes));
  std::map<std::string, const SafetensorsEntry*> by_name;
  for (const SafetensorsEntry& e : header->entries) by_name[e.name] = &e;
  for (const SafetensorsEntry& e : layout->entries) {
    const SafetensorsEntry* from = by_name.at(e.name);
    FUZZ_CHECK(from->num_bytes() == e.num_bytes(), e.name);
    std::memcpy(copy.data() + layout->header.size() + e.begin,
                file.data() + header->data_offset + from->begin,
                static_cast<size_t>(e.num_bytes()));
  }
  absl::StatusOr<SafetensorsHeader> again = ParseSafetensors(copy);
  FUZZ_CHECK(again.ok(), again.status().ToString());
  FUZZ_CHECK(again->entries.size() == header->entries.size(), "count");
  FUZZ_CHECK(again->metadata == header->metadata, "metadata");
  for (const SafetensorsEntry& e : again->entries) {
    const SafetensorsEntry* from = by_name.at(e.name);
    FUZZ_CHECK(e.dtype == from->dtype && e.shape == from->shape, e.name);
    FUZZ_CHECK(std::memcmp(copy.data() + again->data_offset + e.begin,
                           file.data() + header->data_offset + from->begin,
                           static_cast<size_t>(e.num_bytes())) == 0,
               e.name);
  }
}

}  // namespace
}  // namespace tessera

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tessera::Run(data, size);
  return 0;
}
