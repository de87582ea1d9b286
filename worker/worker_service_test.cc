// WorkerService served in-process on 127.0.0.1:0 over a WorkerNode on a
// HostShardStore with shared memory: the raw (zero-copy) region reads, the
// unary small read, and same-host shared memory maps.
#include "worker/worker_service.h"

#include <fcntl.h>
#include <grpcpp/generic/generic_stub.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "core/auth.h"
#include "core/capability.h"
#include "core/testing/grants.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rpc/channel.h"
#include "rpc/server.h"
#include "transport/grpc_transport.h"
#include "transport/shared_memory.h"
#include "transport/shared_memory_arena.h"
#include "worker/device_exchange.h"
#include "worker/host_shard_store.h"
#include "worker/testing/served_worker.h"
#include "worker/worker_node.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::MintTestGrant;
using ::tessera::testing::StatusIs;

constexpr int64_t kRows = 1024,
                  kCols = 512;  // int32: 2 MiB, above the shm threshold

class WorkerServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    HostShardStoreOptions store_options;
    store_options.arena = arena_;
    store_ = std::make_unique<HostShardStore>(store_options);
    node_options_.arena = arena_;
    node_ = std::make_unique<WorkerNode>(store_.get(), node_options_);
    node_->SetIdentity("w0", kKey);
    ASSERT_OK_AND_ASSIGN(served_, ServeWorker(node_.get()));
    channel_ = MakeChannel(served_.address);
    ShardDesc desc;
    desc.tensor = "t";
    desc.dtype = DType::kInt32;
    desc.tensor_shape = {kRows, kCols};
    desc.box = Box{{0, 0}, {kRows, kCols}};
    ASSERT_THAT(store_->Allocate(1, desc, InitSpec{InitSpec::Kind::kArange}),
                IsOk());
  }
  void TearDown() override { served_.Shutdown(); }

  // What the coordinator would grant on tensor "t" version 1 at w0.
  static std::string Grant(uint32_t rights = kRightRead,
                           const std::string& tensor = "t") {
    return MintTestGrant(kKey, rights, tensor);
  }
  static constexpr char kKey[] = "worker-service-test-key";

  // Reads `box` of shard 1 through the gRPC transport.
  std::vector<int32_t> Read(const Box& box) {
    std::vector<int32_t> out(box.NumElements(), -1);
    absl::Status status = ReadRegion(
        channel_, 1, box, 4, absl::Seconds(30),
        [&](int64_t offset, absl::string_view data) {
          EXPECT_EQ(offset % 4, 0);
          EXPECT_EQ(data.size() % 4, 0u);
          std::memcpy(reinterpret_cast<char*>(out.data()) + offset, data.data(),
                      data.size());
          return absl::OkStatus();
        },
        "", Grant());
    EXPECT_THAT(status, IsOk());
    return out;
  }

  static int32_t At(int64_t r, int64_t c) {
    return static_cast<int32_t>(r * kCols + c);
  }

  WorkerNodeOptions node_options_;  // a derived fixture may change it
  std::shared_ptr<SharedMemoryArena> arena_ =
      std::make_shared<SharedMemoryArena>();
  std::unique_ptr<HostShardStore> store_;
  std::unique_ptr<WorkerNode> node_;
  ServedWorker served_;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(WorkerServiceTest, ContiguousRowsStreamFromShardMemory) {
  const std::vector<int32_t> rows =
      Read(Box{{100, 0}, {900, kCols}});  // ~1.8 MiB: streamed
  ASSERT_EQ(rows.size(), 900u * kCols);
  EXPECT_EQ(rows.front(), At(100, 0));
  EXPECT_EQ(rows[12345], At(100 + 12345 / kCols, 12345 % kCols));
  EXPECT_EQ(rows.back(), At(999, kCols - 1));
}

TEST_F(WorkerServiceTest, StridedBoxIsGatheredIntoChunks) {
  const std::vector<int32_t> cols =
      Read(Box{{0, 3}, {kRows, 500}});  // not contiguous
  EXPECT_EQ(cols[0], At(0, 3));
  EXPECT_EQ(cols[500], At(1, 3));
  EXPECT_EQ(cols.back(), At(kRows - 1, 502));
}

TEST_F(WorkerServiceTest, SmallRegionIsOneUnaryCall) {
  // One run of the shard: copied straight from its memory.
  const std::vector<int32_t> row = Read(Box{{7, 0}, {1, kCols}});
  EXPECT_EQ(row[0], At(7, 0));
  EXPECT_EQ(row.back(), At(7, kCols - 1));
  // Strided: gathered run by run.
  const std::vector<int32_t> block = Read(Box{{7, 5}, {3, 4}});
  ASSERT_EQ(block.size(), 12u);
  EXPECT_EQ(block[0], At(7, 5));
  EXPECT_EQ(block[4], At(8, 5));
  EXPECT_EQ(block.back(), At(9, 8));
}

