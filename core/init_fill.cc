#include "core/init_fill.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace tessera {
namespace {

constexpr char kInitForms[] =
    "expected empty, zeros, ones, full:V, arange or rand:SEED";

// A parsed V: an exact integer or a double.
struct FullValue {
  bool is_integer = true;
  int64_t integer = 0;
  double real = 0;
};

bool AllDigits(absl::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

absl::StatusOr<FullValue> ParseFullValue(absl::string_view text) {
  FullValue v;
  if (text == "true" || text == "True") {
    v.integer = 1;
    return v;
  }
  if (text == "false" || text == "False") return v;
  absl::string_view digits = text;
  if (!digits.empty() && (digits[0] == '-' || digits[0] == '+')) {
    digits.remove_prefix(1);
  }
  if (AllDigits(digits)) {
    if (!absl::SimpleAtoi(text, &v.integer)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "invalid init value '", text, "': integers must fit in int64"));
    }
    return v;
  }
  const bool plausible =
      !text.empty() && text.find_first_of(" \t\n") == absl::string_view::npos;
  if (!plausible || !absl::SimpleAtod(text, &v.real)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "invalid init value '", text, "' (expected a number, true or false)"));
  }
  v.is_integer = false;
  return v;
}

// double -> integer as NumPy does on x86-64: types up to 32 bits convert
// through int32 (out of range gives INT32_MIN), then wrap.
int64_t DoubleToInt32Like(double x) {
  if (!(x > -2147483649.0 && x < 2147483648.0)) return INT32_MIN;
  return static_cast<int64_t>(x);
}

int64_t DoubleToInt64Like(double x) {
  // Out of range (and NaN) gives INT64_MIN, like cvttsd2si.
  if (!(x >= -9223372036854775808.0 && x < 9223372036854775808.0)) {
    return INT64_MIN;
  }
  return static_cast<int64_t>(x);
}

// The bytes of one element of `dtype` holding integer `v` (NumPy casts).
void StoreInt(int64_t v, DType dtype, char* out) {
  switch (dtype) {
    case DType::kFloat32: {
      const float f = static_cast<float>(v);
      std::memcpy(out, &f, 4);
      return;
    }
    case DType::kFloat64: {
      const double d = static_cast<double>(v);
      std::memcpy(out, &d, 8);
      return;
    }
    case DType::kFloat16: {
      const uint16_t h = Int64ToHalf(v);
      std::memcpy(out, &h, 2);
      return;
    }
    case DType::kBFloat16: {
      const uint16_t h = Int64ToBFloat16(v);
      std::memcpy(out, &h, 2);
      return;
    }
    case DType::kInt8:
    case DType::kUInt8:
      out[0] = static_cast<char>(static_cast<uint8_t>(v));
      return;
    case DType::kInt16: {
      const uint16_t w = static_cast<uint16_t>(v);
      std::memcpy(out, &w, 2);
      return;
    }
    case DType::kInt32: {
      const uint32_t w = static_cast<uint32_t>(v);
      std::memcpy(out, &w, 4);
      return;
    }
    case DType::kInt64:
    case DType::kUInt64:
      std::memcpy(out, &v, 8);
      return;
    case DType::kBool:
      out[0] = v != 0 ? 1 : 0;
      return;
    case DType::kUInt16: {
      const uint16_t w = static_cast<uint16_t>(v);
      std::memcpy(out, &w, 2);
      return;
    }
    case DType::kUInt32: {
      const uint32_t w = static_cast<uint32_t>(v);
      std::memcpy(out, &w, 4);
      return;
    }
    case DType::kFloat8E4M3FN:
      out[0] = static_cast<char>(Int64ToFloat8E4M3FN(v));
      return;
    case DType::kFloat8E5M2:
      out[0] = static_cast<char>(Int64ToFloat8E5M2(v));
      return;
  }
}

// The bytes of one element of `dtype` holding double `x` (NumPy casts).
void StoreDouble(double x, DType dtype, char* out) {
  switch (dtype) {
    case DType::kFloat32: {
      const float f = static_cast<float>(x);
      std::memcpy(out, &f, 4);
      return;
    }
    case DType::kFloat64:
      std::memcpy(out, &x, 8);
      return;
    case DType::kFloat16: {
      const uint16_t h = DoubleToHalf(x);
      std::memcpy(out, &h, 2);
      return;
    }
    case DType::kBFloat16: {
      const uint16_t h = DoubleToBFloat16(x);
      std::memcpy(out, &h, 2);
      return;
    }
    case DType::kInt8:
    case DType::kUInt8:
    case DType::kInt16:
    case DType::kInt32:
      StoreInt(DoubleToInt32Like(x), dtype, out);
      return;
    case DType::kInt64:
    case DType::kUInt32:
      StoreInt(DoubleToInt64Like(x), dtype, out);
      return;
    case DType::kUInt16:
      StoreInt(DoubleToInt32Like(x), dtype, out);
      return;
    case DType::kUInt64:
      // Past int64's range, uint64's upper half (as NumPy converts).
      if (x >= 9223372036854775808.0 && x < 18446744073709551616.0) {
        StoreInt(static_cast<int64_t>(static_cast<uint64_t>(x)), dtype, out);
      } else {
        StoreInt(DoubleToInt64Like(x), dtype, out);
      }
      return;
    case DType::kBool:
      out[0] = x != 0 ? 1 : 0;  // NaN is true, as in NumPy
      return;
    case DType::kFloat8E4M3FN:
      out[0] = static_cast<char>(DoubleToFloat8E4M3FN(x));
      return;
    case DType::kFloat8E5M2:
      out[0] = static_cast<char>(DoubleToFloat8E5M2(x));
      return;
  }
}

