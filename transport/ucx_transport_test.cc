// UcxTransport against real workers in this process (real gRPC and UCX on
// 127.0.0.1): the transport contract (transport_contract_test.h) for UCX
// alone, a chain forced to UCX and the automatic chain; then what UCX adds:
// byte-exact large and strided moves, keys of freed shards, withdrawn keys,
// and workers that offer no UCX. ucx_transport_tcp_test runs this file with
// UCX_TLS=tcp, the path between hosts.
#include "transport/ucx_transport.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "core/strided_copy.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "transport/transport_chain.h"
#include "transport/transport_contract_test.h"
#include "transport/ucx_testutil.h"

namespace tessera {
namespace testing {
namespace {

using ::testing::HasSubstr;

constexpr absl::Duration kTimeout = absl::Seconds(30);

UcxTransportOptions TestOptions() {
  UcxTransportOptions options;
  options.timeout = kTimeout;
  options.stall_timeout = absl::Seconds(10);
  return options;
}

std::vector<std::shared_ptr<grpc::Service>> Served(WorkerNode* node) {
  return UcxServices(node);
}

INSTANTIATE_TEST_SUITE_P(
    Ucx, TransportContractTest,
    ::testing::Values(
        TransportFactory{
            "ucx",
            [](ChannelCache* channels) -> std::unique_ptr<ShardTransport> {
              return std::make_unique<UcxTransport>(channels, TestOptions());
            },
            false, Served},
        TransportFactory{
            "forced_ucx_chain",
            [](ChannelCache* channels) -> std::unique_ptr<ShardTransport> {
              DataPlaneOptions options;
              options.timeout = kTimeout;
              options.transport = "ucx";
              return TransportChain::Make(channels, options);
            },
            false, Served},
        TransportFactory{
            "auto_chain",
            [](ChannelCache* channels) -> std::unique_ptr<ShardTransport> {
              DataPlaneOptions options;
              options.timeout = kTimeout;
              return TransportChain::Make(channels, options);
            },
            false, Served}),
    FactoryName);

// Fills `n` bytes with a pattern that differs from the workers' arange.
std::string Pattern(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(i * 7 + 13);
  return s;
}

TEST(UcxTransportTest, ForcedUcxReadsAndWritesLargeShardsByteExact) {
  LocalWorker worker(/*ucx=*/true);
  ChannelCache channels;
  DataPlaneOptions options;
  options.timeout = kTimeout;
  options.transport = "ucx";
  auto chain = TransportChain::Make(&channels, options);
  // 2048 x 2048 float32: 16 MiB, several gets in flight.
  const Shape shape{2048, 2048};
  ASSERT_THAT(worker.Allocate(1, shape, DType::kFloat32), IsOk());
  // The shard is the box at {3, 5} of a larger source array.
  const Shape src_shape{2051, 2060};
  const std::string src = Pattern(2051 * 2060 * 4);
  ASSERT_THAT(chain->Write(worker.At(1, shape, DType::kFloat32),
                           WriteSource{src.data(), src_shape, {3, 5}}),
              IsOk());
  std::string want(2048 * 2048 * 4, '\0');
  CopyBox(src.data(), src_shape, {3, 5}, want.data(), shape, {0, 0}, shape, 4);
  ASSERT_TRUE(worker.Bytes(1) == want) << "the worker holds other bytes";

  std::string whole(want.size(), '\0');
  ASSERT_THAT(chain->Read(worker.At(1, shape, DType::kFloat32), WholeBox(shape),
                          ReadTarget::HostArray(whole.data(), shape, {0, 0})),
              IsOk());
  EXPECT_TRUE(whole == want) << "whole read differs";
  // Columns 100..1124 of every row: 4 KiB runs, one message each.
  const Box columns{{0, 100}, {2048, 1024}};
  std::string got(2048 * 1024 * 4, '\x5a');
  ASSERT_THAT(
      chain->Read(worker.At(1, shape, DType::kFloat32), columns,
                  ReadTarget::HostArray(got.data(), {2048, 1024}, {0, 0})),
      IsOk());
  std::string cols(got.size(), '\0');
  CopyBox(want.data(), shape, {0, 100}, cols.data(), Shape{2048, 1024}, {0, 0},
          Shape{2048, 1024}, 4);
  EXPECT_TRUE(got == cols) << "strided read differs";

  const DataPlaneStats stats = chain->Stats();
  // The write, the whole read and the columns.
  EXPECT_EQ(stats.bytes.at("ucx"),
            2 * int64_t{2048} * 2048 * 4 + int64_t{2048} * 1024 * 4);
  EXPECT_EQ(stats.fallbacks.at("ucx"), 0);
}

TEST(UcxTransportTest, SinkTargetsReceiveTheBoxInOrder) {
  LocalWorker worker(/*ucx=*/true);
  ChannelCache channels;
  UcxTransportOptions options = TestOptions();
  options.stage_bytes = 64 << 10;  // several staged chunks
  UcxTransport ucx(&channels, options);
  const Shape shape{512, 300};
  ASSERT_THAT(worker.Allocate(1, shape, DType::kInt32), IsOk());
  const std::string shard = worker.Bytes(1);
  // Whole rows (sent ranges), and short runs (staged in row slabs).
  for (const Box& box : {Box{{7, 0}, {400, 300}}, Box{{1, 2}, {500, 290}},
                         Box{{3, 150}, {100, 150}}}) {
    SCOPED_TRACE(box.ToString());
    std::string got(static_cast<size_t>(box.NumElements()) * 4, '\0');
    int64_t next = 0;
    ASSERT_THAT(ucx.Read(worker.At(1, shape, DType::kInt32), box,
                         ReadTarget::Sink([&](int64_t first, int64_t count,
                                              const char* data) {
                           EXPECT_EQ(first, next);
                           std::memcpy(got.data() + first * 4, data, count * 4);
                           next = first + count;
                           return absl::OkStatus();
                         })),
                IsOk());
    EXPECT_EQ(next, box.NumElements());
    std::string want(got.size(), '\0');
    CopyBoxToFlatRange(shard.data(), shape, box.offsets, box.sizes, 0,
                       box.NumElements(), want.data(), 4);
    EXPECT_TRUE(got == want) << "bytes differ";
  }
  // A thin column: the worker packs it (UcxData.Stage) ...
  std::vector<char> out(100 * 7 * 4);
  const Box thin{{3, 5}, {100, 7}};
  ASSERT_THAT(ucx.Read(worker.At(1, shape, DType::kInt32), thin,
                       ReadTarget::HostArray(out.data(), {100, 7}, {0, 0})),
              IsOk());
  std::string want(out.size(), '\0');
  CopyBoxToFlatRange(shard.data(), shape, thin.offsets, thin.sizes, 0,
                     thin.NumElements(), want.data(), 4);
  EXPECT_TRUE(std::string(out.data(), out.size()) == want) << "bytes differ";
  // ... and without that, whole rows would read far more than it needs:
  // declined, so a chain asks the worker to gather it (gRPC).
  options.remote_stage_bytes = 0;
  UcxTransport rows_only(&channels, options);
  EXPECT_THAT(
      rows_only.Read(worker.At(1, shape, DType::kInt32), thin,
                     ReadTarget::HostArray(out.data(), {100, 7}, {0, 0})),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("too sparse")));
}

TEST(UcxTransportTest, FreedShardThroughCachedKeyFailsCleanly) {
  UcxServerOptions server;
  server.sweep_interval = absl::Milliseconds(20);
  server.grace = absl::Milliseconds(200);
  LocalWorker worker(/*ucx=*/true, server);
  ChannelCache channels;
  UcxTransportOptions options = TestOptions();
  options.key_ttl = absl::Milliseconds(100);  // below the worker's grace
  UcxTransport ucx(&channels, options);
  ASSERT_THAT(worker.Allocate(1, {1000}, DType::kInt32), IsOk());
  ASSERT_THAT(worker.Allocate(2, {1000}, DType::kInt32), IsOk());
  std::vector<char> out(4000);
  auto read = [&](uint64_t id) {
    return ucx.Read(worker.At(id, {1000}, DType::kInt32), WholeBox({1000}),
                    ReadTarget::HostArray(out.data(), {1000}, {0}));
  };
  ASSERT_THAT(read(1), IsOk());
  ASSERT_THAT(worker.store().Free(1), IsOk());
  // The key is cached and fresh: the worker refuses to send.
  EXPECT_THAT(read(1),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("not held")));
  // Once the worker has forgotten the dead key, the reader no longer trusts
  // its old key and asks again: still NOT_FOUND, and nothing faults.
  absl::SleepFor(absl::Milliseconds(500));
  EXPECT_EQ(worker.ucx()->Counts().second, 0u) << "grace not over";
  EXPECT_THAT(read(1), StatusIs(absl::StatusCode::kNotFound));
  // The lane is fine for other shards.
  ASSERT_THAT(read(2), IsOk());
  EXPECT_TRUE(std::string(out.data(), out.size()) == worker.Bytes(2));
}

// A freed shard's key lets the shard go, so the worker's next shard of its
// size takes the same pages at once. A reader still holding the old key
// must be refused: NOT_FOUND, never another shard's bytes.
TEST(UcxTransportTest, FreedShardsPagesServeTheNextShardAndOldKeysAreRefused) {
  if (access("/dev/shm", W_OK) != 0) GTEST_SKIP() << "no /dev/shm here";
  UcxServerOptions server;
  server.sweep_interval = absl::Milliseconds(20);
  auto arena = std::make_shared<SharedMemoryArena>();
  LocalWorker worker(/*ucx=*/true, server, arena);
  ChannelCache channels;
  UcxTransport ucx(&channels, TestOptions());
  const Shape shape = {256, 1024};
  const int64_t bytes = 256 * 1024 * 4;
  ASSERT_THAT(worker.Allocate(1, shape, DType::kInt32, /*writable=*/false),
              IsOk());
  std::vector<char> out(bytes);
  auto read = [&](uint64_t id) {
    return ucx.Read(worker.At(id, shape, DType::kInt32), WholeBox(shape),
                    ReadTarget::HostArray(out.data(), shape, {0, 0}));
  };
  ASSERT_THAT(read(1), IsOk());
  const char* pages = worker.store().Pin(1)->data;
  ASSERT_THAT(worker.store().Free(1), IsOk());
  // The sweeper turns the registration dead and lets the shard go.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (arena->ParkedBytes() < bytes && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(arena->ParkedBytes(), bytes) << "the dead key still holds it";
  EXPECT_EQ(worker.store().PinnedBytes(), 0);
  EXPECT_EQ(worker.ucx()->Counts().second, 1u) << "remembered for its grace";
  ASSERT_THAT(worker.Allocate(2, shape, DType::kInt32, /*writable=*/false,
                              InitSpec{InitSpec::Kind::kOnes}),
              IsOk());
  ASSERT_EQ(worker.store().Pin(2)->data, pages) << "pages not reused";
  // The old key names a dead key: refused, whatever the pages hold now.
  std::fill(out.begin(), out.end(), 0);
  EXPECT_THAT(read(1), StatusIs(absl::StatusCode::kNotFound));
  ASSERT_THAT(read(2), IsOk());
  EXPECT_TRUE(std::string(out.data(), out.size()) == worker.Bytes(2));
}

// A contiguous range is sent by the worker into a posted receive (several
// messages when it is long), byte-exact; a freed shard's range is refused
// (NOT_FOUND), and a worker that sends one message at a time queues the
// rest.
TEST(UcxTransportTest, SentRangesArriveWholeAndFreedAreRefused) {
  UcxServerOptions server;
  server.sweep_interval = absl::Milliseconds(20);
  LocalWorker worker(/*ucx=*/true, server);
  ChannelCache channels;
  UcxTransportOptions options = TestOptions();
  options.send_bytes = 4096;  // a 64 KiB shard in 16 messages
  UcxTransport ucx(&channels, options);
  const Shape shape = {128, 128};
  ASSERT_THAT(worker.Allocate(1, shape, DType::kInt32), IsOk());
  ASSERT_THAT(worker.Allocate(2, shape, DType::kInt32), IsOk());
  std::string out(128 * 128 * 4, '\0');
  auto read = [&](UcxTransport& transport, LocalWorker& at, uint64_t id,
                  const Box& box) {
    out.assign(static_cast<size_t>(box.NumElements() * 4), '\0');
    const Shape sizes(box.sizes.begin(), box.sizes.end());
    return transport.Read(at.At(id, shape, DType::kInt32), box,
                          ReadTarget::HostArray(out.data(), sizes, {0, 0}));
  };
  ASSERT_THAT(read(ucx, worker, 1, WholeBox(shape)), IsOk());
  EXPECT_TRUE(out == worker.Bytes(1));
  EXPECT_EQ(worker.ucx()->RangesSent(), 16) << "not sent in 4 KiB messages";
  // Rows 5..104: one range from the middle of the shard.
  ASSERT_THAT(read(ucx, worker, 1, Box{{5, 0}, {100, 128}}), IsOk());
  EXPECT_TRUE(out == worker.Bytes(1).substr(5 * 128 * 4, 100 * 128 * 4));
  ASSERT_THAT(worker.store().Free(1), IsOk());
  EXPECT_THAT(read(ucx, worker, 1, WholeBox(shape)),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("not held")));
  ASSERT_THAT(read(ucx, worker, 2, WholeBox(shape)), IsOk());
  EXPECT_TRUE(out == worker.Bytes(2));

