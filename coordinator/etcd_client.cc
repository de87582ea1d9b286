#include "coordinator/etcd_client.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "core/status_macros.h"
#include "core/threads.h"
#include "rpc/channel.h"
#include "rpc/status.h"

namespace tessera {
namespace {

constexpr size_t kMaxEndpoints = 16;
constexpr size_t kMaxPrefixBytes = 256;

}  // namespace

absl::StatusOr<EtcdTarget> ParseEtcdUrl(absl::string_view url) {
  constexpr absl::string_view kScheme = "etcd://";
  if (!absl::StartsWith(url, kScheme)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--metadata '", url, "' is not etcd://H1:P1[,H2:P2...]/PREFIX"));
  }
  url.remove_prefix(kScheme.size());
  const size_t slash = url.find('/');
  if (slash == absl::string_view::npos) {
    return absl::InvalidArgumentError(
        "--metadata: etcd://... needs a /PREFIX after its endpoints");
  }
  EtcdTarget target;
  for (absl::string_view endpoint : absl::StrSplit(url.substr(0, slash), ',')) {
    if (!IsHostPort(endpoint)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--metadata: etcd endpoint '", endpoint, "' is not HOST:PORT"));
    }
    target.endpoints.emplace_back(endpoint);
  }
  if (target.endpoints.size() > kMaxEndpoints) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--metadata: more than ", kMaxEndpoints, " etcd endpoints"));
  }
  absl::string_view prefix = url.substr(slash + 1);
  if (prefix.empty() || prefix.size() > kMaxPrefixBytes ||
      prefix.find('\0') != absl::string_view::npos ||
      absl::StrContains(prefix, "..")) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metadata: etcd prefix '", prefix, "' must be 1 to ",
                     kMaxPrefixBytes, " bytes without NUL or '..'"));
  }
  target.prefix = std::string(prefix);
  if (!absl::EndsWith(target.prefix, "/")) target.prefix += '/';
  return target;
}

std::string PrefixEnd(absl::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    if (static_cast<unsigned char>(end.back()) < 0xff) {
      end.back() = static_cast<char>(end.back() + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

EtcdClient::EtcdClient(std::vector<std::string> endpoints,
                       EtcdClientOptions options)
    : endpoints_(std::move(endpoints)), options_(std::move(options)) {
  ChannelOptions channel;
  channel.credentials = options_.credentials;
  channel.max_message_bytes = static_cast<int>(options_.max_reply_bytes);
  // A member that is down is skipped after the call's deadline, and its
  // channel tries again soon after.
  channel.connect_timeout = options_.timeout;
  channel.max_reconnect_backoff = absl::Seconds(1);
  channel.initial_reconnect_backoff = absl::Milliseconds(100);
  for (const std::string& endpoint : endpoints_) {
    std::shared_ptr<grpc::Channel> c = MakeChannel(endpoint, channel);
    channels_.push_back(c);
    kv_.push_back(etcdserverpb::KV::NewStub(c));
    lease_.push_back(etcdserverpb::Lease::NewStub(c));
    renewing_.push_back(std::make_shared<std::atomic<bool>>(false));
  }
}

absl::Status EtcdClient::OnAnyMember(
    absl::string_view what,
    const std::function<grpc::Status(size_t member, grpc::ClientContext*)>&
        call) const {
  // The member that last answered first, members whose connection failed
  // last; a member that is (re)connecting is waited for within the
  // deadline rather than failed at once while its channel backs off.
  const size_t first = current_.load();
  std::vector<size_t> order;
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t k = 0; k < kv_.size(); ++k) {
      const size_t i = (first + k) % kv_.size();
      const bool failing = channels_[i]->GetState(/*try_to_connect=*/true) ==
                           GRPC_CHANNEL_TRANSIENT_FAILURE;
      if (failing == (pass == 1)) order.push_back(i);
    }
  }
  grpc::Status last;
  for (size_t i : order) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + options_.timeout));
    context.set_wait_for_ready(true);
    last = call(i, &context);
    if (last.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      // No answer in time: etcd without quorum (no other member would do
      // better) or a member that hangs. Either way the caller hears it
      // now, and the next call starts at another member.
      current_.store((i + 1) % kv_.size());
      break;
    }
    if (last.error_code() != grpc::StatusCode::UNAVAILABLE) {
      current_.store(i);
      break;
    }
  }
  if (last.ok()) return absl::OkStatus();
  const absl::Status status = FromGrpcStatus(last);
  return absl::Status(status.code(),
                      absl::StrCat("etcd (", absl::StrJoin(endpoints_, ","),
                                   ") ", what, ": ", status.message()));
}

absl::StatusOr<std::vector<mvccpb::KeyValue>> EtcdClient::Range(
    const std::string& key, const std::string& range_end) const {
  std::vector<mvccpb::KeyValue> out;
  etcdserverpb::RangeRequest request;
  request.set_key(key);
  request.set_range_end(range_end);
  request.set_limit(options_.page_keys);
  for (;;) {
    etcdserverpb::RangeResponse response;
    TESSERA_RETURN_IF_ERROR(
        OnAnyMember(absl::StrCat("reading ", key),
                    [&](size_t i, grpc::ClientContext* context) {
                      return kv_[i]->Range(context, request, &response);
                    }));
    for (mvccpb::KeyValue& kv : *response.mutable_kvs()) {
      out.push_back(std::move(kv));
    }
    if (!response.more() || range_end.empty() || out.empty()) return out;
    // The next page starts after the last key, at the first page's
    // revision, so the pages are one view.
    request.set_key(out.back().key() + '\0');
    request.set_revision(response.header().revision());
  }
}

