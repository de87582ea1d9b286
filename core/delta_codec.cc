#include "core/delta_codec.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace tessera {
namespace {

// A run's header: a varint for its gap and one for its count, at least a
// byte each.
constexpr int64_t kRunHeaderBytes = 2;

void PutVarint(uint64_t value, std::string* out) {
  while (value >= 0x80) {
    out->push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out->push_back(static_cast<char>(value));
}

// Reads a varint at `*pos`, advancing it; false when truncated or longer
// than 64 bits.
bool GetVarint(absl::string_view in, size_t* pos, uint64_t* value) {
  uint64_t result = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (*pos >= in.size()) return false;
    const uint8_t byte = static_cast<uint8_t>(in[(*pos)++]);
    if (shift == 63 && byte > 1) return false;
    result |= static_cast<uint64_t>(byte & 0x7f) << shift;
    if ((byte & 0x80) == 0) {
      *value = result;
      return true;
    }
  }
  return false;
}

// Compares the two versions element by element, skipping equal bytes a
// word at a time.
class Comparer {
 public:
  Comparer(absl::string_view base, absl::string_view next, int64_t item)
      : a_(base.data()),
        b_(next.data()),
        bytes_(static_cast<int64_t>(base.size())),
        item_(item) {}

  int64_t elements() const { return bytes_ / item_; }

  // The first element at or after `from` that differs (elements() if none).
  int64_t NextChanged(int64_t from) const {
    int64_t at = from * item_;
    while (at + 8 <= bytes_) {
      uint64_t x;
      uint64_t y;
      std::memcpy(&x, a_ + at, 8);
      std::memcpy(&y, b_ + at, 8);
      if (x != y) break;
      at += 8;
    }
    while (at < bytes_ && a_[at] == b_[at]) ++at;
    return at / item_;
  }

  // The first element after `from` (which differs) that is equal, looking
  // no further than `stop` (returned when reached).
  int64_t NextSame(int64_t from, int64_t stop) const {
    int64_t e = from + 1;
    while (e < stop &&
           std::memcmp(a_ + e * item_, b_ + e * item_, item_) != 0) {
      ++e;
    }
    return e;
  }

 private:
  const char* a_;
  const char* b_;
  int64_t bytes_;
  int64_t item_;
};

}  // namespace

std::optional<std::string> EncodeDelta(absl::string_view base,
                                       absl::string_view next, int64_t item,
                                       int64_t limit) {
  if (item < 1 || base.size() != next.size() ||
      static_cast<int64_t>(base.size()) % item != 0) {
    return std::nullopt;
  }
  const Comparer compare(base, next, item);
  const int64_t n = compare.elements();
  std::string out;
  int64_t done = 0;  // elements before the next run's gap
  for (int64_t first = compare.NextChanged(0); first < n;) {
    // A run reaching `stop` would not fit: the scan ends there (a whole new
    // content costs a pass over the limit's bytes, not the range's).
    const int64_t room = limit - static_cast<int64_t>(out.size());
    if (room < 0) return std::nullopt;
    const int64_t stop = room / item >= n - first ? n : first + room / item + 1;
    int64_t end = compare.NextSame(first, stop);
    int64_t after = compare.NextChanged(end);
    // A gap cheaper to send as values than as a new run joins the two.
    while (after < n && end < stop && (after - end) * item <= kRunHeaderBytes) {
      end = compare.NextSame(after, stop);
      after = compare.NextChanged(end);
    }
    PutVarint(static_cast<uint64_t>(first - done), &out);
    PutVarint(static_cast<uint64_t>(end - first), &out);
    if (static_cast<int64_t>(out.size()) + (end - first) * item > limit) {
      return std::nullopt;
    }
    out.append(next.data() + first * item,
               static_cast<size_t>((end - first) * item));
    done = end;
    first = after;
  }
  if (static_cast<int64_t>(out.size()) > limit) return std::nullopt;
  return out;
}

absl::Status ApplyDelta(absl::string_view encoding, int64_t item,
                        absl::Span<char> data) {
  if (item < 1 || static_cast<int64_t>(data.size()) % item != 0) {
    return absl::InvalidArgumentError(absl::StrCat("applying changes to ",
                                                   data.size(), " bytes of ",
                                                   item, "-byte elements"));
  }
  const uint64_t n = data.size() / static_cast<uint64_t>(item);
  uint64_t at = 0;  // elements before the next run's gap
  size_t pos = 0;
  while (pos < encoding.size()) {
    uint64_t gap = 0;
    uint64_t count = 0;
    if (!GetVarint(encoding, &pos, &gap) ||
        !GetVarint(encoding, &pos, &count)) {
      return absl::DataLossError(absl::StrCat(
          "the changes are malformed: a truncated run header at byte ", pos));
    }
    // Each step checked against what is left, so no sum can overflow.
    if (gap > n - at || count > n - at - gap) {
      return absl::DataLossError(absl::StrCat(
          "the changes are malformed: a run of ", count, " elements after ",
          gap, " unchanged ones passes the end of ", n, " elements"));
    }
    at += gap;
    const uint64_t bytes = count * static_cast<uint64_t>(item);
    if (bytes > encoding.size() - pos) {
      return absl::DataLossError(
          absl::StrCat("the changes are malformed: a run of ", bytes,
                       " bytes has only ", encoding.size() - pos, " left"));
    }
    std::memcpy(data.data() + at * static_cast<uint64_t>(item),
                encoding.data() + pos, bytes);
    pos += bytes;
    at += count;
  }
  return absl::OkStatus();
}

}  // namespace tessera