TEST_F(WorkerServiceTest, GeneratedProtobufClientStillParsesTheStream) {
  auto stub = v1::Worker::NewStub(channel_);
  grpc::ClientContext context;
  context.AddMetadata(kCapabilityHeader, Grant());
  v1::ReadRegionRequest request;
  request.set_shard_id(1);
  for (int64_t v : {int64_t{2}, int64_t{0}}) request.add_offsets(v);
  for (int64_t v : {int64_t{600}, kCols}) request.add_sizes(v);
  request.set_chunk_bytes(256 << 10);
  auto reader = stub->ReadRegion(&context, request);
  v1::ReadRegionResponse chunk;
  int64_t received = 0;
  while (reader->Read(&chunk)) {
    EXPECT_EQ(chunk.offset(), received);
    int32_t first;
    std::memcpy(&first, chunk.data().data(), 4);
    EXPECT_EQ(first, At(2, 0) + received / 4);
    received += static_cast<int64_t>(chunk.data().size());
  }
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_EQ(received, 600 * kCols * 4);
}

TEST_F(WorkerServiceTest, SmallReadAnswersOneMessageAtMost) {
  ShardDesc desc;
  desc.tensor = "t";
  desc.dtype = DType::kInt32;
  desc.tensor_shape = {kMaxChunkBytes / 4 + 1};
  desc.box = Box{{0}, {kMaxChunkBytes / 4 + 1}};
  ASSERT_THAT(store_->Allocate(2, desc, InitSpec{InitSpec::Kind::kArange}),
              IsOk());
  auto stub = v1::Worker::NewStub(channel_);
  auto read = [&](int64_t size, v1::ReadRegionResponse* response) {
    grpc::ClientContext context;
    context.AddMetadata(kCapabilityHeader, Grant());
    v1::ReadRegionRequest request;
    request.set_shard_id(2);
    request.add_offsets(0);
    request.add_sizes(size);
    return stub->ReadSmallRegion(&context, request, response);
  };
  v1::ReadRegionResponse response;
  // One element past a message: refused, nothing sent.
  const grpc::Status refused = read(kMaxChunkBytes / 4 + 1, &response);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(refused.error_message(), ::testing::HasSubstr("use ReadRegion"));
  EXPECT_TRUE(response.data().empty());
  // A whole message, and an empty region.
  ASSERT_TRUE(read(kMaxChunkBytes / 4, &response).ok());
  ASSERT_EQ(response.data().size(), static_cast<size_t>(kMaxChunkBytes));
  int32_t last;
  std::memcpy(&last, response.data().data() + kMaxChunkBytes - 4, 4);
  EXPECT_EQ(last, kMaxChunkBytes / 4 - 1);
  ASSERT_TRUE(read(0, &response).ok());
  EXPECT_TRUE(response.data().empty());
}

// A coalesced small read of `regions` (offsets, sizes) of shard `id`, under
// `grant`.
grpc::Status ReadRegions(const std::shared_ptr<grpc::Channel>& channel,
                         const std::string& grant,
                         const std::vector<std::pair<uint64_t, Box>>& regions,
                         v1::ReadRegionResponse* response) {
  v1::ReadSmallRegionsRequest request;
  for (const auto& [id, box] : regions) {
    v1::ReadRegionRequest* region = request.add_regions();
    region->set_shard_id(id);
    region->mutable_offsets()->Assign(box.offsets.begin(), box.offsets.end());
    region->mutable_sizes()->Assign(box.sizes.begin(), box.sizes.end());
  }
  grpc::ClientContext context;
  context.AddMetadata(kCapabilityHeader, grant);
  return v1::Worker::NewStub(channel)->ReadSmallRegions(&context, request,
                                                        response);
}

TEST(WorkerMethodsTest, EveryMethodIsInTheCapabilityTable) {
  // A method missing there is refused to everyone: a new method must say
  // which right it needs, or that it answers anyone.
  const google::protobuf::ServiceDescriptor* service =
      v1::ReadRegionRequest::descriptor()->file()->FindServiceByName("Worker");
  ASSERT_NE(service, nullptr);
  for (int i = 0; i < service->method_count(); ++i) {
    const std::string method =
        absl::StrCat("/tessera.v1.Worker/", service->method(i)->name());
    if (IsPublicWorkerMethod(method)) {
      EXPECT_FALSE(RequiredRight(method).ok()) << method << " is both";
      continue;
    }
    EXPECT_THAT(RequiredRight(method).status(), IsOk()) << method;
  }
  EXPECT_FALSE(IsPublicWorkerMethod("/tessera.v1.Worker/ReadRegion"));
  EXPECT_EQ(*RequiredRight("/tessera.v1.Worker/ReadSmallRegions"), kRightRead);
}

