// Device and Placement: where a shard lives ("rank:0/cpu", "w1/cuda:1",
// "rank:3", "w1"), plus the name rules for tensors and workers. Value types
// and pure functions; not synchronized.
#ifndef TESSERA_CORE_PLACEMENT_H_
#define TESSERA_CORE_PLACEMENT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tessera {

struct Device {
  enum class Kind { kCpu, kCuda };
  Kind kind = Kind::kCpu;
  int index = 0;  // only meaningful for kCuda

  // "cpu" or "cuda:N".
  std::string ToString() const;

  friend bool operator==(const Device& a, const Device& b) {
    return a.kind == b.kind && (a.kind == Kind::kCpu || a.index == b.index);
  }
  friend bool operator!=(const Device& a, const Device& b) { return !(a == b); }
};

// "cpu", "cuda:N" (N >= 0) or "cuda" (cuda:0).
absl::StatusOr<Device> ParseDevice(absl::string_view text);

struct Placement {
  // Exactly one of `rank` and `worker` is set.
  std::optional<int32_t> rank;
  std::string worker;
  // Unset: the worker's own device.
  std::optional<Device> device;

  // "rank:0/cpu", "w1", "rank:3", "w1/cuda:1".
  std::string ToString() const;

  friend bool operator==(const Placement& a, const Placement& b) {
    return a.rank == b.rank && a.worker == b.worker && a.device == b.device;
  }
  friend bool operator!=(const Placement& a, const Placement& b) {
    return !(a == b);
  }
};

// Parses `rank:N/DEVICE`, `NAME/DEVICE`, `rank:N` or `NAME`. Syntax errors
// are INVALID_ARGUMENT saying what was expected.
absl::StatusOr<Placement> ParsePlacement(absl::string_view text);

// A non-empty comma-separated list of placements.
absl::StatusOr<std::vector<Placement>> ParsePlacementList(
    absl::string_view text);

// 1 to 64 characters of letters, digits, '_', '.', '-'.
bool IsValidWorkerName(absl::string_view name);

// 1 to 255 characters of letters, digits, '_', '.', '-', '/'.
bool IsValidTensorName(absl::string_view name);

// INVALID_ARGUMENT explaining the rule when the name is not valid.
absl::Status CheckTensorName(absl::string_view name);
absl::Status CheckWorkerName(absl::string_view name);

// A GPU's identity as CUDA reports it ("GPU-" and its UUID in hex): empty
// (a host worker, or none reported) or "GPU-" then 1 to 64 hex digits and
// '-'. Two workers that report the same one share a GPU, whatever their
// device indices (each may see only its own devices).
absl::Status CheckGpuUuid(absl::string_view uuid);
// The UUID of CUDA's 16 bytes, as nvidia-smi writes it:
// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx".
std::string GpuUuid(const unsigned char (&bytes)[16]);

// Longest address a worker may register.
inline constexpr size_t kMaxAddressBytes = 255;

// An address others can dial: HOST:PORT with a host name, IPv4 or [IPv6]
// address (not a wildcard such as 0.0.0.0), a port 1..65535, at most
// kMaxAddressBytes. `field` names it in the error.
absl::Status CheckDialAddress(absl::string_view address,
                              absl::string_view field);

}  // namespace tessera

#endif  // TESSERA_CORE_PLACEMENT_H_
