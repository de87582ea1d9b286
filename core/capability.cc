#include "core/capability.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace tessera {
namespace {

std::string Hmac(absl::string_view key, absl::string_view data) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), mac,
       &length);
  return std::string(reinterpret_cast<char*>(mac), length);
}

// Fields are length-prefixed so no name can shift another field.
std::string Encode(const Capability& c) {
  return absl::StrCat("v3|", c.worker.size(), ":", c.worker, "|",
                      c.tensor.size(), ":", c.tensor, "|", c.principal.size(),
                      ":", c.principal, "|", c.version, "|", c.incarnation, "|",
                      c.change, "|", c.rights, "|", c.expires_ms, "|",
                      c.issued_ms);
}

bool TakeString(absl::string_view* in, std::string* out) {
  size_t colon = in->find(':');
  size_t length = 0;
  if (colon == absl::string_view::npos ||
      !absl::SimpleAtoi(in->substr(0, colon), &length)) {
    return false;
  }
  in->remove_prefix(colon + 1);
  if (in->size() < length + 1 || (*in)[length] != '|') return false;
  *out = std::string(in->substr(0, length));
  in->remove_prefix(length + 1);
  return true;
}

bool Decode(absl::string_view in, Capability* c) {
  // v2: minted before grants named their principal (a coordinator not yet
  // upgraded); read as minted for none.
  const bool v3 = in.substr(0, 3) == "v3|";
  if (!v3 && in.substr(0, 3) != "v2|") return false;
  in.remove_prefix(3);
  if (!TakeString(&in, &c->worker) || !TakeString(&in, &c->tensor)) {
    return false;
  }
  if (v3 && !TakeString(&in, &c->principal)) return false;
  std::vector<absl::string_view> rest = absl::StrSplit(in, '|');
  return rest.size() == (v3 ? 6u : 5u) &&
         absl::SimpleAtoi(rest[0], &c->version) &&
         absl::SimpleAtoi(rest[1], &c->incarnation) &&
         absl::SimpleAtoi(rest[2], &c->change) &&
         absl::SimpleAtoi(rest[3], &c->rights) &&
         absl::SimpleAtoi(rest[4], &c->expires_ms) &&
         (!v3 || absl::SimpleAtoi(rest[5], &c->issued_ms));
}

absl::Status Denied(absl::string_view why) {
  return absl::PermissionDeniedError(absl::StrCat("capability refused: ", why));
}

}  // namespace

bool IsPublicWorkerMethod(absl::string_view full_method) {
  return full_method == "/tessera.v1.Worker/DataAddress";
}

absl::StatusOr<Right> RequiredRight(absl::string_view full_method) {
  static constexpr struct {
    const char* method;
    Right right;
  } kTable[] = {
      {"/tessera.v1.Worker/AllocateShards", kRightOrder},
      {"/tessera.v1.Worker/FreeShards", kRightOrder},
      {"/tessera.v1.Worker/SealShards", kRightOrder},
      {"/tessera.v1.Worker/Transfer", kRightOrder},
      {"/tessera.v1.Worker/ListCheckpoint", kRightOrder},
      {"/tessera.v1.Worker/LoadShard", kRightOrder},
      {"/tessera.v1.Worker/SaveShards", kRightOrder},
      {"/tessera.v1.Worker/WriteCheckpointFile", kRightOrder},
      {"/tessera.v1.Worker/RemoveCheckpointFiles", kRightOrder},
      {"/tessera.v1.Worker/WriteShardRuns", kRightOrder},
      {"/tessera.v1.Worker/PublishCheckpointFiles", kRightOrder},
      {"/tessera.v1.Worker/NcclUniqueId", kRightOrder},
      {"/tessera.v1.Worker/NcclExchange", kRightOrder},
      {"/tessera.v1.Worker/WriteShard", kRightWrite},
      {"/tessera.v1.Worker/ReadRegion", kRightRead},
      {"/tessera.v1.Worker/ReadSmallRegion", kRightRead},
      {"/tessera.v1.Worker/ReadSmallRegions", kRightRead},
      {"/tessera.v1.Worker/MapShard", kRightRead},
      {"/tessera.v1.Worker/ReadRows", kRightRead},
      {"/tessera.v1.Worker/StageRead", kRightRead},
      {"/tessera.v1.Worker/AwaitRelayFill", kRightRead},
      {"/tessera.v1.Worker/ReadShardDelta", kRightRead},
  };
  for (const auto& row : kTable) {
    if (full_method == row.method) return row.right;
  }
  return absl::NotFoundError(
      absl::StrCat("no right is granted method ", full_method));
}

std::string MintCapability(const Capability& capability,
                           absl::string_view key) {
  const std::string payload = Encode(capability);
  return absl::StrCat(absl::WebSafeBase64Escape(payload), ".",
                      absl::WebSafeBase64Escape(Hmac(key, payload)));
}

