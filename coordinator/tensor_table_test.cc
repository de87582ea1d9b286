#include "coordinator/tensor_table.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "coordinator/coordinator_testutil.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::tessera::testing::ControlledStore;
using ::tessera::testing::FakeClock;
using ::tessera::testing::IsOkAndHolds;
using ::tessera::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

// A shard of one replica, not placed yet.
ShardInfo OneReplica() {
  ShardInfo shard;
  shard.replicas.emplace_back();
  return shard;
}

class TensorTableTest : public ::testing::Test {
 protected:
  TensorTableTest()
      : store_(std::make_unique<MemoryMetadataStore>()),
        log_(&store_, MetadataLog::Options()),
        table_(Options(), &log_) {}

  TensorTable::Options Options() {
    TensorTable::Options options;
    options.clock = clock_.AsClock();
    options.retire_grace = absl::Seconds(5);
    options.pending_timeout = absl::Minutes(10);
    return options;
  }

  // A tensor of `n` one-row shards on workers w0, w1, ... (ids not yet set).
  static std::shared_ptr<TensorMetadata> Meta(const std::string& name, int n,
                                              uint64_t version = 1) {
    auto meta = std::make_shared<TensorMetadata>();
    meta->name = name;
    meta->shape = {n, 2};
    meta->version = version;
    for (int i = 0; i < n; ++i) {
      ShardInfo shard;
      shard.box = Box{{i, 0}, {1, 2}};
      Replica& replica = shard.replicas.emplace_back();
      replica.rank = i;
      replica.worker = absl::StrCat("w", i);
      meta->shards.push_back(shard);
    }
    return meta;
  }

  // Runs a whole create through the table (as the orchestrator does); a
  // put (`pending`) gets change id 77.
  TensorMetadataPtr Create(const std::string& name, int n, bool pending = false,
                           const std::string& owner = "") {
    std::shared_ptr<TensorMetadata> meta = Meta(name, n);
    if (pending) meta->change = 77;
    EXPECT_OK(table_.ReserveName(name, owner));
    EXPECT_OK(log_.Wait(table_.ReserveIds(absl::MakeSpan(meta->shards))));
    EXPECT_OK(log_.Wait(table_.CommitCreate(meta, pending)));
    if (!pending) table_.FinishCreate(name);
    return meta;
  }

  // Version N+1 of `old` on `n` new shards, committed; returns it.
  TensorMetadataPtr Reshard(const TensorMetadataPtr& old, int n) {
    EXPECT_OK(table_.BeginReshard(old->name, 0));
    std::shared_ptr<TensorMetadata> next = Meta(old->name, n, old->version + 1);
    EXPECT_OK(log_.Wait(table_.ReserveIds(absl::MakeSpan(next->shards))));
    auto ticket = table_.CommitReshard(old, next);
    EXPECT_OK(ticket);
    table_.FinishReshard(next, *old, log_.Wait(*ticket));
    table_.EndReshard(old->name);
    return next;
  }

  // Commits change `change` of `name` at `version` as the orchestrator
  // does (the sealing between is the orchestrator's).
  absl::Status Commit(const std::string& name, uint64_t version,
                      const std::string& principal, uint64_t change) {
    absl::StatusOr<CommitStart> start =
        table_.BeginCommit(name, version, principal, change);
    if (!start.ok()) return start.status();
    if (start->done) return absl::OkStatus();
    absl::Status status = log_.Wait(table_.RecordCommit(name));
    table_.FinishCommit(name, status);
    return status;
  }

  FakeClock clock_;
  ControlledStore store_;
  MetadataLog log_;
  TensorTable table_;
};

TEST_F(TensorTableTest, ACreateIsInvisibleUntilItsRecordIsDurable) {
  std::shared_ptr<TensorMetadata> meta = Meta("a", 2);
  ASSERT_OK(table_.ReserveName("a"));
  EXPECT_THAT(table_.Get("a").status(), StatusIs(absl::StatusCode::kNotFound));
  ASSERT_OK(log_.Wait(table_.ReserveIds(absl::MakeSpan(meta->shards))));
  store_.Hold();
  const TensorTable::Ticket ticket = table_.CommitCreate(meta, false);
  store_.WaitUntilBlocked();
  EXPECT_THAT(table_.Get("a").status(), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(table_.List(), IsEmpty());
  store_.Release();
  ASSERT_OK(log_.Wait(ticket));
  // Durable, but published only by FinishCreate.
  EXPECT_THAT(table_.Get("a").status(), StatusIs(absl::StatusCode::kNotFound));
  table_.FinishCreate("a");
  ASSERT_OK(table_.Get("a"));
  EXPECT_EQ((*table_.Get("a"))->shards.size(), 2u);
  ASSERT_EQ(table_.List().size(), 1u);
  EXPECT_EQ(table_.List()[0].num_shards, 2);
}

TEST_F(TensorTableTest, ANameIsTakenFromItsReservation) {
  ASSERT_OK(table_.ReserveName("a"));
  EXPECT_THAT(table_.ReserveName("a"),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("'a'")));
  table_.AbandonCreate(*Meta("a", 1));
  EXPECT_OK(table_.ReserveName("a"));
}