void FillPattern(char* dst, int64_t count, const char* pattern, size_t item) {
  if (count <= 0) return;
  bool all_zero = true;
  for (size_t i = 0; i < item; ++i) all_zero &= pattern[i] == 0;
  if (all_zero) {
    std::memset(dst, 0, static_cast<size_t>(count) * item);
    return;
  }
  std::memcpy(dst, pattern, item);
  // Doubling copies: log(count) memcpys.
  int64_t filled = 1;
  while (filled < count) {
    const int64_t n = std::min(filled, count - filled);
    std::memcpy(dst + filled * item, dst, static_cast<size_t>(n) * item);
    filled += n;
  }
}

// Calls row(flat_index_of_first, length, out) for each row of `box` (along
// the last dim), in row-major order; `out` advances by the row's bytes.
template <typename RowFn>
void ForEachRow(const Shape& shape, const Box& box, char* dst, size_t item,
                RowFn row) {
  const size_t rank = shape.size();
  if (rank == 0) {
    row(0, 1, dst);
    return;
  }
  std::vector<int64_t> strides(rank);
  int64_t s = 1;
  for (size_t d = rank; d-- > 0;) {
    strides[d] = s;
    s *= shape[d];
  }
  const int64_t len = box.sizes[rank - 1];
  int64_t flat = 0;
  for (size_t d = 0; d < rank; ++d) flat += box.offsets[d] * strides[d];
  std::vector<int64_t> index(rank, 0);
  const size_t row_bytes = static_cast<size_t>(len) * item;
  while (true) {
    row(flat, len, dst);
    dst += row_bytes;
    size_t d = rank - 1;
    while (d-- > 0) {
      flat += strides[d];
      if (++index[d] < box.sizes[d]) break;
      flat -= index[d] * strides[d];
      index[d] = 0;
    }
    if (d == static_cast<size_t>(-1)) return;  // odometer wrapped
  }
}

// Writes fn(first), fn(first + 1), ... to `out` (which may be unaligned).
template <typename T, typename Fn>
void GenerateRow(int64_t first, int64_t n, char* out, Fn fn) {
  for (int64_t i = 0; i < n; ++i) {
    const T v = fn(first + i);
    std::memcpy(out + i * sizeof(T), &v, sizeof(T));
  }
}

void ArangeRow(DType dtype, int64_t first, int64_t n, char* out) {
  switch (dtype) {
    case DType::kFloat32:
      return GenerateRow<float>(
          first, n, out, [](int64_t i) { return static_cast<float>(i); });
    case DType::kFloat64:
      return GenerateRow<double>(
          first, n, out, [](int64_t i) { return static_cast<double>(i); });
    case DType::kFloat16:
      return GenerateRow<uint16_t>(first, n, out, [](int64_t i) {
        return i >= 65520 ? uint16_t{0x7c00} : Int64ToHalf(i);
      });
    case DType::kBFloat16:
      return GenerateRow<uint16_t>(first, n, out, Int64ToBFloat16);
    case DType::kInt8:
    case DType::kUInt8:
      return GenerateRow<uint8_t>(
          first, n, out, [](int64_t i) { return static_cast<uint8_t>(i); });
    case DType::kInt16:
      return GenerateRow<uint16_t>(
          first, n, out, [](int64_t i) { return static_cast<uint16_t>(i); });
    case DType::kInt32:
      return GenerateRow<uint32_t>(
          first, n, out, [](int64_t i) { return static_cast<uint32_t>(i); });
    case DType::kInt64:
    case DType::kUInt64:
      return GenerateRow<int64_t>(first, n, out, [](int64_t i) { return i; });
    case DType::kBool:
      return GenerateRow<uint8_t>(first, n, out, [](int64_t i) {
        return static_cast<uint8_t>(i != 0 ? 1 : 0);
      });
    case DType::kUInt16:
      return GenerateRow<uint16_t>(
          first, n, out, [](int64_t i) { return static_cast<uint16_t>(i); });
    case DType::kUInt32:
      return GenerateRow<uint32_t>(
          first, n, out, [](int64_t i) { return static_cast<uint32_t>(i); });
    case DType::kFloat8E4M3FN:
      return GenerateRow<uint8_t>(first, n, out, Int64ToFloat8E4M3FN);
    case DType::kFloat8E5M2:
      return GenerateRow<uint8_t>(first, n, out, Int64ToFloat8E5M2);
  }
}

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