TEST_F(WorkerServiceTest, CoalescedSmallReadIsEachRegionInTurn) {
  v1::ReadRegionResponse response;
  const grpc::Status status =
      ReadRegions(channel_, Grant(),
                  {{1, Box{{7, 0}, {1, kCols}}},
                   {1, Box{{0, 0}, {0, kCols}}},  // empty
                   {1, Box{{7, 5}, {3, 4}}}},     // strided
                  &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.offset(), 0);
  ASSERT_EQ(response.data().size(), (kCols + 12) * 4u);
  std::vector<int32_t> got(kCols + 12);
  std::memcpy(got.data(), response.data().data(), response.data().size());
  EXPECT_EQ(got[0], At(7, 0));
  EXPECT_EQ(got[kCols - 1], At(7, kCols - 1));
  EXPECT_EQ(got[kCols], At(7, 5));
  EXPECT_EQ(got[kCols + 4], At(8, 5));
  EXPECT_EQ(got.back(), At(9, 8));
}

TEST_F(WorkerServiceTest, CoalescedSmallReadIsBoundedAndAdmittedWhole) {
  const Box row{{0, 0}, {1, kCols}};
  const Box whole{{0, 0}, {kRows, kCols}};  // 2 MiB
  struct Case {
    const char* what;
    std::string grant;
    std::vector<std::pair<uint64_t, Box>> regions;
    grpc::StatusCode code;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"no region", Grant(), {}, grpc::StatusCode::INVALID_ARGUMENT, "1 to 64"},
      {"65 regions", Grant(),
       std::vector<std::pair<uint64_t, Box>>(65, {1, row}),
       grpc::StatusCode::INVALID_ARGUMENT, "not 65"},
      {"over one message in all",
       Grant(),
       {{1, whole}, {1, whole}, {1, row}},
       grpc::StatusCode::INVALID_ARGUMENT,
       "4194304 bytes in all"},
      {"a region outside the shard",
       Grant(),
       {{1, row}, {1, Box{{kRows, 0}, {1, kCols}}}},
       grpc::StatusCode::OUT_OF_RANGE,
       ""},
      {"a shard not held",
       Grant(),
       {{1, row}, {99, row}},
       grpc::StatusCode::NOT_FOUND,
       ""},
      {"a grant for another tensor",
       Grant(kRightRead, "u"),
       {{1, row}},
       grpc::StatusCode::PERMISSION_DENIED,
       ""},
      {"no grant", "", {{1, row}}, grpc::StatusCode::PERMISSION_DENIED, ""},
  };
  for (const Case& c : cases) {
    v1::ReadRegionResponse response;
    const grpc::Status status =
        ReadRegions(channel_, c.grant, c.regions, &response);
    EXPECT_EQ(status.error_code(), c.code)
        << c.what << ": " << status.error_message();
    EXPECT_THAT(status.error_message(), ::testing::HasSubstr(c.message))
        << c.what;
    EXPECT_TRUE(response.data().empty()) << c.what;
  }
  // Exactly one message in all is served.
  v1::ReadRegionResponse response;
  ASSERT_TRUE(
      ReadRegions(channel_, Grant(), {{1, whole}, {1, whole}}, &response).ok());
  EXPECT_EQ(response.data().size(), static_cast<size_t>(kMaxChunkBytes));
}

TEST_F(WorkerServiceTest, ConcurrentSmallReadsOfOneWorkerShareCalls) {
  ChannelCache channels;
  GrpcTransport transport(&channels, GrpcTransportOptions{});
  RemoteShard shard;
  shard.location.address = served_.address;
  shard.location.shard_id = 1;
  shard.location.capability = Grant();
  shard.item_bytes = 4;
  shard.shape = {kRows, kCols};
  constexpr int kCallers = 16, kReads = 200;
  std::vector<std::thread> callers;
  std::atomic<int> wrong{0}, failed{0};
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      for (int i = 0; i < kReads; ++i) {
        // Rows, and strided blocks of three rows, all over the shard.
        const int64_t r = (c * 7919 + i * 104729) % (kRows - 3);
        const Box box =
            i % 2 == 0 ? Box{{r, 0}, {1, kCols}} : Box{{r, 9}, {3, 16}};
        std::vector<int32_t> out(box.NumElements(), -1);
        const absl::Status status = transport.Read(
            shard, box,
            ReadTarget::HostArray(reinterpret_cast<char*>(out.data()),
                                  box.sizes, {0, 0}));
        if (!status.ok()) {
          failed++;
          continue;
        }
        const int64_t cols = box.sizes[1];
        for (int64_t k = 0; k < box.NumElements(); ++k) {
          if (out[k] != At(r + k / cols, box.offsets[1] + k % cols)) {
            wrong++;
            break;
          }
        }
      }
    });
  }
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(wrong.load(), 0);
  // 16 callers against 2 calls in flight: most reads waited and shared.
  EXPECT_GT(transport.coalesced_calls(), 0);
}

