// End-to-end serving tests on a real local cluster: row gathers against a
// reference built element by element (repeats, negatives, out-of-range,
// empty lists, any layout, bfloat16), one batched row read per worker, and
// version-atomic updates — whole and regional, under concurrent readers,
// racing each other, abandoned — that leave nothing behind.

#include <atomic>
#include <cstring>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/tessera_client.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/coordinator.grpc.pb.h"
#include "rpc/channel.h"
#include "tests/cluster.h"
#include "tests/test_arrays.h"

namespace tessera {
namespace {

using ::tessera::testing::StatusIs;
using ::testing::HasSubstr;

constexpr int kGraceMs = 800;

// The metrics ports of the suite's workers.
std::vector<int>& MetricsPorts() {
  static auto* ports = new std::vector<int>;
  return *ports;
}

// Calls of `method` a worker has served, from its metrics (any status).
int64_t CallsServed(int worker, absl::string_view method) {
  return static_cast<int64_t>(MetricSum(
      FetchMetrics(MetricsPorts()[worker]), "tessera_rpc_requests_total",
      absl::StrCat("method=\"/tessera.v1.Worker/", method, "\"")));
}

// The reference row gather: row i of the result is row rows[i] of `src`
// (negatives from the end), copied element by element through Slice.
HostArray ReferenceRows(const HostArray& src,
                        const std::vector<int64_t>& rows) {
  Shape shape = src.shape;
  shape[0] = static_cast<int64_t>(rows.size());
  HostArray out = HostArray::Allocate(src.dtype, shape);
  const int64_t row_bytes =
      rows.empty() ? 0 : out.num_bytes / static_cast<int64_t>(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    const int64_t r = rows[i] < 0 ? rows[i] + src.shape[0] : rows[i];
    std::vector<int64_t> offsets(src.shape.size(), 0);
    std::vector<int64_t> sizes(src.shape.begin(), src.shape.end());
    offsets[0] = r;
    sizes[0] = 1;
    HostArray row = Slice(src, Box(offsets, sizes));
    std::memcpy(out.data() + i * row_bytes, row.data(),
                static_cast<size_t>(row_bytes));
  }
  return out;
}

// An array of `shape` whose every float32 element is `value`.
HostArray Filled(const Shape& shape, float value) {
  HostArray out = HostArray::Allocate(DType::kFloat32, shape);
  float* p = reinterpret_cast<float*>(out.data());
  for (int64_t i = 0; i < out.num_bytes / 4; ++i) p[i] = value;
  return out;
}

// The one value every float32 element of `a` has, or NaN when they differ.
float UniformValue(const HostArray& a) {
  const float* p = reinterpret_cast<const float*>(a.data());
  const int64_t n = a.num_bytes / 4;
  if (n == 0) return 0;
  for (int64_t i = 1; i < n; ++i) {
    if (p[i] != p[0]) return std::nanf("");
  }
  return p[0];
}

class ServingTest : public ClusterSuite<ServingTest> {
 public:
  static TestClusterOptions ClusterOptions() {
    TestClusterOptions options;
    options.coordinator_flags = {"--retire_grace_ms=" +
                                 std::to_string(kGraceMs)};
    MetricsPorts().clear();
    for (int i = 0; i < options.num_workers; ++i)
      MetricsPorts().push_back(PickFreePort());
    options.per_worker_flags = [](int i) {
      return std::vector<std::string>{
          absl::StrCat("--metrics_listen=127.0.0.1:", MetricsPorts()[i])};
    };
    return options;
  }

 protected:
  // Bytes in use once every retired version has been freed.
  static int64_t SettledBytesUsed() {
    absl::SleepFor(absl::Milliseconds(kGraceMs + 1500));
    return BytesUsed();
  }