  UcxServerOptions one;
  one.max_sends_in_flight = 1;
  LocalWorker queued(/*ucx=*/true, one);
  ASSERT_THAT(queued.Allocate(3, shape, DType::kInt32), IsOk());
  ASSERT_THAT(read(ucx, queued, 3, WholeBox(shape)), IsOk());
  EXPECT_TRUE(out == queued.Bytes(3));
  EXPECT_EQ(queued.ucx()->RangesSent(), 16);
}

TEST(UcxTransportTest, WithdrawnKeyIsAskedForAgain) {
  UcxServerOptions server;
  server.max_registrations = 1;  // a second shard's key withdraws the first
  LocalWorker worker(/*ucx=*/true, server);
  ChannelCache channels;
  UcxTransport ucx(&channels, TestOptions());
  ASSERT_THAT(worker.Allocate(1, {64, 64}, DType::kInt16), IsOk());
  ASSERT_THAT(worker.Allocate(2, {64, 64}, DType::kInt16), IsOk());
  std::string out(64 * 64 * 2, '\0');
  auto read = [&](uint64_t id) {
    return ucx.Read(worker.At(id, {64, 64}, DType::kInt16), WholeBox({64, 64}),
                    ReadTarget::HostArray(out.data(), {64, 64}, {0, 0}));
  };
  ASSERT_THAT(read(1), IsOk());
  ASSERT_THAT(read(2), IsOk());
  // Shard 1's cached key was withdrawn: the check says so and a fresh key
  // reads the right bytes.
  ASSERT_THAT(read(1), IsOk());
  EXPECT_TRUE(out == worker.Bytes(1));
}

