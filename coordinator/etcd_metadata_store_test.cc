// The etcd store against the MetadataStore contract on a real etcd member
// (a restart is a new store on the same prefix), and what is etcd's own:
// a prefix holding someone else's keys is refused, large batches and
// snapshots are cut into chunks under etcd's request limit, a writer whose
// fence moved can never commit again, and without quorum a write fails
// within its deadline and is settled once etcd is back.
#include "coordinator/etcd_metadata_store.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/etcd_testutil.h"
#include "coordinator/metadata_store_contract_test.h"
#include "core/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::EtcdCluster;
using ::tessera::testing::StatusIs;
using ::testing::HasSubstr;

// One member for the whole binary, stopped when it exits.
EtcdCluster& SharedEtcd() {
  static EtcdCluster etcd(1, "etcd-contract");
  return etcd;
}

std::shared_ptr<const EtcdClient> ClientOf(const EtcdCluster& etcd) {
  return std::make_shared<EtcdClient>(etcd.endpoints(), EtcdClientOptions{});
}

std::string NewPrefix() {
  static int counter = 0;
  return absl::StrCat("/test-", getpid(), "/", counter++, "/");
}

std::unique_ptr<EtcdMetadataStore> StoreOn(const std::string& prefix,
                                           int64_t chunk_bytes = 1 << 20) {
  EtcdStoreOptions options;
  options.prefix = prefix;
  options.chunk_bytes = chunk_bytes;
  return std::make_unique<EtcdMetadataStore>(ClientOf(SharedEtcd()), options);
}

testing::MetadataStoreFactory EtcdStoreFactory() {
  testing::MetadataStoreFactory factory;
  factory.name = "Etcd";
  // Small chunks, so that the suite's snapshots and batches go through
  // the chunked path too.
  factory.make = [] { return StoreOn(NewPrefix(), 256); };
  factory.make_faulty = [](testing::FaultPlan* faults) {
    return std::make_unique<testing::FaultInjectingMetadataStore>(
        StoreOn(NewPrefix(), 256), faults);
  };
  factory.reopen = [](std::unique_ptr<MetadataStore> store) {
    auto* etcd = dynamic_cast<EtcdMetadataStore*>(store.get());
    if (etcd == nullptr) {
      etcd = static_cast<EtcdMetadataStore*>(
          static_cast<testing::FaultInjectingMetadataStore*>(store.get())
              ->inner());
    }
    const std::string prefix = etcd->prefix();
    store.reset();
    return StoreOn(prefix, 256);
  };
  return factory;
}

using ::tessera::testing::MetadataStoreContractTest;
INSTANTIATE_TEST_SUITE_P(Etcd, MetadataStoreContractTest,
                         ::testing::Values(EtcdStoreFactory()),
                         MetadataStoreContractTest::Name);

void PutKey(const EtcdClient& etcd, const std::string& key,
            const std::string& value) {
  etcdserverpb::TxnRequest txn;
  auto* put = txn.add_success()->mutable_request_put();
  put->set_key(key);
  put->set_value(value);
  ASSERT_OK(etcd.Txn(txn).status());
}

std::shared_ptr<const TensorMetadata> Tensor(const std::string& name,
                                             int64_t shards) {
  auto t = std::make_shared<TensorMetadata>();
  t->name = name;
  t->version = 1;
  t->dtype = DType::kFloat32;
  t->shape = {shards};
  for (int64_t i = 0; i < shards; ++i) {
    ShardInfo s;
    s.box = Box({i}, {1});
    Replica r;
    r.worker = absl::StrCat("w", i % 7);
    r.address = absl::StrCat("10.0.0.", i % 7, ":7000");
    r.shard_id = static_cast<uint64_t>(i + 1);
    s.replicas.push_back(r);
    t->shards.push_back(s);
  }
  return t;
}

TEST(EtcdMetadataStoreTest, APrefixWithOtherKeysIsRefusedByName) {
  ASSERT_TRUE(SharedEtcd().ready());
  auto etcd = ClientOf(SharedEtcd());
  const std::string foreign = NewPrefix();
  PutKey(*etcd, foreign + "something/else", "x");
  EXPECT_THAT(
      StoreOn(foreign)->Load().status(),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr(foreign)));
  const std::string other = NewPrefix();
  PutKey(*etcd, other + "format", "another-tool 9");
  EXPECT_THAT(StoreOn(other)->Load().status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("another-tool 9")));
  // A damaged log entry is DATA_LOSS naming it, not a silent skip.
  const std::string damaged = NewPrefix();
  {
    auto store = StoreOn(damaged);
    ASSERT_OK(store->Load().status());
    ASSERT_OK(store->Append(MetadataChange::Tensor(Tensor("a", 3))));
  }
  PutKey(*etcd, damaged + "log/00000000000000000001", "TLG1Ixxxxjunk");
  EXPECT_THAT(StoreOn(damaged)->Load().status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("log entry 1")));
}