TEST_F(TensorTableTest, ShardIdsAreRandomDistinctAndNeedNoRecord) {
  std::vector<ShardInfo> first(1000, OneReplica()), second(2, OneReplica());
  EXPECT_EQ(table_.ReserveIds(absl::MakeSpan(first)), 0u);
  table_.ReserveIds(absl::MakeSpan(second));
  absl::flat_hash_set<uint64_t> seen;
  int small = 0;
  for (const ShardInfo& s : first) {
    EXPECT_NE(s.replicas[0].shard_id, 0u);
    EXPECT_TRUE(seen.insert(s.replicas[0].shard_id).second);
    if (s.replicas[0].shard_id < (uint64_t{1} << 32)) ++small;
  }
  // Not a counter: almost all ids use the high bits.
  EXPECT_LT(small, 5);
  EXPECT_TRUE(table_.IsReferenced(second[1].replicas[0].shard_id));
  table_.ReleaseIds(second);
  EXPECT_FALSE(table_.IsReferenced(second[1].replicas[0].shard_id));
}

TEST_F(TensorTableTest, RestoreKeepsRecoveredIdsReferenced) {
  MetadataState state;
  std::shared_ptr<TensorMetadata> meta = Meta("a", 2);
  meta->shards[0].replicas[0].shard_id = 10;
  meta->shards[1].replicas[0].shard_id = 11;
  state.tensors["a"] = meta;
  table_.Restore(state);
  EXPECT_THAT(table_.Get("a"), IsOkAndHolds(TensorMetadataPtr(meta)));
  EXPECT_TRUE(table_.IsReferenced(11));
}

TEST_F(TensorTableTest, OnlyTheOwnerOfAPutCommitsIt) {
  Create("p", 1, /*pending=*/true, "alice");
  EXPECT_THAT(table_.BeginCommit("p", 1, "mallory", 77),
              StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(table_.Get("p"), StatusIs(absl::StatusCode::kNotFound));
  ASSERT_OK(Commit("p", 1, "alice", 77));
  EXPECT_OK(table_.Get("p"));
}

// Writer A's put of x is pending; the name is then replaced (A's put
// abandoned and B's committed): A's commit must not commit B's tensor, nor
// its abandon delete it.
TEST_F(TensorTableTest, ACommitOrAbandonNamesItsOwnChange) {
  TensorMetadataPtr a = Create("x", 1, /*pending=*/true);
  ASSERT_OK(table_.Abandon("x", 1, "", 77));
  EXPECT_FALSE(table_.IsReferenced(a->shards[0].replicas[0].shard_id));
  std::shared_ptr<TensorMetadata> b = Meta("x", 2);
  b->change = 88;
  ASSERT_OK(table_.ReserveName("x"));
  ASSERT_OK(log_.Wait(table_.ReserveIds(absl::MakeSpan(b->shards))));
  EXPECT_EQ(table_.CommitCreate(b, /*pending=*/true), 0u);
  EXPECT_THAT(Commit("x", 1, "", 77),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("replaced")));
  EXPECT_THAT(table_.Abandon("x", 1, "", 77).status(),
              StatusIs(absl::StatusCode::kAborted));
  EXPECT_THAT(Commit("x", 1, "", 0), StatusIs(absl::StatusCode::kAborted));
  ASSERT_OK(Commit("x", 1, "", 88));
  // B's tensor, whole; A's late commit still refused, B's again a no-op.
  EXPECT_EQ((*table_.Get("x"))->shards.size(), 2u);
  EXPECT_THAT(Commit("x", 1, "", 77), StatusIs(absl::StatusCode::kAborted));
  EXPECT_OK(Commit("x", 1, "", 88));
  EXPECT_THAT(table_.Abandon("x", 1, "", 88).status(),
              StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(TensorTableTest, AnotherPrincipalsPendingPutIsNotTheirsToDelete) {
  Create("p", 1, /*pending=*/true, "alice");
  EXPECT_THAT(table_.BeginDelete("p", "mallory", /*admin=*/false).status(),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("being put by another principal")));
  EXPECT_OK(table_.BeginDelete("p", "alice", /*admin=*/false));
}

TEST_F(TensorTableTest, ADeleteNamingAnIncarnationSparesALaterTensor) {
  std::shared_ptr<TensorMetadata> meta = Meta("a", 1);
  meta->incarnation = 5;
  ASSERT_OK(table_.ReserveName("a"));
  ASSERT_OK(log_.Wait(table_.ReserveIds(absl::MakeSpan(meta->shards))));
  ASSERT_OK(log_.Wait(table_.CommitCreate(meta, false)));
  table_.FinishCreate("a");
  EXPECT_THAT(table_.BeginDelete("a", "", true, /*incarnation=*/4).status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("replaced")));
  EXPECT_OK(table_.BeginDelete("a", "", true, /*incarnation=*/5));
}

