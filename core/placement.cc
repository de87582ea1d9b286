#include "core/placement.h"

#include <algorithm>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace tessera {
namespace {

constexpr char kPlacementForms[] =
    "expected rank:N/DEVICE, NAME/DEVICE, rank:N or NAME, with DEVICE cpu or "
    "cuda:N";

bool IsNameChar(char c, bool allow_slash) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_' ||
         c == '.' || c == '-' || (allow_slash && c == '/');
}

bool IsValidName(absl::string_view name, size_t max_len, bool allow_slash) {
  if (name.empty() || name.size() > max_len) return false;
  for (char c : name) {
    if (!IsNameChar(c, allow_slash)) return false;
  }
  return true;
}

// Parses a non-negative decimal number made of digits only.
bool ParseNonNegative(absl::string_view text, int64_t max, int64_t* out) {
  if (text.empty() || text.size() > 18) return false;
  int64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  if (v > max) return false;
  *out = v;
  return true;
}

}  // namespace

std::string Device::ToString() const {
  if (kind == Kind::kCpu) return "cpu";
  return absl::StrCat("cuda:", index);
}

absl::StatusOr<Device> ParseDevice(absl::string_view text) {
  Device device;
  if (text == "cpu") return device;
  if (text == "cuda") {
    device.kind = Device::Kind::kCuda;
    return device;
  }
  if (absl::StartsWith(text, "cuda:")) {
    int64_t index;
    if (ParseNonNegative(text.substr(5), std::numeric_limits<int>::max(),
                         &index)) {
      device.kind = Device::Kind::kCuda;
      device.index = static_cast<int>(index);
      return device;
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "invalid device '", text, "' (expected cpu or cuda:N with N >= 0)"));
}

std::string Placement::ToString() const {
  std::string out = rank.has_value() ? absl::StrCat("rank:", *rank) : worker;
  if (device.has_value()) absl::StrAppend(&out, "/", device->ToString());
  return out;
}

absl::StatusOr<Placement> ParsePlacement(absl::string_view text) {
  Placement placement;
  absl::string_view target = text;
  const size_t slash = text.find('/');
  if (slash != absl::string_view::npos) {
    target = text.substr(0, slash);
    auto device = ParseDevice(text.substr(slash + 1));
    if (!device.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "invalid placement '", text, "': ", device.status().message()));
    }
    placement.device = *device;
  }
  if (absl::StartsWith(target, "rank:")) {
    int64_t rank;
    if (!ParseNonNegative(target.substr(5), std::numeric_limits<int32_t>::max(),
                          &rank)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "invalid placement '", text, "': the rank in '", target,
          "' must be a non-negative integer (", kPlacementForms, ")"));
    }
    placement.rank = static_cast<int32_t>(rank);
    return placement;
  }
  if (!IsValidWorkerName(target)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "invalid placement '", text, "' (", kPlacementForms,
        "; a worker NAME is 1 to 64 letters, digits, '_', '.' or '-')"));
  }
  placement.worker = std::string(target);
  return placement;
}

absl::StatusOr<std::vector<Placement>> ParsePlacementList(
    absl::string_view text) {
  if (text.empty()) {
    return absl::InvalidArgumentError(
        "the placement list is empty (expected P1,P2,... with at least one "
        "placement)");
  }
  std::vector<Placement> out;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    auto placement = ParsePlacement(part);
    if (!placement.ok()) return placement.status();
    out.push_back(*std::move(placement));
  }
  return out;
}

bool IsValidWorkerName(absl::string_view name) {
  return IsValidName(name, 64, /*allow_slash=*/false);
}

bool IsValidTensorName(absl::string_view name) {
  return IsValidName(name, 255, /*allow_slash=*/true);
}

absl::Status CheckTensorName(absl::string_view name) {
  if (IsValidTensorName(name)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "invalid tensor name '", name,
      "': a tensor name is 1 to 255 characters of letters, digits, '_', '.', "
      "'-' or '/'"));
}

absl::Status CheckWorkerName(absl::string_view name) {
  if (IsValidWorkerName(name)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "invalid worker name '", name,
      "': a worker name is 1 to 64 characters of letters, digits, '_', '.' or "
      "'-'"));
}

absl::Status CheckGpuUuid(absl::string_view uuid) {
  if (uuid.empty()) return absl::OkStatus();
  bool valid = absl::StartsWith(uuid, "GPU-") && uuid.size() > 4 &&
               uuid.size() <= 4 + 64;
  for (char c : uuid.substr(std::min<size_t>(4, uuid.size()))) {
    valid = valid &&
            (absl::ascii_isxdigit(static_cast<unsigned char>(c)) || c == '-');
  }
  if (valid) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("invalid GPU UUID '", absl::CEscape(uuid.substr(0, 72)),
                   uuid.size() > 72 ? "...'" : "'",
                   ": expected 'GPU-' and up to 64 hex digits or '-'"));
}

std::string GpuUuid(const unsigned char (&bytes)[16]) {
  std::string out = "GPU-";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    absl::StrAppend(&out, absl::Hex(bytes[i], absl::kZeroPad2));
  }
  return out;
}

absl::Status CheckDialAddress(absl::string_view address,
                              absl::string_view field) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, " '", address.substr(0, 64), address.size() > 64 ? "...'" : "'",
        " is not an address others can dial (HOST:PORT): ", why));
  };
  if (address.size() > kMaxAddressBytes) {
    return bad(absl::StrCat("longer than ", kMaxAddressBytes, " bytes"));
  }
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos) return bad("no port");
  absl::string_view host = address.substr(0, colon);
  const absl::string_view port_text = address.substr(colon + 1);
  int port = 0;
  if (!absl::SimpleAtoi(port_text, &port) || port < 1 || port > 65535 ||
      port_text.size() > 5) {
    return bad("the port must be 1 to 65535");
  }
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
    if (host.empty() || host == "::") return bad("a wildcard host");
    for (char c : host) {
      if (!absl::ascii_isxdigit(static_cast<unsigned char>(c)) && c != ':' &&
          c != '.') {
        return bad("not an IPv6 address");
      }
    }
    return absl::OkStatus();
  }
  if (host.empty()) return bad("no host");
  if (host == "0.0.0.0") return bad("a wildcard host");
  for (char c : host) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' &&
        c != '-' && c != '_') {
      return bad("the host has characters a host name cannot have");
    }
  }
  return absl::OkStatus();
}

}  // namespace tessera
