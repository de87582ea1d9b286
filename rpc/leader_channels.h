// LeaderChannels: the channels of a client or worker given several
// coordinator addresses (--coordinator=A1,A2,A3), of which one leads and
// the others stand by (CLI.md "Highly available coordinator (v3)"). A call
// goes to one address at a time, and Call (rpc/call.h) moves it on:
//  * a standby answers UNAVAILABLE with the trailer `tessera-standby` and,
//    once a leader serves, `tessera-leader: ADDRESS`: the call, which was
//    not run, goes to that address at once when it is another listed one
//    that connects; otherwise (no leader named, the standby itself named,
//    an unlisted or dead address) to the next listed address after a
//    moment, so that no answer holds a call on one address or spins;
//  * an address not connected within a short wait (dead, hung, not yet
//    listening) is passed over for the next, and so is one whose call
//    failed in transport.
// One channel per address, so that TLS checks each coordinator's
// certificate against its own host.
#ifndef TESSERA_RPC_LEADER_CHANNELS_H_
#define TESSERA_RPC_LEADER_CHANNELS_H_

#include <grpcpp/grpcpp.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "rpc/channel.h"

namespace tessera {

// The trailers of a standby's answer.
inline constexpr char kStandbyTrailer[] = "tessera-standby";
inline constexpr char kLeaderTrailer[] = "tessera-leader";

class LeaderChannels {
 public:
  // `addresses`: two or more HOST:PORT, comma-separated.
  static absl::StatusOr<std::unique_ptr<LeaderChannels>> Make(
      const std::string& addresses, const ChannelOptions& options);

  size_t size() const { return addresses_.size(); }
  const std::string& address(size_t i) const { return addresses_[i]; }
  // The channel to address `i` now (a refused one is replaced by a fresh
  // one when picked, so keep a stub per channel: LeaderStubs).
  std::shared_ptr<grpc::Channel> channel(size_t i) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // The address calls go to now.
  size_t current() const ABSL_LOCKS_EXCLUDED(mu_);

  // Makes current() a connected coordinator, passing over addresses not
  // connected within `connect_wait`, until `deadline` (then the call goes
  // to the current one and fails as unreachable). Returns current().
  size_t Pick(absl::Time deadline, absl::Duration connect_wait)
      ABSL_LOCKS_EXCLUDED(mu_);
  // What to do after a call to address `i` ended with `status` (`trailers`:
  // its server trailing metadata).
  enum class Next {
    kDone,      // the call ran, or failed in a way another address won't mend
    kFollow,    // a standby named the leader: ask it at once
    kNoLeader,  // a standby named none: ask the next address after a pause
  };
  // Asks again only while `deadline` leaves time for it: after a standby
  // that named no leader, at least kMinAttempt.
  Next After(size_t i, const grpc::Status& status,
             const std::multimap<grpc::string_ref, grpc::string_ref>& trailers,
             absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);
  static constexpr absl::Duration kMinAttempt = absl::Milliseconds(50);
  // Calls go to the address after `i` from now on (if `i` is current).
  void PassOver(size_t i) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Entry {
    std::shared_ptr<grpc::Channel> channel;
    absl::Time made;
  };
  LeaderChannels() = default;
  // Channel `i`, made afresh if it is old enough.
  std::shared_ptr<grpc::Channel> Refreshed(size_t i) ABSL_LOCKS_EXCLUDED(mu_);

  std::vector<std::string> addresses_;
  ChannelOptions options_;
  mutable absl::Mutex mu_;
  std::vector<Entry> channels_ ABSL_GUARDED_BY(mu_);
  size_t current_ ABSL_GUARDED_BY(mu_) = 0;
};

// The stub of the coordinator calls go to now, for a gRPC service
// (`Service::Stub`), made again when its channel was replaced. Thread-safe.
template <typename Service>
class LeaderStubs {
 public:
  // `leaders` outlives this.
  explicit LeaderStubs(LeaderChannels* leaders)
      : leaders_(leaders), stubs_(leaders->size()) {}

  std::shared_ptr<typename Service::Stub> Current() ABSL_LOCKS_EXCLUDED(mu_) {
    const size_t i = leaders_->current();
    std::shared_ptr<grpc::Channel> channel = leaders_->channel(i);
    absl::MutexLock lock(&mu_);
    Made& made = stubs_[i];
    if (made.channel != channel) {
      made.stub = Service::NewStub(channel);
      made.channel = std::move(channel);
    }
    return made.stub;
  }

 private:
  struct Made {
    std::shared_ptr<grpc::Channel> channel;
    std::shared_ptr<typename Service::Stub> stub;
  };
  LeaderChannels* const leaders_;
  absl::Mutex mu_;
  std::vector<Made> stubs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera

#endif  // TESSERA_RPC_LEADER_CHANNELS_H_
