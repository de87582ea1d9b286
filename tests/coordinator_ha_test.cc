// Highly available coordinator (CLI.md v3) on real daemons: three etcd
// members, two coordinators on one prefix (one leads, one stands by), two
// workers and the CLI given both coordinator addresses.
//
// - kill -9 of the leader: the standby leads within its lease, a wait for a
//   version held by the dead leader carries on at the new one, a write is
//   acknowledged through the same address list, nothing acknowledged
//   before is lost, and reads through shard handles taken before go on
//   while no coordinator leads;
// - a leader stopped (SIGSTOP) past its lease is deposed: the other one
//   leads, and when the stopped one resumes it commits nothing, answers no
//   read from its stale state, and exits;
// - one etcd member of three that hangs (quorum intact) costs the leader
//   nothing: its renewals go to the other members;
// - bad input: --metadata with --data_dir, a malformed URL, etcd down.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/tessera_client.h"
#include "coordinator/etcd_client.h"
#include "coordinator/etcd_testutil.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cluster.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

struct Daemon {
  pid_t pid = -1;
  std::string log;
};

Daemon Spawn(const std::vector<std::string>& args, const std::string& log) {
  return Daemon{SpawnDaemon(args, log), log};
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Exit status of `pid` once it exits within `timeout`; -1 if it does not.
int WaitExit(pid_t pid, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  return -1;
}

class CoordinatorHaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    etcd_ = std::make_unique<testing::EtcdCluster>(3, "etcd-ha");
    ASSERT_TRUE(etcd_->ready());
    dir_ = std::getenv("TEST_TMPDIR");
    for (int i = 0; i < 2; ++i) {
      ports_[i] = PickFreePort();
      StartCoordinator(i);
      // The first leads before the second stands by.
      if (i == 0) {
        ASSERT_TRUE(Serving(0));
      }
    }
    addresses_ =
        absl::StrCat("127.0.0.1:", ports_[0], ",127.0.0.1:", ports_[1]);
    for (int w = 0; w < 2; ++w) {
      workers_.push_back(
          Spawn({TestCluster::BinaryPath("worker/tessera-worker"),
                 "--coordinator=" + addresses_, absl::StrCat("--name=w", w),
                 "--listen=127.0.0.1:0"},
                absl::StrCat(dir_, "/w", w, ".log")));
    }
    ASSERT_TRUE(Eventually([&] {
      Result r = Tessera({"workers"});
      return r.code == 0 && absl::StrContains(r.out, "w0") &&
             absl::StrContains(r.out, "w1");
    })) << ReadFile(coordinators_[0].log);
  }
  void TearDown() override {
    for (Daemon& d : workers_) {
      kill(d.pid, SIGKILL);
      waitpid(d.pid, nullptr, 0);
    }
    for (Daemon& d : coordinators_) {
      if (d.pid > 0) {
        kill(d.pid, SIGCONT);
        kill(d.pid, SIGKILL);
        waitpid(d.pid, nullptr, 0);
      }
    }
  }

  // Coordinator `i` on its port, keeping its metadata under etcd `prefix`.
  // `extra`: more flags.
  void StartCoordinator(int i, const std::string& prefix = "ha",
                        const std::vector<std::string>& extra = {}) {
    std::vector<std::string> argv = {
        TestCluster::BinaryPath("coordinator/tessera-coordinator"),
        absl::StrCat("--listen=127.0.0.1:", ports_[i]),
        "--metadata=" + etcd_->url(prefix),
        "--leader_lease=2s",
        "--lease_ms=3000",
        "--heartbeat_ms=250",
        "--snapshot_every=4"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    Daemon d =
        Spawn(argv, absl::StrCat(dir_, "/coordinator", i, "-", prefix, ".log"));
    if (coordinators_.size() <= static_cast<size_t>(i)) {
      coordinators_.resize(static_cast<size_t>(i) + 1);
    }
    coordinators_[static_cast<size_t>(i)] = d;
  }

  struct Result {
    int code = -1;
    std::string out, err;
  };
  Result Tessera(std::vector<std::string> args,
                 const std::string& coordinator = "") {
    args.insert(
        args.begin(),
        {TestCluster::BinaryPath("client/tessera"),
         "--coordinator=" + (coordinator.empty() ? addresses_ : coordinator),
         "--timeout=2"});
    Result r;
    r.code = TestCluster::Run(args, &r.out, &r.err);
    return r;
  }
  bool Serving(int i) {
    return Eventually([&] {
      return Tessera({"ls"}, absl::StrCat("127.0.0.1:", ports_[i])).code == 0;
    });
  }
  // Creates an 8-element tensor on worker `placement` through
  // `coordinator` (default: both) until one create is acknowledged, each
  // try under a new name PREFIX<n> (a try whose answer was lost may have
  // made its name); returns the name acknowledged, "" after 30 s.
  std::string CreateEventually(const std::string& prefix,
                               const std::string& placement,
                               const std::string& coordinator = "") {
    int tries = 0;
    std::string made;
    Eventually([&] {
      const std::string name = absl::StrCat(prefix, tries++);
      if (Tessera({"create", name, "--shape=8", "--dtype=float32",
                   "--chunk_dim=0", "--placements=" + placement, "--init=ones"},
                  coordinator)
              .code != 0) {
        return false;
      }
      made = name;
      return true;
    });
    return made;
  }
  static bool Eventually(const std::function<bool()>& done,
                         absl::Duration timeout = absl::Seconds(30)) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      if (done()) return true;
      absl::SleepFor(absl::Milliseconds(100));
    }
    return false;
  }

  std::unique_ptr<testing::EtcdCluster> etcd_;
  std::string dir_;
  int ports_[2] = {0, 0};
  std::string addresses_;
  std::vector<Daemon> coordinators_;
  std::vector<Daemon> workers_;
};

