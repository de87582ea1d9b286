#include "core/safetensors.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <limits>
#include <numeric>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/checked_math.h"
#include "core/json.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"

namespace tessera {
namespace {

absl::Status Malformed(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("safetensors: ", what));
}

// A quoted name for messages (escaped: names come from the file).
std::string Quoted(absl::string_view name) { return JsonString(name); }

struct DTypeCode {
  DType dtype;
  const char* code;
};
constexpr DTypeCode kDTypeCodes[] = {
    {DType::kFloat32, "F32"},
    {DType::kFloat64, "F64"},
    {DType::kFloat16, "F16"},
    {DType::kBFloat16, "BF16"},
    {DType::kInt8, "I8"},
    {DType::kUInt8, "U8"},
    {DType::kInt16, "I16"},
    {DType::kInt32, "I32"},
    {DType::kInt64, "I64"},
    {DType::kBool, "BOOL"},
    {DType::kUInt16, "U16"},
    {DType::kUInt32, "U32"},
    {DType::kUInt64, "U64"},
    {DType::kFloat8E4M3FN, "F8_E4M3"},
    {DType::kFloat8E5M2, "F8_E5M2"},
};

// The header's JSON, checked event by event, so that a hostile header
// builds nothing beyond the entries it declares: no nesting past the
// format's three levels, no values of unknown fields kept.
class HeaderHandler : public nlohmann::json_sax<nlohmann::json> {
 public:
  // Fields of an entry, as they are seen.
  struct RawEntry {
    std::string name;
    std::string dtype;
    std::vector<int64_t> shape;
    std::vector<int64_t> offsets;
    bool has_dtype = false;
    bool has_shape = false;
    bool has_offsets = false;
  };

  std::vector<RawEntry> entries;
  SafetensorsMetadata metadata;
  std::string error;  // set when a callback refused the input

  bool null() override { return Unexpected("null"); }
  bool boolean(bool) override { return Unexpected("a boolean"); }
  bool number_float(number_float_t, const string_t& s) override {
    return Unexpected(absl::StrCat("the number ", s));
  }
  bool binary(binary_t&) override { return Unexpected("binary data"); }

  bool number_integer(number_integer_t value) override {
    // The lexer gives non-negative integers to number_unsigned.
    if (state_ == State::kShape) {
      return Fail(absl::StrCat("entry ", Quoted(Current().name),
                               " has a negative dim ", value, " in its shape"));
    }
    if (state_ == State::kOffsets) {
      return Fail(absl::StrCat("entry ", Quoted(Current().name),
                               " has a negative data offset ", value));
    }
    return Unexpected(absl::StrCat("the number ", value));
  }

  bool number_unsigned(number_unsigned_t value) override {
    if (state_ != State::kShape && state_ != State::kOffsets) {
      return Unexpected(absl::StrCat("the number ", value));
    }
    RawEntry& e = Current();
    if (value > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return Fail(
          absl::StrCat("entry ", Quoted(e.name), " has ",
                       state_ == State::kShape ? "a dim " : "an offset ", value,
                       ", which does not fit in 63 bits"));
    }
    if (state_ == State::kShape) {
      if (static_cast<int64_t>(e.shape.size()) >= kSafetensorsMaxRank) {
        return Fail(absl::StrCat("entry ", Quoted(e.name), " has more than ",
                                 kSafetensorsMaxRank, " dims"));
      }
      e.shape.push_back(static_cast<int64_t>(value));
    } else {
      if (e.offsets.size() >= 2) {
        return Fail(absl::StrCat("entry ", Quoted(e.name),
                                 ": data_offsets must be [begin, end]"));
      }
      e.offsets.push_back(static_cast<int64_t>(value));
    }
    return true;
  }

  bool string(string_t& value) override {
    if (state_ == State::kMetaValue) {
      metadata.back().second = std::move(value);
      state_ = State::kMetaKey;
      return true;
    }
    if (state_ == State::kEntryValue && field_ == Field::kDType) {
      Current().dtype = std::move(value);
      state_ = State::kEntryKey;
      return true;
    }
    return Unexpected("a string");
  }

