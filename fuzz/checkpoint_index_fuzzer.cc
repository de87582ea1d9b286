// Fuzzes the readers of a checkpoint directory's index files (they come
// from a shared volume anyone may write): the first byte picks
// tessera.json (ParseTesseraIndex) or model.safetensors.index.json
// (ParseHfIndex); the rest is the file. Invariants checked (trap on
// failure): a refusal is INVALID_ARGUMENT naming "checkpoint"; an accepted
// tessera.json's tensors have unique names, bytes equal to their shapes',
// pieces inside them whose elements add up to the tensor's (they tile it),
// plain file names and bytes equal to their boxes'; written back with
// TesseraIndexJson it parses to the same listing. An accepted HF index
// names each file once, sorted, every name plain.
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/checked_math.h"
#include "core/checkpoint_index.h"
#include "core/dtype.h"
#include "fuzz/fuzz_util.h"

namespace tessera {
namespace {

void CheckRefusal(const absl::Status& status) {
  FUZZ_CHECK(status.code() == absl::StatusCode::kInvalidArgument,
             status.ToString());
  FUZZ_CHECK(absl::string_view(status.message()).find("checkpoint") !=
                 absl::string_view::npos,
             status.ToString());
}

bool SamePieces(const CheckpointEntry& a, const CheckpointEntry& b) {
  if (a.pieces.size() != b.pieces.size()) return false;
  for (size_t i = 0; i < a.pieces.size(); ++i) {
    const StoredPiece& p = a.pieces[i];
    const StoredPiece& q = b.pieces[i];
    if (p.box != q.box || p.file != q.file || p.entry != q.entry ||
        p.data_offset != q.data_offset || p.bytes != q.bytes ||
        p.crc32 != q.crc32) {
      return false;
    }
  }
  return true;
}

void Tessera(absl::string_view text) {
  absl::StatusOr<CheckpointListing> listing = ParseTesseraIndex(text);
  if (!listing.ok()) {
    CheckRefusal(listing.status());
    return;
  }
  std::set<std::string> names;
  for (const CheckpointEntry& e : listing->entries) {
    FUZZ_CHECK(names.insert(e.name).second, e.name);
    const int64_t item = static_cast<int64_t>(ItemSize(e.dtype));
    absl::StatusOr<int64_t> bytes = ByteSize(e.shape, item);
    FUZZ_CHECK(bytes.ok() && *bytes == e.bytes, e.name);
    FUZZ_CHECK(!e.pieces.empty(), e.name);
    int64_t elements = 0;
    for (const StoredPiece& p : e.pieces) {
      FUZZ_CHECK(IsWithin(p.box, e.shape), e.name);
      FUZZ_CHECK(CheckCheckpointFileName(p.file).ok(), p.file);
      FUZZ_CHECK(p.bytes == p.box.NumElements() * item, e.name);
      FUZZ_CHECK(p.data_offset >= 0, e.name);
      elements += p.box.NumElements();
    }
    FUZZ_CHECK(elements * item == e.bytes, absl::StrCat(e.name, " ", elements));
    FUZZ_CHECK(e.file == e.pieces.front().file, e.name);
  }
  absl::StatusOr<CheckpointListing> again =
      ParseTesseraIndex(TesseraIndexJson(*listing));
  FUZZ_CHECK(again.ok(), again.status().ToString());
  FUZZ_CHECK(again->metadata == listing->metadata, "metadata");
  FUZZ_CHECK(again->save_id == listing->save_id &&
                 again->saved_by == listing->saved_by,
             "saved_by");
  FUZZ_CHECK(again->entries.size() == listing->entries.size(), "count");
  for (size_t i = 0; i < again->entries.size(); ++i) {
    const CheckpointEntry& a = again->entries[i];
    const CheckpointEntry& b = listing->entries[i];
    FUZZ_CHECK(a.name == b.name && a.dtype == b.dtype && a.shape == b.shape &&
                   a.bytes == b.bytes && SamePieces(a, b),
               a.name);
  }
}

void Hf(absl::string_view text) {
  absl::StatusOr<std::vector<std::string>> files = ParseHfIndex(text);
  if (!files.ok()) {
    CheckRefusal(files.status());
    return;
  }
  for (size_t i = 0; i < files->size(); ++i) {
    FUZZ_CHECK(CheckCheckpointFileName((*files)[i]).ok(), (*files)[i]);
    FUZZ_CHECK(i == 0 || (*files)[i - 1] < (*files)[i], (*files)[i]);
  }
}

}  // namespace
}  // namespace tessera

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const absl::string_view text(reinterpret_cast<const char*>(data) + 1,
                               size - 1);
  if (data[0] & 1) {
    tessera::Hf(text);
  } else {
    tessera::Tessera(text);
  }
  return 0;
}