// Readers the worker forgot (pushed out by newer readers, or idle) are
// told so, and say hello again: each read is served within its deadline,
// not left waiting on requests the worker drops. (A reader's request on an
// endpoint the worker had closed once crashed the worker inside UCX.)
TEST(UcxTransportTest, ReadersTheWorkerForgotSayHelloAgain) {
  UcxServerOptions server;
  server.max_peers = 1;  // each reader pushes the other one out
  server.peer_idle_timeout = absl::Seconds(1);
  server.sweep_interval = absl::Milliseconds(50);
  LocalWorker worker(/*ucx=*/true, server);
  ChannelCache channels;
  UcxTransportOptions options = TestOptions();
  options.timeout = absl::Seconds(20);
  options.stall_timeout = absl::Minutes(10);  // a dropped request: deadline
  UcxTransport first(&channels, options), second(&channels, options);
  ASSERT_THAT(worker.Allocate(1, {256, 64}, DType::kInt32), IsOk());
  const std::string expected = worker.Bytes(1);
  auto read = [&](UcxTransport& ucx) {
    std::string out(expected.size(), '\0');
    absl::Status status =
        ucx.Read(worker.At(1, {256, 64}, DType::kInt32), WholeBox({256, 64}),
                 ReadTarget::HostArray(out.data(), {256, 64}, {0, 0}));
    EXPECT_TRUE(!status.ok() || out == expected);
    return status;
  };
  for (int round = 0; round < 3; ++round) {
    ASSERT_THAT(read(first), IsOk()) << "round " << round;
    ASSERT_THAT(read(second), IsOk()) << "round " << round;
  }
  // Idle past the worker's limit (but not the readers' own): forgotten.
  absl::SleepFor(absl::Milliseconds(2500));
  ASSERT_THAT(read(first), IsOk());
  ASSERT_THAT(read(first), IsOk());
  EXPECT_EQ(worker.ucx()->Peers(), 1);
}

