#include "coordinator/cluster_authority.h"

#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "rpc/security.h"
#include "spdlog/spdlog.h"

namespace tessera {
namespace {

// Orders are minted per call, so they can be short-lived.
constexpr absl::Duration kOrderLifetime = absl::Minutes(15);
constexpr size_t kSecretBytes = 32;

// Refusals are logged at most once a second (with how many were not), so a
// caller hammering the coordinator with bad tokens cannot flood its log.
template <typename... Args>
void LogRefusal(fmt::format_string<Args...> format, Args&&... args) {
  static std::atomic<int64_t> next_ms{0};
  static std::atomic<int64_t> suppressed{0};
  const int64_t now = absl::ToUnixMillis(absl::Now());
  int64_t due = next_ms.load();
  if (now < due || !next_ms.compare_exchange_strong(due, now + 1000)) {
    suppressed.fetch_add(1);
    return;
  }
  const int64_t quiet = suppressed.exchange(0);
  spdlog::warn("{}{}", fmt::format(format, std::forward<Args>(args)...),
               quiet > 0 ? fmt::format(" ({} more refusals not logged)", quiet)
                         : std::string());
}

absl::Status FileError(absl::string_view what, const std::string& path) {
  return absl::FailedPreconditionError(
      absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

}  // namespace

ClusterAuthority::ClusterAuthority(std::optional<TokenTable> tokens,
                                   std::string cluster_secret,
                                   std::function<absl::Time()> clock)
    : authorization_(tokens.has_value()),
      tokens_(tokens.has_value()
                  ? std::make_shared<const TokenTable>(*std::move(tokens))
                  : nullptr),
      secret_(std::move(cluster_secret)),
      clock_(std::move(clock)) {}

absl::Status ClusterAuthority::ReplaceTokens(TokenTable tokens) {
  if (!authorization_) {
    return absl::FailedPreconditionError(
        "authorization is off (started without --tokens)");
  }
  auto replacement = std::make_shared<const TokenTable>(std::move(tokens));
  std::map<std::string, Role> now;
  for (const Principal& p : replacement->principals()) now[p.name] = p.role;
  const int64_t at = absl::ToUnixMillis(clock_());
  const int64_t horizon = RevocationHorizonMs();
  absl::MutexLock lock(&mu_);
  // Bounded by the principals removed within a grant's lifetime.
  for (auto it = revoked_.begin(); it != revoked_.end();) {
    it = it->second < horizon ? revoked_.erase(it) : std::next(it);
  }
  if (tokens_ != nullptr) {
    for (const Principal& p : tokens_->principals()) {
      auto kept = now.find(p.name);
      if (kept != now.end() && kept->second == p.role) continue;
      revoked_[p.name] = at;
      spdlog::info("principal '{}' {}: the grants it holds are revoked", p.name,
                   kept == now.end() ? "was removed" : "has another role");
    }
  }
  tokens_ = std::move(replacement);
  return absl::OkStatus();
}

int64_t ClusterAuthority::RevocationHorizonMs() const {
  // A grant lives kCapabilityLifetime: older revocations void nothing.
  return absl::ToUnixMillis(clock_() - kCapabilityLifetime - absl::Minutes(1));
}

std::vector<std::pair<std::string, int64_t>> ClusterAuthority::Revoked() const {
  const int64_t horizon = RevocationHorizonMs();
  std::vector<std::pair<std::string, int64_t>> out;
  absl::MutexLock lock(&mu_);
  for (const auto& [name, at] : revoked_) {
    if (at >= horizon) out.emplace_back(name, at);
  }
  return out;
}

std::shared_ptr<const TokenTable> ClusterAuthority::tokens() const {
  absl::MutexLock lock(&mu_);
  return tokens_;
}

absl::StatusOr<Principal> ClusterAuthority::Admit(
    const grpc::ServerContextBase& context,
    absl::string_view full_method) const {
  absl::StatusOr<Role> need = RequiredRole(full_method);
  if (!need.ok()) return absl::PermissionDeniedError(need.status().message());
  // Without tokens every caller is trusted as admin; with mutual TLS it is
  // named by its certificate's subject CN (whose quota it uses). A name is
  // kept in the metadata as its tensors' owner, so it is bounded as the
  // owner field is (core/tensor_metadata.h).
  if (!authorization_) {
    std::string cn = PeerCommonName(context);
    if (cn.size() > kMaxOwnerBytes) {
      return absl::UnauthenticatedError(absl::StrCat(
          "unauthenticated: the client certificate's subject CN is ", cn.size(),
          " bytes (at most ", kMaxOwnerBytes, ")"));
    }
    return Principal{std::move(cn), Role::kAdmin};
  }
  const std::string secret = BearerToken(context);
  if (secret.empty()) {
    return absl::UnauthenticatedError(
        "unauthenticated: no token presented (pass --token_file)");
  }
  std::optional<Principal> principal = tokens()->Authenticate(secret);
  if (!principal.has_value()) {
    LogRefusal("refused {} from {}: unknown token", std::string(full_method),
               context.peer());
    return absl::UnauthenticatedError(
        "unauthenticated: the token is not valid for this cluster");
  }
  if (!RoleCovers(principal->role, *need)) {
    LogRefusal("refused {} to '{}' (role {})", std::string(full_method),
               principal->name, std::string(RoleName(principal->role)));
    const size_t slash = full_method.rfind('/');
    return absl::PermissionDeniedError(absl::StrCat(
        "permission denied: '", principal->name, "' (role ",
        RoleName(principal->role), ") may not ", full_method.substr(slash + 1),
        "; it needs role ", RoleName(*need)));
  }
  return *principal;
}

absl::Status ClusterAuthority::CheckWorkerName(const Principal& principal,
                                               absl::string_view worker) const {
  if (!authorization_ || PrincipalMayBeWorker(principal.name, worker)) {
    return absl::OkStatus();
  }
  LogRefusal("refused principal '{}' acting as worker '{}'", principal.name,
             std::string(worker));
  return absl::PermissionDeniedError(
      absl::StrCat("permission denied: principal '", principal.name,
                   "' may not act as worker '", worker, "'"));
}

std::string ClusterAuthority::WorkerKey(absl::string_view worker) const {
  return DeriveWorkerKey(secret_, worker);
}

std::string ClusterAuthority::Order(absl::string_view worker) const {
  Capability order;
  order.worker = std::string(worker);
  order.rights = kRightOrder;
  order.expires_ms = absl::ToUnixMillis(clock_() + kOrderLifetime);
  return MintCapability(order, WorkerKey(worker));
}

std::string ClusterAuthority::Grant(absl::string_view worker,
                                    absl::string_view tensor, uint64_t version,
                                    uint64_t incarnation, uint32_t rights,
                                    uint64_t change,
                                    absl::string_view principal) const {
  Capability grant;
  grant.principal = std::string(principal);
  grant.worker = std::string(worker);
  grant.tensor = std::string(tensor);
  grant.version = version;
  grant.incarnation = incarnation;
  grant.change = (rights & kRightWrite) != 0 ? change : 0;
  grant.rights = rights;
  const absl::Time now = clock_();
  grant.issued_ms = absl::ToUnixMillis(now);
  grant.expires_ms = absl::ToUnixMillis(now + kCapabilityLifetime);
  return MintCapability(grant, WorkerKey(worker));
}

std::map<std::string, std::string> ClusterAuthority::GrantTensor(
    const TensorMetadata& meta, uint32_t rights,
    absl::string_view principal) const {
  std::map<std::string, std::string> grants;
  for (const ShardInfo& shard : meta.shards) {
    for (const Replica& replica : shard.replicas) {
      if (grants.count(replica.worker) != 0) continue;
      grants[replica.worker] =
          Grant(replica.worker, meta.name, meta.version, meta.incarnation,
                rights, meta.change, principal);
    }
  }
  return grants;
}

absl::StatusOr<std::string> LoadOrMakeClusterSecret(
    const std::string& data_dir) {
  if (data_dir.empty()) return RandomBytes(kSecretBytes);
  if (mkdir(data_dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return FileError("cannot create --data_dir", data_dir);
  }
  const std::string path = absl::StrCat(data_dir, "/cluster_secret");
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    std::string secret(kSecretBytes, '\0');
    const ssize_t n = read(fd, secret.data(), secret.size());
    close(fd);
    if (n != static_cast<ssize_t>(kSecretBytes)) {
      return absl::DataLossError(
          absl::StrCat(path, " is not a ", kSecretBytes, "-byte secret"));
    }
    return secret;
  }
  if (errno != ENOENT) return FileError("cannot read", path);
  // Written aside and renamed, so a crash never leaves half a secret.
  const std::string temp = path + ".tmp";
  std::string secret = RandomBytes(kSecretBytes);
  fd = open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return FileError("cannot write", temp);
  const bool written = write(fd, secret.data(), secret.size()) ==
                           static_cast<ssize_t>(secret.size()) &&
                       fsync(fd) == 0;
  close(fd);
  if (!written || rename(temp.c_str(), path.c_str()) != 0) {
    return FileError("cannot write", path);
  }
  return secret;
}

}  // namespace tessera
