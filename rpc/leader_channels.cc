#include "rpc/leader_channels.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "rpc/status.h"

namespace tessera {
namespace {

// While no one leads (a failover), a standby is asked again this often.
constexpr absl::Duration kNoLeaderPause = absl::Milliseconds(50);
// A refused address gets a fresh channel at most this often.
constexpr absl::Duration kRefreshEvery = absl::Milliseconds(100);
// After a round of addresses none of which connected.
constexpr absl::Duration kRoundPause = absl::Milliseconds(50);

absl::Time EarlierOf(absl::Time a, absl::Time b) { return a < b ? a : b; }

std::chrono::system_clock::time_point ToChrono(absl::Time t) {
  return absl::ToChronoTime(t);
}

}  // namespace

absl::StatusOr<std::unique_ptr<LeaderChannels>> LeaderChannels::Make(
    const std::string& addresses, const ChannelOptions& options) {
  std::unique_ptr<LeaderChannels> out(new LeaderChannels());
  absl::MutexLock lock(&out->mu_);  // not shared yet; for the analysis
  for (absl::string_view address : absl::StrSplit(addresses, ',')) {
    if (!IsHostPort(address)) {
      return absl::InvalidArgumentError(
          absl::StrCat("address '", address, "' is not HOST:PORT"));
    }
    out->addresses_.emplace_back(address);
    out->channels_.push_back(
        {MakeChannel(std::string(address), options), absl::Now()});
  }
  out->options_ = options;
  if (out->addresses_.size() < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", addresses, "' names fewer than two addresses"));
  }
  return out;
}

std::shared_ptr<grpc::Channel> LeaderChannels::channel(size_t i) const {
  absl::MutexLock lock(&mu_);
  return channels_[i].channel;
}

std::shared_ptr<grpc::Channel> LeaderChannels::Refreshed(size_t i) {
  absl::MutexLock lock(&mu_);
  Entry& entry = channels_[i];
  if (absl::Now() - entry.made >= kRefreshEvery) {
    entry.channel = MakeChannel(addresses_[i], options_);
    entry.made = absl::Now();
  }
  return entry.channel;
}

size_t LeaderChannels::current() const {
  absl::MutexLock lock(&mu_);
  return current_;
}

size_t LeaderChannels::Pick(absl::Time deadline, absl::Duration connect_wait) {
  size_t i = current();
  for (size_t passed = 0;; ++passed) {
    std::shared_ptr<grpc::Channel> channel = this->channel(i);
    grpc_connectivity_state state = channel->GetState(/*try_to_connect=*/false);
    // gRPC tries a refused address again only after its backoff: a
    // coordinator back (restarted, or a standby that now leads on its
    // port) is found on a fresh channel at once.
    if (state == GRPC_CHANNEL_TRANSIENT_FAILURE) {
      channel = Refreshed(i);
      state = channel->GetState(/*try_to_connect=*/false);
    }
    if (state == GRPC_CHANNEL_IDLE) {
      state = channel->GetState(/*try_to_connect=*/true);
    }
    const absl::Time give_up = EarlierOf(deadline, absl::Now() + connect_wait);
    // Refused (TRANSIENT_FAILURE) goes to the next address at once; one
    // that neither connects nor refuses (a hung process) after the wait.
    while (state != GRPC_CHANNEL_READY &&
           state != GRPC_CHANNEL_TRANSIENT_FAILURE &&
           channel->WaitForStateChange(state, ToChrono(give_up))) {
      state = channel->GetState(/*try_to_connect=*/true);
    }
    if (state == GRPC_CHANNEL_READY || absl::Now() >= deadline) {
      absl::MutexLock lock(&mu_);
      current_ = i;
      return i;
    }
    i = (i + 1) % size();
    if ((passed + 1) % size() == 0) {
      absl::SleepFor(std::min(kRoundPause, deadline - absl::Now()));
    }
  }
}

LeaderChannels::Next LeaderChannels::After(
    size_t i, const grpc::Status& status,
    const std::multimap<grpc::string_ref, grpc::string_ref>& trailers,
    absl::Time deadline) {
  if (status.ok()) return Next::kDone;
  if (IsTransportFailure(status)) {
    PassOver(i);
    return Next::kDone;
  }
  if (status.error_code() != grpc::StatusCode::UNAVAILABLE ||
      trailers.find(kStandbyTrailer) == trailers.end()) {
    return Next::kDone;
  }
  std::string leader;
  if (auto it = trailers.find(kLeaderTrailer); it != trailers.end()) {
    leader.assign(it->second.data(), it->second.size());
  }
  const auto named = std::find(addresses_.begin(), addresses_.end(), leader);
  const size_t named_index = static_cast<size_t>(named - addresses_.begin());
  // Followed only to another listed address that this client can connect
  // to: a standby that names itself (a stale or hostile answer) or a leader
  // that just died (named until its lease runs out) is as good as none.
  const bool follow =
      named != addresses_.end() && named_index != i &&
      channel(named_index)->GetState(false) != GRPC_CHANNEL_TRANSIENT_FAILURE;
  if (follow) {
    absl::MutexLock lock(&mu_);
    current_ = named_index;
    return absl::Now() < deadline ? Next::kFollow : Next::kDone;
  }
  // No leader to follow: ask the next listed address (the leader may be
  // one this standby does not know of yet, or under a name this client
  // was not given), calmly, so that a round of standbys with no leader
  // among them is not a hot loop.
  PassOver(i);
  absl::SleepFor(std::min(kNoLeaderPause, deadline - absl::Now()));
  return absl::Now() + kMinAttempt <= deadline ? Next::kNoLeader : Next::kDone;
}

void LeaderChannels::PassOver(size_t i) {
  absl::MutexLock lock(&mu_);
  if (current_ == i) current_ = (i + 1) % channels_.size();
}

}  // namespace tessera
