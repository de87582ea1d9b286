// End-to-end reshard tests on a real local cluster: every layout change keeps
// the data exactly, bumps the version, moves only the bytes that change
// worker, and fails cleanly (version N intact, nothing leaked).
#include <atomic>
#include <csignal>
#include <thread>

#include "client/tessera_client.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cluster.h"
#include "tests/test_arrays.h"

namespace tessera {
namespace {

using ::tessera::testing::StatusIs;
using ::testing::HasSubstr;

constexpr int kGraceMs = 1500;

class ReshardTest : public ClusterSuite<ReshardTest> {
 public:
  static TestClusterOptions ClusterOptions() {
    TestClusterOptions options;
    options.coordinator_flags = {"--retire_grace_ms=" +
                                 std::to_string(kGraceMs)};
    return options;
  }

 protected:
  // Bytes in use once every retired version has been freed.
  static int64_t SettledBytesUsed() {
    absl::SleepFor(absl::Milliseconds(kGraceMs + 600));
    return BytesUsed();
  }

  static void ExpectData(const std::string& name, const HostArray& expected) {
    auto got = client_->Get(name);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(SameBytes(*got, expected)) << name;
  }
};

TEST_F(ReshardTest, RowsToColumnsPreservesDataAndMovesOnlyChangedBytes) {
  HostArray a = Iota(DType::kFloat32, {64, 32});
  ASSERT_OK(client_->Put("rows_to_cols", a,
                         LayoutSpec::Chunk(0, Ranks({0, 1, 2, 3}))));
  auto stats = client_->Reshard("rows_to_cols",
                                LayoutSpec::Chunk(1, Ranks({0, 1, 2, 3})));
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->version, 2u);
  EXPECT_EQ(stats->shards_kept, 0);
  EXPECT_EQ(stats->pieces_moved, 12);
  EXPECT_EQ(stats->bytes_moved, a.num_bytes * 3 / 4);
  EXPECT_EQ(stats->bytes_copied_locally, a.num_bytes / 4);
  ExpectData("rows_to_cols", a);
  auto meta = client_->Describe("rows_to_cols");
  ASSERT_OK(meta);
  EXPECT_EQ(meta->version, 2u);
  EXPECT_EQ(meta->shards[1].box.offsets[1], 8);
}

TEST_F(ReshardTest, FourWorkersToThree) {
  HostArray a = Iota(DType::kInt64, {50, 7}, 3);
  ASSERT_OK(client_->Put("four_to_three", a,
                         LayoutSpec::Chunk(0, Ranks({0, 1, 2, 3}))));
  auto stats =
      client_->Reshard("four_to_three", LayoutSpec::Chunk(0, Ranks({0, 1, 2})));
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->bytes_moved + stats->bytes_copied_locally, a.num_bytes);
  ExpectData("four_to_three", a);
}

TEST_F(ReshardTest, EnumerableToChunkAndChunkToGrid) {
  HostArray a = Iota(DType::kFloat32, {12, 12});
  std::vector<Box> uneven = {
      {{0, 0}, {3, 12}}, {{3, 0}, {9, 5}}, {{3, 5}, {9, 7}}};
  ASSERT_OK(client_->Put("enum_chunk", a,
                         LayoutSpec::Enumerable(uneven, Ranks({2, 0, 1}))));
  ASSERT_OK(client_->Reshard("enum_chunk",
                             LayoutSpec::Chunk(0, Ranks({3, 2, 1, 0}))));
  ExpectData("enum_chunk", a);
  std::vector<Box> grid = {
      {{0, 0}, {6, 6}}, {{0, 6}, {6, 6}}, {{6, 0}, {6, 6}}, {{6, 6}, {6, 6}}};
  auto stats = client_->Reshard(
      "enum_chunk", LayoutSpec::Enumerable(grid, Ranks({0, 1, 2, 3})));
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->version, 3u);
  ExpectData("enum_chunk", a);
  auto region = client_->Get("enum_chunk", Box{{4, 3}, {5, 8}});
  ASSERT_OK(region);
  EXPECT_TRUE(SameBytes(*region, Slice(a, Box{{4, 3}, {5, 8}})));
}