TEST(EtcdMetadataStoreTest, LargeBatchesAndSnapshotsAreChunked) {
  ASSERT_TRUE(SharedEtcd().ready());
  auto etcd = ClientOf(SharedEtcd());
  const std::string prefix = NewPrefix();
  // Chunks of 64 KiB, so that even a well-packed 100k-shard tensor is cut.
  auto store = StoreOn(prefix, 64 << 10);
  ASSERT_OK(store->Load().status());
  ASSERT_OK(store->Append(MetadataChange::Tensor(Tensor("big", 100000))));
  ASSERT_OK_AND_ASSIGN(
      std::vector<mvccpb::KeyValue> chunks,
      etcd->Range(prefix + "logchunk/", PrefixEnd(prefix + "logchunk/")));
  EXPECT_GT(chunks.size(), 1u);
  store = StoreOn(prefix);
  ASSERT_OK_AND_ASSIGN(MetadataState state, store->Load());
  ASSERT_EQ(state.tensors.count("big"), 1u);
  EXPECT_EQ(state.tensors.at("big")->shards.size(), 100000u);
  EXPECT_EQ(state.tensors.at("big")->shards[99999].replicas[0].shard_id,
            100000u);
  // The snapshot takes the log's place: its chunks go with it.
  ASSERT_OK(store->Snapshot(state));
  ASSERT_OK_AND_ASSIGN(chunks, etcd->Range(prefix + "logchunk/",
                                           PrefixEnd(prefix + "logchunk/")));
  EXPECT_TRUE(chunks.empty());
  ASSERT_OK(store->Append(MetadataChange::DeletedTensor("big")));
  ASSERT_OK(store->Append(MetadataChange::Tensor(Tensor("small", 2))));
  store = StoreOn(prefix);
  ASSERT_OK_AND_ASSIGN(state, store->Load());
  EXPECT_EQ(state.tensors.count("big"), 0u);
  EXPECT_EQ(state.tensors.count("small"), 1u);
}

// A standby follows the leader's writes as they land, so that at
// promotion its Load reads only what was written since it last looked.
TEST(EtcdMetadataStoreTest, AStandbyFollowsAndLoadsOnlyTheTail) {
  ASSERT_TRUE(SharedEtcd().ready());
  const std::string prefix = NewPrefix();
  auto leader = StoreOn(prefix);
  auto standby = StoreOn(prefix);
  // Nothing written yet: nothing to follow, and no error.
  ASSERT_OK(standby->Follow());
  ASSERT_OK_AND_ASSIGN(MetadataState state, leader->Load());
  ASSERT_OK(leader->Append(MetadataChange::Tensor(Tensor("a", 3))));
  ASSERT_OK(leader->Append(MetadataChange::Tensor(Tensor("b", 2))));
  ASSERT_OK(standby->Follow());
  EXPECT_EQ(standby->follow_stats().entries_read, 2u);
  EXPECT_EQ(standby->follow_stats().snapshots_read, 0u);
  // A snapshot replaces the log: the standby reads it once, then only the
  // entries after it.
  state.Apply(MetadataChange::Tensor(Tensor("a", 3)));
  state.Apply(MetadataChange::Tensor(Tensor("b", 2)));
  ASSERT_OK(leader->Snapshot(state));
  ASSERT_OK(leader->Append(MetadataChange::DeletedTensor("a")));
  ASSERT_OK(standby->Follow());
  ASSERT_OK(standby->Follow());
  EXPECT_EQ(standby->follow_stats().snapshots_read, 1u);
  EXPECT_EQ(standby->follow_stats().entries_read, 3u);
  ASSERT_OK(leader->Append(MetadataChange::Tensor(Tensor("c", 100000))));
  // Promotion: the tail only (one entry), and the same state a cold Load
  // reads.
  ASSERT_OK_AND_ASSIGN(MetadataState warm, standby->Load());
  EXPECT_EQ(standby->follow_stats().snapshots_read, 1u);
  EXPECT_EQ(standby->follow_stats().entries_read, 4u);
  ASSERT_OK_AND_ASSIGN(MetadataState cold, StoreOn(prefix)->Load());
  EXPECT_EQ(warm.cluster_id, cold.cluster_id);
  EXPECT_FALSE(warm.cluster_id.empty());
  ASSERT_EQ(warm.tensors.size(), 2u);
  ASSERT_EQ(cold.tensors.size(), 2u);
  EXPECT_EQ(warm.tensors.count("a"), 0u);
  EXPECT_EQ(warm.tensors.at("b")->shards.size(), 2u);
  EXPECT_EQ(warm.tensors.at("c")->shards.size(), 100000u);
  EXPECT_EQ(warm.tensors.at("c")->shards[99999].replicas,
            cold.tensors.at("c")->shards[99999].replicas);
  // The promoted store writes after what it followed.
  ASSERT_OK(standby->Append(MetadataChange::DeletedTensor("b")));
  ASSERT_OK_AND_ASSIGN(cold, StoreOn(prefix)->Load());
  EXPECT_EQ(cold.tensors.count("b"), 0u);
  EXPECT_EQ(cold.tensors.count("c"), 1u);
}

