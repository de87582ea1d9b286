#include "core/shard_record.h"

#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/checked_math.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"

namespace tessera {
namespace {

using Json = nlohmann::json;

constexpr size_t kMaxNameBytes = 1024;
constexpr size_t kMaxRank = 64;

absl::Status Bad(absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("store: a shard record ", what));
}

absl::StatusOr<uint64_t> Unsigned(const Json& json, const char* key) {
  auto it = json.find(key);
  if (it == json.end() || !it->is_number_unsigned()) {
    return Bad(absl::StrCat("has no \"", key, "\" count"));
  }
  return it->get<uint64_t>();
}

absl::StatusOr<std::string> Name(const Json& json, const char* key,
                                 bool may_be_empty = false) {
  auto it = json.find(key);
  if (it == json.end() || !it->is_string() ||
      it->get_ref<const std::string&>().size() > kMaxNameBytes ||
      (!may_be_empty && it->get_ref<const std::string&>().empty())) {
    return Bad(absl::StrCat("has no \"", key, "\" of at most ", kMaxNameBytes,
                            " bytes"));
  }
  return it->get<std::string>();
}

absl::StatusOr<std::vector<int64_t>> Dims(const Json& json, const char* key) {
  auto it = json.find(key);
  if (it == json.end() || !it->is_array() || it->size() > kMaxRank) {
    return Bad(absl::StrCat("has no \"", key, "\" list of at most ", kMaxRank,
                            " counts"));
  }
  std::vector<int64_t> dims;
  for (const Json& d : *it) {
    if (!d.is_number_unsigned() ||
        d.get<uint64_t>() >
            static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return Bad(absl::StrCat("has a \"", key, "\" that is not counts"));
    }
    dims.push_back(static_cast<int64_t>(d.get<uint64_t>()));
  }
  return dims;
}

}  // namespace

std::string ShardRecordJson(const ShardRecord& record) {
  Json json;
  json["shard_id"] = record.shard_id;
  json["cluster_id"] = record.cluster_id;
  json["tensor"] = record.tensor;
  json["version"] = record.version;
  json["incarnation"] = record.incarnation;
  json["dtype"] = std::string(DTypeName(record.dtype));
  json["tensor_shape"] = record.tensor_shape;
  json["offsets"] = std::vector<int64_t>(record.box.offsets.begin(),
                                         record.box.offsets.end());
  json["sizes"] =
      std::vector<int64_t>(record.box.sizes.begin(), record.box.sizes.end());
  json["bytes"] = record.bytes;
  json["crc32"] = record.crc32;
  return json.dump() + "\n";
}

absl::StatusOr<ShardRecord> ParseShardRecord(absl::string_view text) {
  if (static_cast<int64_t>(text.size()) > kMaxShardRecordBytes) {
    return Bad(absl::StrCat("is larger than ", kMaxShardRecordBytes, " bytes"));
  }
  const Json json = Json::parse(text.begin(), text.end(), nullptr,
                                /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) {
    return Bad("is not a JSON object");
  }
  ShardRecord r;
  TESSERA_ASSIGN_OR_RETURN(r.shard_id, Unsigned(json, "shard_id"));
  TESSERA_ASSIGN_OR_RETURN(r.cluster_id, Name(json, "cluster_id", true));
  TESSERA_ASSIGN_OR_RETURN(r.tensor, Name(json, "tensor"));
  TESSERA_ASSIGN_OR_RETURN(r.version, Unsigned(json, "version"));
  TESSERA_ASSIGN_OR_RETURN(r.incarnation, Unsigned(json, "incarnation"));
  TESSERA_ASSIGN_OR_RETURN(const std::string dtype, Name(json, "dtype"));
  absl::StatusOr<DType> parsed = ParseDType(dtype);
  if (!parsed.ok()) return Bad(absl::StrCat("has unknown dtype '", dtype, "'"));
  r.dtype = *parsed;
  TESSERA_ASSIGN_OR_RETURN(r.tensor_shape, Dims(json, "tensor_shape"));
  TESSERA_ASSIGN_OR_RETURN(const std::vector<int64_t> offsets,
                           Dims(json, "offsets"));
  TESSERA_ASSIGN_OR_RETURN(const std::vector<int64_t> sizes,
                           Dims(json, "sizes"));
  r.box = Box(offsets, sizes);
  // An empty box may sit past the end (a chunk layout's trailing shards).
  if (r.tensor_shape.empty() || offsets.size() != r.tensor_shape.size() ||
      sizes.size() != r.tensor_shape.size() ||
      !ByteSize(r.tensor_shape, ItemSize(r.dtype)).ok() ||
      (r.box.NumElements() > 0 && !IsWithin(r.box, r.tensor_shape))) {
    return Bad("has a box that does not lie in its tensor's shape");
  }
  TESSERA_ASSIGN_OR_RETURN(const uint64_t bytes, Unsigned(json, "bytes"));
  TESSERA_ASSIGN_OR_RETURN(const uint64_t crc, Unsigned(json, "crc32"));
  r.bytes = static_cast<int64_t>(
      std::min<uint64_t>(bytes, std::numeric_limits<int64_t>::max()));
  if (r.bytes !=
      r.box.NumElements() * static_cast<int64_t>(ItemSize(r.dtype))) {
    return Bad("has bytes that do not match its box");
  }
  if (crc > std::numeric_limits<uint32_t>::max()) return Bad("has no crc32");
  r.crc32 = static_cast<uint32_t>(crc);
  return r;
}

uint64_t ShardIdentity(absl::string_view tensor, uint64_t incarnation,
                       const Box& box) {
  uint64_t h = 14695981039346656037ull;
  auto mix = [&h](const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) {
      h ^= p[i];
      h *= 1099511628211ull;
    }
  };
  auto mix_int = [&mix](uint64_t v) {
    unsigned char bytes[8];
    for (int i = 0; i < 8; ++i)
      bytes[i] = static_cast<unsigned char>(v >> (8 * i));
    mix(bytes, sizeof(bytes));
  };
  mix_int(tensor.size());
  mix(tensor.data(), tensor.size());
  mix_int(incarnation);
  mix_int(box.offsets.size());
  for (int64_t o : box.offsets) mix_int(static_cast<uint64_t>(o));
  for (int64_t n : box.sizes) mix_int(static_cast<uint64_t>(n));
  return h;
}

}  // namespace tessera
