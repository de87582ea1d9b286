#include "core/auth.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/config_lines.h"
#include "core/small_file.h"

namespace tessera {
namespace {

std::array<unsigned char, 32> Digest(absl::string_view secret) {
  std::array<unsigned char, 32> digest;
  SHA256(reinterpret_cast<const unsigned char*>(secret.data()), secret.size(),
         digest.data());
  return digest;
}

// The one table: each coordinator method and the least role it needs.
// Workers take no user calls at all (they obey capabilities), so only the
// coordinator's methods are here.
const absl::flat_hash_map<std::string, Role>& MethodTable() {
  static const auto* table = new absl::flat_hash_map<std::string, Role>{
      {"/tessera.v1.Coordinator/RegisterWorker", Role::kWorker},
      {"/tessera.v1.Coordinator/Heartbeat", Role::kWorker},
      {"/tessera.v1.Coordinator/ListWorkers", Role::kRead},
      {"/tessera.v1.Coordinator/ListCoordinators", Role::kRead},
      {"/tessera.v1.Coordinator/GetTensor", Role::kRead},
      {"/tessera.v1.Coordinator/ReleaseRead", Role::kRead},
      {"/tessera.v1.Coordinator/ListTensors", Role::kRead},
      {"/tessera.v1.Coordinator/GetMoveProgress", Role::kRead},
      {"/tessera.v1.Coordinator/WaitForVersion", Role::kRead},
      {"/tessera.v1.Coordinator/GetQuotas", Role::kRead},
      {"/tessera.v1.Coordinator/CreateTensor", Role::kWrite},
      {"/tessera.v1.Coordinator/CommitTensor", Role::kWrite},
      {"/tessera.v1.Coordinator/KeepPending", Role::kWrite},
      {"/tessera.v1.Coordinator/DeleteTensor", Role::kWrite},
      {"/tessera.v1.Coordinator/ReshardTensor", Role::kWrite},
      {"/tessera.v1.Coordinator/DescribeCheckpoint", Role::kWrite},
      {"/tessera.v1.Coordinator/LoadCheckpoint", Role::kWrite},
      {"/tessera.v1.Coordinator/SaveCheckpoint", Role::kWrite},
      {"/tessera.v1.Coordinator/UpdateTensor", Role::kWrite},
      {"/tessera.v1.Coordinator/SetWorkerState", Role::kAdmin},
      {"/tessera.v1.Coordinator/RemoveWorker", Role::kAdmin},
  };
  return *table;
}

}  // namespace

absl::StatusOr<Role> ParseRole(absl::string_view text) {
  if (text == "read") return Role::kRead;
  if (text == "write") return Role::kWrite;
  if (text == "admin") return Role::kAdmin;
  if (text == "worker") return Role::kWorker;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown role '", text, "' (expected read, write, admin or worker)"));
}

absl::string_view RoleName(Role role) {
  switch (role) {
    case Role::kRead:
      return "read";
    case Role::kWrite:
      return "write";
    case Role::kAdmin:
      return "admin";
    case Role::kWorker:
      return "worker";
  }
  return "unknown";
}

bool RoleCovers(Role have, Role need) {
  if (have == Role::kWorker || need == Role::kWorker) return have == need;
  return static_cast<int>(have) >= static_cast<int>(need);
}

absl::StatusOr<Role> RequiredRole(absl::string_view full_method) {
  const auto& table = MethodTable();
  auto it = table.find(std::string(full_method));
  if (it == table.end()) {
    return absl::NotFoundError(
        absl::StrCat("no role is granted method ", full_method));
  }
  return it->second;
}

std::vector<std::string> MethodsWithRoles() {
  std::vector<std::string> methods;
  for (const auto& [method, role] : MethodTable()) methods.push_back(method);
  return methods;
}

std::vector<Principal> TokenTable::principals() const {
  std::vector<Principal> out;
  out.reserve(entries_.size());
  for (const Entry& e : entries_) out.push_back(e.principal);
  return out;
}

absl::StatusOr<TokenTable> TokenTable::Parse(absl::string_view text) {
  TokenTable table;
  for (const auto& [line_number, fields] : ConfigLines(text)) {
    if (fields.size() != 3) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tokens line ", line_number, ": expected NAME ROLE SECRET, got ",
          fields.size(), " fields"));
    }
    absl::StatusOr<Role> role = ParseRole(fields[1]);
    if (!role.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tokens line ", line_number, ": ", role.status().message()));
    }
    if (fields[2].size() < 16) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokens line ", line_number,
                       ": the secret is shorter than 16 characters"));
    }
    if (fields[0].size() > kMaxPrincipalBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tokens line ", line_number, ": a principal's name is at most ",
          kMaxPrincipalBytes, " characters"));
    }
    Entry entry{Principal{std::string(fields[0]), *role}, Digest(fields[2])};
    for (const Entry& other : table.entries_) {
      if (other.principal.name == entry.principal.name) {
        return absl::InvalidArgumentError(
            absl::StrCat("tokens line ", line_number, ": principal '",
                         entry.principal.name, "' is listed twice"));
      }
      if (other.digest == entry.digest) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tokens line ", line_number, ": two principals share one secret"));
      }
    }
    table.entries_.push_back(std::move(entry));
  }
  if (table.entries_.empty()) {
    return absl::InvalidArgumentError("the tokens file names no principal");
  }
  return table;
}

absl::StatusOr<TokenTable> TokenTable::Load(const std::string& path) {
  // The mode is checked on the file that is read (fstat of the open file).
  mode_t mode = 0;
  absl::StatusOr<std::string> text =
      ReadSmallFile(path, kMaxTokensFileBytes, "tokens file", &mode);
  if (!text.ok()) return text.status();
  if ((mode & 077) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "tokens file ", path,
        " has permissions readable by group or others; chmod 600 it"));
  }
  absl::StatusOr<TokenTable> table = Parse(*text);
  if (!table.ok()) {
    return absl::Status(table.status().code(),
                        absl::StrCat(path, ": ", table.status().message()));
  }
  return table;
}

std::optional<Principal> TokenTable::Authenticate(
    absl::string_view secret) const {
  const std::array<unsigned char, 32> digest = Digest(secret);
  const Entry* match = nullptr;
  // Every entry is compared, in constant time each, whatever matches.
  for (const Entry& entry : entries_) {
    if (CRYPTO_memcmp(entry.digest.data(), digest.data(), digest.size()) == 0) {
      match = &entry;
    }
  }
  if (match == nullptr) return std::nullopt;
  return match->principal;
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  absl::StatusOr<std::string> text =
      ReadSmallFile(path, kMaxTokenFileBytes, "token file");
  if (!text.ok()) return text.status();
  std::string secret(absl::StripAsciiWhitespace(*text));
  if (secret.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("token file ", path, " is empty"));
  }
  for (char c : secret) {
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(absl::StrCat(
          "token file ", path,
          " holds more than one printable word (it must hold only the "
          "secret)"));
    }
  }
  return secret;
}

bool PrincipalMayBeWorker(absl::string_view principal_name,
                          absl::string_view worker_name) {
  if (absl::EndsWith(principal_name, "*")) {
    principal_name.remove_suffix(1);
    return absl::StartsWith(worker_name, principal_name) &&
           worker_name.size() > principal_name.size();
  }
  return principal_name == worker_name;
}

}  // namespace tessera