TEST_F(CoordinatorHaTest, AKilledLeaderIsReplacedAndNothingAcknowledgedIsLost) {
  ASSERT_EQ(Tessera({"create", "x", "--shape=64,16", "--dtype=float32",
                     "--chunk_dim=0", "--placements=w0,w1", "--init=ones"})
                .code,
            0);
  // Both stand; the first leads.
  Result listed = Tessera({"coordinators", "--json"});
  ASSERT_EQ(listed.code, 0) << listed.err;
  EXPECT_EQ(listed.out,
            absl::StrCat("[{\"address\": \"127.0.0.1:", ports_[0],
                         "\", \"role\": \"leader\", \"alive\": true}, "
                         "{\"address\": \"127.0.0.1:",
                         ports_[1],
                         "\", \"role\": \"standby\", \"alive\": true}]\n"));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client,
                       Client::Connect(addresses_));
  ASSERT_OK_AND_ASSIGN(std::vector<ShardHandle> handles, client->Handles("x"));
  // Reads through handles go on while no coordinator leads.
  std::atomic<bool> stop{false};
  std::atomic<int> reads{0}, failed{0};
  std::thread reader([&] {
    while (!stop) {
      for (const ShardHandle& h : handles) {
        absl::StatusOr<HostArray> got = h.ToHere();
        if (got.ok()) {
          ++reads;
        } else {
          ++failed;
        }
      }
    }
  });

  // A wait for x's next version, held by the leader when it dies: it
  // carries on at the new leader and returns at the reshard below.
  absl::StatusOr<uint64_t> waited = absl::UnknownError("not run");
  std::thread waiter([&] {
    absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(addresses_);
    waited = c.ok()
                 ? (*c)->WaitForVersion("x", std::nullopt, absl::Seconds(120))
                 : c.status();
  });
  absl::SleepFor(absl::Milliseconds(500));

  kill(coordinators_[0].pid, SIGKILL);
  waitpid(coordinators_[0].pid, nullptr, 0);
  coordinators_[0].pid = -1;
  const absl::Time killed = absl::Now();
  // The next write through the same address list lands on the new leader.
  const std::string y = CreateEventually("y", "w1");
  ASSERT_FALSE(y.empty()) << ReadFile(coordinators_[1].log);
  std::cerr << "first write acknowledged "
            << absl::FormatDuration(absl::Now() - killed)
            << " after kill -9 of the leader\n";
  stop = true;
  reader.join();
  EXPECT_GT(reads.load(), 0);
  EXPECT_EQ(failed.load(), 0);
  EXPECT_THAT(ReadFile(coordinators_[1].log), HasSubstr("leading etcd prefix"));

  // The second leads; the first is down (its lease ran out).
  listed = Tessera({"coordinators"});
  ASSERT_EQ(listed.code, 0) << listed.err;
  EXPECT_THAT(listed.out, HasSubstr(absl::StrCat("127.0.0.1:", ports_[1],
                                                 "   leader    yes")));
  EXPECT_THAT(listed.out, HasSubstr(absl::StrCat("127.0.0.1:", ports_[0],
                                                 "   standby   no")));
  Result ls = Tessera({"ls"});
  ASSERT_EQ(ls.code, 0) << ls.err;
  EXPECT_THAT(ls.out, HasSubstr("x "));
  EXPECT_THAT(ls.out, HasSubstr(y + " "));
  // Whole reads once both workers have found the new leader.
  EXPECT_TRUE(Eventually([&] {
    return Tessera({"get", "x", "--output=" + dir_ + "/x.npy"}).code == 0;
  }));
  EXPECT_TRUE(Eventually([&] {
    return Tessera({"reshard", "x", "--chunk_dim=1", "--placements=w0,w1"})
               .code == 0;
  }));
  waiter.join();
  ASSERT_TRUE(waited.ok()) << waited.status();
  EXPECT_EQ(*waited, 2u);
}