TEST(UcxTransportTest, RowsOfSeveralShardsArriveWhole) {
  LocalWorker worker(/*ucx=*/true);
  ChannelCache channels;
  UcxTransportOptions options = TestOptions();
  options.stage_bytes = 4096;  // several staged batches of rows
  UcxTransport ucx(&channels, options);
  ASSERT_THAT(worker.Allocate(1, {100, 300}, DType::kInt32), IsOk());
  ASSERT_THAT(worker.Allocate(2, {50, 7}, DType::kFloat64), IsOk());
  std::vector<ShardRows> entries(2);
  entries[0].shard = worker.At(1, {100, 300}, DType::kInt32);
  entries[0].rows = {99, 0, 5, 5, 42, 17, 63};
  entries[1].shard = worker.At(2, {50, 7}, DType::kFloat64);
  entries[1].rows = {3, 49};
  const std::string one = worker.Bytes(1), two = worker.Bytes(2);
  int delivered = 0;
  ASSERT_THAT(
      ucx.ReadRows(entries,
                   [&](size_t e, size_t k, const char* row) {
                     const int64_t bytes = e == 0 ? 1200 : 56;
                     const std::string& shard = e == 0 ? one : two;
                     EXPECT_EQ(std::string(row, bytes),
                               shard.substr(entries[e].rows[k] * bytes, bytes))
                         << "entry " << e << " row " << k;
                     ++delivered;
                   }),
      IsOk());
  EXPECT_EQ(delivered, 9);
  entries[1].rows = {50};
  EXPECT_THAT(
      ucx.ReadRows(entries, [](size_t, size_t, const char*) {}),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("outside")));
  entries.resize(1);
  ASSERT_THAT(worker.store().Free(1), IsOk());
  EXPECT_THAT(ucx.ReadRows(entries, [](size_t, size_t, const char*) {}),
              StatusIs(absl::StatusCode::kNotFound));
}

