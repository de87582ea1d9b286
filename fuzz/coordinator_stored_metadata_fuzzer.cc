// Fuzzes what a coordinator reads back from its durable stores (the file
// log, etcd): a batch of changes (MetadataBatch), a snapshot
// (MetadataSnapshot) and the header of an etcd value (ParseStoredValue).
// Invariants (trap on failure): whatever decodes encodes again and decodes
// to the same changes and state; a stored value's header never names more
// chunks than bytes, nor bytes past its bound, and inline bytes lie inside
// the value.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "coordinator/etcd_metadata_store.h"
#include "coordinator/metadata_codec.h"
#include "fuzz/fuzz_util.h"

namespace tessera {
namespace {

constexpr int64_t kMaxBytes = int64_t{1} << 30;

}  // namespace
}  // namespace tessera

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;  // NOLINT
  const std::string bytes(reinterpret_cast<const char*>(data), size);

  absl::StatusOr<std::vector<MetadataChange>> batch = DecodeBatch(bytes);
  if (batch.ok()) {
    absl::StatusOr<std::string> again = EncodeBatch(*batch);
    FUZZ_CHECK(again.ok(), "a decoded batch encodes");
    absl::StatusOr<std::vector<MetadataChange>> back = DecodeBatch(*again);
    FUZZ_CHECK(back.ok() && back->size() == batch->size(),
               "a batch encoded again decodes to as many changes");
    for (size_t i = 0; i < batch->size(); ++i) {
      FUZZ_CHECK((*back)[i].kind == (*batch)[i].kind, "the same kinds");
    }
  }

  MetadataState state;
  if (DecodeSnapshot(bytes, &state).ok()) {
    absl::StatusOr<std::string> again = EncodeSnapshot(state);
    FUZZ_CHECK(again.ok(), "a decoded snapshot encodes");
    MetadataState back;
    FUZZ_CHECK(DecodeSnapshot(*again, &back).ok(), "and decodes");
    FUZZ_CHECK(back.tensors.size() == state.tensors.size() &&
                   back.workers.size() == state.workers.size() &&
                   back.shard_id_high_water == state.shard_id_high_water,
               "to the same state");
  }

  for (absl::string_view magic : {"TLG1", "TSN1"}) {
    absl::StatusOr<StoredValue> value =
        ParseStoredValue(bytes, magic, kMaxBytes);
    if (!value.ok()) continue;
    if (value->chunked) {
      FUZZ_CHECK(value->chunks >= 1 && value->chunks <= value->total_bytes &&
                     value->total_bytes <= static_cast<uint64_t>(kMaxBytes),
                 "chunk list within its bounds");
    } else {
      FUZZ_CHECK(value->inline_bytes.data() >= bytes.data() &&
                     value->inline_bytes.data() + value->inline_bytes.size() <=
                         bytes.data() + bytes.size(),
                 "inline bytes inside the value");
    }
  }
  return 0;
}