TEST(EtcdMetadataStoreTest, AWriterWhoseFenceMovedNeverCommits) {
  ASSERT_TRUE(SharedEtcd().ready());
  auto etcd = ClientOf(SharedEtcd());
  const std::string prefix = NewPrefix();
  const std::string leader = prefix + kElectionDir + "leader";
  PutKey(*etcd, leader, "me");
  ASSERT_OK_AND_ASSIGN(std::vector<mvccpb::KeyValue> held, etcd->Range(leader));
  auto store = StoreOn(prefix);
  store->SetFence(leader, held.front().create_revision());
  // The secret and the election key are the prefix's own, not foreign.
  ASSERT_OK_AND_ASSIGN(const std::string secret, store->LoadOrMakeSecret(32));
  EXPECT_EQ(secret.size(), 32u);
  ASSERT_OK(store->Load().status());
  ASSERT_OK_AND_ASSIGN(const std::string again,
                       StoreOn(prefix)->LoadOrMakeSecret(32));
  EXPECT_EQ(again, secret);
  ASSERT_OK(store->Append(MetadataChange::Tensor(Tensor("a", 2))));
  // Another coordinator takes the key (deleted, made again).
  etcdserverpb::TxnRequest take;
  take.add_success()->mutable_request_delete_range()->set_key(leader);
  ASSERT_OK(etcd->Txn(take).status());
  PutKey(*etcd, leader, "other");
  EXPECT_THAT(store->Append(MetadataChange::Tensor(Tensor("b", 2))),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("no longer the leader")));
  EXPECT_THAT(store->Snapshot(MetadataState{}),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  ASSERT_OK_AND_ASSIGN(MetadataState state, StoreOn(prefix)->Load());
  EXPECT_EQ(state.tensors.count("a"), 1u);
  EXPECT_EQ(state.tensors.count("b"), 0u);
}

TEST(EtcdMetadataStoreTest, WithoutQuorumWritesFailAndAreSettledAfter) {
  EtcdCluster three(3, "etcd-quorum");
  ASSERT_TRUE(three.ready());
  EtcdStoreOptions options;
  options.prefix = NewPrefix();
  auto store = std::make_unique<EtcdMetadataStore>(ClientOf(three), options);
  ASSERT_OK(store->Load().status());
  ASSERT_OK(store->Append(MetadataChange::Tensor(Tensor("a", 2))));
  three.Kill(1);
  three.Kill(2);
  const absl::Time start = absl::Now();
  const absl::Status lost =
      store->Append(MetadataChange::Tensor(Tensor("b", 2)));
  EXPECT_THAT(lost, StatusIs(absl::StatusCode::kUnavailable)) << lost;
  std::cerr << "a write without quorum failed after "
            << absl::FormatDuration(absl::Now() - start) << "\n";
  three.Start(1);
  three.Start(2);
  ASSERT_TRUE(three.WaitReady(absl::Seconds(30)));
  // The lost write is settled first: voided (the usual case), or found
  // landed, which the store then refuses to write past.
  absl::Status next;
  for (int i = 0; i < 50; ++i) {
    next = store->Append(MetadataChange::Tensor(Tensor("c", 2)));
    if (!absl::IsUnavailable(next)) break;
    absl::SleepFor(absl::Milliseconds(200));
  }
  ASSERT_OK_AND_ASSIGN(
      MetadataState state,
      std::make_unique<EtcdMetadataStore>(ClientOf(three), options)->Load());
  EXPECT_EQ(state.tensors.count("a"), 1u);
  if (next.ok()) {
    EXPECT_EQ(state.tensors.count("b"), 0u);
    EXPECT_EQ(state.tensors.count("c"), 1u);
  } else {
    EXPECT_THAT(next, StatusIs(absl::StatusCode::kDataLoss));
    EXPECT_EQ(state.tensors.count("b"), 1u);
    EXPECT_EQ(state.tensors.count("c"), 0u);
  }
}

}  // namespace
}  // namespace tessera