// Quota use is summed from the metadata by whichever coordinator leads: a
// new leader admits and refuses exactly as the old one did, and its use
// equals the bytes the workers hold for the owner.
TEST_F(CoordinatorHaTest, AfterAFailoverQuotaUseIsTheOwnersBytes) {
  // Both coordinators again, with quotas for the anonymous principal.
  const std::string quotas = dir_ + "/quotas";
  { std::ofstream(quotas) << "* 64K 10\n"; }
  for (int i = 0; i < 2; ++i) {
    kill(coordinators_[i].pid, SIGKILL);
    waitpid(coordinators_[i].pid, nullptr, 0);
  }
  for (int i = 0; i < 2; ++i) {
    StartCoordinator(i, "ha", {"--quotas=" + quotas});
    if (i == 0) {
      ASSERT_TRUE(Serving(0)) << ReadFile(coordinators_[0].log);
    }
  }
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client,
                       Client::Connect(addresses_));
  // What the workers hold, once both have reported to the leader.
  auto held = [&]() -> int64_t {
    absl::StatusOr<std::vector<WorkerInfo>> workers = client->Workers();
    if (!workers.ok() || workers->size() != 2) return -1;
    int64_t total = 0;
    for (const WorkerInfo& w : *workers) {
      if (!w.alive) return -1;
      total += w.bytes_used;
    }
    return total;
  };
  auto use = [&]() -> int64_t {
    absl::StatusOr<std::vector<QuotaInfo>> q = client->Quotas();
    return q.ok() && q->size() == 1 ? (*q)[0].bytes : -1;
  };
  // Both workers have found the restarted leader before the first create
  // (a create placed on a worker not yet re-registered is refused).
  ASSERT_TRUE(Eventually([&] { return held() == 0; }));
  // 16 KiB, twice over (R = 2), and 4 KiB: 36 KiB of 64.
  for (const auto& [name, flags] :
       std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"q1", {"--shape=4096", "--replicas=2"}},
           {"q2", {"--shape=1024"}}}) {
    std::vector<std::string> args = {"create",
                                     name,
                                     "--dtype=float32",
                                     "--chunk_dim=0",
                                     "--placements=w0,w1",
                                     "--init=ones"};
    args.insert(args.end(), flags.begin(), flags.end());
    Result made = Tessera(args);
    ASSERT_EQ(made.code, 0) << made.err;
  }
  EXPECT_TRUE(Eventually([&] { return held() == 36 * 1024; }));
  EXPECT_EQ(use(), 36 * 1024);
  const std::string refusal =
      "quota: principal 'anonymous' uses 36864 of its 65536 bytes; creating "
      "'big' needs 32768 more";
  Result over = Tessera({"create", "big", "--shape=8192", "--dtype=float32",
                         "--chunk_dim=0", "--placements=w0,w1"});
  EXPECT_EQ(over.code, 1);
  EXPECT_THAT(over.err, HasSubstr(refusal));

  kill(coordinators_[0].pid, SIGKILL);
  waitpid(coordinators_[0].pid, nullptr, 0);
  coordinators_[0].pid = -1;
  ASSERT_TRUE(Serving(1)) << ReadFile(coordinators_[1].log);
  // The new leader's use is the owner's bytes, and it refuses the same.
  EXPECT_TRUE(Eventually([&] { return held() == 36 * 1024; }));
  EXPECT_EQ(use(), 36 * 1024);
  over = Tessera({"create", "big", "--shape=8192", "--dtype=float32",
                  "--chunk_dim=0", "--placements=w0,w1"});
  EXPECT_EQ(over.code, 1);
  EXPECT_THAT(over.err, HasSubstr(refusal));
  // A delete there frees room at once.
  Result removed = Tessera({"rm", "q1"});
  ASSERT_EQ(removed.code, 0) << removed.err;
  EXPECT_EQ(use(), 4 * 1024);
  Result made = Tessera({"create", "big", "--shape=8192", "--dtype=float32",
                         "--chunk_dim=0", "--placements=w0,w1"});
  EXPECT_EQ(made.code, 0) << made.err;
  EXPECT_EQ(use(), 36 * 1024);
  EXPECT_TRUE(Eventually([&] { return held() == 36 * 1024; }));
}

