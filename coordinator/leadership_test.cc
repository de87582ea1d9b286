// Leadership against a real etcd member: standing by, campaigning,
// following, promotion with a fence, publishing, stepping down.
#include "coordinator/leadership.h"

#include <unistd.h>

#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "coordinator/etcd_testutil.h"
#include "core/testing/status_matchers.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::tessera::testing::EtcdCluster;
using ::tessera::testing::StatusIs;

EtcdCluster& SharedEtcd() {
  static EtcdCluster etcd(1, "etcd-leadership");
  return etcd;
}

std::string NewPrefix() {
  static int counter = 0;
  return absl::StrCat("/leadership-", getpid(), "/", counter++, "/");
}

// One coordinator's part: its store and its leadership.
struct Candidate {
  std::unique_ptr<EtcdMetadataStore> store;
  std::unique_ptr<Leadership> leadership;
};

Candidate Stand(const std::string& prefix, const std::string& advertise) {
  auto etcd = std::make_shared<EtcdClient>(SharedEtcd().endpoints(),
                                           EtcdClientOptions{});
  Candidate c;
  EtcdStoreOptions store_options;
  store_options.prefix = prefix;
  c.store = std::make_unique<EtcdMetadataStore>(etcd, store_options);
  LeadershipOptions options;
  options.listen = "127.0.0.1:0";
  options.advertise = advertise;
  options.lease = absl::Seconds(1);
  options.follow_every = absl::Milliseconds(50);
  absl::StatusOr<std::unique_ptr<Leadership>> stood =
      Leadership::Stand(etcd, prefix, c.store.get(), options);
  EXPECT_OK(stood.status());
  if (stood.ok()) c.leadership = *std::move(stood);
  return c;
}

bool Eventually(const std::function<bool()>& done,
                absl::Duration timeout = absl::Seconds(15)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return true;
}

class LeadershipTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(SharedEtcd().ready()); }
};

TEST_F(LeadershipTest, AStandbyFollowsTheLeaderAndTakesOverWhenItStepsDown) {
  const std::string prefix = NewPrefix();
  Candidate a = Stand(prefix, "127.0.0.1:7001");
  ASSERT_NE(a.leadership, nullptr);
  EXPECT_NE(a.leadership->serve_at(), "127.0.0.1:0");  // bound: a port

  absl::Notification never;
  ASSERT_OK(a.leadership->Campaign(never, [] {}));
  EXPECT_GT(a.leadership->fence(), 0);
  ASSERT_OK(a.store->Load().status());
  ASSERT_OK(a.store->Append(MetadataChange::ShardIdHighWater(41)));
  a.leadership->ReleasePort();
  ASSERT_OK(a.leadership->Publish());

  Candidate b = Stand(prefix, "127.0.0.1:7002");
  ASSERT_NE(b.leadership, nullptr);
  absl::Notification b_leads;
  absl::Status b_campaign;
  std::thread campaign([&] {
    b_campaign = b.leadership->Campaign(never, [] {});
    b_leads.Notify();
  });
  // Standing by: it names the leader, and reads what the leader writes.
  EXPECT_TRUE(Eventually(
      [&] { return b.leadership->leader_seen() == "127.0.0.1:7001"; }));
  ASSERT_OK(a.store->Append(MetadataChange::ShardIdHighWater(42)));
  EXPECT_TRUE(
      Eventually([&] { return b.store->follow_stats().entries_read >= 2; }));
  absl::StatusOr<std::vector<EtcdLeadership::Member>> members =
      a.leadership->Members();
  ASSERT_OK(members.status());
  ASSERT_EQ(members->size(), 2u);
  EXPECT_EQ((*members)[0].address, "127.0.0.1:7001");
  EXPECT_TRUE((*members)[0].leader);
  EXPECT_FALSE(b_leads.HasBeenNotified());

  // Stepping down hands over at once (well within the lease's wait).
  const absl::Time stepped = absl::Now();
  a.leadership->StepDown();
  ASSERT_TRUE(b_leads.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_LT(absl::Now() - stepped, absl::Seconds(5));
  campaign.join();
  ASSERT_OK(b_campaign);
  EXPECT_GT(b.leadership->fence(), a.leadership->fence());
  // The new leader has what the old one wrote; the old one's writes are
  // refused by the fence.
  absl::StatusOr<MetadataState> state = b.store->Load();
  ASSERT_OK(state.status());
  EXPECT_EQ(state->shard_id_high_water, 42u);
  EXPECT_FALSE(a.store->Append(MetadataChange::ShardIdHighWater(43)).ok());
  ASSERT_OK(b.store->Append(MetadataChange::ShardIdHighWater(44)));
}

TEST_F(LeadershipTest, ACampaignEndsWhenItIsStopped) {
  const std::string prefix = NewPrefix();
  Candidate a = Stand(prefix, "127.0.0.1:7003");
  ASSERT_NE(a.leadership, nullptr);
  absl::Notification never;
  ASSERT_OK(a.leadership->Campaign(never, [] {}));
  ASSERT_OK(a.leadership->Publish());

  Candidate b = Stand(prefix, "127.0.0.1:7004");
  ASSERT_NE(b.leadership, nullptr);
  absl::Notification stop;
  absl::Status campaign;
  absl::Notification over;
  std::thread standing([&] {
    campaign = b.leadership->Campaign(stop, [] {});
    over.Notify();
  });
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_FALSE(over.HasBeenNotified());
  stop.Notify();
  EXPECT_TRUE(over.WaitForNotificationWithTimeout(absl::Seconds(5)));
  standing.join();
  EXPECT_THAT(campaign, StatusIs(absl::StatusCode::kCancelled));
  EXPECT_EQ(b.leadership->fence(), 0);
  // The leader is untouched.
  EXPECT_OK(a.leadership->CheckLease());
}

TEST_F(LeadershipTest, AStandbyPortIsBoundAtOnceAndReleasedForTheLeader) {
  const std::string prefix = NewPrefix();
  Candidate a = Stand(prefix, "127.0.0.1:7005");
  ASSERT_NE(a.leadership, nullptr);
  const std::string at = a.leadership->serve_at();
  // Taken while standing by: nobody else binds it.
  EXPECT_FALSE(StartServer(at, {}, ServerOptions()).ok());
  absl::Notification never;
  ASSERT_OK(a.leadership->Campaign(never, [] {}));
  a.leadership->ReleasePort();
  absl::StatusOr<RunningServer> leader = StartServer(at, {}, ServerOptions());
  ASSERT_OK(leader.status());
  leader->Stop(absl::ZeroDuration());
}

}  // namespace
}  // namespace tessera