  bool start_object(std::size_t) override {
    switch (state_) {
      case State::kStart:
        state_ = State::kTopKey;
        return true;
      case State::kTopValue:
        if (in_metadata_) {
          state_ = State::kMetaKey;
        } else {
          state_ = State::kEntryKey;
        }
        return true;
      default:
        return Unexpected("an object");
    }
  }

  bool key(string_t& k) override {
    switch (state_) {
      case State::kTopKey: {
        if (!top_keys_.insert(k).second) {
          return Fail(absl::StrCat("the header names ", Quoted(k), " twice"));
        }
        in_metadata_ = k == kSafetensorsMetadataKey;
        if (!in_metadata_) {
          if (k.empty()) return Fail("an entry has an empty name");
          if (static_cast<int64_t>(entries.size()) >= kSafetensorsMaxEntries) {
            return Fail(absl::StrCat("the header has more than ",
                                     kSafetensorsMaxEntries, " entries"));
          }
          entries.emplace_back();
          entries.back().name = std::move(k);
        }
        state_ = State::kTopValue;
        return true;
      }
      case State::kMetaKey: {
        if (!meta_keys_.insert(k).second) {
          return Fail(absl::StrCat("__metadata__ names ", Quoted(k), " twice"));
        }
        if (static_cast<int64_t>(metadata.size()) >= kSafetensorsMaxMetadata) {
          return Fail(absl::StrCat("__metadata__ has more than ",
                                   kSafetensorsMaxMetadata, " keys"));
        }
        metadata.emplace_back(std::move(k), std::string());
        state_ = State::kMetaValue;
        return true;
      }
      case State::kEntryKey: {
        RawEntry& e = Current();
        bool* seen = nullptr;
        if (k == "dtype") {
          field_ = Field::kDType;
          seen = &e.has_dtype;
        } else if (k == "shape") {
          field_ = Field::kShape;
          seen = &e.has_shape;
        } else if (k == "data_offsets") {
          field_ = Field::kOffsets;
          seen = &e.has_offsets;
        } else {
          return Fail(absl::StrCat("entry ", Quoted(e.name),
                                   " has an unknown field ", Quoted(k),
                                   " (expected dtype, shape, data_offsets)"));
        }
        if (*seen) {
          return Fail(absl::StrCat("entry ", Quoted(e.name), " gives ",
                                   Quoted(k), " twice"));
        }
        *seen = true;
        state_ = State::kEntryValue;
        return true;
      }
      default:
        return Unexpected("a key");
    }
  }

  bool end_object() override {
    switch (state_) {
      case State::kTopKey:
        state_ = State::kDone;
        return true;
      case State::kMetaKey:
        in_metadata_ = false;
        state_ = State::kTopKey;
        return true;
      case State::kEntryKey: {
        const RawEntry& e = Current();
        for (auto [has, field] :
             {std::pair<bool, const char*>{e.has_dtype, "dtype"},
              {e.has_shape, "shape"},
              {e.has_offsets, "data_offsets"}}) {
          if (!has) {
            return Fail(
                absl::StrCat("entry ", Quoted(e.name), " has no ", field));
          }
        }
        state_ = State::kTopKey;
        return true;
      }
      default:
        return Unexpected("the end of an object");
    }
  }

  bool start_array(std::size_t) override {
    if (state_ == State::kEntryValue && field_ == Field::kShape) {
      state_ = State::kShape;
      return true;
    }
    if (state_ == State::kEntryValue && field_ == Field::kOffsets) {
      state_ = State::kOffsets;
      return true;
    }
    return Unexpected("an array");
  }