// A standby answers every call UNAVAILABLE naming the leader, and clients
// given it first go on to the leader; it follows the metadata as the
// leader writes it, so that when it takes over it reads only the tail.
TEST_F(CoordinatorHaTest, AStandbyNamesTheLeaderAndTakesOverWarm) {
  const std::string leader = absl::StrCat("127.0.0.1:", ports_[0]);
  const std::string standby = absl::StrCat("127.0.0.1:", ports_[1]);
  // Enough changes for snapshots (--snapshot_every=4) and log after them.
  for (int i = 0; i < 6; ++i) {
    ASSERT_EQ(
        Tessera({"create", absl::StrCat("t", i), "--shape=8", "--dtype=float32",
                 "--chunk_dim=0", "--placements=w0", "--init=ones"})
            .code,
        0);
  }
  Result asked = Tessera({"ls"}, standby);
  EXPECT_NE(asked.code, 0);
  EXPECT_THAT(asked.err,
              HasSubstr(absl::StrCat("the coordinator at ", standby,
                                     " stands by; the leader is at ", leader)));
  // Nothing ran on the standby: a write sent there is refused the same way.
  asked = Tessera({"rm", "t0"}, standby);
  EXPECT_NE(asked.code, 0);
  EXPECT_THAT(asked.err, HasSubstr("stands by"));
  // The standby first in the list: the client goes on to the leader.
  const std::string standby_first = absl::StrCat(standby, ",", leader);
  Result created = Tessera({"create", "z", "--shape=8", "--dtype=float32",
                            "--chunk_dim=0", "--placements=w1", "--init=ones"},
                           standby_first);
  ASSERT_EQ(created.code, 0) << created.err;
  Result ls = Tessera({"ls"}, standby_first);
  ASSERT_EQ(ls.code, 0) << ls.err;
  EXPECT_THAT(ls.out, HasSubstr("t0 "));
  EXPECT_THAT(ls.out, HasSubstr("z "));

  kill(coordinators_[0].pid, SIGKILL);
  waitpid(coordinators_[0].pid, nullptr, 0);
  coordinators_[0].pid = -1;
  const std::string after = CreateEventually("after", "w1", standby_first);
  ASSERT_FALSE(after.empty()) << ReadFile(coordinators_[1].log);
  // It had followed the snapshot and the log: at promotion it read no
  // snapshot again.
  const std::string log = ReadFile(coordinators_[1].log);
  EXPECT_THAT(log, HasSubstr("took over the metadata: read 0 snapshot(s)"));
  EXPECT_THAT(log, ::testing::ContainsRegex(
                       "after [1-9][0-9]* and [0-9]+ while standing by"));
  ls = Tessera({"ls"}, standby);
  ASSERT_EQ(ls.code, 0) << ls.err;
  for (const std::string& name :
       {std::string("t0"), std::string("t5"), std::string("z"), after}) {
    EXPECT_THAT(ls.out, HasSubstr(name + " "));
  }
}

