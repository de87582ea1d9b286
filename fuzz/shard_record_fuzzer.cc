// Fuzzes the reader of the records a worker keeps beside each shard of its
// --store_dir (ParseShardRecord): a restarted worker reads them from a
// directory anyone with access may have written. Invariants checked (trap
// on failure): a refusal is INVALID_ARGUMENT naming "store"; an accepted
// record has a non-empty tensor name, a box inside its tensor's shape (or
// empty) of the record's bytes, and ShardRecordJson of it parses back the same.
#include <cstddef>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/shard_record.h"
#include "fuzz/fuzz_util.h"

namespace tessera {
namespace {

void Run(absl::string_view text) {
  absl::StatusOr<ShardRecord> r = ParseShardRecord(text);
  if (!r.ok()) {
    FUZZ_CHECK(r.status().code() == absl::StatusCode::kInvalidArgument,
               r.status().ToString());
    FUZZ_CHECK(absl::string_view(r.status().message()).find("store") !=
                   absl::string_view::npos,
               r.status().ToString());
    return;
  }
  FUZZ_CHECK(!r->tensor.empty(), "empty tensor name");
  FUZZ_CHECK(r->box.NumElements() == 0 || IsWithin(r->box, r->tensor_shape),
             r->box.ToString());
  FUZZ_CHECK(r->bytes == r->box.NumElements() *
                             static_cast<int64_t>(ItemSize(r->dtype)),
             absl::StrCat(r->bytes));
  absl::StatusOr<ShardRecord> again = ParseShardRecord(ShardRecordJson(*r));
  FUZZ_CHECK(again.ok(), again.status().ToString());
  FUZZ_CHECK(
      again->shard_id == r->shard_id && again->cluster_id == r->cluster_id &&
          again->tensor == r->tensor && again->version == r->version &&
          again->incarnation == r->incarnation && again->dtype == r->dtype &&
          again->tensor_shape == r->tensor_shape && again->box == r->box &&
          again->bytes == r->bytes && again->crc32 == r->crc32,
      "round trip");
}

}  // namespace
}  // namespace tessera

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tessera::Run(absl::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