  // A client that moves bytes over gRPC only, so every row read is a call.
  static std::unique_ptr<Client> GrpcOnlyClient() {
    ClientOptions options;
    options.transport = "grpc";
    auto client = Client::Connect(cluster_->coordinator_address(), options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  static void ExpectRows(Client& client, const std::string& name,
                         const HostArray& table,
                         const std::vector<int64_t>& rows) {
    auto got = client.GatherRows(name, rows);
    ASSERT_TRUE(got.ok()) << got.status();
    const HostArray want = ReferenceRows(table, rows);
    EXPECT_EQ(got->shape, want.shape);
    EXPECT_TRUE(SameBytes(*got, want)) << name;
  }
};

TEST_F(ServingTest, RowsInAnyOrderWithRepeatsAndNegatives) {
  const HostArray table = Iota(DType::kFloat32, {1000, 24});
  ASSERT_OK(client_->Put("rows_table", table,
                         LayoutSpec::Chunk(0, Ranks({0, 1, 2, 3}))));
  const std::vector<int64_t> rows = {999,   0,   3, 3,   -1,  250, 251, 249,
                                     -1000, 500, 3, 748, 749, 750, 751, 0};
  ExpectRows(*client_, "rows_table", table, rows);
  std::unique_ptr<Client> grpc = GrpcOnlyClient();
  ASSERT_NE(grpc, nullptr);
  ExpectRows(*grpc, "rows_table", table, rows);
  // Into a caller's buffer, and a wrong size is refused.
  const HostArray want = ReferenceRows(table, rows);
  std::string buffer(static_cast<size_t>(want.num_bytes), '\0');
  ASSERT_OK(client_->GatherRowsInto("rows_table", rows, buffer.data(),
                                    want.num_bytes));
  EXPECT_EQ(std::memcmp(buffer.data(), want.data(), buffer.size()), 0);
  EXPECT_THAT(client_->GatherRowsInto("rows_table", rows, buffer.data(),
                                      want.num_bytes - 4),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(ServingTest, RowsOfColumnShardsGridsAndUnevenLayouts) {
  const HostArray table = Iota(DType::kInt32, {97, 10}, 5);
  ASSERT_OK(client_->Put("rows_cols", table,
                         LayoutSpec::Chunk(1, Ranks({0, 1, 2, 3}))));
  const std::vector<int64_t> rows = {96, 1, 50, 1, -2, 0, 77};
  ExpectRows(*client_, "rows_cols", table, rows);
  std::vector<Box> grid = {{{0, 0}, {40, 4}},
                           {{0, 4}, {40, 6}},
                           {{40, 0}, {57, 7}},
                           {{40, 7}, {57, 3}}};
  ASSERT_OK(client_->Put("rows_grid", table,
                         LayoutSpec::Enumerable(grid, Ranks({3, 2, 1, 0}))));
  ExpectRows(*client_, "rows_grid", table, rows);
  std::unique_ptr<Client> grpc = GrpcOnlyClient();
  ASSERT_NE(grpc, nullptr);
  ExpectRows(*grpc, "rows_grid", table, rows);
  // 3-d, bfloat16, rows of 2 x 3 elements.
  const HostArray bf16 = Iota(DType::kBFloat16, {33, 2, 3}, 9);
  ASSERT_OK(
      client_->Put("rows_bf16", bf16, LayoutSpec::Chunk(0, Ranks({1, 2}))));
  ExpectRows(*client_, "rows_bf16", bf16, {32, 0, 16, 17, 16, -33});
}

TEST_F(ServingTest, EmptyAndOutOfRangeIndices) {
  const HostArray table = Iota(DType::kFloat64, {20, 3});
  ASSERT_OK(
      client_->Put("rows_edges", table, LayoutSpec::Chunk(0, Ranks({0, 1}))));
  auto empty = client_->GatherRows("rows_edges", {});
  ASSERT_OK(empty.status());
  EXPECT_EQ(empty->shape, (Shape{0, 3}));
  for (int64_t bad : {int64_t{20}, int64_t{-21}, int64_t{1} << 40}) {
    EXPECT_THAT(
        client_->GatherRows("rows_edges", {0, bad}),
        StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("out of bounds")))
        << bad;
  }
  EXPECT_THAT(client_->GatherRows("no_such_table", {0}),
              StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(ServingTest, OneBatchedRowReadPerWorkerNeverOnePerRow) {
  const HostArray table = Iota(DType::kFloat32, {4096, 64});
  ASSERT_OK(client_->Put("rows_batched", table,
                         LayoutSpec::Chunk(0, Ranks({0, 1, 2, 3}))));
  std::unique_ptr<Client> grpc = GrpcOnlyClient();
  ASSERT_NE(grpc, nullptr);
  std::vector<int64_t> before(4);
  for (int w = 0; w < 4; ++w) before[w] = CallsServed(w, "ReadRows");
  // 2000 rows, spread over every worker, some repeated.
  std::vector<int64_t> rows;
  for (int64_t i = 0; i < 2000; ++i) rows.push_back((i * 7919) % 4096);
  ExpectRows(*grpc, "rows_batched", table, rows);
  for (int w = 0; w < 4; ++w) {
    EXPECT_EQ(CallsServed(w, "ReadRows") - before[w], 1) << "worker " << w;
  }
}

TEST_F(ServingTest, ConcurrentSmallGetsShareCallsAndEachGetsItsOwnBytes) {
  const HostArray table = Iota(DType::kFloat32, {4096, 256});  // 1 KiB rows
  ASSERT_OK(client_->Put("small_gets", table,
                         LayoutSpec::Chunk(0, Ranks({0, 1, 2, 3}))));
  std::unique_ptr<Client> grpc = GrpcOnlyClient();
  ASSERT_NE(grpc, nullptr);
  auto calls = [] {
    int64_t single = 0, coalesced = 0;
    for (int w = 0; w < 4; ++w) {
      single += CallsServed(w, "ReadSmallRegion");
      coalesced += CallsServed(w, "ReadSmallRegions");
    }
    return std::make_pair(single, coalesced);
  };
  const auto [single_before, coalesced_before] = calls();
  constexpr int kCallers = 16, kGets = 100;
  std::atomic<int> failed{0}, wrong{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      std::vector<char> out(4 * 1024);
      for (int i = 0; i < kGets; ++i) {
        // Four rows here, a strided 4x64 block there, all over the table.
        const int64_t r = (c * 7919 + i * 104729) % (4096 - 4);
        const Box box =
            i % 2 == 0 ? Box{{r, 0}, {4, 256}} : Box{{r, 100}, {4, 64}};
        const int64_t bytes = box.NumElements() * 4;
        if (!grpc->GetInto("small_gets", box, out.data(), bytes).ok()) {
          failed++;
          continue;
        }
        const HostArray want = Slice(table, box);
        if (std::memcmp(out.data(), want.data(), bytes) != 0) wrong++;
      }
    });
  }
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(wrong.load(), 0);
  const auto [single_after, coalesced_after] = calls();
  // Some calls carried several gets, so fewer calls than gets were made.
  EXPECT_GT(coalesced_after - coalesced_before, 0);
  EXPECT_LT(
      (single_after - single_before) + (coalesced_after - coalesced_before),
      kCallers * kGets);
}

TEST_F(ServingTest, WholeUpdateWritesVersionTwoAndFreesVersionOne) {
  const int64_t before = SettledBytesUsed();
  const HostArray v1 = Iota(DType::kFloat32, {64, 16}, 1);
  const HostArray v2 = Iota(DType::kFloat32, {64, 16}, 2);
  ASSERT_OK(
      client_->Put("upd_whole", v1, LayoutSpec::Chunk(0, Ranks({0, 1, 2, 3}))));
  auto stats = client_->Update("upd_whole", v2);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->version, 2u);
  EXPECT_EQ(stats->bytes_written, v2.num_bytes);
  EXPECT_EQ(stats->shards_kept, 0);
  auto got = client_->Get("upd_whole");
  ASSERT_OK(got.status());
  EXPECT_TRUE(SameBytes(*got, v2));
  EXPECT_EQ(client_->Describe("upd_whole")->version, 2u);
  EXPECT_EQ(SettledBytesUsed() - before, v2.num_bytes);
  ASSERT_OK(client_->Delete("upd_whole"));
}

TEST_F(ServingTest, RegionalUpdateKeepsUntouchedShardsHandles) {
  const HostArray v1 = Iota(DType::kFloat32, {40, 8}, 3);
  ASSERT_OK(client_->Put("upd_region", v1,
                         LayoutSpec::Chunk(0, Ranks({0, 1, 2, 3}))));
  auto old_meta = client_->Describe("upd_region");
  ASSERT_OK(old_meta.status());
  // Rows 12..17, columns 2..6: inside shard 1 (rows 10..19) only, in part.
  const Box region({12, 2}, {6, 5});
  const HostArray patch = Iota(DType::kFloat32, {6, 5}, 77);
  auto stats = client_->Update("upd_region", patch, region);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->version, 2u);
  EXPECT_EQ(stats->shards_kept, 3);
  EXPECT_EQ(stats->bytes_written, patch.num_bytes);
  auto new_meta = client_->Describe("upd_region");
  ASSERT_OK(new_meta.status());
  for (int i : {0, 2, 3}) {
    EXPECT_EQ(new_meta->shards[i].replicas[0].shard_id,
              old_meta->shards[i].replicas[0].shard_id)
        << "shard " << i << " was copied, not kept";
  }
  EXPECT_NE(new_meta->shards[1].replicas[0].shard_id,
            old_meta->shards[1].replicas[0].shard_id);
  auto got = client_->Get("upd_region");
  ASSERT_OK(got.status());
  EXPECT_TRUE(SameBytes(*got, Patched(v1, region, patch)));

  // A region across shards 0..2, whole rows: shards 0 and 2 patched, 1
  // rewritten, 3 kept.
  const Box across({5, 0}, {20, 8});
  const HostArray patch2 = Iota(DType::kFloat32, {20, 8}, 78);
  stats = client_->Update("upd_region", patch2, across);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->version, 3u);
  EXPECT_EQ(stats->shards_kept, 1);
  got = client_->Get("upd_region");
  ASSERT_OK(got.status());
  EXPECT_TRUE(
      SameBytes(*got, Patched(Patched(v1, region, patch), across, patch2)));
  ASSERT_OK(client_->Delete("upd_region"));
}

TEST_F(ServingTest, UpdateOfAnotherShapeOrDtypeChangesNothing) {
  const HostArray v1 = Iota(DType::kFloat32, {16, 4}, 4);
  ASSERT_OK(client_->Put("upd_bad", v1, LayoutSpec::Chunk(0, Ranks({0, 1}))));
  EXPECT_THAT(client_->Update("upd_bad", Iota(DType::kFloat32, {16, 5}, 5)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("shape")));
  EXPECT_THAT(client_->Update("upd_bad", Iota(DType::kInt32, {16, 4}, 5)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dtype")));
  EXPECT_THAT(client_->Update("upd_bad", Iota(DType::kFloat32, {2, 2}, 5),
                              Box({15, 3}, {2, 2})),
              StatusIs(absl::StatusCode::kOutOfRange));
  EXPECT_THAT(client_->Update("upd_bad", Iota(DType::kFloat32, {2, 3}, 5),
                              Box({0, 0}, {2, 2})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("shape")));
  EXPECT_EQ(client_->Describe("upd_bad")->version, 1u);
  auto got = client_->Get("upd_bad");
  ASSERT_OK(got.status());
  EXPECT_TRUE(SameBytes(*got, v1));
  ASSERT_OK(client_->Delete("upd_bad"));
}

TEST_F(ServingTest, ReadersSeeAllOfOneVersionUnderUpdates) {
  const Shape shape = {256, 64};
  ASSERT_OK(client_->Put("upd_readers", Filled(shape, 1),
                         LayoutSpec::Chunk(0, Ranks({0, 1, 2, 3}))));
  std::atomic<bool> stop{false};
  std::atomic<int64_t> reads{0}, mixed{0}, failed{0};
  std::vector<std::thread> readers;
  for (int r = 0; r < 4; ++r) {
    readers.emplace_back([&, r] {
      auto client = Client::Connect(cluster_->coordinator_address());
      if (!client.ok()) {
        ++failed;
        return;
      }
      while (!stop.load()) {
        // Whole gets, and row gathers across every shard.
        absl::StatusOr<HostArray> got =
            r % 2 == 0 ? (*client)->Get("upd_readers")
                       : (*client)->GatherRows("upd_readers",
                                               {255, 0, 64, 128, 192, 63});
        if (!got.ok()) {
          ++failed;
          continue;
        }
        ++reads;
        if (std::isnan(UniformValue(*got))) ++mixed;
      }
    });
  }
  for (int v = 2; v <= 12; ++v) {
    auto stats = client_->Update("upd_readers", Filled(shape, v));
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_EQ(stats->version, static_cast<uint64_t>(v));
  }
  stop = true;
  for (std::thread& t : readers) t.join();
  EXPECT_GT(reads.load(), 0);
  EXPECT_EQ(mixed.load(), 0) << "a read saw parts of two versions";
  EXPECT_EQ(failed.load(), 0);
  auto last = client_->Get("upd_readers");
  ASSERT_OK(last.status());
  EXPECT_EQ(UniformValue(*last), 12.0f);
  ASSERT_OK(client_->Delete("upd_readers"));
}

TEST_F(ServingTest, RacingUpdatesOneWinsTheOtherIsAbortedNothingLeaks) {
  const int64_t before = SettledBytesUsed();
  const Shape shape = {512, 32};
  ASSERT_OK(client_->Put("upd_race", Filled(shape, 0),
                         LayoutSpec::Chunk(0, Ranks({0, 1, 2, 3}))));
  std::atomic<int> ok{0}, aborted{0}, other{0};
  std::vector<std::thread> writers;
  for (int w = 1; w <= 2; ++w) {
    writers.emplace_back([&, w] {
      auto client = Client::Connect(cluster_->coordinator_address());
      ASSERT_TRUE(client.ok());
      for (int i = 0; i < 10; ++i) {
        absl::StatusOr<UpdateStats> s =
            (*client)->Update("upd_race", Filled(shape, w));
        if (s.ok()) {
          ++ok;
        } else if (absl::IsAborted(s.status())) {
          ++aborted;
        } else {
          ++other;
          ADD_FAILURE() << s.status();
        }
      }
    });
  }
  for (std::thread& t : writers) t.join();
  EXPECT_EQ(other.load(), 0);
  EXPECT_EQ(ok.load() + aborted.load(), 20);
  auto meta = client_->Describe("upd_race");
  ASSERT_OK(meta.status());
  EXPECT_EQ(meta->version, static_cast<uint64_t>(1 + ok.load()));
  auto got = client_->Get("upd_race");
  ASSERT_OK(got.status());
  const float value = UniformValue(*got);
  EXPECT_TRUE(value == 1.0f || value == 2.0f) << value;
  EXPECT_EQ(SettledBytesUsed() - before, 512 * 32 * 4);
  ASSERT_OK(client_->Delete("upd_race"));
}

TEST_F(ServingTest, AStagedUpdateBlocksOthersUntilAbandonedAndLeavesNothing) {
  const int64_t before = SettledBytesUsed();
  const HostArray v1 = Iota(DType::kFloat32, {32, 8}, 6);
  ASSERT_OK(
      client_->Put("upd_staged", v1, LayoutSpec::Chunk(0, Ranks({0, 1}))));
  // A caller that starts an update and goes quiet.
  auto stub = v1::Coordinator::NewStub(
      MakeChannel(cluster_->coordinator_address(), ChannelOptions{}));
  v1::UpdateTensorRequest start;
  start.set_name("upd_staged");
  v1::UpdateTensorResponse staged;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(stub->UpdateTensor(&context, start, &staged).ok());
  }
  EXPECT_EQ(staged.tensor().version(), 2u);
  EXPECT_GT(BytesUsed() - before, v1.num_bytes);
  // Another update, or a reshard, is refused meanwhile; readers see N.
  EXPECT_THAT(client_->Update("upd_staged", Iota(DType::kFloat32, {32, 8}, 7)),
              StatusIs(absl::StatusCode::kAborted));
  EXPECT_THAT(
      client_->Reshard("upd_staged", LayoutSpec::Chunk(1, Ranks({0, 1}))),
      StatusIs(absl::StatusCode::kAborted));
  auto got = client_->Get("upd_staged");
  ASSERT_OK(got.status());
  EXPECT_TRUE(SameBytes(*got, v1));
  // Abandoned: N+1's shards are freed, and updates work again.
  v1::CommitTensorRequest abandon;
  abandon.set_name("upd_staged");
  abandon.set_version(2);
  abandon.set_change_id(staged.change_id());
  abandon.set_abandon(true);
  v1::CommitTensorResponse abandoned;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(stub->CommitTensor(&context, abandon, &abandoned).ok());
  }
  EXPECT_EQ(BytesUsed() - before, v1.num_bytes);
  const HostArray v2 = Iota(DType::kFloat32, {32, 8}, 8);
  auto stats = client_->Update("upd_staged", v2);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->version, 2u);
  got = client_->Get("upd_staged");
  ASSERT_OK(got.status());
  EXPECT_TRUE(SameBytes(*got, v2));

