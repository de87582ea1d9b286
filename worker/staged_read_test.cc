// The staging protocol of same-host reads of device shards (Worker.StageRead,
// transport/staged_read.h), served in-process on 127.0.0.1:0. The store keeps
// its bytes in host memory but reports a device, so the protocol — slots,
// pipelining, parallel streams, checks, budget — runs on any machine; the
// CUDA copies behind it run in tests/gpu_test on a GPU.
#include "transport/staged_read.h"

#include <grpcpp/grpcpp.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/capability.h"
#include "core/testing/grants.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/worker.grpc.pb.h"
#include "rpc/channel.h"
#include "rpc/security.h"
#include "rpc/server.h"
#include "transport/shared_memory.h"
#include "worker/host_shard_store.h"
#include "worker/testing/device_like_store.h"
#include "worker/testing/served_worker.h"
#include "worker/worker_node.h"
#include "worker/worker_service.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::MintTestGrant;
using ::tessera::testing::StatusIs;
using ::testing::HasSubstr;

constexpr int64_t kRows = 1024, kCols = 1024;  // int32: 4 MiB

class StagedReadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (LocalHostId().empty()) GTEST_SKIP() << "no /dev/shm";
    store_ = std::make_unique<DeviceLikeStore>();
    WorkerNodeOptions options;
    options.arena = arena_;
    options.max_staging_bytes = 64 << 20;
    node_ = std::make_unique<WorkerNode>(store_.get(), options);
    node_->SetIdentity("w0", kKey);
    ASSERT_OK_AND_ASSIGN(served_, ServeWorker(node_.get()));
    ShardDesc desc;
    desc.tensor = "t";
    desc.version = 1;
    desc.dtype = DType::kInt32;
    desc.tensor_shape = {kRows, kCols};
    desc.box = Box{{0, 0}, {kRows, kCols}};
    ASSERT_THAT(store_->Allocate(1, desc, InitSpec{InitSpec::Kind::kArange}),
                IsOk());
  }
  void TearDown() override { served_.Shutdown(); }

  static std::string Grant() { return MintTestGrant(kKey); }
  static constexpr char kKey[] = "staged-read-test-key";

  RemoteShard Shard() const {
    RemoteShard shard;
    shard.location.worker = "w0";
    shard.location.address = served_.address;
    shard.location.shard_id = 1;
    shard.location.capability = Grant();
    shard.item_bytes = 4;
    shard.shape = {kRows, kCols};
    return shard;
  }

  // `box` of the arange shard, as it should read.
  static std::vector<int32_t> Expected(const Box& box) {
    std::vector<int32_t> out;
    for (int64_t r = 0; r < box.sizes[0]; ++r) {
      for (int64_t c = 0; c < box.sizes[1]; ++c) {
        out.push_back(static_cast<int32_t>((box.offsets[0] + r) * kCols +
                                           box.offsets[1] + c));
      }
    }
    return out;
  }

  absl::Status Read(const Box& box, std::vector<int32_t>* out,
                    const StagedReadOptions& options) {
    out->assign(box.NumElements(), -1);
    const std::vector<int64_t> zeros(2, 0);
    return StagedRead(
        channels_.Get(served_.address), Shard(), box,
        ReadTarget::HostArray(reinterpret_cast<char*>(out->data()), box.sizes,
                              zeros),
        options);
  }

  std::shared_ptr<SharedMemoryArena> arena_ =
      std::make_shared<SharedMemoryArena>();
  std::unique_ptr<DeviceLikeStore> store_;
  std::unique_ptr<WorkerNode> node_;
  ServedWorker served_;
  ChannelCache channels_;
};

TEST_F(StagedReadTest, WholeAndStridedBoxesReadExactlyInManyChunks) {
  StagingMappings mappings;
  StagedReadOptions options;
  options.slot_bytes = 64 << 10;  // many chunks per stream
  options.max_streams = 3;
  options.min_stream_bytes = 1;
  options.mappings = &mappings;
  std::vector<int32_t> got;
  for (const Box& box : {Box{{0, 0}, {kRows, kCols}}, Box{{3, 5}, {1000, 7}},
                         Box{{1023, 1000}, {1, 24}}}) {
    ASSERT_THAT(Read(box, &got, options), IsOk()) << box.ToString();
    EXPECT_EQ(got, Expected(box)) << box.ToString();
  }
}

