#include "core/npy.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/checked_math.h"
#include "core/status_macros.h"

namespace tessera {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;
constexpr size_t kAlign = 64;
constexpr int kGrowthAxisMaxDigits = 21;  // NumPy's spare room in headers

absl::Status HeaderError(absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("invalid .npy header: ", what));
}

// A cursor over the header dict text, a subset of Python literal syntax.
class DictParser {
 public:
  explicit DictParser(absl::string_view text) : text_(text) {}

  void SkipSpace() {
    while (pos_ < text_.size() &&
           absl::ascii_isspace(static_cast<unsigned char>(text_[pos_]))) {
      ++pos_;
    }
  }
  bool Consume(char c) {
    SkipSpace();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool Peek(char c) {
    SkipSpace();
    return pos_ < text_.size() && text_[pos_] == c;
  }
  bool String(std::string* out) {
    SkipSpace();
    if (pos_ >= text_.size()) return false;
    const char quote = text_[pos_];
    if (quote != '\'' && quote != '"') return false;
    const size_t end = text_.find(quote, pos_ + 1);
    if (end == absl::string_view::npos) return false;
    *out = std::string(text_.substr(pos_ + 1, end - pos_ - 1));
    pos_ = end + 1;
    return true;
  }
  bool Word(absl::string_view word) {
    SkipSpace();
    if (text_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }
  bool Integer(int64_t* out) {
    SkipSpace();
    size_t start = pos_;
    int64_t v = 0;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
      if (v > (INT64_MAX - 9) / 10) return false;
      v = v * 10 + (text_[pos_] - '0');
      ++pos_;
    }
    if (pos_ == start) return false;
    if (pos_ < text_.size() && text_[pos_] == 'L') ++pos_;  // Python 2
    *out = v;
    return true;
  }
  bool AtEnd() {
    SkipSpace();
    return pos_ == text_.size();
  }

 private:
  absl::string_view text_;
  size_t pos_ = 0;
};

// Maps a descr like "<f4" to a dtype.
absl::Status ParseDescr(absl::string_view descr, NpyArray* out) {
  auto unsupported = [&] {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported .npy dtype '", descr,
                     "' (expected f2 f4 f8 i1 u1 i2 u2 i4 u4 i8 u8 b1)"));
  };
  if (descr.size() != 3) return unsupported();
  const char order = descr[0];
  if (order != '<' && order != '>' && order != '|' && order != '=') {
    return unsupported();
  }
  struct Code {
    absl::string_view code;
    DType dtype;
  };
  static constexpr Code kCodes[] = {
      {"f4", DType::kFloat32}, {"f8", DType::kFloat64}, {"f2", DType::kFloat16},
      {"i1", DType::kInt8},    {"u1", DType::kUInt8},   {"i2", DType::kInt16},
      {"i4", DType::kInt32},   {"i8", DType::kInt64},   {"b1", DType::kBool},
      {"u2", DType::kUInt16},  {"u4", DType::kUInt32},  {"u8", DType::kUInt64},
  };
  for (const Code& code : kCodes) {
    if (descr.substr(1) == code.code) {
      out->dtype = code.dtype;
      out->byte_swapped = order == '>' && ItemSize(code.dtype) > 1;
      out->descr = std::string(descr);
      return absl::OkStatus();
    }
  }
  return unsupported();
}

uint32_t ReadLe(const char* p, int bytes) {
  uint32_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) {
    v = (v << 8) | static_cast<unsigned char>(p[i]);
  }
  return v;
}

void SwapBytes(char* data, int64_t count, size_t item_size) {
  for (int64_t i = 0; i < count; ++i) {
    std::reverse(data, data + item_size);
    data += item_size;
  }
}

template <size_t kItem>
void FortranToC(const char* src, char* dst, const Shape& shape) {
  const size_t rank = shape.size();
  // Fortran strides (in items) of each dim.
  std::vector<int64_t> fstride(rank);
  int64_t s = 1;
  for (size_t d = 0; d < rank; ++d) {
    fstride[d] = s;
    s *= shape[d];
  }
  const int64_t total = s;
  const int64_t inner = shape[rank - 1];
  const int64_t inner_stride = fstride[rank - 1] * kItem;
  std::vector<int64_t> index(rank, 0);
  int64_t base = 0;  // Fortran offset (items) of the current row start
  for (int64_t done = 0; done < total; done += inner) {
    const char* from = src + base * kItem;
    for (int64_t j = 0; j < inner; ++j) {
      std::memcpy(dst, from, kItem);
      dst += kItem;
      from += inner_stride;
    }
    for (size_t d = rank - 1; d-- > 0;) {
      base += fstride[d];
      if (++index[d] < shape[d]) break;
      base -= index[d] * fstride[d];
      index[d] = 0;
    }
  }
}

}  // namespace