inline uint64_t Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The random word of element `index`: splitmix64 keyed by the seed.
struct RandomWord {
  uint64_t key;
  uint64_t operator()(int64_t index) const {
    return Mix(key + (static_cast<uint64_t>(index) + 1) * kGolden);
  }
};

const std::vector<uint16_t>& HalfUnitTable() {  // k / 2048 as float16
  static const std::vector<uint16_t>* const kTable = [] {
    auto* t = new std::vector<uint16_t>(2048);
    for (int k = 0; k < 2048; ++k) (*t)[k] = DoubleToHalf(k / 2048.0);
    return t;
  }();
  return *kTable;
}

void RandRow(DType dtype, uint64_t seed, int64_t first, int64_t n, char* out) {
  const RandomWord word{Mix(seed ^ 0x7E55E7A5EED5ull)};
  // Integers: 0 to 99, the high word of word(i) * 100.
  auto below_100 = [word](int64_t i) {
    return static_cast<int64_t>(
        (static_cast<unsigned __int128>(word(i)) * 100) >> 64);
  };
  switch (dtype) {
    case DType::kFloat32:
      return GenerateRow<float>(first, n, out, [word](int64_t i) {
        return static_cast<float>(word(i) >> 40) * (1.0f / 16777216.0f);
      });
    case DType::kFloat64:
      return GenerateRow<double>(first, n, out, [word](int64_t i) {
        return static_cast<double>(word(i) >> 11) * (1.0 / 9007199254740992.0);
      });
    case DType::kFloat16: {
      const uint16_t* table = HalfUnitTable().data();
      return GenerateRow<uint16_t>(first, n, out, [word, table](int64_t i) {
        return table[word(i) >> 53];
      });
    }
    case DType::kBFloat16:
      // k / 256 with k < 256 is exact in bfloat16 (8 significant bits).
      return GenerateRow<uint16_t>(first, n, out, [word](int64_t i) {
        return FloatToBFloat16(static_cast<float>(word(i) >> 56) / 256.0f);
      });
    case DType::kFloat8E4M3FN:
      // k / 16 with k < 16 is exact in e4m3 (4 significant bits).
      return GenerateRow<uint8_t>(first, n, out, [word](int64_t i) {
        return DoubleToFloat8E4M3FN(static_cast<double>(word(i) >> 60) / 16);
      });
    case DType::kFloat8E5M2:
      // k / 8 with k < 8 is exact in e5m2 (3 significant bits).
      return GenerateRow<uint8_t>(first, n, out, [word](int64_t i) {
        return DoubleToFloat8E5M2(static_cast<double>(word(i) >> 61) / 8);
      });
    case DType::kInt8:
    case DType::kUInt8:
      return GenerateRow<uint8_t>(first, n, out, [below_100](int64_t i) {
        return static_cast<uint8_t>(below_100(i));
      });
    case DType::kInt16:
    case DType::kUInt16:
      return GenerateRow<int16_t>(first, n, out, [below_100](int64_t i) {
        return static_cast<int16_t>(below_100(i));
      });
    case DType::kInt32:
    case DType::kUInt32:
      return GenerateRow<int32_t>(first, n, out, [below_100](int64_t i) {
        return static_cast<int32_t>(below_100(i));
      });
    case DType::kInt64:
    case DType::kUInt64:
      return GenerateRow<int64_t>(first, n, out, below_100);
    case DType::kBool:
      return GenerateRow<uint8_t>(first, n, out, [word](int64_t i) {
        return static_cast<uint8_t>(word(i) >> 63);
      });
  }
}

}  // namespace

std::string InitSpec::ToString() const {
  switch (kind) {
    case Kind::kEmpty:
      return "empty";
    case Kind::kZeros:
      return "zeros";
    case Kind::kOnes:
      return "ones";
    case Kind::kFull:
      return absl::StrCat("full:", value);
    case Kind::kArange:
      return "arange";
    case Kind::kRand:
      return absl::StrCat("rand:", seed);
  }
  return "empty";
}

