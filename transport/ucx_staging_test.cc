// Boxes with short contiguous runs read over UCX through the worker's
// staging memory (UcxData.Stage, transport/ucx_server.h): byte-exact into
// host arrays with long and short runs and into sinks, leases ended after
// each range, a range of the shard sent unpacked, a worker that stages
// nothing, a shard freed during a read, and the bounds and lapses of the
// staging memory itself.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "core/strided_copy.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/ucx.grpc.pb.h"
#include "rpc/channel.h"
#include "rpc/security.h"
#include "rpc/status.h"
#include "transport/ucx_testutil.h"
#include "transport/ucx_transport.h"

namespace tessera {
namespace testing {
namespace {

using ::testing::HasSubstr;

UcxTransportOptions Options(int64_t remote_stage_bytes) {
  UcxTransportOptions options;
  options.timeout = absl::Seconds(30);
  options.stall_timeout = absl::Seconds(10);
  options.remote_stage_bytes = remote_stage_bytes;
  return options;
}

// The box of the shard's bytes, row-major.
std::string Expected(const std::string& shard, const Shape& shape,
                     const Box& box, size_t item) {
  std::string want(static_cast<size_t>(box.NumElements()) * item, '\0');
  const std::vector<int64_t> sizes(box.sizes.begin(), box.sizes.end());
  CopyBox(shard.data(), shape, box.offsets, want.data(), sizes,
          std::vector<int64_t>(box.rank(), 0), sizes, item);
  return want;
}

TEST(UcxStagingTest, ShortRunsArePackedByTheWorkerByteExact) {
  LocalWorker worker(/*ucx=*/true);
  ChannelCache channels;
  // 100 KiB ranges: several leases per box, cut mid-row.
  UcxTransport ucx(&channels, Options(100 << 10));
  const Shape shape{1024, 1000};
  ASSERT_THAT(worker.Allocate(1, shape, DType::kInt32), IsOk());
  const std::string shard = worker.Bytes(1);
  const RemoteShard at = worker.At(1, shape, DType::kInt32);
  // A rows -> columns piece: 1 KiB of every row.
  const Box box{{5, 100}, {1000, 256}};
  const std::string want = Expected(shard, shape, box, 4);

  // Into an array where the box's rows lie end to end: sent straight in.
  std::string direct(want.size(), '\x5a');
  ASSERT_THAT(
      ucx.Read(at, box,
               ReadTarget::HostArray(direct.data(), {1000, 256}, {0, 0})),
      IsOk());
  EXPECT_TRUE(direct == want) << "packed read into whole rows differs";

  // Into an array where they do not (short runs there too).
  const Shape wide{1003, 300};
  std::string out(1003 * 300 * 4, '\x5a');
  ASSERT_THAT(
      ucx.Read(at, box, ReadTarget::HostArray(out.data(), wide, {3, 7})),
      IsOk());
  std::string placed(want.size(), '\0');
  CopyBox(out.data(), wide, {3, 7}, placed.data(), Shape{1000, 256}, {0, 0},
          Shape{1000, 256}, 4);
  EXPECT_TRUE(placed == want) << "packed read into short runs differs";
  EXPECT_EQ(out[0], '\x5a') << "bytes outside the box were written";

  // Into a sink, in order.
  std::string sunk(want.size(), '\0');
  int64_t next = 0;
  ASSERT_THAT(ucx.Read(at, box,
                       ReadTarget::Sink([&](int64_t first, int64_t count,
                                            const char* data) {
                         EXPECT_EQ(first, next);
                         next = first + count;
                         std::memcpy(sunk.data() + first * 4, data, count * 4);
                         return absl::OkStatus();
                       })),
              IsOk());
  EXPECT_EQ(next, box.NumElements());
  EXPECT_TRUE(sunk == want) << "packed read into a sink differs";

  // Every lease was ended by its reader's check.
  const auto [leases, bytes] = worker.ucx()->StagingCounts();
  EXPECT_EQ(leases, 0u);
  EXPECT_EQ(bytes, 0);
  // The packed ranges were sent into the reader's buffers (each read is
  // at least 10 leases of 100 KiB).
  EXPECT_GE(worker.ucx()->RangesSent(), 30);
  EXPECT_EQ(worker.ucx()->RangesStaged(), worker.ucx()->RangesSent());
}

// A worker that sends one range at a time queues the rest: the packed
// ranges arrive byte-exact all the same.
TEST(UcxStagingTest, SendsBeyondTheBoundAreQueued) {
  UcxServerOptions server;
  server.max_sends_in_flight = 1;
  LocalWorker worker(/*ucx=*/true, server);
  ChannelCache channels;
  UcxTransport ucx(&channels, Options(100 << 10));
  const Shape shape{1024, 1000};
  ASSERT_THAT(worker.Allocate(1, shape, DType::kInt32), IsOk());
  const Box box{{5, 100}, {1000, 256}};
  std::string got(static_cast<size_t>(box.NumElements()) * 4, '\x5a');
  ASSERT_THAT(ucx.Read(worker.At(1, shape, DType::kInt32), box,
                       ReadTarget::HostArray(got.data(), {1000, 256}, {0, 0})),
              IsOk());
  EXPECT_TRUE(got == Expected(worker.Bytes(1), shape, box, 4));
  EXPECT_GT(worker.ucx()->RangesSent(), 0);
  EXPECT_EQ(worker.ucx()->StagingCounts().first, 0u);
}

// A box that is one range of its shard (whole rows), read into an array
// where its runs are short (a columns -> rows reshard piece): nothing to
// pack, so the worker sends the range straight from the shard, and it is
// placed byte-exact.
TEST(UcxStagingTest, OneRangeIntoShortRunsIsSentUnpacked) {
  {
    LocalWorker worker(/*ucx=*/true);
    ChannelCache channels;
    // 1 MiB ranges: three for the box, the last one short.
    UcxTransport ucx(&channels, Options(1 << 20));
    const Shape shape{4096, 256};  // rows of 1 KiB
    ASSERT_THAT(worker.Allocate(1, shape, DType::kInt32), IsOk());
    const Box box{{3, 0}, {2900, 256}};
    const std::string want = Expected(worker.Bytes(1), shape, box, 4);
    const Shape wide{2902, 1024};
    std::string out(2902 * 1024 * 4, '\x5a');
    ASSERT_THAT(ucx.Read(worker.At(1, shape, DType::kInt32), box,
                         ReadTarget::HostArray(out.data(), wide, {1, 300})),
                IsOk());
    std::string placed(want.size(), '\0');
    CopyBox(out.data(), wide, {1, 300}, placed.data(), Shape{2900, 256}, {0, 0},
            Shape{2900, 256}, 4);
    EXPECT_TRUE(placed == want) << "the range placed into short runs differs";
    EXPECT_EQ(out[0], '\x5a') << "bytes outside the box were written";
    EXPECT_EQ(out[(1 * 1024 + 299) * 4], '\x5a');
    EXPECT_EQ(out[(1 * 1024 + 556) * 4], '\x5a');
    EXPECT_EQ(worker.ucx()->RangesSent(), 3);
    EXPECT_EQ(worker.ucx()->RangesStaged(), 0) << "nothing is packed";
  }
}

TEST(UcxStagingTest, WorkerThatStagesNothingIsReadAsWholeRows) {
  UcxServerOptions server;
  server.staging_bytes = 0;
  LocalWorker worker(/*ucx=*/true, server);
  ChannelCache channels;
  UcxTransport ucx(&channels, Options(1 << 20));
  const Shape shape{300, 512};
  ASSERT_THAT(worker.Allocate(1, shape, DType::kInt16), IsOk());
  const Box box{{10, 3}, {250, 100}};
  std::string got(static_cast<size_t>(box.NumElements()) * 2, '\0');
  ASSERT_THAT(ucx.Read(worker.At(1, shape, DType::kInt16), box,
                       ReadTarget::HostArray(got.data(), {250, 100}, {0, 0})),
              IsOk());
  EXPECT_TRUE(got == Expected(worker.Bytes(1), shape, box, 2));
}

TEST(UcxStagingTest, ShardFreedDuringAStagedReadFailsWithNotFound) {
  LocalWorker worker(/*ucx=*/true);
  ChannelCache channels;
  UcxTransport ucx(&channels, Options(16 << 10));
  const Shape shape{512, 512};
  ASSERT_THAT(worker.Allocate(1, shape, DType::kInt32), IsOk());
  const std::string shard = worker.Bytes(1);
  const Box box{{0, 0}, {512, 64}};
  const std::string want = Expected(shard, shape, box, 4);
  bool freed = false;
  absl::Status status = ucx.Read(
      worker.At(1, shape, DType::kInt32), box,
      ReadTarget::Sink([&](int64_t first, int64_t count, const char* data) {
        // What arrives is the shard's, never other bytes.
        EXPECT_EQ(std::memcmp(data, want.data() + first * 4, count * 4), 0);
        if (!freed) {
          freed = true;
          return worker.store().Free(1);
        }
        return absl::OkStatus();
      }));
  EXPECT_TRUE(freed);
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(worker.ucx()->StagingCounts().first, 0u);
}

TEST(UcxStagingTest, StagingIsBoundedCheckedAndLapses) {
  UcxServerOptions server;
  server.staging_bytes = 4 << 20;
  server.staging_slot_bytes = 1 << 20;
  server.max_stage_bytes = 2 << 20;
  // Long enough that the four leases below still hold when the fifth asks
  // on a loaded machine (100 ms was not, with other tests beside it).
  server.staging_ttl = absl::Seconds(1);
  server.sweep_interval = absl::Milliseconds(20);
  LocalWorker worker(/*ucx=*/true, server);
  UcxServer& ucx = *worker.ucx();
  ASSERT_THAT(worker.Allocate(1, {1024, 1024}, DType::kInt32), IsOk());
  const Box box{{0, 0}, {1024, 256}};  // 1 MiB
  EXPECT_THAT(ucx.Stage(9, box, 0, 10).status(),
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(ucx.Stage(1, Box{{0, 900}, {10, 200}}, 0, 10).status(),
              StatusIs(absl::StatusCode::kOutOfRange));
  EXPECT_THAT(ucx.Stage(1, Box{{0}, {10}}, 0, 10).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ucx.Stage(1, box, 262100, 200).status(),
              StatusIs(absl::StatusCode::kOutOfRange));
  EXPECT_THAT(ucx.Stage(1, box, -1, 10).status(),
              StatusIs(absl::StatusCode::kOutOfRange));
  EXPECT_THAT(ucx.Stage(1, Box{{0, 0}, {1024, 1024}}, 0, 1024 * 1024).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("lease")));
  // Four 1 MiB leases fill the staging memory; a fifth waits for a lapse.
  for (int i = 0; i < 4; ++i) {
    absl::StatusOr<UcxStaged> staged = ucx.Stage(1, box, 0, 262144);
    ASSERT_THAT(staged.status(), IsOk());
    EXPECT_EQ(staged->bytes, 1 << 20);
    EXPECT_NE(staged->lease, 0u);
  }
  EXPECT_THAT(ucx.Stage(1, box, 0, 1).status(),
              StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(ucx.StagingCounts().second, 4 << 20);
  const absl::Time until = absl::Now() + absl::Seconds(5);
  while (ucx.StagingCounts().first > 0 && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(ucx.StagingCounts().first, 0u) << "leases did not lapse";
  absl::StatusOr<UcxStaged> again = ucx.Stage(1, box, 5, 7);
  ASSERT_THAT(again.status(), IsOk());
  EXPECT_EQ(again->bytes, 7 * 4);
  EXPECT_EQ(ucx.StagingCounts().first, 1u);
}

TEST(UcxStagingTest, StageNeedsAReadCapability) {
  LocalWorker worker(/*ucx=*/true);
  ASSERT_THAT(worker.Allocate(1, {64, 64}, DType::kInt32), IsOk());
  std::unique_ptr<v1::UcxData::Stub> stub =
      v1::UcxData::NewStub(MakeChannel(worker.address()));
  auto stage = [&](const std::string& capability, int rank) {
    grpc::ClientContext context;
    PresentCapability(&context, capability);
    v1::UcxStageRequest request;
    request.set_shard_id(1);
    for (int d = 0; d < rank; ++d) {
      request.add_offsets(0);
      request.add_sizes(d == 0 ? 64 : 8);
    }
    request.set_first(0);
    request.set_count(16);
    v1::UcxStageResponse reply;
    return FromGrpcStatus(stub->Stage(&context, request, &reply));
  };
  const std::string granted =
      worker.At(1, {64, 64}, DType::kInt32).location.capability;
  EXPECT_THAT(stage("", 2), StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(stage(granted, 70), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(stage(granted, 2), IsOk());
}

}  // namespace
}  // namespace testing
}  // namespace tessera
