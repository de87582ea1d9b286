#include "coordinator/leadership.h"

#include <thread>
#include <utility>

#include "core/status_macros.h"
#include "spdlog/spdlog.h"

namespace tessera {

Leadership::Leadership(std::shared_ptr<const EtcdClient> etcd,
                       std::string prefix, EtcdMetadataStore* store,
                       LeadershipOptions options)
    : prefix_(std::move(prefix)),
      store_(store),
      options_(std::move(options)),
      election_(std::move(etcd), prefix_, options_.advertise, options_.lease),
      standby_(options_.advertise) {}

Leadership::~Leadership() { ReleasePort(); }

absl::StatusOr<std::unique_ptr<Leadership>> Leadership::Stand(
    std::shared_ptr<const EtcdClient> etcd, std::string prefix,
    EtcdMetadataStore* store, LeadershipOptions options) {
  // Before any key is written (the election's, the secret): a prefix of
  // another cluster, or inside one, is refused untouched.
  if (absl::Status prefix_ok = store->CheckPrefix(); !prefix_ok.ok()) {
    return absl::Status(prefix_ok.code(),
                        absl::StrCat("--metadata: ", prefix_ok.message()));
  }
  std::unique_ptr<Leadership> self(new Leadership(
      std::move(etcd), std::move(prefix), store, std::move(options)));
  // Standing by, this coordinator answers on its port, naming the leader.
  ServerOptions standby_options = self->options_.server;
  standby_options.fallback = &self->standby_;
  TESSERA_ASSIGN_OR_RETURN(
      RunningServer standing,
      StartServer(self->options_.listen, {}, standby_options));
  self->standby_server_ = std::make_unique<RunningServer>(std::move(standing));
  self->serve_at_ =
      WithPort(self->options_.listen, self->standby_server_->port);
  spdlog::info("standing for leader of etcd prefix {} as {} (standby on {})",
               self->prefix_, self->options_.advertise, self->serve_at_);
  return self;
}

void Leadership::Follow(const absl::Notification& until) {
  std::string said;
  do {
    const absl::Status followed = store_->Follow();
    if (!followed.ok() && followed.ToString() != said) {
      spdlog::warn("standing by: cannot follow the metadata yet: {}",
                   std::string(followed.message()));
    }
    said = followed.ok() ? std::string() : followed.ToString();
  } while (!until.WaitForNotificationWithTimeout(options_.follow_every));
}

absl::Status Leadership::Campaign(const absl::Notification& stop,
                                  std::function<void()> on_lost) {
  absl::Notification campaign_over;
  std::thread follower([&] { Follow(campaign_over); });
  absl::StatusOr<int64_t> fence = election_.Campaign(
      stop,
      [&](const std::string& leader) {
        standby_.SetLeader(leader);
        {
          absl::MutexLock lock(&mu_);
          leader_seen_ = leader;
        }
        if (leader.empty()) {
          spdlog::info("standing by: no coordinator serves as leader yet");
        } else {
          spdlog::info("standing by: the leader is {}", leader);
        }
      },
      std::move(on_lost));
  campaign_over.Notify();
  follower.join();
  if (!fence.ok()) return fence.status();
  spdlog::info("leading etcd prefix {} (fence revision {})", prefix_, *fence);
  fence_ = *fence;
  store_->SetFence(election_.key(), *fence);
  followed_before_ = store_->follow_stats();
  return absl::OkStatus();
}

void Leadership::ReleasePort() {
  if (standby_server_ == nullptr) return;
  // A grace, however short: a call the standby is answering gets its
  // UNAVAILABLE, which sends the caller on to this leader, rather than a
  // CANCELLED it would not try again.
  standby_server_->Stop(absl::Milliseconds(250));
  standby_server_.reset();
}

absl::Status Leadership::Publish() {
  TESSERA_RETURN_IF_ERROR(election_.Publish());
  spdlog::info("serving as the leader; standbys now send callers to {}",
               options_.advertise);
  return absl::OkStatus();
}

std::string Leadership::leader_seen() const {
  absl::MutexLock lock(&mu_);
  return leader_seen_;
}

}  // namespace tessera