absl::StatusOr<std::optional<int64_t>> NpyStreamBytes(absl::string_view head) {
  const size_t magic = std::min(head.size(), kMagicLen);
  if (head.substr(0, magic) != absl::string_view(kMagic, magic)) {
    return ParseNpyHeader(head).status();  // "not a .npy file"
  }
  if (head.size() < kMagicLen + 2) return std::optional<int64_t>();
  const bool v1 = head[6] == 1 && head[7] == 0;
  const bool v2 = (head[6] == 2 || head[6] == 3) && head[7] == 0;
  if (!v1 && !v2) return ParseNpyHeader(head).status();  // the version
  const int len_bytes = v1 ? 2 : 4;
  const size_t prefix = kMagicLen + 2 + len_bytes;
  if (head.size() < prefix) return std::optional<int64_t>();
  const size_t header_len = ReadLe(head.data() + 8, len_bytes);
  if (header_len > kMaxNpyStreamHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        ".npy header of ", header_len, " bytes is longer than the ",
        kMaxNpyStreamHeaderBytes, " read from a stream"));
  }
  if (head.size() - prefix < header_len) return std::optional<int64_t>();
  TESSERA_ASSIGN_OR_RETURN(const NpyArray header, ParseNpyHeader(head));
  TESSERA_ASSIGN_OR_RETURN(const int64_t bytes, NpyDataBytes(header));
  if (bytes > std::numeric_limits<int64_t>::max() -
                  static_cast<int64_t>(header.data_offset)) {
    return absl::InvalidArgumentError(".npy array is larger than any file");
  }
  return std::optional<int64_t>(static_cast<int64_t>(header.data_offset) +
                                bytes);
}

absl::StatusOr<NpyArray> ParseNpyHeader(absl::string_view file_prefix) {
  if (file_prefix.size() < kMagicLen ||
      file_prefix.substr(0, kMagicLen) !=
          absl::string_view(kMagic, kMagicLen)) {
    return absl::InvalidArgumentError(
        "not a .npy file (it does not start with \\x93NUMPY)");
  }
  if (file_prefix.size() < kMagicLen + 2) {
    return absl::InvalidArgumentError(".npy header is truncated");
  }
  const int major = static_cast<unsigned char>(file_prefix[6]);
  const int minor = static_cast<unsigned char>(file_prefix[7]);
  size_t len_bytes;
  if (major == 1 && minor == 0) {
    len_bytes = 2;
  } else if ((major == 2 || major == 3) && minor == 0) {
    len_bytes = 4;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported .npy format version ", major, ".", minor,
                     " (expected 1.0, 2.0 or 3.0)"));
  }
  const size_t prefix = kMagicLen + 2 + len_bytes;
  if (file_prefix.size() < prefix) {
    return absl::InvalidArgumentError(".npy header is truncated");
  }
  const size_t header_len = ReadLe(file_prefix.data() + 8, len_bytes);
  if (file_prefix.size() - prefix < header_len) {
    return absl::InvalidArgumentError(absl::StrCat(
        ".npy header is truncated: it declares ", header_len,
        " bytes but only ", file_prefix.size() - prefix, " follow"));
  }
  NpyArray out;
  out.data_offset = prefix + header_len;
  DictParser p(file_prefix.substr(prefix, header_len));
  if (!p.Consume('{')) return HeaderError("expected a '{'");
  bool have_descr = false, have_order = false, have_shape = false;
  while (!p.Consume('}')) {
    std::string key;
    if (!p.String(&key)) return HeaderError("expected a quoted key");
    if (!p.Consume(':')) return HeaderError("expected ':' after a key");
    if (key == "descr") {
      std::string descr;
      if (!p.String(&descr)) {
        return HeaderError(
            "'descr' is not a simple type string (structured arrays are not "
            "supported)");
      }
      TESSERA_RETURN_IF_ERROR(ParseDescr(descr, &out));
      have_descr = true;
    } else if (key == "fortran_order") {
      if (p.Word("True")) {
        out.fortran_order = true;
      } else if (p.Word("False")) {
        out.fortran_order = false;
      } else {
        return HeaderError("'fortran_order' must be True or False");
      }
      have_order = true;
    } else if (key == "shape") {
      if (!p.Consume('(')) return HeaderError("'shape' must be a tuple");
      while (!p.Consume(')')) {
        int64_t dim;
        if (!p.Integer(&dim)) {
          return HeaderError("'shape' must hold non-negative integers");
        }
        out.shape.push_back(dim);
        if (!p.Consume(',') && !p.Peek(')')) {
          return HeaderError("expected ',' or ')' in 'shape'");
        }
      }
      have_shape = true;
    } else {
      return HeaderError(absl::StrCat("unexpected key '", key, "'"));
    }
    if (!p.Consume(',') && !p.Peek('}')) {
      return HeaderError("expected ',' or '}' after a value");
    }
  }
  if (!p.AtEnd()) return HeaderError("unexpected text after the dict");
  if (!have_descr || !have_order || !have_shape) {
    return HeaderError("it needs the keys 'descr', 'fortran_order', 'shape'");
  }
  if (out.shape.empty()) {
    return absl::InvalidArgumentError(
        "0-d arrays are not supported (the .npy array has shape ())");
  }
  auto bytes = ByteSize(out.shape, ItemSize(out.dtype));
  if (!bytes.ok()) {
    return Annotate(bytes.status(), absl::StrCat(".npy array of shape ",
                                                 ShapeToString(out.shape)));
  }
  return out;
}