  bool end_array() override {
    if (state_ == State::kShape) {
      state_ = State::kEntryKey;
      return true;
    }
    if (state_ == State::kOffsets) {
      if (Current().offsets.size() != 2) {
        return Fail(absl::StrCat("entry ", Quoted(Current().name),
                                 ": data_offsets must be [begin, end]"));
      }
      state_ = State::kEntryKey;
      return true;
    }
    return Unexpected("the end of an array");
  }

  bool parse_error(std::size_t, const std::string&,
                   const nlohmann::detail::exception& ex) override {
    if (error.empty()) {
      error = absl::StrCat("the header is not valid JSON: ", ex.what());
    }
    return false;
  }

  bool done() const { return state_ == State::kDone; }

 private:
  enum class State {
    kStart,
    kTopKey,
    kTopValue,
    kMetaKey,
    kMetaValue,
    kEntryKey,
    kEntryValue,
    kShape,
    kOffsets,
    kDone,
  };
  enum class Field { kDType, kShape, kOffsets };

  RawEntry& Current() { return entries.back(); }

  bool Fail(std::string message) {
    error = std::move(message);
    return false;
  }

  // A value the format has no place for here: say what was expected.
  bool Unexpected(absl::string_view got) {
    switch (state_) {
      case State::kStart:
        return Fail(absl::StrCat("the header is ", got, ", not a JSON object"));
      case State::kTopValue:
        return Fail(
            in_metadata_
                ? absl::StrCat("__metadata__ is ", got, ", not an object")
                : absl::StrCat("entry ", Quoted(Current().name), " is ", got,
                               ", not an object"));
      case State::kMetaValue:
        return Fail(absl::StrCat("__metadata__ value of ",
                                 Quoted(metadata.back().first), " is ", got,
                                 ", not a string"));
      case State::kEntryValue: {
        const char* want =
            field_ == Field::kDType ? "a string" : "an array of integers";
        const char* name = field_ == Field::kDType   ? "dtype"
                           : field_ == Field::kShape ? "shape"
                                                     : "data_offsets";
        return Fail(absl::StrCat("entry ", Quoted(Current().name), ": ", name,
                                 " is ", got, ", not ", want));
      }
      case State::kShape:
      case State::kOffsets:
        return Fail(
            absl::StrCat("entry ", Quoted(Current().name), ": ",
                         state_ == State::kShape ? "shape" : "data_offsets",
                         " holds ", got, ", not a non-negative integer"));
      default:
        return Fail(absl::StrCat("unexpected ", got, " in the header"));
    }
  }

  State state_ = State::kStart;
  Field field_ = Field::kDType;
  bool in_metadata_ = false;
  absl::flat_hash_set<std::string> top_keys_;
  absl::flat_hash_set<std::string> meta_keys_;
};

uint64_t LoadLittleEndian64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

}  // namespace

absl::string_view SafetensorsDTypeCode(DType dtype) {
  for (const DTypeCode& c : kDTypeCodes) {
    if (c.dtype == dtype) return c.code;
  }
  return "?";
}

absl::StatusOr<DType> DTypeFromSafetensors(absl::string_view code) {
  for (const DTypeCode& c : kDTypeCodes) {
    if (code == c.code) return c.dtype;
  }
  std::vector<std::string> known;
  for (const DTypeCode& c : kDTypeCodes) known.emplace_back(c.code);
  return Malformed(absl::StrCat("dtype ", Quoted(code),
                                " is not one tessera stores (supported: ",
                                absl::StrJoin(known, " "), ")"));
}

absl::StatusOr<SafetensorsHeader> ParseSafetensors(absl::string_view file) {
  return ParseSafetensorsHeader(file, static_cast<int64_t>(file.size()));
}