TEST_F(ReshardTest, GatherOntoOneWorker) {
  HostArray a = Iota(DType::kFloat16, {40, 9}, 5);
  ASSERT_OK(
      client_->Put("gather_one", a, LayoutSpec::Chunk(0, Ranks({0, 1, 2, 3}))));
  auto stats = client_->Reshard("gather_one", LayoutSpec::Chunk(0, Ranks({2})));
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->pieces_moved, 3);
  EXPECT_EQ(stats->bytes_copied_locally, a.num_bytes / 4);
  auto meta = client_->Describe("gather_one");
  ASSERT_OK(meta);
  ASSERT_EQ(meta->shards.size(), 1u);
  EXPECT_EQ(meta->shards[0].replicas[0].worker, "w2");
  auto whole = client_->GetShard("gather_one", 0);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_TRUE(SameBytes(*whole, a));
}

TEST_F(ReshardTest, NoOpReshardMovesNothingButBumpsTheVersion) {
  HostArray a = Iota(DType::kInt32, {16, 4}, 9);
  const LayoutSpec spec = LayoutSpec::Chunk(0, Ranks({0, 1, 2, 3}));
  ASSERT_OK(client_->Put("noop", a, spec));
  auto before = client_->Describe("noop");
  ASSERT_OK(before);
  auto stats = client_->Reshard("noop", spec);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->version, 2u);
  EXPECT_EQ(stats->shards_kept, 4);
  EXPECT_EQ(stats->pieces_moved, 0);
  EXPECT_EQ(stats->bytes_moved, 0);
  EXPECT_EQ(stats->bytes_copied_locally, 0);
  auto after = client_->Describe("noop");
  ASSERT_OK(after);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(after->shards[i].replicas[0].shard_id,
              before->shards[i].replicas[0].shard_id);  // same memory
  }
  ExpectData("noop", a);
}

TEST_F(ReshardTest,
       OldVersionStaysReadableForTheGracePeriodThenHandlesFailClearly) {
  HostArray a = Iota(DType::kFloat32, {8, 8});
  ASSERT_OK(client_->Put("versions", a, LayoutSpec::Chunk(0, Ranks({0, 1}))));
  auto handles = client_->Handles("versions");
  ASSERT_OK(handles);
  ASSERT_OK(client_->Reshard("versions", LayoutSpec::Chunk(1, Ranks({2, 3}))));
  // A reader of version 1 that started before the commit finishes on version 1.
  auto early = (*handles)[1].ToHere();
  ASSERT_TRUE(early.ok()) << early.status();
  EXPECT_TRUE(SameBytes(*early, Slice(a, Box{{4, 0}, {4, 8}})));
  absl::SleepFor(absl::Milliseconds(kGraceMs + 600));
  EXPECT_THAT(
      (*handles)[1].ToHere().status(),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("version 1")));
  ExpectData("versions", a);
}

TEST_F(ReshardTest, GetsDuringTwentyReshardsAlwaysSeeTheSourceData) {
  HostArray a = Iota(DType::kFloat32, {512, 128});
  ASSERT_OK(client_->Put("back_and_forth", a,
                         LayoutSpec::Chunk(0, Ranks({0, 1, 2, 3}))));
  std::atomic<bool> stop{false};
  std::atomic<int> gets{0}, bad{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 3; ++t) {
    readers.emplace_back([&, t] {
      while (!stop.load()) {
        Box region = t == 0 ? WholeBox(a.shape) : Box{{100 * t, 7}, {300, 100}};
        auto got = client_->Get("back_and_forth", region);
        if (!got.ok() || !SameBytes(*got, Slice(a, region))) {
          ++bad;
          ADD_FAILURE() << (got.ok() ? "wrong data" : got.status().ToString());
        }
        ++gets;
      }
    });
  }
  for (int i = 0; i < 20; ++i) {
    LayoutSpec spec = i % 2 == 0 ? LayoutSpec::Chunk(1, Ranks({3, 2, 1}))
                                 : LayoutSpec::Chunk(0, Ranks({0, 1, 2, 3}));
    auto stats = client_->Reshard("back_and_forth", spec);
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_EQ(stats->version, static_cast<uint64_t>(i + 2));
  }
  stop = true;
  for (std::thread& t : readers) t.join();
  EXPECT_GT(gets.load(), 0);
  EXPECT_EQ(bad.load(), 0);
  ExpectData("back_and_forth", a);
}

