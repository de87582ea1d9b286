// ClusterAuthority: the coordinator's side of security. It authenticates
// callers (bearer tokens against the --tokens table; without one, every
// caller is trusted as admin: protected mode or TLS alone), applies the one
// method -> role table of core/auth.h, binds worker names to principals,
// and signs the capabilities workers check (core/capability.h) under keys
// derived from the cluster secret. Thread-safe; the principals can be
// replaced while it serves (the --tokens file changed on disk).
#ifndef TESSERA_COORDINATOR_CLUSTER_AUTHORITY_H_
#define TESSERA_COORDINATOR_CLUSTER_AUTHORITY_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/auth.h"
#include "core/capability.h"
#include "core/tensor_metadata.h"

namespace grpc {
class ServerContextBase;
}

namespace tessera {

class ClusterAuthority {
 public:
  // `tokens`: nullopt turns authorization off. `cluster_secret`: the root of
  // every worker key (random per cluster; kept in --data_dir).
  ClusterAuthority(std::optional<TokenTable> tokens, std::string cluster_secret,
                   std::function<absl::Time()> clock = absl::Now);

  bool authorization_on() const { return authorization_; }

  // Replaces the principals: callers are judged by `tokens` from now on
  // (calls already admitted are not), and the grants of a principal
  // removed or given another role are revoked (Revoked). FAILED_PRECONDITION
  // when the authority was made without tokens (authorization stays off).
  absl::Status ReplaceTokens(TokenTable tokens) ABSL_LOCKS_EXCLUDED(mu_);
  // The principals whose grants minted before a time are void: principal
  // -> that time (Unix ms), kept while such a grant could be unexpired.
  // Workers get it with every heartbeat (core/capability.h Revocations).
  std::vector<std::pair<std::string, int64_t>> Revoked() const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Who is calling `full_method`, if the table lets them:
  // UNAUTHENTICATED without a valid token, PERMISSION_DENIED for a role
  // that may not. Without tokens: an anonymous admin.
  absl::StatusOr<Principal> Admit(const grpc::ServerContextBase& context,
                                  absl::string_view full_method) const;
  // OK when `principal` may act as worker `worker` (always, without tokens).
  absl::Status CheckWorkerName(const Principal& principal,
                               absl::string_view worker) const;

  // The key worker `worker` checks capabilities with.
  std::string WorkerKey(absl::string_view worker) const;
  // An order (allocate, free, transfer) for `worker`.
  std::string Order(absl::string_view worker) const;
  // `rights` on `tensor` (incarnation `incarnation`) version `version` at
  // `worker`; a write grant names its put or update `change`.
  // `principal`: whom for (empty: the coordinator's own moves).
  std::string Grant(absl::string_view worker, absl::string_view tensor,
                    uint64_t version, uint64_t incarnation, uint32_t rights,
                    uint64_t change = 0,
                    absl::string_view principal = "") const;
  // One grant per worker holding a shard of `meta` (a write grant names
  // meta.change), for `principal`.
  std::map<std::string, std::string> GrantTensor(
      const TensorMetadata& meta, uint32_t rights,
      absl::string_view principal = "") const;

 private:
  std::shared_ptr<const TokenTable> tokens() const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t RevocationHorizonMs() const;

  const bool authorization_;
  mutable absl::Mutex mu_;
  // Null when authorization is off; replaced whole, never changed.
  std::shared_ptr<const TokenTable> tokens_ ABSL_GUARDED_BY(mu_);
  // Principal -> Unix ms of its removal (or change of role).
  std::map<std::string, int64_t> revoked_ ABSL_GUARDED_BY(mu_);
  const std::string secret_;
  const std::function<absl::Time()> clock_;
};

// The cluster secret kept in `data_dir` (made, mode 0600, on first start);
// empty `data_dir`: a fresh random secret (lives as long as the process).
absl::StatusOr<std::string> LoadOrMakeClusterSecret(
    const std::string& data_dir);

}  // namespace tessera

#endif  // TESSERA_COORDINATOR_CLUSTER_AUTHORITY_H_