TEST_F(CoordinatorHaTest, AStoppedLeaderIsDeposedAndCommitsNothingAfter) {
  ASSERT_EQ(Tessera({"create", "a", "--shape=8", "--dtype=float32",
                     "--chunk_dim=0", "--placements=w0", "--init=ones"})
                .code,
            0);
  // Stopped past its lease: the standby leads.
  kill(coordinators_[0].pid, SIGSTOP);
  const std::string b =
      CreateEventually("b", "w1", absl::StrCat("127.0.0.1:", ports_[1]));
  ASSERT_FALSE(b.empty()) << ReadFile(coordinators_[1].log);
  // The new leader deletes "a": the deposed one still has it in memory.
  ASSERT_EQ(Tessera({"rm", "a"}, absl::StrCat("127.0.0.1:", ports_[1])).code,
            0);
  // Resumed, the deposed leader finds its lease gone and exits; a write
  // it was sent meanwhile is never acknowledged, and a read answers not
  // from its stale state (it lists no "a"): its lease deadline has passed.
  std::thread late([&] {
    Result r = Tessera({"create", "c", "--shape=8", "--dtype=float32",
                        "--chunk_dim=0", "--placements=w0", "--init=ones"},
                       absl::StrCat("127.0.0.1:", ports_[0]));
    EXPECT_NE(r.code, 0) << r.out;
  });
  std::thread stale_read([&] {
    Result r = Tessera({"ls", "--json"}, absl::StrCat("127.0.0.1:", ports_[0]));
    EXPECT_THAT(r.out, ::testing::Not(HasSubstr("\"name\": \"a\""))) << r.err;
  });
  absl::SleepFor(absl::Milliseconds(300));
  kill(coordinators_[0].pid, SIGCONT);
  EXPECT_EQ(WaitExit(coordinators_[0].pid, absl::Seconds(15)), 1)
      << ReadFile(coordinators_[0].log);
  coordinators_[0].pid = -1;
  late.join();
  stale_read.join();
  EXPECT_THAT(ReadFile(coordinators_[0].log), HasSubstr("lost the leader"));
  Result ls = Tessera({"ls"});
  ASSERT_EQ(ls.code, 0) << ls.err;
  EXPECT_THAT(Tessera({"ls", "--json"}).out,
              ::testing::Not(HasSubstr("\"name\": \"a\"")));
  EXPECT_THAT(ls.out, HasSubstr(b + " "));
  EXPECT_THAT(ls.out, ::testing::Not(HasSubstr("c ")));
}

// One etcd member of three that hangs (SIGSTOP; quorum intact) costs the
// leader nothing: a renewal it does not answer in its share of the lease
// goes on to the other members. Each follower hangs in turn, past the
// lease. (etcd's own raft leader is not stopped: etcd 3.4 revokes every
// lease when a paused raft leader resumes, etcd-io/etcd#12528, whatever its
// clients do.)
TEST_F(CoordinatorHaTest, AHungEtcdMemberDoesNotDeposeTheLeader) {
  const std::vector<std::string> endpoints = etcd_->endpoints();
  // (The log file is shared with the tests before: only this one's lines.)
  const size_t log_before = ReadFile(coordinators_[0].log).size();
  // The raft leader's member id, and each member's, from etcdctl.
  auto status_of = [&](const std::string& endpoint) {
    std::string out, err;
    TestCluster::Run({"/usr/bin/etcdctl", "--endpoints=" + endpoint, "endpoint",
                      "status", "-w", "json"},
                     &out, &err);
    auto field = [&](const std::string& key) {
      const size_t at = out.find("\"" + key + "\":");
      return at == std::string::npos
                 ? std::string()
                 : out.substr(at + key.size() + 3, out.find_first_of(",}", at) -
                                                       at - key.size() - 3);
    };
    return std::make_pair(field("member_id"), field("leader"));
  };
  int stalled = 0;
  for (size_t member = 0; member < endpoints.size(); ++member) {
    const auto [id, leader] = status_of(endpoints[member]);
    ASSERT_FALSE(id.empty()) << endpoints[member];
    if (id == leader) continue;
    ++stalled;
    ASSERT_EQ(kill(etcd_->pid(static_cast<int>(member)), SIGSTOP), 0);
    absl::SleepFor(absl::Seconds(3));
    ASSERT_EQ(kill(etcd_->pid(static_cast<int>(member)), SIGCONT), 0);
    absl::SleepFor(absl::Milliseconds(700));
    int status = 0;
    ASSERT_EQ(waitpid(coordinators_[0].pid, &status, WNOHANG), 0)
        << "the leader exited while etcd member " << member
        << " hung: " << ReadFile(coordinators_[0].log);
  }
  EXPECT_EQ(stalled, 2);
  EXPECT_THAT(ReadFile(coordinators_[0].log).substr(log_before),
              ::testing::Not(HasSubstr("lost the leader")));
  const std::string made =
      CreateEventually("h", "w0", absl::StrCat("127.0.0.1:", ports_[0]));
  EXPECT_FALSE(made.empty()) << ReadFile(coordinators_[0].log);
}