TEST_F(ReshardTest, ConcurrentReshardsOfOneTensorOneWinsTheOtherIsAborted) {
  HostArray a =
      Iota(DType::kFloat32, {2048, 1024});  // 8 MiB: the reshards overlap
  ASSERT_OK(
      client_->Put("racing", a, LayoutSpec::Chunk(0, Ranks({0, 1, 2, 3}))));
  std::vector<absl::StatusOr<ReshardStats>> results(
      2, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      results[t] = client_->Reshard(
          "racing", t == 0 ? LayoutSpec::Chunk(1, Ranks({0, 1, 2, 3}))
                           : LayoutSpec::Chunk(0, Ranks({3, 2, 1, 0})));
    });
  }
  for (std::thread& t : threads) t.join();
  int ok = 0;
  for (const auto& r : results) {
    if (r.ok()) {
      ++ok;
    } else {
      EXPECT_THAT(r.status(), StatusIs(absl::StatusCode::kAborted,
                                       HasSubstr("in progress")));
    }
  }
  EXPECT_GE(ok, 1);
  auto meta = client_->Describe("racing");
  ASSERT_OK(meta);
  EXPECT_EQ(meta->version, static_cast<uint64_t>(1 + ok));
  ExpectData("racing", a);
}

TEST_F(ReshardTest, BadSpecChangesNothing) {
  HostArray a = Iota(DType::kFloat32, {6, 6});
  ASSERT_OK(
      client_->Put("bad_reshard", a, LayoutSpec::Chunk(0, Ranks({0, 1}))));
  const int64_t before = SettledBytesUsed();
  EXPECT_THAT(client_->Reshard("bad_reshard", LayoutSpec::Chunk(5, Ranks({0})))
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("invalid sharding dim")));
  EXPECT_THAT(client_->Reshard("bad_reshard", LayoutSpec::Chunk(0, Ranks({7})))
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("does not exist")));
  EXPECT_THAT(client_
                  ->Reshard("bad_reshard", LayoutSpec::Enumerable(
                                               {{{0, 0}, {4, 6}}}, Ranks({0})))
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("cover")));
  EXPECT_THAT(
      client_->Reshard("missing", LayoutSpec::Chunk(0, Ranks({0}))).status(),
      StatusIs(absl::StatusCode::kNotFound, HasSubstr("not found")));
  auto meta = client_->Describe("bad_reshard");
  ASSERT_OK(meta);
  EXPECT_EQ(meta->version, 1u);
  EXPECT_EQ(BytesUsed(), before);
  ExpectData("bad_reshard", a);
}

// Runs last: it kills a worker.
TEST_F(ReshardTest,
       ZZWorkerDyingDuringReshardLeavesVersionNReadableAndNothingLeaked) {
  HostArray a = Iota(DType::kFloat32, {256, 256});
  ASSERT_OK(client_->Put("killed", a, LayoutSpec::Chunk(0, Ranks({0, 1}))));
  const int64_t before = SettledBytesUsed();
  auto workers_before = client_->Workers();
  ASSERT_OK(workers_before);
  // w3 dies; its lease has not expired, so the coordinator still plans onto it.
  cluster_->StopWorker(3, SIGKILL);
  auto stats =
      client_->Reshard("killed", LayoutSpec::Chunk(1, Ranks({1, 2, 3})));
  EXPECT_THAT(stats.status(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("w3")));
  auto meta = client_->Describe("killed");
  ASSERT_OK(meta);
  EXPECT_EQ(meta->version, 1u);
  ExpectData("killed", a);
  // Live workers hold exactly what they held before.
  auto workers_after = client_->Workers();
  ASSERT_OK(workers_after);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ((*workers_after)[i].bytes_used, (*workers_before)[i].bytes_used)
        << (*workers_after)[i].name;
  }
  (void)before;
  ASSERT_OK(cluster_->RestartWorker(3));
  auto again =
      client_->Reshard("killed", LayoutSpec::Chunk(1, Ranks({1, 2, 3})));
  ASSERT_TRUE(again.ok()) << again.status();
  ExpectData("killed", a);
}

}  // namespace
}  // namespace tessera