TEST_F(WorkerServiceTest, IdleCoalescersOfGoneWorkersAreNotKept) {
  ChannelCache channels;
  GrpcTransport transport(&channels, GrpcTransportOptions{});
  auto read_from = [&](const std::string& address) {
    RemoteShard shard;
    shard.location.address = address;
    shard.location.shard_id = 1;
    shard.location.capability = Grant();
    shard.item_bytes = 4;
    std::vector<int32_t> out(kCols);
    const Box row{{3, 0}, {1, kCols}};
    return transport.Read(
        shard, row,
        ReadTarget::HostArray(reinterpret_cast<char*>(out.data()), row.sizes,
                              {0, 0}));
  };
  ASSERT_THAT(read_from(served_.address), IsOk());
  // Workers that came and went (nothing listens there now).
  for (int port : {1, 2, 3}) {
    EXPECT_FALSE(read_from(absl::StrCat("127.0.0.1:", port)).ok());
    EXPECT_EQ(transport.coalescers(), 1u);
  }
  ASSERT_THAT(read_from(served_.address), IsOk());
  EXPECT_EQ(transport.coalescers(), 1u);
}

TEST_F(WorkerServiceTest, ReadOfUnknownShardIsNotFound) {
  absl::Status status = ReadRegion(
      channel_, 99, Box{{0}, {4}}, 4, absl::Seconds(30),
      [](int64_t, absl::string_view) { return absl::OkStatus(); }, "", Grant());
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(WorkerServiceTest, SameHostClientMapsTheShardUntilItIsFreed) {
  if (access("/dev/shm", W_OK) != 0)
    GTEST_SKIP() << "no writable /dev/shm here";
  const Box box{{10, 0}, {5, kCols}};
  absl::StatusOr<std::unique_ptr<ShardMapping>> mapping =
      MapShardBox(channel_, 1, box, 4, absl::Seconds(30), Grant());
  ASSERT_THAT(mapping.status(), IsOk());
  int32_t value;
  std::memcpy(&value, (*mapping)->At((12 * kCols + 7) * 4), 4);
  EXPECT_EQ(value, At(12, 7));
  EXPECT_EQ((*mapping)->shape(), (Shape{kRows, kCols}));
  // A wrong element size is refused rather than misread.
  EXPECT_THAT(
      MapShardBox(channel_, 1, box, 8, absl::Seconds(30), Grant()).status(),
      StatusIs(absl::StatusCode::kFailedPrecondition));
  ASSERT_THAT(store_->Free(1), IsOk());
  // The old mapping still shows the freed shard's bytes, never other data...
  std::memcpy(&value, (*mapping)->At((12 * kCols + 7) * 4), 4);
  EXPECT_EQ(value, At(12, 7));
  // ...and new maps fail as a gRPC read would.
  EXPECT_THAT(
      MapShardBox(channel_, 1, box, 4, absl::Seconds(30), Grant()).status(),
      StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(WorkerServiceTest, SegmentShorterThanReportedIsAnErrorNotSigbus) {
  if (access("/dev/shm", W_OK) != 0)
    GTEST_SKIP() << "no writable /dev/shm here";
  absl::StatusOr<PinnedShard> pinned = store_->Pin(1);
  ASSERT_OK(pinned);
  std::optional<SegmentInfo> segment = arena_->Find(pinned->data);
  ASSERT_TRUE(segment.has_value());
  // Something else cut the segment to half its size.
  const int fd = shm_open(segment->name.c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, kRows * kCols * 4 / 2), 0);
  close(fd);
  const Box last_rows{{kRows - 4, 0}, {4, kCols}};
  EXPECT_THAT(MapShardBox(channel_, 1, last_rows, 4, absl::Seconds(30), Grant())
                  .status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       ::testing::HasSubstr("smaller than the shard")));
}

TEST_F(WorkerServiceTest, PrivateShardIsNotOfferedForMapping) {
  ShardDesc desc;
  desc.tensor = "t";
  desc.dtype = DType::kInt32;
  desc.tensor_shape = {4};
  desc.box = Box{{0}, {4}};
  ASSERT_THAT(store_->Allocate(2, desc, InitSpec{}), IsOk());
  EXPECT_THAT(
      MapShardBox(channel_, 2, Box{{0}, {4}}, 4, absl::Seconds(30), Grant())
          .status(),
      StatusIs(absl::StatusCode::kFailedPrecondition));
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// --- Bounded under hostile input: allocation requests ---

v1::AllocateShardsRequest OneByteShards(const std::string& tensor, int n) {
  v1::AllocateShardsRequest request;
  request.set_tensor(tensor);
  request.set_version(1);
  request.set_dtype(v1::INT8);
  request.add_tensor_shape(n);
  for (int i = 0; i < n; ++i) {
    v1::AllocateShardsRequest::Item* item = request.add_shards();
    item->set_shard_id(100 + i);
    item->add_offsets(i);
    item->add_sizes(1);
  }
  return request;
}

TEST_F(WorkerServiceTest, AllocateRefusesAnInvalidTensorName) {
  v1::AllocateShardsResponse response;
  for (const std::string& name :
       {std::string(256 << 10, 'n'), std::string("bad name"), std::string()}) {
    EXPECT_THAT(served_.service->Allocate(
                    Grant(kRightOrder), OneByteShards(name, 3), {}, &response),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         ::testing::HasSubstr("invalid tensor name")));
  }
  EXPECT_THAT(store_->ShardIds(), ::testing::ElementsAre(1));
}

TEST_F(WorkerServiceTest, ShardsOfOneAllocationShareOneNameString) {
  const std::string name(255, 'n');
  v1::AllocateShardsResponse response;
  ASSERT_THAT(served_.service->Allocate(
                  Grant(kRightOrder), OneByteShards(name, 100), {}, &response),
              IsOk());
  absl::StatusOr<ShardDesc> first = store_->Describe(100);
  absl::StatusOr<ShardDesc> last = store_->Describe(199);
  ASSERT_THAT(first.status(), IsOk());
  ASSERT_THAT(last.status(), IsOk());
  EXPECT_EQ(first->tensor.str(), name);
  EXPECT_TRUE(first->tensor.SharesStorageWith(last->tensor));
}

// --- Bounded under hostile input: streams ---

// A worker with tight stream limits over a 64 MiB shard (private memory),
// more than the flow-control windows and socket buffers hold: a reader
// that never reads stalls the worker's writes.
class WorkerStreamLimitsTest : public ::testing::Test {
 protected:
  static constexpr int64_t kBigBytes = int64_t{64} << 20;

  // Serves with the given idle limit and at most 2 streams.
  void Start(absl::Duration idle) {
    WorkerNodeOptions options;
    options.stream_idle_timeout = idle;
    options.max_streams = 2;
    node_ = std::make_unique<WorkerNode>(&store_, options);
    node_->SetIdentity("w0", kKey);
    ASSERT_OK_AND_ASSIGN(served_, ServeWorker(node_.get()));
    channel_ = MakeChannel(served_.address);
    ShardDesc desc;
    desc.tensor = "t";
    desc.version = 1;
    desc.dtype = DType::kInt8;
    desc.tensor_shape = {kBigBytes};
    desc.box = Box{{0}, {kBigBytes}};
    ASSERT_THAT(store_.Allocate(1, desc, InitSpec{}), IsOk());
  }
  void TearDown() override { served_.Shutdown(); }

  static std::string Grant() { return MintTestGrant(kKey); }
  static constexpr char kKey[] = "stream-limits-test-key";

  // A ReadRegion of the whole shard that reads one chunk, then nothing.
  struct StalledReader {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReader<v1::ReadRegionResponse>> reader;
    ~StalledReader() { context.TryCancel(); }
  };
  std::unique_ptr<StalledReader> Stall() {
    auto stalled = std::make_unique<StalledReader>();
    stalled->context.AddMetadata(kCapabilityHeader, Grant());
    v1::ReadRegionRequest request;
    request.set_shard_id(1);
    request.add_offsets(0);
    request.add_sizes(kBigBytes);
    stalled->reader =
        v1::Worker::NewStub(channel_)->ReadRegion(&stalled->context, request);
    v1::ReadRegionResponse chunk;
    EXPECT_TRUE(stalled->reader->Read(&chunk));  // the handler runs
    return stalled;
  }

  HostShardStore store_;
  std::unique_ptr<WorkerNode> node_;
  ServedWorker served_;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(WorkerStreamLimitsTest, ReaderThatNeverReadsIsCutOffAndItsPinReleased) {
  Start(absl::Milliseconds(300));
  std::unique_ptr<StalledReader> stalled = Stall();
  ASSERT_THAT(store_.Free(1), IsOk());
  // The chunks the worker has queued pin the freed shard, which still
  // counts against the capacity...
  EXPECT_GT(store_.PinnedBytes(), 0);
  EXPECT_EQ(store_.BytesUsed(), 0);
  // ...until the idle limit cancels the stream and gRPC drops them.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (store_.PinnedBytes() > 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(store_.PinnedBytes(), 0);
  EXPECT_EQ(store_.ChargedBytes(), 0);
  v1::ReadRegionResponse chunk;
  while (stalled->reader->Read(&chunk)) {
  }
  EXPECT_NE(stalled->reader->Finish().error_code(), grpc::StatusCode::OK);
}

TEST_F(WorkerStreamLimitsTest, StreamsBeyondTheCapAreRefused) {
  Start(absl::Seconds(30));
  std::unique_ptr<StalledReader> a = Stall();
  std::unique_ptr<StalledReader> b = Stall();
  grpc::ClientContext context;
  context.AddMetadata(kCapabilityHeader, Grant());
  v1::ReadRegionRequest request;
  request.set_shard_id(1);
  request.add_offsets(0);
  request.add_sizes(16);
  auto reader = v1::Worker::NewStub(channel_)->ReadRegion(&context, request);
  v1::ReadRegionResponse chunk;
  EXPECT_FALSE(reader->Read(&chunk));
  const grpc::Status refused = reader->Finish();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(), ::testing::HasSubstr("at most 2"));
  // Unary reads are not streams: still served.
  EXPECT_THAT(ReadRegion(
                  channel_, 1, Box{{0}, {16}}, 1, absl::Seconds(10),
                  [&](int64_t, absl::string_view) { return absl::OkStatus(); },
                  "", Grant()),
              IsOk());
}

TEST_F(WorkerStreamLimitsTest, StopEndsAStalledStreamWithinTheGrace) {
  Start(absl::Seconds(30));
  std::unique_ptr<StalledReader> stalled = Stall();
  const absl::Time start = absl::Now();
  EXPECT_TRUE(served_.server.Stop(absl::Milliseconds(100)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  served_.server.server.reset();
}

TEST_F(WorkerServiceTest, CallsWithoutTheRightCapabilityChangeNothing) {
  auto read = [&](const std::string& capability) {
    return ReadRegion(
        channel_, 1, Box{{0, 0}, {1, 1}}, 4, absl::Seconds(30),
        [](int64_t, absl::string_view) { return absl::OkStatus(); }, "",
        capability);
  };
  EXPECT_THAT(read(""), StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(read(Grant(kRightRead, "other")),
              StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(read("forged.token"),
              StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(read(Grant(kRightRead)), IsOk());
  // A read grant is no order: the shard survives a free.
  auto stub = v1::Worker::NewStub(channel_);
  for (const std::string& capability : {std::string(), Grant(kRightRead)}) {
    grpc::ClientContext context;
    if (!capability.empty()) context.AddMetadata(kCapabilityHeader, capability);
    v1::FreeShardsRequest request;
    request.add_shard_ids(1);
    v1::FreeShardsResponse response;
    EXPECT_EQ(stub->FreeShards(&context, request, &response).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
  }
  EXPECT_TRUE(store_->Describe(1).ok());
  // Nor may a reader write: the shard is not a put's, and it is sealed.
  grpc::ClientContext context;
  context.AddMetadata(kCapabilityHeader, Grant(kRightRead | kRightWrite));
  v1::WriteShardResponse response;
  auto writer = stub->WriteShard(&context, &response);
  v1::WriteShardRequest chunk;
  chunk.set_shard_id(1);
  chunk.set_data(std::string(16, 'x'));
  writer->Write(chunk);
  writer->WritesDone();
  EXPECT_EQ(writer->Finish().error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Read(Box{{0, 0}, {1, 4}}), (std::vector<int32_t>{0, 1, 2, 3}));
}

// Rank 0 of 2 sends row 0 of shard 1 to rank 1.
v1::NcclExchangeRequest OneSendShare(char id) {
  v1::NcclExchangeRequest share;
  share.set_unique_id(std::string(kExchangeIdBytes, id));
  share.set_ranks(2);
  share.set_rank(0);
  v1::NcclPiece* piece = share.add_sends();
  piece->set_peer(1);
  piece->set_shard_id(1);
  piece->add_offsets(0);
  piece->add_offsets(0);
  piece->add_sizes(1);
  piece->add_sizes(4);
  return share;
}

// A host worker takes no part in NCCL exchanges: the coordinator's order
// is answered FAILED_PRECONDITION (it then has the pieces pulled); anyone
// else's is refused, and a malformed share is INVALID_ARGUMENT.
TEST_F(WorkerServiceTest, ExchangesNeedAnOrderAndAGpuWorker) {
  auto stub = v1::Worker::NewStub(channel_);
  auto id = [&](const std::string& capability) {
    grpc::ClientContext context;
    if (!capability.empty()) context.AddMetadata(kCapabilityHeader, capability);
    v1::NcclUniqueIdRequest request;
    v1::NcclUniqueIdResponse response;
    return stub->NcclUniqueId(&context, request, &response).error_code();
  };
  const v1::NcclExchangeRequest share = OneSendShare('i');
  auto exchange = [&](const std::string& capability,
                      const v1::NcclExchangeRequest& request) {
    grpc::ClientContext context;
    if (!capability.empty()) context.AddMetadata(kCapabilityHeader, capability);
    v1::NcclExchangeResponse response;
    return stub->NcclExchange(&context, request, &response).error_code();
  };
  EXPECT_EQ(id(""), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(id(Grant(kRightRead)), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(id(Grant(kRightOrder)), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(exchange(Grant(kRightRead), share),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(exchange(Grant(kRightOrder), share),
            grpc::StatusCode::FAILED_PRECONDITION);
  v1::NcclExchangeRequest self = share;
  self.mutable_sends(0)->set_peer(0);
  EXPECT_EQ(exchange(Grant(kRightOrder), self),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Read(Box{{0, 0}, {1, 4}}), (std::vector<int32_t>{0, 1, 2, 3}));
}

// Stands in for NCCL: a member that waits for a peer that never comes,
// until the call's stop says to give up.
class WaitingExchange : public DeviceExchange {
 public:
  absl::StatusOr<std::string> UniqueId() override {
    return std::string(kExchangeIdBytes, 'w');
  }
  absl::StatusOr<int64_t> Run(const ExchangePlan&,
                              const StopCondition& stop) override {
    running.Notify();
    absl::Status why;
    while ((why = stop.Check("waiting for a peer")).ok()) {
      absl::SleepFor(absl::Milliseconds(2));
    }
    ended = why;
    done.Notify();
    return why;
  }
  absl::Notification running;
  absl::Notification done;
  absl::Status ended;
};

// The coordinator gives up an exchange whose other member failed by
// cancelling its call: the member's exchange learns it and stops, instead
// of waiting for the failed peer until its deadline.
TEST_F(WorkerServiceTest, ACancelledExchangeStopsTheMembersWait) {
  WaitingExchange nccl;
  WorkerNodeOptions options;
  options.arena = arena_;
  options.exchange = &nccl;
  WorkerNode node(store_.get(), options);
  node.SetIdentity("w0", kKey);
  ASSERT_OK_AND_ASSIGN(ServedWorker served, ServeWorker(&node));
  auto stub = v1::Worker::NewStub(MakeChannel(served.address));
  const v1::NcclExchangeRequest share = OneSendShare('w');
  grpc::ClientContext context;
  context.AddMetadata(kCapabilityHeader, Grant(kRightOrder));
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Minutes(2)));
  std::thread coordinator([&] {
    ASSERT_TRUE(nccl.running.WaitForNotificationWithTimeout(absl::Seconds(30)));
    context.TryCancel();
  });
  v1::NcclExchangeResponse response;
  EXPECT_EQ(stub->NcclExchange(&context, share, &response).error_code(),
            grpc::StatusCode::CANCELLED);
  coordinator.join();
  ASSERT_TRUE(nccl.done.WaitForNotificationWithTimeout(absl::Seconds(30)))
      << "the member still waits for its peer";
  EXPECT_THAT(nccl.ended, StatusIs(absl::StatusCode::kCancelled));
  served.server.Stop(absl::ZeroDuration());
}

// The coordinator orders a worker as soon as it has registered it, and a
// client may read at once: a request that comes before the worker has the
// registration's reply (its key) waits for it, instead of failing.
TEST_F(WorkerServiceTest, ARequestBeforeTheRegistrationReplyWaitsForIt) {
  WorkerNode node(store_.get(), node_options_);  // not registered yet
  ASSERT_OK_AND_ASSIGN(ServedWorker served, ServeWorker(&node));
  std::thread registration([&] {
    absl::SleepFor(absl::Milliseconds(300));
    node.SetIdentity("w0", kKey);
  });
  std::vector<int32_t> out(kCols, -1);
  const absl::Status status = ReadRegion(
      MakeChannel(served.address), 1, Box{{7, 0}, {1, kCols}}, 4,
      absl::Seconds(30),
      [&](int64_t offset, absl::string_view data) {
        std::memcpy(reinterpret_cast<char*>(out.data()) + offset, data.data(),
                    data.size());
        return absl::OkStatus();
      },
      "", Grant());
  registration.join();
  EXPECT_THAT(status, IsOk());
  EXPECT_EQ(out.front(), At(7, 0));
  EXPECT_EQ(out.back(), At(7, kCols - 1));
  served.Shutdown();
}

// A worker that never gets its registration's reply serves nothing: the
// request fails as unavailable once the short wait is over.
TEST_F(WorkerServiceTest, ARequestToAWorkerNeverRegisteredFails) {
  WorkerNode node(store_.get(), node_options_);
  ASSERT_OK_AND_ASSIGN(ServedWorker served, ServeWorker(&node));
  const absl::Status status = ReadRegion(
      MakeChannel(served.address), 1, Box{{7, 0}, {1, kCols}}, 4,
      absl::Seconds(30),
      [](int64_t, absl::string_view) { return absl::OkStatus(); }, "", Grant());
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(std::string(status.message()),
              ::testing::HasSubstr("not registered with its coordinator"));
  served.Shutdown();
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// --- Bounded under hostile input: small reads whose replies wait ---

class WorkerSmallReadBoundsTest : public WorkerServiceTest {
 protected:
  WorkerSmallReadBoundsTest() { node_options_.max_small_reads = 1; }
};

TEST_F(WorkerSmallReadBoundsTest, SmallReadsWaitingOnTheirReaderAreBounded) {
  WorkerService& service = *served_.service;
  const std::string& address = served_.address;
  const std::string capability = Grant();
  v1::ReadRegionRequest whole;  // 2 MiB: one message, 32 windows
  whole.set_shard_id(1);
  for (int64_t v : {0, 0}) whole.add_offsets(v);
  for (int64_t v : {kRows, kCols}) whole.add_sizes(v);

  // A reader that asks and never reads (raw, as a stream: a unary async
  // call sends nothing before its reply is asked for): its 64 KiB window
  // holds the reply at the worker.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 64 << 10);
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  grpc::GenericStub stalled_stub(grpc::CreateCustomChannel(
      address, grpc::InsecureChannelCredentials(), args));
  grpc::CompletionQueue cq;
  grpc::ClientContext stalled;
  stalled.AddMetadata(kCapabilityHeader, capability);
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call =
      stalled_stub.PrepareCall(&stalled, "/tessera.v1.Worker/ReadSmallRegion",
                               &cq);
  grpc::ByteBuffer request;
  bool own = false;
  ASSERT_TRUE(grpc::SerializationTraits<v1::ReadRegionRequest>::Serialize(
                  whole, &request, &own)
                  .ok());
  void* tag = nullptr;
  bool started = false;
  call->StartCall(reinterpret_cast<void*>(1));
  ASSERT_TRUE(cq.Next(&tag, &started) && started);
  call->WriteLast(request, grpc::WriteOptions(), reinterpret_cast<void*>(2));
  // The queue's poller moves the call's bytes.
  std::thread poller([&cq] {
    void* done;
    bool ok;
    while (cq.Next(&done, &ok)) {
    }
  });
  absl::Cleanup stop_poller = [&] {
    stalled.TryCancel();
    cq.Shutdown();
    poller.join();
  };
  // What gRPC holds settles once each call's OnDone has run.
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  auto settles_at = [&](int n) {
    while (service.small_reads_in_flight() != n && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    return service.small_reads_in_flight();
  };
  ASSERT_EQ(settles_at(1), 1);

  // Another reader is refused while it waits, and changes nothing.
  auto stub = v1::Worker::NewStub(MakeChannel(address));
  v1::ReadRegionRequest row = whole;
  row.set_sizes(0, 1);
  auto read_row = [&] {
    grpc::ClientContext context;
    context.AddMetadata(kCapabilityHeader, capability);
    v1::ReadRegionResponse response;
    const grpc::Status status = stub->ReadSmallRegion(&context, row, &response);
    return std::make_pair(status, response.data().size());
  };
  auto [refused, refused_bytes] = read_row();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(),
              ::testing::HasSubstr("at most 1 small reads at once"));
  EXPECT_EQ(refused_bytes, 0u);
  EXPECT_EQ(settles_at(1), 1);  // the stalled one still holds its place

  // Once the stalled reader gives up, reads are served again.
  stalled.TryCancel();
  EXPECT_EQ(settles_at(0), 0);
  auto [served, served_bytes] = read_row();
  EXPECT_TRUE(served.ok()) << served.error_message();
  EXPECT_EQ(served_bytes, static_cast<size_t>(kCols) * 4);
  std::move(stop_poller).Invoke();
}

}  // namespace
}  // namespace tessera
