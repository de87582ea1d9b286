// Helpers shared by the fuzz targets: a simple framing of the input into
// (op, bytes) records that the seed generator (fuzz/make_seeds.cc) writes
// too, and a trap that says why. Not thread-safe; one per input.
#ifndef TESSERA_FUZZ_FUZZ_UTIL_H_
#define TESSERA_FUZZ_FUZZ_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "absl/strings/string_view.h"

namespace tessera {
namespace fuzz {

// Input = records of [op: 1 byte][length: 2 bytes little-endian][bytes].
// A truncated last record takes what is left.
class Records {
 public:
  Records(const uint8_t* data, size_t size)
      : data_(reinterpret_cast<const char*>(data)), size_(size) {}

  bool Next(uint8_t* op, absl::string_view* bytes) {
    if (pos_ >= size_) return false;
    *op = static_cast<uint8_t>(data_[pos_++]);
    size_t len = 0;
    if (pos_ < size_) len = static_cast<uint8_t>(data_[pos_++]);
    if (pos_ < size_)
      len |= static_cast<size_t>(static_cast<uint8_t>(data_[pos_++])) << 8;
    if (len > size_ - pos_) len = size_ - pos_;
    *bytes = absl::string_view(data_ + pos_, len);
    pos_ += len;
    return true;
  }

 private:
  const char* data_;
  size_t size_;
  size_t pos_ = 0;
};

// Appends one record (used by the seed generator).
inline void AppendRecord(std::string* out, uint8_t op,
                         absl::string_view bytes) {
  out->push_back(static_cast<char>(op));
  out->push_back(static_cast<char>(bytes.size() & 0xff));
  out->push_back(static_cast<char>((bytes.size() >> 8) & 0xff));
  out->append(bytes.data(), bytes.size());
}

// An invariant broke: say which, then crash so libFuzzer keeps the input.
[[noreturn]] inline void Fail(const char* what,
                              const std::string& detail = "") {
  std::fprintf(stderr, "FUZZ INVARIANT BROKEN: %s %s\n", what, detail.c_str());
  __builtin_trap();
}

#define FUZZ_CHECK(cond, detail)                         \
  do {                                                   \
    if (!(cond)) ::tessera::fuzz::Fail(#cond, (detail)); \
  } while (0)

}  // namespace fuzz
}  // namespace tessera

#endif  // TESSERA_FUZZ_FUZZ_UTIL_H_
