// Fuzzes the .npy reader: ParseNpyHeader on arbitrary bytes; when the header
// parses and promises a sane amount of data, NpyDataBytes and
// NormalizeNpyData run on the bytes after the header (zero-padded to the
// promised size). Invariants checked (trap on failure): the header's own
// data offset lies within the input; NormalizeNpyData agrees with a naive
// per-element transpose/byte swap; EncodeNpyHeader of what parsed parses
// back to the same dtype and shape; NpyStreamBytes sizes a stream as the
// header does.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/dtype.h"
#include "core/npy.h"
#include "fuzz/fuzz_util.h"

namespace tessera {
namespace {

// Data bytes normalized per input (keeps each run fast and small).
constexpr int64_t kMaxDataBytes = 1 << 20;

// The C-order result computed the slow way: element at C index i comes from
// Fortran index f(i), with its bytes reversed when swapped.
std::vector<char> NaiveNormalize(const NpyArray& h,
                                 const std::vector<char>& in) {
  const size_t item = ItemSize(h.dtype);
  const size_t rank = h.shape.size();
  int64_t count = 1;
  for (int64_t d : h.shape) count *= d;
  std::vector<char> out(in.size());
  std::vector<int64_t> idx(rank, 0);
  for (int64_t c = 0; c < count; ++c) {
    // idx is the multi-index of C-order element c.
    int64_t src = c;
    if (h.fortran_order && rank > 1) {
      src = 0;
      int64_t stride = 1;
      for (size_t d = 0; d < rank; ++d) {
        src += idx[d] * stride;
        stride *= h.shape[d];
      }
    }
    std::memcpy(out.data() + c * item, in.data() + src * item, item);
    if (h.byte_swapped && item > 1)
      std::reverse(out.data() + c * item, out.data() + (c + 1) * item);
    for (size_t d = rank; d-- > 0;) {
      if (++idx[d] < h.shape[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

void Run(const uint8_t* data, size_t size) {
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<NpyArray> header = ParseNpyHeader(input);
  // Read as a stream (stdin), the same bytes size the file as its header
  // does, or say why not; a stream that gives a size has a header.
  absl::StatusOr<std::optional<int64_t>> stream = NpyStreamBytes(input);
  if (stream.ok() && stream->has_value()) {
    FUZZ_CHECK(header.ok(), "a stream sized without a header");
  }
  if (!header.ok()) return;
  if (header->data_offset <= kMaxNpyStreamHeaderBytes + 12) {
    FUZZ_CHECK(stream.ok() && stream->has_value(),
               "a header the stream reader does not size");
    absl::StatusOr<int64_t> data = NpyDataBytes(*header);
    FUZZ_CHECK(
        data.ok() &&
            **stream == static_cast<int64_t>(header->data_offset) + *data,
        "the stream's size is not the header's");
  }
  FUZZ_CHECK(header->data_offset <= size, absl::StrCat(header->data_offset));
  FUZZ_CHECK(!header->shape.empty(), "0-d accepted");
  for (int64_t d : header->shape) FUZZ_CHECK(d >= 0, "negative dim");

  absl::StatusOr<int64_t> bytes = NpyDataBytes(*header);
  FUZZ_CHECK(bytes.ok(),
             bytes.status().ToString());  // ParseNpyHeader checked it
  FUZZ_CHECK(*bytes >= 0, "negative size");

  if (*bytes > 0 && *bytes <= kMaxDataBytes) {
    std::vector<char> buf(static_cast<size_t>(*bytes), 0);
    const size_t have =
        std::min<size_t>(buf.size(), size - header->data_offset);
    std::memcpy(buf.data(), input.data() + header->data_offset, have);
    const std::vector<char> want = NaiveNormalize(*header, buf);
    absl::Status s = NormalizeNpyData(*header, absl::MakeSpan(buf));
    FUZZ_CHECK(s.ok(), s.ToString());
    FUZZ_CHECK(buf == want,
               "NormalizeNpyData disagrees with the naive transpose");
    // Too little data is an error, not a read past the end.
    std::vector<char> short_buf(static_cast<size_t>(*bytes) - 1);
    FUZZ_CHECK(!NormalizeNpyData(*header, absl::MakeSpan(short_buf)).ok(),
               "short data");
  }

  // Round trip through the writer.
  const std::string encoded = EncodeNpyHeader(header->dtype, header->shape);
  FUZZ_CHECK(encoded.size() % 64 == 0, absl::StrCat(encoded.size()));
  absl::StatusOr<NpyArray> again = ParseNpyHeader(encoded);
  FUZZ_CHECK(again.ok(), again.status().ToString());
  FUZZ_CHECK(again->dtype == header->dtype && again->shape == header->shape &&
                 !again->fortran_order && !again->byte_swapped &&
                 again->data_offset == encoded.size(),
             encoded);
}

}  // namespace
}  // namespace tessera

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tessera::Run(data, size);
  return 0;
}