TEST(UcxTransportTest, WorkerWithoutUcxFallsBackToGrpcAndCountsIt) {
  LocalWorker worker(/*ucx=*/false);
  ChannelCache channels;
  DataPlaneOptions options;
  options.timeout = kTimeout;
  options.shared_memory = false;
  auto chain = TransportChain::Make(&channels, options);
  ASSERT_THAT(worker.Allocate(1, {1000}, DType::kInt32), IsOk());
  std::vector<char> out(4000);
  for (int i = 0; i < 2; ++i) {
    ASSERT_THAT(
        chain->Read(worker.At(1, {1000}, DType::kInt32), WholeBox({1000}),
                    ReadTarget::HostArray(out.data(), {1000}, {0})),
        IsOk());
  }
  EXPECT_TRUE(std::string(out.data(), out.size()) == worker.Bytes(1));
  const DataPlaneStats stats = chain->Stats();
  EXPECT_EQ(stats.bytes.at("ucx"), 0);
  EXPECT_EQ(stats.bytes.at("grpc"), 8000);
  EXPECT_EQ(stats.fallbacks.at("ucx"), 2);
}

TEST(UcxTransportTest, ForcedUcxNamesTheTransportAndWorkerItCannotReach) {
  LocalWorker worker(/*ucx=*/false);
  ChannelCache channels;
  DataPlaneOptions options;
  options.timeout = kTimeout;
  options.transport = "ucx";
  auto chain = TransportChain::Make(&channels, options);
  ASSERT_THAT(worker.Allocate(1, {1000}, DType::kInt32), IsOk());
  std::vector<char> out(4000);
  EXPECT_THAT(
      chain->Read(worker.At(1, {1000}, DType::kInt32), WholeBox({1000}),
                  ReadTarget::HostArray(out.data(), {1000}, {0})),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               ::testing::AllOf(HasSubstr("ucx transport"), HasSubstr("w0"))));
  RemoteShard gone = worker.At(1, {1000}, DType::kInt32);
  gone.location.address = "127.0.0.1:1";
  EXPECT_THAT(
      chain->Read(gone, WholeBox({1000}),
                  ReadTarget::HostArray(out.data(), {1000}, {0})),
      StatusIs(absl::StatusCode::kUnavailable,
               ::testing::AllOf(HasSubstr("transport"), HasSubstr("w0"))));
}

}  // namespace
}  // namespace testing
}  // namespace tessera

