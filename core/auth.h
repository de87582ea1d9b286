// Who may do what: the roles of CLI.md's "Security" table, the one table of
// RPC method -> least role, the coordinator's tokens file, and which worker
// names a principal may register. Every daemon and test reads these rules
// from here; services only ask.
#ifndef TESSERA_CORE_AUTH_H_
#define TESSERA_CORE_AUTH_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tessera {

// Roles in increasing power for users; `kWorker` stands apart (it may only
// register and heartbeat, and no user role may do that).
enum class Role { kRead, kWrite, kAdmin, kWorker };

absl::StatusOr<Role> ParseRole(absl::string_view text);
absl::string_view RoleName(Role role);

// True when a principal of role `have` may do what needs `need`.
bool RoleCovers(Role have, Role need);

// The least role each coordinator method needs, by its full gRPC name
// ("/tessera.v1.Coordinator/CreateTensor"). NOT_FOUND for a method missing
// from the table: callers deny it.
absl::StatusOr<Role> RequiredRole(absl::string_view full_method);

// Every method the table names (for the contract test that walks the
// services and checks each is covered).
std::vector<std::string> MethodsWithRoles();

// Longest principal name (a token's, a certificate's CN): tensors keep it
// as their owner (core/tensor_metadata.h kMaxOwnerBytes is the same).
inline constexpr size_t kMaxPrincipalBytes = 1024;

// Largest --tokens table and --token_file read (a longer file is not one).
inline constexpr int64_t kMaxTokensFileBytes = int64_t{1} << 20;
inline constexpr int64_t kMaxTokenFileBytes = int64_t{64} << 10;

// An authenticated caller.
struct Principal {
  std::string name;
  Role role = Role::kRead;
};

// The coordinator's --tokens file: one principal per line, `NAME ROLE
// SECRET`, `#` starting a comment. Secrets are kept only as SHA-256 digests
// and compared in constant time; they never appear in errors or logs.
class TokenTable {
 public:
  // Parses the file's text. Errors name the line, never the secret.
  static absl::StatusOr<TokenTable> Parse(absl::string_view text);
  // Reads and parses `path`; FAILED_PRECONDITION with `permissions` when
  // group or others may read it.
  static absl::StatusOr<TokenTable> Load(const std::string& path);

  // The principal whose secret is `secret`; nullopt when none is. Takes the
  // same time whichever principal (if any) matches.
  std::optional<Principal> Authenticate(absl::string_view secret) const;

  size_t size() const { return entries_.size(); }
  // Every principal, in the file's order.
  std::vector<Principal> principals() const;

 private:
  struct Entry {
    Principal principal;
    std::array<unsigned char, 32> digest;
  };
  std::vector<Entry> entries_;
};

// Reads a --token_file (the secret, surrounding whitespace trimmed).
// Errors never quote the contents.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

// OK when `principal_name` may register as worker `worker_name`: equal, or
// the name ends in `*` and the worker's name starts with what precedes it
// (one token shared by a StatefulSet's pods, e.g. `tessera-worker-*`).
bool PrincipalMayBeWorker(absl::string_view principal_name,
                          absl::string_view worker_name);

// gRPC metadata keys (lower case, as gRPC requires).
inline constexpr char kAuthorizationHeader[] = "authorization";
inline constexpr char kBearerPrefix[] = "Bearer ";
inline constexpr char kCapabilityHeader[] = "x-tessera-capability";

}  // namespace tessera

#endif  // TESSERA_CORE_AUTH_H_
