// Quotas: how many bytes and tensor names each principal may hold (CLI.md
// "Quotas (v4)"). The --quotas file has one line per principal, `PRINCIPAL
// BYTES [NAMES]`, `#` starting a comment; BYTES takes K, M, G, T (powers of
// 1024) or `unlimited`; `*` stands for every principal not listed. The
// check of a change against a limit, and its error, are written only here.
// Pure values and functions; safe to share between threads once built.
#ifndef TESSERA_CORE_QUOTA_H_
#define TESSERA_CORE_QUOTA_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tessera {

// A principal's limits; kUnlimited where it has none.
struct QuotaLimit {
  static constexpr int64_t kUnlimited = -1;
  int64_t bytes = kUnlimited;
  int64_t names = kUnlimited;

  bool unlimited() const { return bytes < 0 && names < 0; }
};

// What a principal holds: bytes of every replica, mirror and pending new
// shard of the tensors it owns, and how many names (tensors, pending or
// not) it owns.
struct QuotaUse {
  int64_t bytes = 0;
  int64_t names = 0;
};

// Parses "1048576", "64K", "10M", "2G", "1T" or "unlimited"
// (QuotaLimit::kUnlimited). INVALID_ARGUMENT naming the text otherwise.
absl::StatusOr<int64_t> ParseQuotaBytes(absl::string_view text);

class QuotaTable {
 public:
  // Parses the file's text. Errors name the line.
  static absl::StatusOr<QuotaTable> Parse(absl::string_view text);
  // Reads and parses `path` (errors name it).
  static absl::StatusOr<QuotaTable> Load(const std::string& path);

  // The limits of `principal`: its own line, else `*`'s, else none.
  QuotaLimit For(absl::string_view principal) const;
  // The principals listed by name (not `*`), in order.
  std::vector<std::string> Listed() const;
  // Whether `*` is listed.
  bool HasDefault() const { return default_.has_value(); }

 private:
  std::map<std::string, QuotaLimit, std::less<>> limits_;
  std::optional<QuotaLimit> default_;
};

// OK when `principal`, using `use`, may take `more` (bytes and names on
// top of it) under `limit`. Otherwise RESOURCE_EXHAUSTED "quota: ..."
// naming the principal, its use, its limit and what the change needs;
// `what` says what the change is ("creating 'w'").
absl::Status CheckQuota(absl::string_view principal, const QuotaUse& use,
                        const QuotaUse& more, const QuotaLimit& limit,
                        absl::string_view what);

// How a principal is named in messages and listings: the empty principal
// (a cluster without tokens or client certificates) is "anonymous".
std::string PrincipalLabel(absl::string_view principal);

}  // namespace tessera

#endif  // TESSERA_CORE_QUOTA_H_