namespace tessera {
namespace testing {
namespace {

// UCX that cannot make a worker here (the host's shared memory is
// exhausted, or its configuration is wrong) is a transport that cannot
// run: the chain falls back to gRPC and counts it, instead of failing the
// read.
TEST(UcxTransportStartTest, AWorkerThatCannotStartFallsBackToGrpc) {
  if (TrustedFabricByEnvironment()) {
    GTEST_SKIP() << "breaks UCX's shared-memory transport; the same-host "
                    "suite runs it";
  }
  LocalWorker worker(/*ucx=*/true);  // its UCX starts before the damage
  ASSERT_THAT(worker.Allocate(1, {1000}, DType::kInt32), IsOk());
  // An invalid FIFO size makes every new UCX worker of this process fail.
  ASSERT_EQ(setenv("UCX_MM_FIFO_SIZE", "1", 1), 0);
  ChannelCache channels;
  DataPlaneOptions options;
  options.timeout = kTimeout;
  options.shared_memory = false;
  auto chain = TransportChain::Make(&channels, options);
  std::vector<char> out(4000);
  absl::Status read =
      chain->Read(worker.At(1, {1000}, DType::kInt32), WholeBox({1000}),
                  ReadTarget::HostArray(out.data(), {1000}, {0}));
  unsetenv("UCX_MM_FIFO_SIZE");
  ASSERT_THAT(read, IsOk());
  EXPECT_TRUE(std::string(out.data(), out.size()) == worker.Bytes(1));
  const DataPlaneStats stats = chain->Stats();
  EXPECT_EQ(stats.bytes.at("grpc"), 4000);
  EXPECT_EQ(stats.fallbacks.at("ucx"), 1);
}

}  // namespace
}  // namespace testing
}  // namespace tessera