TEST_F(StagedReadTest, SharedMemoryTransportStagesDeviceShards) {
  SharedMemoryTransport transport(&channels_, SharedMemoryTransportOptions{});
  const Box box{{10, 0}, {500, kCols}};
  std::vector<int32_t> got(box.NumElements(), -1);
  const std::vector<int64_t> zeros(2, 0);
  ASSERT_THAT(
      transport.Read(Shard(), box,
                     ReadTarget::HostArray(reinterpret_cast<char*>(got.data()),
                                           box.sizes, zeros)),
      IsOk());
  EXPECT_EQ(got, Expected(box));
  // A sink takes its ranges in order.
  int64_t next = 0;
  std::vector<int32_t> sunk;
  ASSERT_THAT(
      transport.Read(
          Shard(), box,
          ReadTarget::Sink([&](int64_t first, int64_t count, const char* data) {
            EXPECT_EQ(first, next);
            next += count;
            const int32_t* v = reinterpret_cast<const int32_t*>(data);
            sunk.insert(sunk.end(), v, v + count);
            return absl::OkStatus();
          })),
      IsOk());
  EXPECT_EQ(sunk, Expected(box));
  // No segment for writes: the chain goes on to gRPC.
  WriteSource source;
  EXPECT_THAT(transport.Write(Shard(), source),
              StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST_F(StagedReadTest, AFreedShardIsNotFound) {
  ASSERT_THAT(node_->Free({1}), IsOk());
  std::vector<int32_t> got;
  EXPECT_THAT(Read(Box{{0, 0}, {kRows, kCols}}, &got, StagedReadOptions{}),
              StatusIs(absl::StatusCode::kNotFound));
}

// A stream written by hand, as a hostile client would.
class RawStream {
 public:
  RawStream(const std::shared_ptr<grpc::Channel>& channel,
            const std::string& capability) {
    PresentCapability(&context_, capability);
    stream_ = v1::Worker::NewStub(channel)->StageRead(&context_);
  }
  bool Send(const v1::StageReadRequest& request) {
    return stream_->Write(request);
  }
  bool Receive(v1::StageReadResponse* reply) { return stream_->Read(reply); }
  absl::Status Finish() {
    stream_->WritesDone();
    const grpc::Status status = stream_->Finish();
    return status.ok() ? absl::OkStatus()
                       : absl::Status(
                             static_cast<absl::StatusCode>(status.error_code()),
                             status.error_message());
  }

 private:
  grpc::ClientContext context_;
  std::unique_ptr<
      grpc::ClientReaderWriter<v1::StageReadRequest, v1::StageReadResponse>>
      stream_;
};

v1::StageReadRequest Open(int64_t slot_bytes) {
  v1::StageReadRequest request;
  request.set_shard_id(1);
  request.add_offsets(0);
  request.add_offsets(0);
  request.add_sizes(kRows);
  request.add_sizes(kCols);
  request.set_slot_bytes(slot_bytes);
  request.set_item_bytes(4);
  return request;
}

TEST_F(StagedReadTest, HostileRequestsAreRefusedAndChangeNothing) {
  const auto refused = [&](const std::string& capability,
                           const v1::StageReadRequest& open,
                           const std::vector<v1::StageReadRequest>& then) {
    RawStream stream(channels_.Get(served_.address), capability);
    v1::StageReadResponse reply;
    if (stream.Send(open) && stream.Receive(&reply)) {
      for (const v1::StageReadRequest& request : then) {
        if (!stream.Send(request) || !stream.Receive(&reply)) break;
      }
    }
    return stream.Finish();
  };
  EXPECT_THAT(refused("", Open(1 << 20), {}),
              StatusIs(absl::StatusCode::kPermissionDenied));
  for (int64_t slot_bytes :
       {int64_t{0}, int64_t{-4}, int64_t{6}, int64_t{128} << 20}) {
    EXPECT_THAT(refused(Grant(), Open(slot_bytes), {}),
                StatusIs(absl::StatusCode::kInvalidArgument))
        << slot_bytes;
  }
  v1::StageReadRequest other_item = Open(1 << 20);
  other_item.set_item_bytes(2);  // the reader thinks they are int16
  EXPECT_THAT(refused(Grant(), other_item, {}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("4-byte elements")));
  v1::StageReadRequest outside = Open(1 << 20);
  outside.set_offsets(0, 1);
  EXPECT_THAT(refused(Grant(), outside, {}),
              StatusIs(absl::StatusCode::kOutOfRange));
  v1::StageReadRequest chunk;
  chunk.set_first(0);
  chunk.set_count(1 << 10);
  chunk.set_slot(2);
  EXPECT_THAT(refused(Grant(), Open(1 << 20), {chunk}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("slot")));
  chunk.set_slot(1);
  chunk.set_count((1 << 18) + 1);  // one element more than a slot
  EXPECT_THAT(refused(Grant(), Open(1 << 20), {chunk}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("fit")));
  chunk.set_first(kRows * kCols - 10);
  chunk.set_count(11);
  EXPECT_THAT(refused(Grant(), Open(1 << 20), {chunk}),
              StatusIs(absl::StatusCode::kOutOfRange));
  // The shard is intact and still reads.
  std::vector<int32_t> got;
  ASSERT_THAT(Read(Box{{0, 0}, {kRows, kCols}}, &got, StagedReadOptions{}),
              IsOk());
  EXPECT_EQ(got, Expected(Box{{0, 0}, {kRows, kCols}}));
}

TEST_F(StagedReadTest, PastTheStagingBudgetTheClientFallsBack) {
  {
    // Two open streams of 2 x 16 MiB slots take the whole 64 MiB budget.
    RawStream a(channels_.Get(served_.address), Grant());
    RawStream b(channels_.Get(served_.address), Grant());
    v1::StageReadResponse reply;
    ASSERT_TRUE(a.Send(Open(16 << 20)) && a.Receive(&reply));
    ASSERT_TRUE(b.Send(Open(16 << 20)) && b.Receive(&reply));
    std::vector<int32_t> got;
    // FAILED_PRECONDITION: the chain reads over gRPC instead.
    EXPECT_THAT(
        Read(Box{{0, 0}, {kRows, kCols}}, &got, StagedReadOptions{}),
        StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("staging")));
    EXPECT_THAT(a.Finish(), IsOk());
    EXPECT_THAT(b.Finish(), IsOk());
  }
  // Their blocks are back: staging works again.
  std::vector<int32_t> got;
  ASSERT_THAT(Read(Box{{0, 0}, {kRows, kCols}}, &got, StagedReadOptions{}),
              IsOk());
  EXPECT_EQ(got, Expected(Box{{0, 0}, {kRows, kCols}}));
}

}  // namespace
}  // namespace tessera
