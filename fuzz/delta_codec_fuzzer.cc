// Fuzzes ApplyDelta, which reads a relay source's reply (core/delta_codec.h):
// byte 0 picks the element size, bytes 1-2 the element count of the base
// (at most 4096), the rest is the encoding. Invariants checked (trap on
// failure): a refused encoding is DATA_LOSS; an accepted one changes the
// base into a result that EncodeDelta encodes again into changes that
// ApplyDelta turns the base into the same result; no byte is touched past
// the end (ASan).
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "core/delta_codec.h"
#include "fuzz/fuzz_util.h"

namespace tessera {
namespace {

constexpr int64_t kItems[] = {1, 2, 4, 8, 16};

}  // namespace
}  // namespace tessera

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  if (size < 3) return 0;
  const int64_t item = kItems[data[0] % 5];
  const int64_t count = (data[1] | (data[2] << 8)) % 4097;
  const absl::string_view encoding(reinterpret_cast<const char*>(data + 3),
                                   size - 3);
  std::string base(static_cast<size_t>(count * item), '\0');
  for (size_t i = 0; i < base.size(); ++i) base[i] = static_cast<char>(i * 7);
  std::string result = base;
  const absl::Status applied =
      ApplyDelta(encoding, item, absl::MakeSpan(result));
  if (!applied.ok()) {
    FUZZ_CHECK(absl::IsDataLoss(applied), applied.ToString());
    return 0;
  }
  std::optional<std::string> again = EncodeDelta(base, result, item, INT64_MAX);
  FUZZ_CHECK(again.has_value(), "EncodeDelta refused without a limit");
  std::string twice = base;
  FUZZ_CHECK(ApplyDelta(*again, item, absl::MakeSpan(twice)).ok(),
             "the changes encoded again do not apply");
  FUZZ_CHECK(twice == result, "the changes encoded again differ");
  return 0;
}
