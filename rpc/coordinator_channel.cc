#include "rpc/coordinator_channel.h"

#include <utility>

#include "core/status_macros.h"

namespace tessera {

absl::StatusOr<std::unique_ptr<CoordinatorChannel>> CoordinatorChannel::Make(
    const std::string& addresses, ChannelOptions options) {
  if (addresses.find(',') == std::string::npos) {
    return Single(addresses, options);
  }
  options.connect_timeout = absl::Seconds(1);
  options.max_reconnect_backoff = absl::Milliseconds(200);
  std::unique_ptr<CoordinatorChannel> channel(new CoordinatorChannel());
  TESSERA_ASSIGN_OR_RETURN(channel->leaders_,
                           LeaderChannels::Make(addresses, options));
  channel->leader_stubs_ =
      std::make_unique<LeaderStubs<v1::Coordinator>>(channel->leaders_.get());
  return channel;
}

std::unique_ptr<CoordinatorChannel> CoordinatorChannel::Single(
    const std::string& address, const ChannelOptions& options) {
  std::unique_ptr<CoordinatorChannel> channel(new CoordinatorChannel());
  channel->single_ = v1::Coordinator::NewStub(MakeChannel(address, options));
  return channel;
}

std::shared_ptr<v1::Coordinator::Stub> CoordinatorChannel::stub() {
  return leader_stubs_ != nullptr ? leader_stubs_->Current() : single_;
}

}  // namespace tessera