absl::StatusOr<std::optional<std::string>> EtcdClient::FirstKey(
    const std::string& key, const std::string& range_end) const {
  etcdserverpb::RangeRequest request;
  request.set_key(key);
  request.set_range_end(range_end);
  request.set_limit(1);
  request.set_keys_only(true);
  etcdserverpb::RangeResponse response;
  TESSERA_RETURN_IF_ERROR(
      OnAnyMember(absl::StrCat("reading ", key),
                  [&](size_t i, grpc::ClientContext* context) {
                    return kv_[i]->Range(context, request, &response);
                  }));
  if (response.kvs().empty()) return std::nullopt;
  return response.kvs(0).key();
}

absl::StatusOr<etcdserverpb::TxnResponse> EtcdClient::Txn(
    const etcdserverpb::TxnRequest& request) const {
  etcdserverpb::TxnResponse response;
  TESSERA_RETURN_IF_ERROR(
      OnAnyMember("writing", [&](size_t i, grpc::ClientContext* context) {
        return kv_[i]->Txn(context, request, &response);
      }));
  return response;
}

absl::StatusOr<int64_t> EtcdClient::GrantLease(absl::Duration ttl) const {
  etcdserverpb::LeaseGrantRequest request;
  request.set_ttl(std::max<int64_t>(1, absl::ToInt64Seconds(ttl)));
  etcdserverpb::LeaseGrantResponse response;
  TESSERA_RETURN_IF_ERROR(OnAnyMember(
      "granting a lease", [&](size_t i, grpc::ClientContext* context) {
        return lease_[i]->LeaseGrant(context, request, &response);
      }));
  if (!response.error().empty()) {
    return absl::UnavailableError(
        absl::StrCat("etcd granting a lease: ", response.error()));
  }
  return response.id();
}

namespace {

// One renewal on one member, run on a thread of its own: the stream's
// deadline does not bound a Write or Read to a member that hangs (its TCP
// connection open, nothing answered), so the caller waits on this instead.
struct RenewalTry {
  absl::Mutex mu;
  bool done ABSL_GUARDED_BY(mu) = false;
  grpc::Status status ABSL_GUARDED_BY(mu);
  bool answered ABSL_GUARDED_BY(mu) = false;
  etcdserverpb::LeaseKeepAliveResponse response ABSL_GUARDED_BY(mu);
};

}  // namespace

absl::Status EtcdClient::KeepAlive(int64_t id,
                                   absl::Duration per_member) const {
  etcdserverpb::LeaseKeepAliveRequest request;
  request.set_id(id);
  const absl::Duration wait = std::min(per_member, options_.timeout);
  const size_t first = current_.load();
  grpc::Status last(grpc::StatusCode::UNAVAILABLE, "no member was free");
  for (size_t k = 0; k < lease_.size(); ++k) {
    const size_t i = (first + k) % lease_.size();
    // A member still holding an earlier renewal is skipped.
    if (renewing_[i]->exchange(true)) continue;
    auto attempt = std::make_shared<RenewalTry>();
    std::optional<std::thread> renewal =
        TryStartThread([stub = lease_[i], busy = renewing_[i], attempt, request,
                        timeout = options_.timeout] {
          grpc::ClientContext context;
          context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
          context.set_wait_for_ready(true);
          etcdserverpb::LeaseKeepAliveResponse response;
          bool answered = false;
          auto stream = stub->LeaseKeepAlive(&context);
          if (stream->Write(request) && stream->Read(&response))
            answered = true;
          stream->WritesDone();
          context.TryCancel();
          const grpc::Status status = stream->Finish();
          busy->store(false);
          absl::MutexLock lock(&attempt->mu);
          attempt->done = true;
          attempt->status = answered ? grpc::Status::OK : status;
          attempt->answered = answered;
          attempt->response = std::move(response);
        });
    if (!renewal.has_value()) {
      // No thread to be had: this renewal fails (the leader steps down if
      // it cannot renew in time), the process lives on.
      renewing_[i]->store(false);
      last = grpc::Status(
          grpc::StatusCode::RESOURCE_EXHAUSTED,
          absl::StrCat("no thread for the renewal: ", std::strerror(errno)));
      break;
    }
    renewal->detach();
    absl::MutexLock lock(&attempt->mu);
    attempt->mu.AwaitWithTimeout(absl::Condition(&attempt->done), wait);
    if (!attempt->done) {
      // Hangs: the next member, and the next call starts there too.
      current_.store((i + 1) % lease_.size());
      last = grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                          "a member did not answer in time");
      continue;
    }
    if (attempt->answered) {
      current_.store(i);
      if (attempt->response.ttl() <= 0) {
        return absl::NotFoundError(
            absl::StrCat("etcd lease ", id, " has expired"));
      }
      return absl::OkStatus();
    }
    last = attempt->status;
    if (last.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      current_.store((i + 1) % lease_.size());
    }
  }
  const absl::Status status = FromGrpcStatus(last);
  return absl::Status(status.code(),
                      absl::StrCat("etcd (", absl::StrJoin(endpoints_, ","),
                                   ") renewing a lease: ", status.message()));
}

absl::Status EtcdClient::RevokeLease(int64_t id) const {
  etcdserverpb::LeaseRevokeRequest request;
  request.set_id(id);
  etcdserverpb::LeaseRevokeResponse response;
  return OnAnyMember(
      "revoking a lease", [&](size_t i, grpc::ClientContext* context) {
        return lease_[i]->LeaseRevoke(context, request, &response);
      });
}

}  // namespace tessera