  // A delete takes a staged update along.
  {
    grpc::ClientContext context;
    ASSERT_TRUE(stub->UpdateTensor(&context, start, &staged).ok());
  }
  ASSERT_OK(client_->Delete("upd_staged"));
  EXPECT_EQ(SettledBytesUsed(), before);
}

// Read leases with a long lease time: a replaced version nobody reads is
// freed at once, one a reader leased stays until that reader is done.
class LeaseTest : public ClusterSuite<LeaseTest> {
 public:
  static TestClusterOptions ClusterOptions() {
    TestClusterOptions options;
    options.num_workers = 2;
    options.coordinator_flags = {"--retire_grace_ms=60000"};
    return options;
  }

 protected:
  // Polls `workers` until the bytes in use equal `want`; false after 3 s.
  static bool BytesUsedBecomes(int64_t want) {
    const absl::Time deadline = absl::Now() + absl::Seconds(3);
    while (absl::Now() < deadline) {
      if (BytesUsed() == want) return true;
      absl::SleepFor(absl::Milliseconds(50));
    }
    return BytesUsed() == want;
  }
};

TEST_F(LeaseTest, AReplacedVersionNobodyReadsIsFreedAtOnce) {
  const int64_t before = BytesUsed();
  const HostArray v1 = Iota(DType::kFloat32, {128, 64}, 1);
  ASSERT_OK(
      client_->Put("lease_none", v1, LayoutSpec::Chunk(0, Ranks({0, 1}))));
  // Read through the SDK (it leases and releases), then replaced twice.
  ASSERT_OK(client_->Get("lease_none").status());
  ASSERT_OK(client_->Update("lease_none", Iota(DType::kFloat32, {128, 64}, 2)));
  ASSERT_OK(
      client_->Reshard("lease_none", LayoutSpec::Chunk(1, Ranks({1, 0}))));
  // Within the 2 s `workers` promises, not the 60 s lease time.
  EXPECT_TRUE(BytesUsedBecomes(before + v1.num_bytes)) << BytesUsed();
  ASSERT_OK(client_->Delete("lease_none"));
}

TEST_F(LeaseTest, AVersionALeasedReaderHoldsStaysUntilReleased) {
  const int64_t before = BytesUsed();
  const HostArray v1 = Iota(DType::kFloat32, {128, 64}, 3);
  ASSERT_OK(
      client_->Put("lease_held", v1, LayoutSpec::Chunk(0, Ranks({0, 1}))));
  // A reader leases version 1 and reads it after version 2 is committed.
  auto stub = v1::Coordinator::NewStub(
      MakeChannel(cluster_->coordinator_address(), ChannelOptions{}));
  v1::GetTensorRequest get;
  get.set_name("lease_held");
  get.set_lease(true);
  v1::GetTensorResponse leased;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(stub->GetTensor(&context, get, &leased).ok());
  }
  EXPECT_EQ(leased.lease_ms(), 60000);
  ASSERT_GT(leased.tensor().shards_size(), 0);
  const uint64_t old_shard = leased.tensor().shards(0).handle().shard_id();
  auto old_handles = client_->Handles("lease_held");
  ASSERT_OK(old_handles.status());
  ASSERT_EQ((*old_handles)[0].shard().replicas[0].shard_id, old_shard);
  ASSERT_OK(client_->Update("lease_held", Iota(DType::kFloat32, {128, 64}, 4)));
  absl::SleepFor(absl::Milliseconds(500));
  EXPECT_EQ(BytesUsed() - before, 2 * v1.num_bytes);
  auto still = (*old_handles)[0].ToHere();
  ASSERT_OK(still.status());
  EXPECT_TRUE(SameBytes(*still, Slice(v1, Box({0, 0}, {64, 64}))));
  // Done: version 1 goes now.
  v1::ReleaseReadRequest release;
  release.set_name("lease_held");
  release.set_version(1);
  v1::ReleaseReadResponse released;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(stub->ReleaseRead(&context, release, &released).ok());
  }
  EXPECT_TRUE(BytesUsedBecomes(before + v1.num_bytes)) << BytesUsed();
  EXPECT_THAT(
      (*old_handles)[0].ToHere(),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("freed")));
  ASSERT_OK(client_->Delete("lease_held"));
}

}  // namespace
}  // namespace tessera
