// LeaderChannels: the channels of a client or worker given several
// coordinator addresses (--coordinator=A1,A2,A3), of which one leads and
// the others stand by (CLI.md "Highly available coordinator (v3)"). A call
// goes to one address at a time, and Call (rpc/call.h) moves it on:
//  * a standby answers UNAVAILABLE with the trailer `tessera-standby` and,
//    once a leader serves, `tessera-leader: ADDRESS`: the call, which was
//    not run, goes to that address at once, or waits a moment while no one
//    leads;
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
  const std::shared_ptr<grpc::Channel>& channel(size_t i) const {
    return channels_[i];
  }
  // The address calls go to now.
  size_t current() const ABSL_LOCKS_EXCLUDED(mu_);

  // Makes current() a connected coordinator, passing over addresses not
  // connected within `connect_wait`, until `deadline` (then the call goes
  // to the current one and fails as unreachable). Returns current().
  size_t Pick(absl::Time deadline, absl::Duration connect_wait)
      ABSL_LOCKS_EXCLUDED(mu_);
  // What a call to address `i` ended with (`trailers`: its server trailing
  // metadata). True when it was not run and should go again at once to
  // the next Pick (a standby answered, and `deadline` is not past).
  bool After(size_t i, const grpc::Status& status,
             const std::multimap<grpc::string_ref, grpc::string_ref>& trailers,
             absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);
  // Calls go to the address after `i` from now on (if `i` is current).
  void PassOver(size_t i) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  LeaderChannels() = default;
  std::vector<std::string> addresses_;
  std::vector<std::shared_ptr<grpc::Channel>> channels_;
  mutable absl::Mutex mu_;
  size_t current_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tessera

#endif  // TESSERA_RPC_LEADER_CHANNELS_H_