absl::StatusOr<int64_t> NpyDataBytes(const NpyArray& header) {
  return ByteSize(header.shape, ItemSize(header.dtype));
}

absl::StatusOr<int64_t> NpyDataBytesInFile(const NpyArray& header,
                                           int64_t file_bytes) {
  TESSERA_ASSIGN_OR_RETURN(const int64_t bytes, NpyDataBytes(header));
  const int64_t offset = static_cast<int64_t>(header.data_offset);
  const int64_t follow = file_bytes < offset ? 0 : file_bytes - offset;
  if (follow < bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(".npy data is truncated: the header promises ", bytes,
                     " data bytes for shape ", ShapeToString(header.shape),
                     " of ", header.descr, " but only ", follow, " follow"));
  }
  if (follow > bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(".npy file is longer than its header says: shape ",
                     ShapeToString(header.shape), " of ", header.descr,
                     " needs ", bytes, " data bytes, but ", follow, " follow"));
  }
  return bytes;
}

DType NpyFileDType(DType dtype) {
  switch (dtype) {
    case DType::kBFloat16:
      return DType::kUInt16;
    case DType::kFloat8E4M3FN:
    case DType::kFloat8E5M2:
      return DType::kUInt8;
    default:
      return dtype;
  }
}

std::string EncodeNpyHeader(DType dtype, const Shape& shape) {
  absl::string_view descr;
  switch (dtype) {
    case DType::kFloat32:
      descr = "<f4";
      break;
    case DType::kFloat64:
      descr = "<f8";
      break;
    case DType::kFloat16:
      descr = "<f2";
      break;
    case DType::kBFloat16:
      descr = "<u2";
      break;
    case DType::kInt8:
      descr = "|i1";
      break;
    case DType::kUInt8:
      descr = "|u1";
      break;
    case DType::kInt16:
      descr = "<i2";
      break;
    case DType::kInt32:
      descr = "<i4";
      break;
    case DType::kInt64:
      descr = "<i8";
      break;
    case DType::kBool:
      descr = "|b1";
      break;
    case DType::kUInt16:
      descr = "<u2";
      break;
    case DType::kUInt32:
      descr = "<u4";
      break;
    case DType::kUInt64:
      descr = "<u8";
      break;
    case DType::kFloat8E4M3FN:
    case DType::kFloat8E5M2:
      descr = "|u1";
      break;
  }
  std::string shape_text =
      shape.size() == 1 ? absl::StrCat("(", shape[0], ",)")
                        : absl::StrCat("(", absl::StrJoin(shape, ", "), ")");
  std::string dict =
      absl::StrCat("{'descr': '", descr,
                   "', 'fortran_order': False, 'shape': ", shape_text, ", }");
  if (!shape.empty()) {
    const int digits = static_cast<int>(absl::StrCat(shape[0]).size());
    dict.append(std::max(0, kGrowthAxisMaxDigits - digits), ' ');
  }
  auto finish = [&dict](size_t prefix) {
    const size_t pad = kAlign - (prefix + dict.size() + 1) % kAlign;
    std::string text = dict;
    text.append(pad, ' ');  // NumPy pads a full 64 when already aligned
    text.push_back('\n');
    return text;
  };
  std::string text = finish(kMagicLen + 2 + 2);
  std::string out(kMagic, kMagicLen);
  if (text.size() <= 65535) {
    out.push_back('\x01');
    out.push_back('\x00');
    out.push_back(static_cast<char>(text.size() & 0xff));
    out.push_back(static_cast<char>(text.size() >> 8));
  } else {
    text = finish(kMagicLen + 2 + 4);
    out.push_back('\x02');
    out.push_back('\x00');
    for (int i = 0; i < 4; ++i) {
      out.push_back(static_cast<char>((text.size() >> (8 * i)) & 0xff));
    }
  }
  out += text;
  return out;
}

absl::Status NormalizeNpyData(const NpyArray& header, absl::Span<char> data) {
  TESSERA_ASSIGN_OR_RETURN(const int64_t bytes, NpyDataBytes(header));
  if (static_cast<int64_t>(data.size()) < bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(".npy data is truncated: the header promises ", bytes,
                     " bytes for shape ", ShapeToString(header.shape), " but ",
                     data.size(), " are present"));
  }
  const size_t item = ItemSize(header.dtype);
  const int64_t count = bytes / static_cast<int64_t>(item);
  if (header.byte_swapped && item > 1) SwapBytes(data.data(), count, item);
  if (header.fortran_order && header.shape.size() > 1 && count > 0) {
    std::vector<char> copy(data.data(), data.data() + bytes);
    switch (item) {
      case 1:
        FortranToC<1>(copy.data(), data.data(), header.shape);
        break;
      case 2:
        FortranToC<2>(copy.data(), data.data(), header.shape);
        break;
      case 4:
        FortranToC<4>(copy.data(), data.data(), header.shape);
        break;
      case 8:
        FortranToC<8>(copy.data(), data.data(), header.shape);
        break;
    }
  }
  return absl::OkStatus();
}

}  // namespace tessera