TEST_F(TensorTableTest, PendingChangesAreListedWithWhoAndSince) {
  Create("p", 1, /*pending=*/true, "alice");
  TensorMetadataPtr u = Create("u", 2);
  clock_.Advance(absl::Seconds(30));
  EXPECT_EQ(table_.List().size(), 1u) << "a pending put is not visible";
  EXPECT_THAT(table_.Get("p").status(),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("a put of it is by 'alice' pending since")));
  ASSERT_OK(table_.BeginReshard("u", 1));
  auto next = std::make_shared<TensorMetadata>(*u);
  next->version = 2;
  next->change = 99;
  TensorMetadata fresh = *next;
  table_.StageUpdate(next, std::move(fresh), "bob");
  clock_.Advance(absl::Seconds(5));
  const std::vector<TensorSummary> all = table_.List(/*all=*/true);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].name, "p");
  EXPECT_EQ(all[0].pending, TensorSummary::Pending::kPut);
  EXPECT_EQ(all[0].pending_owner, "alice");
  EXPECT_EQ(all[1].pending, TensorSummary::Pending::kUpdate);
  EXPECT_EQ(all[1].pending_version, 2u);
  EXPECT_EQ(all[1].pending_owner, "bob");
  EXPECT_THAT(table_.PendingNote("u"),
              HasSubstr("an update to version 2 by 'bob' pending since"));
  // A second change says what is pending and how it ends.
  EXPECT_THAT(
      table_.BeginReshard("u", 0).status(),
      StatusIs(absl::StatusCode::kAborted, HasSubstr("pending_timeout")));
}

TEST_F(TensorTableTest, AReshardShowsVersionNUntilNPlus1IsDurable) {
  TensorMetadataPtr v1 = Create("a", 2);
  ASSERT_OK(table_.BeginReshard("a", 1));
  std::shared_ptr<TensorMetadata> v2 = Meta("a", 1, 2);
  ASSERT_OK(log_.Wait(table_.ReserveIds(absl::MakeSpan(v2->shards))));
  store_.Hold();
  auto ticket = table_.CommitReshard(v1, v2);
  ASSERT_OK(ticket);
  store_.WaitUntilBlocked();
  EXPECT_EQ((*table_.Get("a"))->version, 1u);
  store_.Release();
  table_.FinishReshard(v2, *v1, log_.Wait(*ticket));
  table_.EndReshard("a");
  EXPECT_EQ((*table_.Get("a"))->version, 2u);
  EXPECT_EQ(table_.List()[0].version, 2u);
}

TEST_F(TensorTableTest, ReplacedVersionIsRetiredAfterItsGrace) {
  TensorMetadataPtr v1 = Create("a", 2);
  ASSERT_OK(table_.GetLeased("a"));  // a reader that never says it is done
  TensorMetadataPtr v2 = Reshard(v1, 1);
  EXPECT_EQ(table_.NumRetired(), 1u);
  EXPECT_TRUE(table_.IsReferenced(v1->shards[0].replicas[0].shard_id));
  clock_.Advance(absl::Seconds(4));
  EXPECT_THAT(table_.TakeDue(), IsEmpty());
  clock_.Advance(absl::Seconds(2));
  std::vector<TensorMetadataPtr> due = table_.TakeDue();
  ASSERT_EQ(due.size(), 1u);
  EXPECT_EQ(due[0]->version, 1u);
  EXPECT_EQ(due[0]->shards.size(), 2u);
  EXPECT_FALSE(table_.IsReferenced(v1->shards[0].replicas[0].shard_id));
  EXPECT_TRUE(table_.IsReferenced(v2->shards[0].replicas[0].shard_id));
  EXPECT_EQ(table_.NumRetired(), 0u);
}

