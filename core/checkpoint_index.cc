#include "core/checkpoint_index.h"

#include <algorithm>
#include <limits>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "core/checked_math.h"
#include "core/dtype.h"
#include "core/shard_layout.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"

namespace tessera {
namespace {

using Json = nlohmann::ordered_json;

constexpr char kFormat[] = "tessera.checkpoint";
constexpr int kFormatVersion = 1;
// Longest tensor or entry name read.
constexpr size_t kMaxNameBytes = 1024;

absl::StatusOr<Json> ParseObject(absl::string_view text,
                                 absl::string_view what) {
  if (static_cast<int64_t>(text.size()) > kMaxCheckpointIndexBytes) {
    return CheckpointError(absl::StrCat(what, " is larger than ",
                                        kMaxCheckpointIndexBytes, " bytes"));
  }
  Json json = Json::parse(text.begin(), text.end(), nullptr,
                          /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) {
    return CheckpointError(absl::StrCat(what, " is not a JSON object"));
  }
  return json;
}

// A non-negative integer that fits int64.
absl::StatusOr<int64_t> Count(const Json& value, absl::string_view what) {
  if (value.is_number_unsigned() &&
      value.get<uint64_t>() <=
          static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return static_cast<int64_t>(value.get<uint64_t>());
  }
  if (value.is_number_integer() && value.get<int64_t>() >= 0) {
    return value.get<int64_t>();
  }
  return CheckpointError(
      absl::StrCat(kTesseraIndexName, ": ", what, " is not a count"));
}

absl::StatusOr<std::vector<int64_t>> Dims(const Json& value,
                                          absl::string_view what) {
  if (!value.is_array() ||
      static_cast<int64_t>(value.size()) > kMaxCheckpointRank) {
    return CheckpointError(absl::StrCat(kTesseraIndexName, ": ", what,
                                        " is not a list of at most ",
                                        kMaxCheckpointRank, " counts"));
  }
  std::vector<int64_t> dims;
  for (const Json& d : value) {
    TESSERA_ASSIGN_OR_RETURN(int64_t n, Count(d, what));
    dims.push_back(n);
  }
  return dims;
}

absl::StatusOr<std::string> Name(const Json& object, const char* key,
                                 absl::string_view what) {
  auto it = object.find(key);
  if (it == object.end() || !it->is_string() ||
      it->get_ref<const std::string&>().empty() ||
      it->get_ref<const std::string&>().size() > kMaxNameBytes) {
    return CheckpointError(absl::StrCat(kTesseraIndexName, ": ", what,
                                        " has no \"", key, "\" of 1 to ",
                                        kMaxNameBytes, " bytes"));
  }
  return it->get<std::string>();
}

const Json& Field(const Json& object, const char* key) {
  static const Json* const kNull = new Json();
  auto it = object.find(key);
  return it == object.end() ? *kNull : *it;
}

}  // namespace

absl::Status CheckpointError(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("checkpoint: ", what));
}

absl::Status CheckpointRootError(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("checkpoint_root: ", what));
}

bool IsCheckpointRootError(const absl::Status& status) {
  return absl::IsInvalidArgument(status) &&
         absl::StartsWith(status.message(), "checkpoint_root: ");
}