namespace {

// ParseSafetensorsHeader; with `stream`, the file's size is not known
// (file_bytes is then no bound) and the data section is what the entries
// tile.
absl::StatusOr<SafetensorsHeader> ParseHeader(absl::string_view file,
                                              int64_t file_bytes, bool stream) {
  if (file_bytes < 8 || static_cast<int64_t>(file.size()) < 8) {
    return Malformed(absl::StrCat("the file has ", file_bytes,
                                  " bytes, too few for the 8-byte header "
                                  "length"));
  }
  const uint64_t n = LoadLittleEndian64(file.data());
  if (n > static_cast<uint64_t>(kSafetensorsMaxHeaderBytes)) {
    return Malformed(absl::StrCat("header length ", n, " exceeds the limit of ",
                                  kSafetensorsMaxHeaderBytes, " bytes"));
  }
  if (n > static_cast<uint64_t>(file_bytes - 8)) {
    return Malformed(absl::StrCat("header length ", n,
                                  " runs past the end of the file (",
                                  file_bytes, " bytes)"));
  }
  if (file.size() - 8 < n) {
    return Malformed(absl::StrCat("the header's ", n,
                                  " bytes were not all "
                                  "read (the file is being cut short?)"));
  }
  const absl::string_view json = file.substr(8, n);
  if (json.empty() || json[0] != '{') {
    return Malformed("the header does not start with '{' (not a JSON object)");
  }

  HeaderHandler handler;
  bool parsed = false;
  try {
    parsed = nlohmann::json::sax_parse(json.begin(), json.end(), &handler);
  } catch (const std::bad_alloc&) {
    throw;  // the CLI reports running out of memory itself
  } catch (const std::exception& e) {
    return Malformed(absl::StrCat("the header is not valid JSON: ", e.what()));
  }
  if (!parsed || !handler.done()) {
    return Malformed(handler.error.empty() ? "the header is not valid JSON"
                                           : handler.error);
  }

  SafetensorsHeader header;
  header.data_offset = static_cast<int64_t>(8 + n);
  header.data_bytes = file_bytes - header.data_offset;
  header.metadata = std::move(handler.metadata);
  header.entries.reserve(handler.entries.size());
  for (HeaderHandler::RawEntry& raw : handler.entries) {
    SafetensorsEntry e;
    e.name = std::move(raw.name);
    absl::StatusOr<DType> dtype = DTypeFromSafetensors(raw.dtype);
    if (!dtype.ok()) {
      return Annotate(dtype.status(), absl::StrCat("entry ", Quoted(e.name)));
    }
    e.dtype = *dtype;
    e.shape = std::move(raw.shape);
    absl::StatusOr<int64_t> bytes = ByteSize(e.shape, ItemSize(e.dtype));
    if (!bytes.ok()) {
      return Malformed(absl::StrCat("entry ", Quoted(e.name), " of shape [",
                                    absl::StrJoin(e.shape, ", "),
                                    "]: ", bytes.status().message()));
    }
    e.begin = raw.offsets[0];
    e.end = raw.offsets[1];
    if (e.begin > e.end) {
      return Malformed(absl::StrCat("entry ", Quoted(e.name),
                                    " has data_offsets [", e.begin, ", ", e.end,
                                    "] that end before they begin"));
    }
    if (e.end > header.data_bytes) {
      return Malformed(absl::StrCat(
          "entry ", Quoted(e.name), " has data_offsets [", e.begin, ", ", e.end,
          "] outside the data section of ", header.data_bytes, " bytes"));
    }
    if (e.end - e.begin != *bytes) {
      return Malformed(absl::StrCat(
          "entry ", Quoted(e.name), " has ", e.end - e.begin,
          " bytes at data_offsets [", e.begin, ", ", e.end, "] but its shape [",
          absl::StrJoin(e.shape, ", "), "] of ", SafetensorsDTypeCode(e.dtype),
          " needs ", *bytes));
    }
    header.entries.push_back(std::move(e));
  }

  // The entries must tile the data section, in offset order.
  std::sort(header.entries.begin(), header.entries.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
              if (a.begin != b.begin) return a.begin < b.begin;
              if (a.end != b.end) return a.end < b.end;
              return a.name < b.name;
            });
  int64_t covered = 0;
  const SafetensorsEntry* previous = nullptr;
  for (const SafetensorsEntry& e : header.entries) {
    if (e.begin < covered) {
      return Malformed(absl::StrCat("entries ", Quoted(previous->name), " [",
                                    previous->begin, ", ", previous->end,
                                    ") and ", Quoted(e.name), " [", e.begin,
                                    ", ", e.end, ") overlap"));
    }
    if (e.begin > covered) {
      return Malformed(absl::StrCat("bytes [", covered, ", ", e.begin,
                                    ") of the data section belong to no "
                                    "entry (a hole before ",
                                    Quoted(e.name), ")"));
    }
    covered = e.end;
    previous = &e;
  }
  if (stream) {
    header.data_bytes = covered;
  } else if (covered != header.data_bytes) {
    return Malformed(absl::StrCat("bytes [", covered, ", ", header.data_bytes,
                                  ") at the end of the data section belong "
                                  "to no entry"));
  }
  return header;
}

}  // namespace

absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::string_view file,
                                                         int64_t file_bytes) {
  return ParseHeader(file, file_bytes, /*stream=*/false);
}

absl::StatusOr<std::optional<int64_t>> SafetensorsStreamBytes(
    absl::string_view head) {
  if (head.size() < 8) return std::optional<int64_t>();
  const uint64_t n = LoadLittleEndian64(head.data());
  if (n > static_cast<uint64_t>(kSafetensorsMaxHeaderBytes)) {
    return Malformed(absl::StrCat("header length ", n, " exceeds the limit of ",
                                  kSafetensorsMaxHeaderBytes, " bytes"));
  }
  if (head.size() > 8 && head[8] != '{') {
    return Malformed("the header does not start with '{' (not a JSON object)");
  }
  if (head.size() - 8 < n) return std::optional<int64_t>();
  TESSERA_ASSIGN_OR_RETURN(
      const SafetensorsHeader header,
      ParseHeader(head.substr(0, 8 + n), std::numeric_limits<int64_t>::max(),
                  /*stream=*/true));
  if (header.data_bytes >
      std::numeric_limits<int64_t>::max() - header.data_offset) {
    return Malformed(absl::StrCat("its entries end at byte ", header.data_bytes,
                                  " of the data section, past any file"));
  }
  return std::optional<int64_t>(header.data_offset + header.data_bytes);
}

absl::StatusOr<SafetensorsHeader> ReadSafetensorsHeader(int fd) {
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    return Malformed("not a regular file");
  }
  char prefix[8];
  if (st.st_size < 8 || pread(fd, prefix, sizeof(prefix), 0) != 8) {
    return Malformed(absl::StrCat("the file has ", st.st_size,
                                  " bytes, too few for the 8-byte header "
                                  "length"));
  }
  const uint64_t n = LoadLittleEndian64(prefix);
  if (n > static_cast<uint64_t>(kSafetensorsMaxHeaderBytes) ||
      n > static_cast<uint64_t>(st.st_size) - 8) {
    // The same words as a parse of the whole file.
    return ParseSafetensorsHeader(absl::string_view(prefix, sizeof(prefix)),
                                  st.st_size);
  }
  std::string head(8 + n, '\0');
  std::memcpy(head.data(), prefix, sizeof(prefix));
  size_t got = 8;
  while (got < head.size()) {
    const ssize_t r = pread(fd, head.data() + got, head.size() - got,
                            static_cast<off_t>(got));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;  // cut short meanwhile: the parse says so
    got += static_cast<size_t>(r);
  }
  head.resize(got);
  return ParseSafetensorsHeader(head, st.st_size);
}