TEST_F(TensorTableTest, AReshardWhoseRecordFailedKeepsVersionN) {
  TensorMetadataPtr v1 = Create("a", 2);
  ASSERT_OK(table_.BeginReshard("a", 0));
  std::shared_ptr<TensorMetadata> v2 = Meta("a", 1, 2);
  ASSERT_OK(log_.Wait(table_.ReserveIds(absl::MakeSpan(v2->shards))));
  store_.FailAppends(1, absl::InternalError("no space"));
  auto ticket = table_.CommitReshard(v1, v2);
  ASSERT_OK(ticket);
  const absl::Status recorded = log_.Wait(*ticket);
  EXPECT_THAT(recorded, StatusIs(absl::StatusCode::kInternal));
  table_.FinishReshard(v2, *v1, recorded);
  table_.EndReshard("a");
  EXPECT_EQ((*table_.Get("a"))->version, 1u);
  EXPECT_EQ(table_.NumRetired(), 0u);
  EXPECT_EQ(log_.DurableState().tensors.at("a")->version, 1u);
}

TEST_F(TensorTableTest, OneReshardAtATimeAndOnlyOfTheExpectedVersion) {
  Create("a", 2);
  EXPECT_THAT(table_.BeginReshard("a", 7),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("version 1")));
  ASSERT_OK(table_.BeginReshard("a", 1));
  EXPECT_THAT(table_.BeginReshard("a", 0),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("in progress")));
  EXPECT_THAT(table_.BeginDelete("a").status(),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("resharded")));
  table_.EndReshard("a");
  EXPECT_OK(table_.BeginReshard("a", 1));
  EXPECT_THAT(table_.BeginReshard("missing", 0).status(),
              StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(TensorTableTest, APutIsPendingUntilCommitted) {
  TensorMetadataPtr meta = Create("a", 2, /*pending=*/true);
  EXPECT_THAT(table_.Get("a").status(), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(table_.BeginCommit("a", 2, "", 77).status(),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("version 2")));
  absl::StatusOr<CommitStart> start = table_.BeginCommit("a", 1, "", 77);
  ASSERT_OK(start);
  EXPECT_FALSE(start->done);
  EXPECT_EQ(start->seal, meta) << "the put's shards are sealed first";
  table_.FinishCommit("a", log_.Wait(table_.RecordCommit("a")));
  EXPECT_OK(table_.Get("a"));
  // Committing again is a no-op.
  start = table_.BeginCommit("a", 1, "", 77);
  ASSERT_OK(start);
  EXPECT_TRUE(start->done);
  EXPECT_THAT(table_.BeginCommit("b", 1, "", 77).status(),
              StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(TensorTableTest, ACommitWhoseRecordFailedLeavesThePutPending) {
  Create("a", 1, /*pending=*/true);
  store_.FailAppends(1, absl::InternalError("no space"));
  EXPECT_THAT(Commit("a", 1, "", 77), StatusIs(absl::StatusCode::kInternal));
  EXPECT_THAT(table_.Get("a").status(), StatusIs(absl::StatusCode::kNotFound));
  ASSERT_OK(Commit("a", 1, "", 77));
  EXPECT_OK(table_.Get("a"));
}

TEST_F(TensorTableTest, APutNeverCommittedIsRemovedAfterItsTimeout) {
  TensorMetadataPtr meta = Create("a", 2, /*pending=*/true);
  clock_.Advance(absl::Minutes(9));
  EXPECT_THAT(table_.TakeDue(), IsEmpty());
  clock_.Advance(absl::Minutes(2));
  std::vector<TensorMetadataPtr> due = table_.TakeDue();
  ASSERT_EQ(due.size(), 1u);
  EXPECT_EQ(due[0], meta);
  EXPECT_FALSE(table_.IsReferenced(meta->shards[0].replicas[0].shard_id));
  EXPECT_THAT(table_.BeginCommit("a", 1, "", 77).status(),
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_OK(table_.ReserveName("a"));
}

// Stages an update of `old` whose shard 0 is new and the rest kept.
TensorMetadataPtr StageUpdateOf(TensorTable& table, MetadataLog& log,
                                const TensorMetadataPtr& old,
                                const std::string& owner) {
  EXPECT_OK(table.BeginReshard(old->name, old->version));
  auto next = std::make_shared<TensorMetadata>(*old);
  next->version = old->version + 1;
  next->change = 55;
  TensorMetadata fresh = *next;
  fresh.shards.resize(1);
  EXPECT_OK(log.Wait(table.ReserveIds(absl::MakeSpan(fresh.shards))));
  next->shards[0].replicas[0].shard_id = fresh.shards[0].replicas[0].shard_id;
  table.StageUpdate(next, std::move(fresh), owner);
  return next;
}

TEST_F(TensorTableTest, AStagedUpdateIsInvisibleUntilCommittedThenRetiresN) {
  TensorMetadataPtr v1 = Create("a", 3);
  TensorMetadataPtr v2 = StageUpdateOf(table_, log_, v1, "p");
  EXPECT_EQ((*table_.Get("a"))->version, 1u);
  // One change at a time; only its owner commits.
  EXPECT_THAT(table_.BeginReshard("a", 0).status(),
              StatusIs(absl::StatusCode::kAborted));
  EXPECT_THAT(table_.BeginCommit("a", 2, "q", 55).status(),
              StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(table_.BeginCommit("a", 2, "p", 54).status(),
              StatusIs(absl::StatusCode::kAborted));
  ASSERT_OK(Commit("a", 2, "p", 55));
  EXPECT_EQ((*table_.Get("a"))->version, 2u);
  EXPECT_EQ(log_.DurableState().tensors.at("a")->version, 2u);
  EXPECT_OK(Commit("a", 2, "p", 55));
  // Only the replaced shard retires; the kept ones stay referenced.
  clock_.Advance(absl::Seconds(6));
  std::vector<TensorMetadataPtr> due = table_.TakeDue();
  ASSERT_EQ(due.size(), 1u);
  ASSERT_EQ(due[0]->shards.size(), 1u);
  EXPECT_EQ(due[0]->shards[0].replicas[0].shard_id,
            v1->shards[0].replicas[0].shard_id);
  EXPECT_FALSE(table_.IsReferenced(v1->shards[0].replicas[0].shard_id));
  EXPECT_TRUE(table_.IsReferenced(v1->shards[1].replicas[0].shard_id));
  EXPECT_TRUE(table_.IsReferenced(v2->shards[0].replicas[0].shard_id));
  EXPECT_OK(table_.BeginReshard("a", 2));
}

TEST_F(TensorTableTest, AStagedUpdateIsAbandonedExplicitlyOrAfterItsTimeout) {
  TensorMetadataPtr v1 = Create("a", 2);
  TensorMetadataPtr v2 = StageUpdateOf(table_, log_, v1, "");
  EXPECT_THAT(table_.Abandon("a", 3, "", 55).status(),
              StatusIs(absl::StatusCode::kAborted));
  auto fresh = table_.Abandon("a", 2, "", 55);
  ASSERT_OK(fresh);
  ASSERT_EQ((*fresh)->shards.size(), 1u);
  EXPECT_FALSE(table_.IsReferenced(v2->shards[0].replicas[0].shard_id));
  EXPECT_TRUE(table_.IsReferenced(v1->shards[0].replicas[0].shard_id));
  EXPECT_THAT(table_.Abandon("a", 2, "", 55).status(),
              StatusIs(absl::StatusCode::kNotFound));
  // Staged again and left: freed after pending_timeout, N untouched.
  TensorMetadataPtr again = StageUpdateOf(table_, log_, v1, "");
  clock_.Advance(absl::Minutes(11));
  std::vector<TensorMetadataPtr> due = table_.TakeDue();
  ASSERT_EQ(due.size(), 1u);
  EXPECT_EQ(due[0]->shards[0].replicas[0].shard_id,
            again->shards[0].replicas[0].shard_id);
  EXPECT_EQ((*table_.Get("a"))->version, 1u);
  EXPECT_OK(table_.BeginReshard("a", 1));
}

TEST_F(TensorTableTest, ADeleteTakesAStagedUpdateAlong) {
  TensorMetadataPtr v1 = Create("a", 2);
  TensorMetadataPtr v2 = StageUpdateOf(table_, log_, v1, "");
  auto ticket = table_.BeginDelete("a");
  ASSERT_OK(ticket);
  auto freed = table_.FinishDelete("a", log_.Wait(*ticket));
  ASSERT_OK(freed);
  ASSERT_EQ(freed->size(), 2u);
  EXPECT_FALSE(table_.IsReferenced(v1->shards[1].replicas[0].shard_id));
  EXPECT_FALSE(table_.IsReferenced(v2->shards[0].replicas[0].shard_id));
}

TEST_F(TensorTableTest, AReplacedVersionNobodyReadsIsDueAtOnce) {
  TensorMetadataPtr v1 = Create("a", 2);
  Reshard(v1, 1);
  std::vector<TensorMetadataPtr> due = table_.TakeDue();
  ASSERT_EQ(due.size(), 1u);
  EXPECT_EQ(due[0]->version, 1u);
}

TEST_F(TensorTableTest, AReplacedVersionWaitsForItsReadLeases) {
  TensorMetadataPtr v1 = Create("a", 2);
  ASSERT_OK(table_.GetLeased("a"));
  ASSERT_OK(table_.GetLeased("a"));
  TensorMetadataPtr v2 = Reshard(v1, 1);
  EXPECT_THAT(table_.TakeDue(), IsEmpty());
  // A lease on the new version, or a stray release, changes nothing for N.
  ASSERT_OK(table_.GetLeased("a"));
  table_.ReleaseRead("a", 7);
  table_.ReleaseRead("missing", 1);
  table_.ReleaseRead("a", 1);
  EXPECT_THAT(table_.TakeDue(), IsEmpty());
  // The last reader of N is done: N is due now, long before its leases
  // would have expired.
  clock_.Advance(absl::Seconds(1));
  table_.ReleaseRead("a", 1);
  std::vector<TensorMetadataPtr> due = table_.TakeDue();
  ASSERT_EQ(due.size(), 1u);
  EXPECT_EQ(due[0]->version, 1u);
  // Leases never released expire: v2 replaced while leased is due after the
  // lease time.
  TensorMetadataPtr v3 = Reshard(v2, 2);  // v2's lease ends at second 5
  clock_.Advance(absl::Seconds(3));
  EXPECT_THAT(table_.TakeDue(), IsEmpty());
  clock_.Advance(absl::Seconds(2));
  due = table_.TakeDue();
  ASSERT_EQ(due.size(), 1u);
  EXPECT_EQ(due[0]->version, 2u);
  EXPECT_THAT(table_.GetLeased("missing").status(),
              StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(TensorTableTest, DeleteReturnsTheCurrentAndEveryRetiredVersion) {
  TensorMetadataPtr v1 = Create("a", 2);
  TensorMetadataPtr v2 = Reshard(v1, 3);
  TensorMetadataPtr v3 = Reshard(v2, 1);
  Create("b", 1);
  auto ticket = table_.BeginDelete("a");
  ASSERT_OK(ticket);
  // Visible until the delete is durable and finished.
  EXPECT_OK(table_.Get("a"));
  auto versions = table_.FinishDelete("a", log_.Wait(*ticket));
  ASSERT_OK(versions);
  std::vector<uint64_t> numbers;
  for (const TensorMetadataPtr& v : *versions) numbers.push_back(v->version);
  EXPECT_THAT(numbers, UnorderedElementsAre(1u, 2u, 3u));
  EXPECT_THAT(table_.Get("a").status(), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(table_.NumRetired(), 0u);
  for (const TensorMetadataPtr& v : {v1, v2, v3}) {
    for (const ShardInfo& s : v->shards)
      EXPECT_FALSE(table_.IsReferenced(s.replicas[0].shard_id));
  }
  EXPECT_THAT(table_.List().size(), 1u);
}

TEST_F(TensorTableTest, ADeleteWhoseRecordFailedKeepsTheTensor) {
  Create("a", 1);
  store_.FailAppends(1, absl::InternalError("no space"));
  auto ticket = table_.BeginDelete("a");
  ASSERT_OK(ticket);
  EXPECT_THAT(table_.FinishDelete("a", log_.Wait(*ticket)).status(),
              StatusIs(absl::StatusCode::kInternal));
  EXPECT_OK(table_.Get("a"));
  ticket = table_.BeginDelete("a");
  ASSERT_OK(ticket);
  EXPECT_OK(table_.FinishDelete("a", log_.Wait(*ticket)));
}

TEST_F(TensorTableTest, ADeleteWaitsForTheCreateInFlight) {
  std::shared_ptr<TensorMetadata> meta = Meta("a", 1);
  ASSERT_OK(table_.ReserveName("a"));
  ASSERT_OK(log_.Wait(table_.ReserveIds(absl::MakeSpan(meta->shards))));
  const TensorTable::Ticket create = table_.CommitCreate(meta, false);
  absl::StatusOr<TensorTable::Ticket> deletion;
  std::thread deleter([&] { deletion = table_.BeginDelete("a"); });
  ASSERT_OK(log_.Wait(create));
  table_.FinishCreate("a");
  deleter.join();
  ASSERT_OK(deletion);  // it saw the finished create, not a half-made one
  EXPECT_OK(table_.FinishDelete("a", log_.Wait(*deletion)));
  EXPECT_THAT(log_.DurableState().tensors, IsEmpty());
}

TEST_F(TensorTableTest, ReconcileMarksMissingShardsLostAndReturnsStrays) {
  TensorMetadataPtr a = Create("a", 2);  // a shard on w0 and one on w1
  TensorMetadataPtr b = Create("b", 1);  // a shard on w0
  const uint64_t a0 = a->shards[0].replicas[0].shard_id;
  const uint64_t a1 = a->shards[1].replicas[0].shard_id;
  const uint64_t b0 = b->shards[0].replicas[0].shard_id;
  Reconciliation r = table_.Reconcile("w0", {a0, 9999});
  EXPECT_THAT(r.unreferenced, ElementsAre(9999u));
  EXPECT_THAT(r.lost, ElementsAre(b0));
  EXPECT_THAT(r.found, ElementsAre(a0));
  EXPECT_TRUE(table_.IsLost(b0));
  EXPECT_FALSE(table_.IsLost(a1)) << "another worker's shard";
  TensorMetadata copy = *b;
  table_.MarkLost(&copy);
  EXPECT_FALSE(copy.shards[0].replicas[0].available);
  // It comes back with the shard.
  r = table_.Reconcile("w0", {a0, b0});
  EXPECT_THAT(r.unreferenced, IsEmpty());
  EXPECT_FALSE(table_.IsLost(b0));
}

TEST_F(TensorTableTest,
       ReconcileCountsRetiredVersionsAndAllocationsInProgress) {
  TensorMetadataPtr v1 = Create("a", 2);
  Reshard(v1, 1);  // v1's shard on w1 is retired, still held
  std::vector<ShardInfo> in_progress(1, OneReplica());
  table_.ReserveIds(absl::MakeSpan(in_progress));  // being allocated
  const uint64_t retired = v1->shards[1].replicas[0].shard_id;
  Reconciliation r =
      table_.Reconcile("w1", {retired, in_progress[0].replicas[0].shard_id});
  EXPECT_THAT(r.unreferenced, IsEmpty());
  EXPECT_THAT(r.found, ElementsAre(retired));
}

// --- Quotas ---

std::shared_ptr<const QuotaTable> Quotas(const std::string& text) {
  absl::StatusOr<QuotaTable> table = QuotaTable::Parse(text);
  EXPECT_OK(table);
  return std::make_shared<const QuotaTable>(*std::move(table));
}

TEST_F(TensorTableTest, ConcurrentCreatesCannotShareTheRemainingBytes) {
  // Ten 8-byte tensors fit ann's 80 bytes; 16 threads race for them.
  table_.SetQuotas(Quotas("ann 80\n"));
  std::vector<absl::Status> results(16);
  std::vector<std::thread> threads;
  for (int i = 0; i < 16; ++i) {
    threads.emplace_back([&, i] {
      results[i] = table_.ReserveName(absl::StrCat("t", i), "ann", 8);
    });
  }
  for (std::thread& t : threads) t.join();
  int admitted = 0;
  for (const absl::Status& status : results) {
    if (status.ok()) {
      ++admitted;
    } else {
      EXPECT_THAT(status, StatusIs(absl::StatusCode::kResourceExhausted,
                                   HasSubstr("quota: principal 'ann' uses 80 "
                                             "of its 80 bytes")));
    }
  }
  EXPECT_EQ(admitted, 10);
  // The refused reserved nothing: no name, no bytes.
  const std::map<std::string, QuotaUse> usage = table_.Usage();
  EXPECT_EQ(usage.at("ann").bytes, 80);
  EXPECT_EQ(usage.at("ann").names, 10);
  // Another principal is not limited by ann's line (no `*`).
  EXPECT_OK(table_.ReserveName("bob's", "bob", 1 << 20));
}

TEST_F(TensorTableTest,
       ANameQuotaCountsPendingPutsAndAnExistingNameIsNoQuotaError) {
  table_.SetQuotas(Quotas("* unlimited 2\n"));
  Create("a", 1, /*pending=*/false, "ann");
  Create("b", 1, /*pending=*/true, "ann");
  EXPECT_THAT(table_.ReserveName("c", "ann", 8),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("holds 2 of its 2 tensor names")));
  EXPECT_THAT(table_.ReserveName("a", "ann", 8),
              StatusIs(absl::StatusCode::kAlreadyExists));
  EXPECT_OK(table_.ReserveName("c", "bob", 8));
}

TEST_F(TensorTableTest, UseCountsEveryReplicaAChangeInFlightAndReplacedShards) {
  // 4 shards of 8 bytes, each on 2 workers: 64 bytes.
  std::shared_ptr<TensorMetadata> meta = Meta("a", 4);
  meta->owner = "ann";
  for (ShardInfo& shard : meta->shards) shard.replicas.push_back(Replica());
  ASSERT_EQ(HeldBytes(*meta), 64);
  ASSERT_OK(table_.ReserveName("a", "ann", HeldBytes(*meta)));
  EXPECT_EQ(table_.Usage().at("ann").bytes, 64);  // admitted, not allocated
  ASSERT_OK(log_.Wait(table_.ReserveIds(absl::MakeSpan(meta->shards))));
  ASSERT_OK(log_.Wait(table_.CommitCreate(meta, false)));
  table_.FinishCreate("a");
  EXPECT_EQ(table_.Usage().at("ann").bytes, 64);

  // A reshard onto 2 one-replica shards: its new shards count from the
  // charge, the old ones until they are freed.
  table_.SetQuotas(Quotas("ann 100\n"));
  ASSERT_OK(table_.BeginReshard("a", 1));
  EXPECT_THAT(table_.Charge("a", 40, "resharding 'a'"),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("uses 64 of its 100 bytes; resharding 'a' "
                                 "needs 40 more")));
  EXPECT_EQ(table_.Usage().at("ann").bytes, 64);  // the refusal took nothing
  ASSERT_OK(table_.Charge("a", 16, "resharding 'a'"));
  EXPECT_EQ(table_.Usage().at("ann").bytes, 80);
  std::shared_ptr<TensorMetadata> next = Meta("a", 2, 2);
  next->owner = "ann";
  ASSERT_OK(log_.Wait(table_.ReserveIds(absl::MakeSpan(next->shards))));
  absl::StatusOr<TensorTable::Ticket> ticket =
      table_.CommitReshard(table_.Get("a").value(), next);
  ASSERT_OK(ticket);
  table_.FinishReshard(next, *meta, log_.Wait(*ticket));
  table_.EndReshard("a");
  EXPECT_EQ(table_.Usage().at("ann").bytes, 16 + 64);  // 64 not freed yet
  EXPECT_EQ(table_.TakeDue().size(), 1u);              // nobody reads version 1
  EXPECT_EQ(table_.Usage().at("ann").bytes, 16);

  // A reshard given up releases its charge.
  ASSERT_OK(table_.BeginReshard("a", 2));
  ASSERT_OK(table_.Charge("a", 50, "resharding 'a'"));
  table_.EndReshard("a");
  EXPECT_EQ(table_.Usage().at("ann").bytes, 16);
}

TEST_F(TensorTableTest, UseIsRecomputedFromRecoveredMetadata) {
  MetadataState state;
  for (const char* name : {"a", "b"}) {
    std::shared_ptr<TensorMetadata> meta = Meta(name, 3);
    meta->owner = "ann";
    state.tensors[name] = meta;
  }
  state.tensors["old"] = Meta("old", 1);  // before owners: no one's
  table_.Restore(state);
  const std::map<std::string, QuotaUse> usage = table_.Usage();
  EXPECT_EQ(usage.at("ann").bytes, 48);
  EXPECT_EQ(usage.at("ann").names, 2);
  EXPECT_EQ(usage.at("").bytes, 8);
  table_.SetQuotas(Quotas("ann 50\n"));
  EXPECT_THAT(table_.ReserveName("c", "ann", 8),
              StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_OK(table_.ReserveName("c", "ann", 2));
}

}  // namespace
}  // namespace tessera
