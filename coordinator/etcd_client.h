// EtcdClient: the few calls of etcd's v3 gRPC API the coordinator needs
// (range, transaction, lease), spoken directly with the API's own protos
// (third_party/etcd), over one channel per member. A call goes to the member
// that last answered and on to the next when one is unreachable; every call
// has a deadline, so an etcd without quorum costs a caller `timeout`, never
// more. etcd applies a request at most once per call, but a call that timed
// out may still have been applied: callers that must know guard their
// transactions (a compare on the key they create) and read back.
//
// Bounds: a range is read in pages of at most `page_keys` keys, and every
// reply's size is bounded by the channel (max_reply_bytes).
#ifndef TESSERA_COORDINATOR_ETCD_CLIENT_H_
#define TESSERA_COORDINATOR_ETCD_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "third_party/etcd/rpc.grpc.pb.h"

namespace tessera {

// What --metadata=etcd://H1:P1,H2:P2/PREFIX names.
struct EtcdTarget {
  std::vector<std::string> endpoints;  // host:port, at least one
  std::string prefix;                  // non-empty, ends with '/'
};
// INVALID_ARGUMENT naming what is wrong: another scheme, no endpoint, an
// endpoint that is not host:port, an empty prefix or one with NUL or "..".
absl::StatusOr<EtcdTarget> ParseEtcdUrl(absl::string_view url);

// The smallest key after every key that starts with `prefix` (etcd's
// range_end for "all keys with this prefix").
std::string PrefixEnd(absl::string_view prefix);

struct EtcdClientOptions {
  // Null: plaintext. With TLS: etcd's client-certificate auth.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  absl::Duration timeout = absl::Seconds(1);  // per call, per member
  int64_t max_reply_bytes = int64_t{64} << 20;
  int64_t page_keys = 16;  // values are at most ~1 MiB each
};

class EtcdClient {
 public:
  EtcdClient(std::vector<std::string> endpoints, EtcdClientOptions options);

  const std::vector<std::string>& endpoints() const { return endpoints_; }
  absl::Duration timeout() const { return options_.timeout; }

  // Every key in [key, range_end) (range_end empty: `key` alone), in key
  // order, read page by page at one revision.
  absl::StatusOr<std::vector<mvccpb::KeyValue>> Range(
      const std::string& key, const std::string& range_end = "") const;
  // The first key in [key, range_end), if any (its value not read).
  absl::StatusOr<std::optional<std::string>> FirstKey(
      const std::string& key, const std::string& range_end) const;
  absl::StatusOr<etcdserverpb::TxnResponse> Txn(
      const etcdserverpb::TxnRequest& request) const;
  // A lease of `ttl`; its id.
  absl::StatusOr<int64_t> GrantLease(absl::Duration ttl) const;
  // Renews lease `id` once; NOT_FOUND when it has expired. A renewal is
  // idempotent, so a member that does not answer within `per_member` (at
  // most the client's timeout) is left for the next, not waited out.
  absl::Status KeepAlive(
      int64_t id, absl::Duration per_member = absl::InfiniteDuration()) const;
  absl::Status RevokeLease(int64_t id) const;

 private:
  // Runs `call` against members in turn, starting at the last that
  // answered, until one answers with anything but UNAVAILABLE.
  absl::Status OnAnyMember(
      absl::string_view what,
      const std::function<grpc::Status(size_t member, grpc::ClientContext*)>&
          call) const;

  const std::vector<std::string> endpoints_;
  const EtcdClientOptions options_;
  std::vector<std::shared_ptr<grpc::Channel>> channels_;
  std::vector<std::unique_ptr<etcdserverpb::KV::Stub>> kv_;
  std::vector<std::shared_ptr<etcdserverpb::Lease::Stub>> lease_;
  mutable std::atomic<size_t> current_{0};
  // Per member: a renewal still waiting on it (a stream to a member that
  // hangs can block past its deadline), so no second one is sent there.
  std::vector<std::shared_ptr<std::atomic<bool>>> renewing_;
};

}  // namespace tessera

#endif  // TESSERA_COORDINATOR_ETCD_CLIENT_H_