absl::StatusOr<SafetensorsLayout> LayoutSafetensors(
    std::vector<SafetensorsTensor> tensors, const SafetensorsMetadata& metadata,
    bool keep_order) {
  if (static_cast<int64_t>(tensors.size()) > kSafetensorsMaxEntries) {
    return Malformed(absl::StrCat(tensors.size(),
                                  " entries exceed the limit of ",
                                  kSafetensorsMaxEntries));
  }
  if (static_cast<int64_t>(metadata.size()) > kSafetensorsMaxMetadata) {
    return Malformed(absl::StrCat(metadata.size(),
                                  " metadata keys exceed the limit of ",
                                  kSafetensorsMaxMetadata));
  }
  absl::flat_hash_set<std::string> names;
  std::vector<int64_t> bytes(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const SafetensorsTensor& t = tensors[i];
    if (t.name.empty()) return Malformed("an entry has an empty name");
    if (t.name == kSafetensorsMetadataKey) {
      return Malformed(absl::StrCat("an entry cannot be named ",
                                    Quoted(kSafetensorsMetadataKey)));
    }
    if (!names.insert(t.name).second) {
      return Malformed(absl::StrCat("two entries are named ", Quoted(t.name)));
    }
    if (static_cast<int64_t>(t.shape.size()) > kSafetensorsMaxRank) {
      return Malformed(absl::StrCat("entry ", Quoted(t.name), " has more than ",
                                    kSafetensorsMaxRank, " dims"));
    }
    absl::StatusOr<int64_t> b = ByteSize(t.shape, ItemSize(t.dtype));
    if (!b.ok()) {
      return Malformed(
          absl::StrCat("entry ", Quoted(t.name), ": ", b.status().message()));
    }
    bytes[i] = *b;
  }
  // Larger items first, then by name: each entry starts aligned to its item
  // size (the data section starts at a multiple of 8), and the same set of
  // tensors always gives the same file.
  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), 0);
  if (!keep_order)
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      const size_t ia = ItemSize(tensors[a].dtype);
      const size_t ib = ItemSize(tensors[b].dtype);
      if (ia != ib) return ia > ib;
      return tensors[a].name < tensors[b].name;
    });

  SafetensorsLayout layout;
  nlohmann::ordered_json json = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [key, value] : metadata) {
      if (meta.contains(key)) {
        return Malformed(
            absl::StrCat("metadata names ", Quoted(key), " twice"));
      }
      meta[key] = value;
    }
    json[kSafetensorsMetadataKey] = std::move(meta);
  }
  int64_t offset = 0;
  for (size_t i : order) {
    SafetensorsTensor& t = tensors[i];
    SafetensorsEntry e;
    e.begin = offset;
    TESSERA_ASSIGN_OR_RETURN(offset, CheckedAdd(offset, bytes[i]));
    e.end = offset;
    nlohmann::ordered_json item = nlohmann::ordered_json::object();
    item["dtype"] = std::string(SafetensorsDTypeCode(t.dtype));
    item["shape"] = t.shape;
    item["data_offsets"] = {e.begin, e.end};
    json[t.name] = std::move(item);
    e.name = std::move(t.name);
    e.dtype = t.dtype;
    e.shape = std::move(t.shape);
    layout.entries.push_back(std::move(e));
  }
  std::string text;
  try {
    text = json.dump(-1, ' ', false, nlohmann::json::error_handler_t::strict);
  } catch (const nlohmann::json::exception& e) {
    return Malformed(absl::StrCat("cannot encode the header: ", e.what()));
  }
  // Spaces after the JSON make the data start at a multiple of 8.
  text.append((8 - text.size() % 8) % 8, ' ');
  if (static_cast<int64_t>(text.size()) > kSafetensorsMaxHeaderBytes) {
    return Malformed(absl::StrCat("the header would take ", text.size(),
                                  " bytes, more than the limit of ",
                                  kSafetensorsMaxHeaderBytes));
  }
  const uint64_t n = text.size();
  layout.header.resize(8);
  for (int i = 0; i < 8; ++i) {
    layout.header[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  }
  layout.header += text;
  TESSERA_ASSIGN_OR_RETURN(
      layout.file_bytes,
      CheckedAdd(static_cast<int64_t>(layout.header.size()), offset));
  return layout;
}

}  // namespace tessera