absl::Status CheckCheckpointFileName(absl::string_view name) {
  if (name.empty() || name.size() > 255 || absl::StrContains(name, '/') ||
      absl::StrContains(name, '\0') || name == "." || name == "..") {
    return CheckpointError(
        absl::StrCat("the index names file '", name,
                     "', which is not a plain file name in the directory"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> ParseHfIndex(absl::string_view text) {
  TESSERA_ASSIGN_OR_RETURN(Json json, ParseObject(text, kHfIndexName));
  if (!json.contains("weight_map") || !json["weight_map"].is_object()) {
    return CheckpointError(
        absl::StrCat(kHfIndexName, " has no \"weight_map\" object"));
  }
  std::vector<std::string> files;
  absl::flat_hash_set<std::string> seen;
  for (const auto& [name, file] : json["weight_map"].items()) {
    if (!file.is_string()) {
      return CheckpointError(absl::StrCat(kHfIndexName, " maps '", name,
                                          "' to something not a file name"));
    }
    const std::string& f = file.get_ref<const std::string&>();
    TESSERA_RETURN_IF_ERROR(CheckCheckpointFileName(f));
    if (seen.insert(f).second) files.push_back(f);
    if (static_cast<int64_t>(files.size()) > kMaxCheckpointFiles) {
      return CheckpointError(absl::StrCat(kHfIndexName, " names more than ",
                                          kMaxCheckpointFiles, " files"));
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

std::string SavedFileName(absl::string_view worker, absl::string_view save_id,
                          int64_t k) {
  return absl::StrCat(worker, "-", save_id, "-", k, ".safetensors");
}

bool IsSavedFileOf(absl::string_view file, absl::string_view save_id) {
  if (save_id.empty() || !absl::ConsumeSuffix(&file, ".safetensors")) {
    return false;
  }
  const size_t dash = file.rfind('-');
  if (dash == absl::string_view::npos || dash + 1 == file.size()) return false;
  const absl::string_view k = file.substr(dash + 1);
  if (!std::all_of(k.begin(), k.end(),
                   [](char c) { return c >= '0' && c <= '9'; })) {
    return false;
  }
  file = file.substr(0, dash);
  return absl::ConsumeSuffix(&file, save_id) &&
         absl::ConsumeSuffix(&file, "-") && !file.empty();
}

std::string HfIndexJson(const CheckpointListing& listing) {
  Json json;
  int64_t total = 0;
  Json map = Json::object();
  for (const CheckpointEntry& e : listing.entries) {
    total += e.bytes;
    for (const StoredPiece& piece : e.pieces) map[piece.entry] = piece.file;
  }
  json["metadata"] = {{"total_size", total}};
  json["weight_map"] = std::move(map);
  return json.dump(2) + "\n";
}

std::string TesseraIndexJson(const CheckpointListing& listing) {
  // A line per tensor and per piece: readable, and diffs well.
  Json metadata = Json::object();
  for (const auto& [key, value] : listing.metadata) metadata[key] = value;
  std::string out = absl::StrCat(
      "{\"format\": \"", kFormat, "\", \"version\": ", kFormatVersion,
      // A principal's name is the --tokens file's bytes: not always UTF-8.
      ", \"save_id\": ",
      Json(listing.save_id)
          .dump(-1, ' ', false, Json::error_handler_t::replace),
      ", \"saved_by\": ",
      Json(listing.saved_by)
          .dump(-1, ' ', false, Json::error_handler_t::replace),
      ", \"metadata\": ", metadata.dump(), ",\n \"tensors\": [");
  for (size_t t = 0; t < listing.entries.size(); ++t) {
    const CheckpointEntry& e = listing.entries[t];
    absl::StrAppend(&out, t == 0 ? "\n" : ",\n",
                    "  {\"name\": ", Json(e.name).dump(), ", \"dtype\": \"",
                    DTypeName(e.dtype), "\", \"shape\": ", Json(e.shape).dump(),
                    ", \"pieces\": [");
    for (size_t i = 0; i < e.pieces.size(); ++i) {
      const StoredPiece& piece = e.pieces[i];
      Json p;
      p["offsets"] = std::vector<int64_t>(piece.box.offsets.begin(),
                                          piece.box.offsets.end());
      p["sizes"] =
          std::vector<int64_t>(piece.box.sizes.begin(), piece.box.sizes.end());
      p["file"] = piece.file;
      p["entry"] = piece.entry;
      p["data_offset"] = piece.data_offset;
      p["bytes"] = piece.bytes;
      p["crc32"] = piece.crc32;
      absl::StrAppend(&out, i == 0 ? "\n   " : ",\n   ", p.dump());
    }
    absl::StrAppend(&out, "]}");
  }
  absl::StrAppend(&out, "\n]}\n");
  return out;
}

namespace {

// What a tessera.json's files and pieces may add up to, counted across its
// tensors.
struct IndexBounds {
  absl::flat_hash_set<std::string> files;
  int64_t pieces = 0;
};

// One piece of tensor `entry` (its dtype and shape parsed), checked against
// the tensor: its rank, its box within it, its bytes.
absl::StatusOr<StoredPiece> ParsePiece(const Json& p,
                                       const CheckpointEntry& entry,
                                       const std::string& what,
                                       IndexBounds* bounds) {
  if (!p.is_object()) {
    return CheckpointError(absl::StrCat(kTesseraIndexName, ": a piece of ",
                                        what, " is not an object"));
  }
  StoredPiece piece;
  const std::string of = absl::StrCat("a piece of ", what);
  TESSERA_ASSIGN_OR_RETURN(std::vector<int64_t> offsets,
                           Dims(Field(p, "offsets"), of + "'s offsets"));
  TESSERA_ASSIGN_OR_RETURN(std::vector<int64_t> sizes,
                           Dims(Field(p, "sizes"), of + "'s sizes"));
  if (offsets.size() != entry.shape.size() ||
      sizes.size() != entry.shape.size()) {
    return CheckpointError(
        absl::StrCat(kTesseraIndexName, ": ", of, " is not of its rank"));
  }
  piece.box = Box(offsets, sizes);
  if (!IsWithin(piece.box, entry.shape)) {
    return CheckpointError(
        absl::StrCat(kTesseraIndexName, ": ", of, " lies outside it"));
  }
  TESSERA_ASSIGN_OR_RETURN(piece.file, Name(p, "file", of));
  TESSERA_RETURN_IF_ERROR(CheckCheckpointFileName(piece.file));
  bounds->files.insert(piece.file);
  if (static_cast<int64_t>(bounds->files.size()) > kMaxCheckpointFiles) {
    return CheckpointError(absl::StrCat(kTesseraIndexName, " names more than ",
                                        kMaxCheckpointFiles, " files"));
  }
  TESSERA_ASSIGN_OR_RETURN(piece.entry, Name(p, "entry", of));
  TESSERA_ASSIGN_OR_RETURN(piece.data_offset,
                           Count(Field(p, "data_offset"), of + "'s offset"));
  TESSERA_ASSIGN_OR_RETURN(piece.bytes,
                           Count(Field(p, "bytes"), of + "'s bytes"));
  TESSERA_ASSIGN_OR_RETURN(const int64_t crc,
                           Count(Field(p, "crc32"), of + "'s crc32"));
  if (crc > std::numeric_limits<uint32_t>::max()) {
    return CheckpointError(
        absl::StrCat(kTesseraIndexName, ": ", of, "'s crc32 is not one"));
  }
  piece.crc32 = static_cast<uint32_t>(crc);
  // Within the tensor's bytes, so the box's product cannot overflow.
  const int64_t item = static_cast<int64_t>(ItemSize(entry.dtype));
  if (piece.bytes != piece.box.NumElements() * item ||
      piece.data_offset > std::numeric_limits<int64_t>::max() - piece.bytes) {
    return CheckpointError(absl::StrCat(kTesseraIndexName, ": ", of,
                                        " has bytes that do not match its "
                                        "box"));
  }
  return piece;
}

// One tensor of a tessera.json: its name, dtype and shape, and pieces that
// tile it.
absl::StatusOr<CheckpointEntry> ParseIndexEntry(const Json& t,
                                                IndexBounds* bounds) {
  if (!t.is_object()) {
    return CheckpointError(
        absl::StrCat(kTesseraIndexName, ": a tensor is not an object"));
  }
  CheckpointEntry entry;
  TESSERA_ASSIGN_OR_RETURN(entry.name, Name(t, "name", "a tensor"));
  const std::string what = absl::StrCat("tensor '", entry.name, "'");
  const Json& dtype = Field(t, "dtype");
  absl::StatusOr<DType> parsed = dtype.is_string()
                                     ? ParseDType(dtype.get<std::string>())
                                     : absl::InvalidArgumentError("");
  if (!parsed.ok()) {
    return CheckpointError(
        absl::StrCat(kTesseraIndexName, ": ", what, " has no known dtype"));
  }
  entry.dtype = *parsed;
  TESSERA_ASSIGN_OR_RETURN(entry.shape,
                           Dims(Field(t, "shape"), what + "'s shape"));
  absl::StatusOr<int64_t> bytes =
      ByteSize(entry.shape, static_cast<int64_t>(ItemSize(entry.dtype)));
  if (!bytes.ok()) {
    return CheckpointError(
        absl::StrCat(kTesseraIndexName, ": ", what, " is too large"));
  }
  entry.bytes = *bytes;
  const Json& pieces = Field(t, "pieces");
  if (!pieces.is_array() || pieces.empty() ||
      static_cast<int64_t>(pieces.size()) >
          kMaxCheckpointPieces - bounds->pieces) {
    return CheckpointError(absl::StrCat(kTesseraIndexName, ": ", what,
                                        " has no \"pieces\" list, or more "
                                        "pieces than a checkpoint holds (",
                                        kMaxCheckpointPieces, ")"));
  }
  bounds->pieces += static_cast<int64_t>(pieces.size());
  std::vector<Box> boxes;
  for (const Json& p : pieces) {
    TESSERA_ASSIGN_OR_RETURN(StoredPiece piece,
                             ParsePiece(p, entry, what, bounds));
    boxes.push_back(piece.box);
    entry.pieces.push_back(std::move(piece));
  }
  if (entry.shape.empty()) {
    if (boxes.size() != 1) {
      return CheckpointError(absl::StrCat(kTesseraIndexName, ": 0-d ", what,
                                          " has more than one piece"));
    }
  } else if (absl::Status s =
                 ValidateLayout(entry.shape, boxes, LayoutKind::kEnumerable);
             !s.ok()) {
    return CheckpointError(absl::StrCat(kTesseraIndexName, ": the pieces of ",
                                        what, ": ", s.message()));
  }
  entry.file = entry.pieces.front().file;
  entry.data_offset = entry.pieces.front().data_offset;
  return entry;
}

// Who saved the checkpoint (absent before these were kept: then empty) and
// the files' shared metadata.
absl::Status ParseIndexHeader(const Json& json, CheckpointListing* listing) {
  for (auto [key, out] :
       {std::pair<const char*, std::string*>{"save_id", &listing->save_id},
        {"saved_by", &listing->saved_by}}) {
    const Json& value = Field(json, key);
    if (value.is_null()) continue;
    if (!value.is_string() ||
        value.get_ref<const std::string&>().size() > kMaxSavedByBytes) {
      return CheckpointError(absl::StrCat(kTesseraIndexName, ": \"", key,
                                          "\" is not a short string"));
    }
    *out = value.get<std::string>();
  }
  const Json& metadata = Field(json, "metadata");
  if (metadata.is_null()) return absl::OkStatus();
  if (!metadata.is_object()) {
    return CheckpointError(
        absl::StrCat(kTesseraIndexName, ": \"metadata\" is not an object"));
  }
  for (const auto& [key, value] : metadata.items()) {
    if (!value.is_string()) {
      return CheckpointError(absl::StrCat(kTesseraIndexName, ": metadata '",
                                          key, "' is not a string"));
    }
    listing->metadata.emplace_back(key, value.get<std::string>());
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CheckpointListing> ParseTesseraIndex(absl::string_view text) {
  TESSERA_ASSIGN_OR_RETURN(Json json, ParseObject(text, kTesseraIndexName));
  if (Field(json, "format") != kFormat) {
    return CheckpointError(
        absl::StrCat(kTesseraIndexName, " is not a \"", kFormat, "\" file"));
  }
  if (Field(json, "version") != kFormatVersion) {
    return CheckpointError(absl::StrCat(kTesseraIndexName,
                                        " is of a version this build does not "
                                        "read (it reads ",
                                        kFormatVersion, ")"));
  }
  CheckpointListing listing;
  TESSERA_RETURN_IF_ERROR(ParseIndexHeader(json, &listing));
  const Json& tensors = Field(json, "tensors");
  if (!tensors.is_array() ||
      static_cast<int64_t>(tensors.size()) > kMaxCheckpointEntries) {
    return CheckpointError(absl::StrCat(kTesseraIndexName,
                                        ": \"tensors\" is not a list of at "
                                        "most ",
                                        kMaxCheckpointEntries, " tensors"));
  }
  absl::flat_hash_set<std::string> names;
  IndexBounds bounds;
  for (const Json& t : tensors) {
    TESSERA_ASSIGN_OR_RETURN(CheckpointEntry entry,
                             ParseIndexEntry(t, &bounds));
    if (!names.insert(entry.name).second) {
      return CheckpointError(
          absl::StrCat(kTesseraIndexName, " lists '", entry.name, "' twice"));
    }
    listing.entries.push_back(std::move(entry));
  }
  return listing;
}

}  // namespace tessera