// etcd without quorum: writes fail, the leader, unable to renew its lease,
// steps down (it exits, to be started again), and the standby waits for
// etcd instead of exiting; once quorum is back it leads, with everything
// acknowledged before.
TEST_F(CoordinatorHaTest, WithoutQuorumTheStandbyWaitsAndLeadsOnceItIsBack) {
  ASSERT_EQ(Tessera({"create", "q", "--shape=8", "--dtype=float32",
                     "--chunk_dim=0", "--placements=w0", "--init=ones"})
                .code,
            0);
  etcd_->Kill(1);
  etcd_->Kill(2);
  EXPECT_NE(Tessera({"create", "lost", "--shape=8", "--dtype=float32",
                     "--chunk_dim=0", "--placements=w0", "--init=ones"})
                .code,
            0);
  EXPECT_EQ(WaitExit(coordinators_[0].pid, absl::Seconds(15)), 1)
      << ReadFile(coordinators_[0].log);
  coordinators_[0].pid = -1;
  absl::SleepFor(absl::Seconds(2));
  int status = 0;
  ASSERT_EQ(waitpid(coordinators_[1].pid, &status, WNOHANG), 0)
      << "the standby exited while etcd had no quorum: "
      << ReadFile(coordinators_[1].log);
  etcd_->Start(1);
  etcd_->Start(2);
  const std::string r = CreateEventually("r", "w1");
  ASSERT_FALSE(r.empty()) << ReadFile(coordinators_[1].log);
  Result ls = Tessera({"ls"});
  EXPECT_THAT(ls.out, HasSubstr("q "));
  EXPECT_THAT(ls.out, HasSubstr(r + " "));
  // ("lost" was refused UNAVAILABLE: whether its write reached etcd is
  // unknown, as for any timed-out call.)
}

// A coordinator started on another prefix is another cluster: workers that
// come to it keep the shards of their own cluster (quarantined, never freed
// on its word), and serve them again once their cluster's leader is back.
TEST_F(CoordinatorHaTest, AnotherPrefixIsAnotherClusterAndWorkersQuarantine) {
  ASSERT_EQ(Tessera({"create", "x", "--shape=64,16", "--dtype=float32",
                     "--chunk_dim=0", "--placements=w0,w1", "--init=ones"})
                .code,
            0);
  for (Daemon& d : coordinators_) {
    kill(d.pid, SIGKILL);
    waitpid(d.pid, nullptr, 0);
    d.pid = -1;
  }
  // The first address now serves prefix "typo": a new, empty cluster.
  StartCoordinator(0, "typo");
  ASSERT_TRUE(Eventually([&] {
    Result r = Tessera({"workers"});
    return r.code == 0 && absl::StrContains(r.out, "w0 keeps 1 shard(s)") &&
           absl::StrContains(r.out, "w1 keeps 1 shard(s)");
  })) << Tessera({"workers"}).out
      << ReadFile(coordinators_[0].log);
  Result ls = Tessera({"ls"});
  ASSERT_EQ(ls.code, 0) << ls.err;
  EXPECT_THAT(ls.out, ::testing::Not(HasSubstr("x ")));
  // Back to the cluster's own prefix: x reads whole.
  kill(coordinators_[0].pid, SIGKILL);
  waitpid(coordinators_[0].pid, nullptr, 0);
  StartCoordinator(0);
  ASSERT_TRUE(Eventually([&] {
    return Tessera({"get", "x", "--output=" + dir_ + "/x-back.npy"}).code == 0;
  })) << ReadFile(coordinators_[0].log);
  Result workers = Tessera({"workers"});
  EXPECT_THAT(workers.out, ::testing::Not(HasSubstr("quarantined")));
}