absl::StatusOr<InitSpec> ParseInit(absl::string_view text) {
  InitSpec spec;
  if (text == "empty") return spec;
  if (text == "zeros") {
    spec.kind = InitSpec::Kind::kZeros;
    return spec;
  }
  if (text == "ones") {
    spec.kind = InitSpec::Kind::kOnes;
    return spec;
  }
  if (text == "arange") {
    spec.kind = InitSpec::Kind::kArange;
    return spec;
  }
  if (absl::StartsWith(text, "full:")) {
    spec.kind = InitSpec::Kind::kFull;
    spec.value = std::string(text.substr(5));
    auto value = ParseFullValue(spec.value);
    if (!value.ok()) return value.status();
    return spec;
  }
  if (absl::StartsWith(text, "rand:")) {
    const absl::string_view seed = text.substr(5);
    spec.kind = InitSpec::Kind::kRand;
    if (!AllDigits(seed) || !absl::SimpleAtoi(seed, &spec.seed)) {
      return absl::InvalidArgumentError(
          absl::StrCat("invalid init '", text,
                       "': SEED must be a non-negative integer below 2^64"));
    }
    return spec;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("invalid init '", text, "' (", kInitForms, ")"));
}

absl::Status CheckInitValue(const InitSpec& spec, DType dtype) {
  if (spec.kind != InitSpec::Kind::kFull) return absl::OkStatus();
  TESSERA_ASSIGN_OR_RETURN(const FullValue v, ParseFullValue(spec.value));
  if (!v.is_integer && !std::isfinite(v.real) && !IsFloating(dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("init value '", spec.value, "' is not a finite number, ",
                     "which dtype ", DTypeName(dtype), " cannot hold"));
  }
  return absl::OkStatus();
}

absl::StatusOr<InitFill> InitFill::Make(const InitSpec& spec, DType dtype) {
  InitFill fill;
  fill.kind_ = spec.kind;
  fill.dtype_ = dtype;
  fill.seed_ = spec.seed;
  switch (spec.kind) {
    case InitSpec::Kind::kOnes:
      StoreInt(1, dtype, fill.pattern_);
      break;
    case InitSpec::Kind::kFull: {
      TESSERA_RETURN_IF_ERROR(CheckInitValue(spec, dtype));
      TESSERA_ASSIGN_OR_RETURN(const FullValue v, ParseFullValue(spec.value));
      if (v.is_integer) {
        StoreInt(v.integer, dtype, fill.pattern_);
      } else {
        StoreDouble(v.real, dtype, fill.pattern_);
      }
      break;
    }
    default:
      break;
  }
  return fill;
}

absl::Status InitFill::Fill(const Shape& tensor_shape, const Box& box,
                            void* dst) const {
  // Chunk sharding makes empty shards past the end: they hold nothing to
  // fill and are never out of bounds.
  const bool empty = box.IsEmpty() && !box.sizes.empty() &&
                     box.rank() == tensor_shape.size() &&
                     *std::min_element(box.sizes.begin(), box.sizes.end()) >= 0;
  if (!empty) {
    TESSERA_RETURN_IF_ERROR(
        CheckWithin(box, tensor_shape, absl::StrCat("box ", box.ToString())));
  }
  if (empty) return absl::OkStatus();
  // Flat indices run over the whole tensor: its element count must fit.
  int64_t elements = 1;
  for (int64_t n : tensor_shape) {
    if (__builtin_mul_overflow(elements, n, &elements)) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor of shape ", ShapeToString(tensor_shape),
                       " has more elements than fit in 64 bits"));
    }
  }
  const DType dtype = dtype_;
  const size_t item = ItemSize(dtype);
  const int64_t count = box.NumElements();
  char* out = static_cast<char*>(dst);
  switch (kind_) {
    case InitSpec::Kind::kEmpty:
      return absl::OkStatus();
    case InitSpec::Kind::kZeros:
      std::memset(out, 0, static_cast<size_t>(count) * item);
      return absl::OkStatus();
    case InitSpec::Kind::kOnes:
    case InitSpec::Kind::kFull:
      FillPattern(out, count, pattern_, item);
      return absl::OkStatus();
    case InitSpec::Kind::kArange:
      ForEachRow(tensor_shape, box, out, item,
                 [dtype](int64_t first, int64_t n, char* row) {
                   ArangeRow(dtype, first, n, row);
                 });
      return absl::OkStatus();
    case InitSpec::Kind::kRand: {
      const uint64_t seed = seed_;
      ForEachRow(tensor_shape, box, out, item,
                 [dtype, seed](int64_t first, int64_t n, char* row) {
                   RandRow(dtype, seed, first, n, row);
                 });
      return absl::OkStatus();
    }
  }
  return absl::OkStatus();
}

absl::Status FillBox(const InitSpec& spec, DType dtype,
                     const Shape& tensor_shape, const Box& box, void* dst) {
  TESSERA_ASSIGN_OR_RETURN(const InitFill fill, InitFill::Make(spec, dtype));
  return fill.Fill(tensor_shape, box, dst);
}

}  // namespace tessera