absl::StatusOr<Capability> VerifyCapability(absl::string_view token,
                                            absl::string_view key,
                                            absl::string_view worker,
                                            absl::Time now) {
  if (token.empty()) return Denied("none presented");
  if (token.size() > 4096) return Denied("longer than 4096 bytes");
  std::vector<absl::string_view> parts = absl::StrSplit(token, '.');
  std::string payload;
  std::string mac;
  if (parts.size() != 2 || !absl::WebSafeBase64Unescape(parts[0], &payload) ||
      !absl::WebSafeBase64Unescape(parts[1], &mac)) {
    return Denied("malformed");
  }
  const std::string expected = Hmac(key, payload);
  if (key.empty() || mac.size() != expected.size() ||
      CRYPTO_memcmp(mac.data(), expected.data(), mac.size()) != 0) {
    return Denied("bad signature (not issued by this cluster's coordinator)");
  }
  Capability capability;
  if (!Decode(payload, &capability)) return Denied("malformed");
  if (capability.worker != worker) {
    return Denied(absl::StrCat("issued for worker '", capability.worker,
                               "', not '", worker, "'"));
  }
  if (absl::FromUnixMillis(capability.expires_ms) <= now) {
    return Denied("expired (fetch the tensor's metadata again)");
  }
  return capability;
}

absl::StatusOr<Capability> CapabilityVerifier::Verify(absl::string_view token,
                                                      absl::string_view key,
                                                      absl::string_view worker,
                                                      absl::Time now) {
  {
    absl::MutexLock lock(&mu_);
    if (key != key_ || worker != worker_) {
      verified_.clear();
      key_ = std::string(key);
      worker_ = std::string(worker);
    }
    auto it = verified_.find(token);
    if (it != verified_.end()) {
      if (absl::FromUnixMillis(it->second.expires_ms) > now) return it->second;
      verified_.erase(it);  // expired: refused below, with the reason
    }
  }
  absl::StatusOr<Capability> capability =
      VerifyCapability(token, key, worker, now);
  if (!capability.ok()) return capability;
  absl::MutexLock lock(&mu_);
  // Verified under a key replaced meanwhile: not remembered.
  if (key != key_ || worker != worker_) return capability;
  if (verified_.size() >= capacity_) verified_.clear();
  verified_.emplace(token, *capability);
  return capability;
}

size_t CapabilityVerifier::remembered() const {
  absl::MutexLock lock(&mu_);
  return verified_.size();
}

void Revocations::Set(std::vector<std::pair<std::string, int64_t>> revoked) {
  // The newest kept when there are too many.
  if (revoked.size() > kMaxEntries) {
    std::nth_element(
        revoked.begin(), revoked.begin() + kMaxEntries, revoked.end(),
        [](const auto& a, const auto& b) { return a.second > b.second; });
    revoked.resize(kMaxEntries);
  }
  absl::flat_hash_map<std::string, int64_t> next;
  for (auto& [principal, before] : revoked) {
    int64_t& at = next[std::move(principal)];
    at = std::max(at, before);
  }
  absl::MutexLock lock(&mu_);
  any_.store(!next.empty(), std::memory_order_release);
  before_ms_ = std::move(next);
}

absl::Status Revocations::Check(const Capability& capability) const {
  // Every call of a worker passes here: no lock while nothing is revoked.
  if (capability.principal.empty() || !any_.load(std::memory_order_acquire)) {
    return absl::OkStatus();
  }
  absl::MutexLock lock(&mu_);
  auto it = before_ms_.find(capability.principal);
  if (it == before_ms_.end() || capability.issued_ms > it->second) {
    return absl::OkStatus();
  }
  return Denied(absl::StrCat("principal '", capability.principal,
                             "' was removed from the coordinator's tokens "
                             "after it was issued"));
}

std::string DeriveWorkerKey(absl::string_view cluster_secret,
                            absl::string_view worker) {
  return Hmac(cluster_secret, absl::StrCat("tessera worker key|", worker));
}

std::string RandomBytes(size_t n) {
  std::string bytes(n, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(bytes.data()),
                 static_cast<int>(n)) != 1) {
    // The OS CSPRNG failing is not something to run on.
    std::abort();
  }
  return bytes;
}

uint64_t RandomId() { return RandomIds(1)[0]; }

std::vector<uint64_t> RandomIds(size_t n) {
  std::vector<uint64_t> ids(n);
  constexpr size_t kPerDraw = size_t{1} << 20;  // RAND_bytes takes an int
  for (size_t first = 0; first < n; first += kPerDraw) {
    const size_t count = std::min(kPerDraw, n - first);
    if (RAND_bytes(reinterpret_cast<unsigned char*>(ids.data() + first),
                   static_cast<int>(count * sizeof(uint64_t))) != 1) {
      std::abort();  // as in RandomBytes
    }
  }
  for (uint64_t& id : ids) {
    while (id == 0) {  // 0 means "no shard"; drawn again
      if (RAND_bytes(reinterpret_cast<unsigned char*>(&id), sizeof(id)) != 1) {
        std::abort();
      }
    }
  }
  return ids;
}

}  // namespace tessera