// etcd with client-certificate auth (TLS): a coordinator given the CA and a
// certificate of it leads and serves; one without is refused by etcd and
// says etcd is unreachable.
TEST(CoordinatorHaTlsTest, EtcdOverTlsNeedsTheClientCertificate) {
  const std::string certs = std::string(std::getenv("TEST_TMPDIR")) + "/certs";
  std::string out, err;
  const std::string script =
      absl::StrCat(std::getenv("TEST_SRCDIR"), "/tessera/deploy/make-certs.sh");
  ASSERT_EQ(TestCluster::Run({"/bin/bash", script, certs, "--workers", "0"},
                             &out, &err),
            0)
      << err;
  testing::EtcdTls tls{certs + "/ca.crt", certs + "/coordinator.crt",
                       certs + "/coordinator.key"};
  testing::EtcdCluster etcd(1, "etcd-tls", tls);
  ASSERT_TRUE(etcd.ready());
  const std::string coordinator =
      TestCluster::BinaryPath("coordinator/tessera-coordinator");
  const std::string metadata = "--metadata=" + etcd.url("tls");
  EXPECT_EQ(TestCluster::Run(
                {coordinator,
                 absl::StrCat("--listen=127.0.0.1:", PickFreePort()), metadata},
                &out, &err),
            1);
  EXPECT_THAT(out + err, HasSubstr("etcd is unreachable"));
  const int port = PickFreePort();
  Daemon leader = Spawn({coordinator, absl::StrCat("--listen=127.0.0.1:", port),
                         metadata, "--etcd_ca=" + tls.ca,
                         "--etcd_cert=" + tls.cert, "--etcd_key=" + tls.key},
                        certs + "/../coordinator-tls.log");
  const std::string cli = TestCluster::BinaryPath("client/tessera");
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  int code = -1;
  while (absl::Now() < deadline && code != 0) {
    code = TestCluster::Run(
        {cli, absl::StrCat("--coordinator=127.0.0.1:", port), "coordinators"},
        &out, &err);
    if (code != 0) absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ(code, 0) << ReadFile(certs + "/../coordinator-tls.log");
  EXPECT_THAT(out, HasSubstr("leader"));
  kill(leader.pid, SIGTERM);
  EXPECT_EQ(WaitExit(leader.pid, absl::Seconds(15)), 0);
}

TEST(CoordinatorHaFlagsTest, BadMetadataFlagsAndAnUnreachableEtcdAreClear) {
  const std::string coordinator =
      TestCluster::BinaryPath("coordinator/tessera-coordinator");
  std::string out, log;
  const std::string listen =
      absl::StrCat("--listen=127.0.0.1:", PickFreePort());
  EXPECT_EQ(
      TestCluster::Run({coordinator, listen, "--metadata=etcd://127.0.0.1:1/p",
                        "--data_dir=/tmp/x"},
                       &log, &out),
      2);
  EXPECT_THAT(log + out, HasSubstr("--data_dir"));
  EXPECT_EQ(
      TestCluster::Run({coordinator, listen, "--metadata=http://127.0.0.1:1/p"},
                       &log, &out),
      2);
  EXPECT_THAT(log + out, HasSubstr("etcd://"));
  EXPECT_EQ(TestCluster::Run(
                {coordinator, listen, "--metadata=etcd://127.0.0.1:notaport/p"},
                &log, &out),
            2);
  EXPECT_THAT(log + out, HasSubstr("not HOST:PORT"));
  // Leases are whole seconds, renewed every third: 0 would spin.
  EXPECT_EQ(
      TestCluster::Run({coordinator, listen, "--metadata=etcd://127.0.0.1:1/p",
                        "--leader_lease=0s"},
                       &log, &out),
      2);
  EXPECT_THAT(log + out, HasSubstr("--leader_lease"));
  EXPECT_EQ(
      TestCluster::Run({coordinator, listen, "--metadata=etcd://127.0.0.1:1/p",
                        "--advertise=no-port"},
                       &log, &out),
      2);
  EXPECT_THAT(log + out, HasSubstr("--advertise"));
  // Port 0 is known only once serving: a standby could not be named.
  EXPECT_EQ(TestCluster::Run({coordinator, "--listen=127.0.0.1:0",
                              "--metadata=etcd://127.0.0.1:1/p"},
                             &log, &out),
            2);
  EXPECT_THAT(log + out, HasSubstr("--listen port other than 0"));
  const int closed = PickFreePort();
  EXPECT_EQ(TestCluster::Run(
                {coordinator, listen,
                 absl::StrCat("--metadata=etcd://127.0.0.1:", closed, "/p")},
                &log, &out),
            1);
  EXPECT_THAT(log + out, HasSubstr("etcd is unreachable"));
  EXPECT_THAT(log + out, HasSubstr(absl::StrCat("127.0.0.1:", closed)));
}

// A coordinator given a prefix that is not its own — another tool's keys,
// or inside another cluster's metadata (its log, where a stray key would
// stop that cluster's standby from following) — is refused before it writes
// anything: no election key, no cluster secret.
TEST(CoordinatorHaPrefixTest, AForeignOrNestedPrefixIsRefusedUntouched) {
  testing::EtcdCluster etcd(1, "etcd-prefix");
  ASSERT_TRUE(etcd.ready());
  auto client =
      std::make_shared<EtcdClient>(etcd.endpoints(), EtcdClientOptions{});
  const std::string coordinator =
      TestCluster::BinaryPath("coordinator/tessera-coordinator");
  const std::string dir = std::getenv("TEST_TMPDIR");
  // A real cluster on "ours": its prefix holds tessera's format key.
  const int port = PickFreePort();
  Daemon ours = Spawn({coordinator, absl::StrCat("--listen=127.0.0.1:", port),
                       "--metadata=" + etcd.url("ours"), "--leader_lease=2s"},
                      dir + "/prefix-ours.log");
  bool formatted = false;
  for (const absl::Time give_up = absl::Now() + absl::Seconds(30);
       !formatted && absl::Now() < give_up;
       absl::SleepFor(absl::Milliseconds(100))) {
    absl::StatusOr<std::vector<mvccpb::KeyValue>> format =
        client->Range("ours/format");
    formatted = format.ok() && !format->empty();
  }
  ASSERT_TRUE(formatted) << ReadFile(dir + "/prefix-ours.log");
  // Another tool's keys.
  {
    etcdserverpb::TxnRequest txn;
    auto* put = txn.add_success()->mutable_request_put();
    put->set_key("foreign/settings");
    put->set_value("x");
    ASSERT_TRUE(client->Txn(txn).ok());
  }
  const std::pair<std::string, std::string> refused[] = {
      {"foreign", "not tessera's metadata"},
      {"ours/log", "lies inside the tessera metadata of prefix ours/"},
      {"ours/election/x", "lies inside the tessera metadata of prefix ours/"},
  };
  for (const auto& [prefix, why] : refused) {
    std::string log, out;
    // Bounded: a coordinator that took the prefix would stand by for good.
    EXPECT_EQ(TestCluster::Run(
                  {"/usr/bin/timeout", "20", coordinator,
                   absl::StrCat("--listen=127.0.0.1:", PickFreePort()),
                   "--metadata=" + etcd.url(prefix), "--leader_lease=2s"},
                  &log, &out),
              1)
        << prefix;
    EXPECT_THAT(log + out, HasSubstr(why)) << prefix;
    for (const std::string& key :
         {prefix + "/cluster_secret", prefix + "/election/"}) {
      absl::StatusOr<std::optional<std::string>> any =
          client->FirstKey(key, PrefixEnd(key));
      ASSERT_TRUE(any.ok());
      EXPECT_FALSE(any->has_value()) << "written: " << **any;
    }
  }
  kill(ours.pid, SIGKILL);
  waitpid(ours.pid, nullptr, 0);
}

}  // namespace
}  // namespace tessera
