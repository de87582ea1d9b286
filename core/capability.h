// Capabilities: what the coordinator lets a caller do on one worker, signed
// so the worker can check it alone (as HDFS DataNodes check NameNode-issued
// block tokens). A capability names the worker, a tensor version, rights and
// an expiry, and carries an HMAC-SHA256 under the key that worker received
// at registration. Keys are derived per worker from the cluster secret, so a
// worker cannot forge capabilities for another.
//
// Clients get read capabilities with the metadata and write capabilities
// with a put's pending version; the coordinator signs its own orders
// (allocate, free, transfer) with `kOrder`.
#ifndef TESSERA_CORE_CAPABILITY_H_
#define TESSERA_CORE_CAPABILITY_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace tessera {

enum Right : uint32_t {
  kRightRead = 1,   // read shards of the named tensor version
  kRightWrite = 2,  // write shards of the named (pending) tensor version
  kRightOrder = 4,  // allocate, free and transfer: the coordinator only
};

struct Capability {
  std::string worker;        // the worker that honours it
  std::string tensor;        // empty for orders
  uint64_t version = 0;      // the tensor version (0 for orders)
  uint64_t incarnation = 0;  // the tensor's (TensorMetadata::incarnation)
  // A write grant's put or update (TensorMetadata::change): the worker's
  // shards of that change take its writes until the change is committed.
  uint64_t change = 0;
  uint32_t rights = 0;     // Right bits
  int64_t expires_ms = 0;  // Unix time in milliseconds
  // Whom a grant was minted for (a --tokens principal; empty for orders,
  // the coordinator's own moves, and clusters without tokens), and when:
  // a worker refuses grants of a principal removed after they were minted
  // (Revocations).
  std::string principal;
  int64_t issued_ms = 0;

  bool Allows(Right right) const { return (rights & right) != 0; }
};

// The right each Worker method needs, by its full gRPC name: the workers'
// half of the one table (core/auth.h has the coordinator's). NOT_FOUND for a
// method missing from it: the worker denies it.
absl::StatusOr<Right> RequiredRight(absl::string_view full_method);
// Whether a Worker method needs no capability at all: it answers what is
// not secret (the worker's data address, also listed by `workers`).
bool IsPublicWorkerMethod(absl::string_view full_method);

// How long a capability stays valid: long enough for a 1 TiB get, short
// enough that a leaked one soon stops working.
inline constexpr absl::Duration kCapabilityLifetime = absl::Hours(1);

// Signs `capability` under `key`: "PAYLOAD.MAC", both URL-safe base64, so
// it travels as gRPC metadata.
std::string MintCapability(const Capability& capability, absl::string_view key);

// The capability `token` names, when its MAC under `key` is right, it names
// `worker`, and it has not expired at `now`. PERMISSION_DENIED otherwise,
// with the reason; the token itself is never quoted.
absl::StatusOr<Capability> VerifyCapability(absl::string_view token,
                                            absl::string_view key,
                                            absl::string_view worker,
                                            absl::Time now);

// VerifyCapability for a worker's every call, remembering what it verified:
// a reader's many small reads carry one token, and checking it (base64,
// HMAC-SHA256) was most of a small read's cost on the worker. A remembered
// capability is still refused once expired, everything is forgotten when
// the key or worker name changes (a new registration) and when `capacity`
// tokens are held, and only exact tokens that verified are remembered.
// Revocation is untouched: it lives in the shards a capability names (a
// deleted tensor's are gone), which the worker checks at every call.
// Thread-safe.
class CapabilityVerifier {
 public:
  explicit CapabilityVerifier(size_t capacity = 4096) : capacity_(capacity) {}
  absl::StatusOr<Capability> Verify(absl::string_view token,
                                    absl::string_view key,
                                    absl::string_view worker, absl::Time now)
      ABSL_LOCKS_EXCLUDED(mu_);
  size_t remembered() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const size_t capacity_;
  mutable absl::Mutex mu_;
  std::string key_ ABSL_GUARDED_BY(mu_);  // what the entries verified under
  std::string worker_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Capability> verified_ ABSL_GUARDED_BY(mu_);
};

// Principals removed from the coordinator's --tokens (or given another
// role): grants minted for `principal` at or before `before_ms` are void.
// The coordinator sends them to workers with every heartbeat, for as long
// as such a grant could still be unexpired. Thread-safe.
class Revocations {
 public:
  // Most principals remembered (the newest kept).
  static constexpr size_t kMaxEntries = 4096;

  // Replaces what is revoked with `revoked`: principal -> before_ms.
  void Set(std::vector<std::pair<std::string, int64_t>> revoked)
      ABSL_LOCKS_EXCLUDED(mu_);
  // PERMISSION_DENIED when `capability` was minted for a principal revoked
  // after its minting.
  absl::Status Check(const Capability& capability) const
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  std::atomic<bool> any_{false};  // before_ms_ is not empty
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, int64_t> before_ms_ ABSL_GUARDED_BY(mu_);
};

// The key worker `worker` signs and checks with, from the cluster secret.
std::string DeriveWorkerKey(absl::string_view cluster_secret,
                            absl::string_view worker);

// `n` bytes from the operating system's CSPRNG (OpenSSL's RAND_bytes).
std::string RandomBytes(size_t n);
// A random non-zero 64-bit id (shard ids are not guessable).
uint64_t RandomId();
// `n` of them from one draw: each call to the CSPRNG takes its locks and
// checks for a fork, about 1 us, so 100k shards draw once, not 100k times.
std::vector<uint64_t> RandomIds(size_t n);

}  // namespace tessera

#endif  // TESSERA_CORE_CAPABILITY_H_
