// The Coordinator service over a real gRPC server on 127.0.0.1:0, with fake
// workers: every reply fits in one message by construction (the most
// workers with the longest names and addresses; tensors up to what a packed
// describe can carry), replies that could not are refused with a clear
// error, and the caller's deadline and cancellation reach the coordinator.
#include "coordinator/coordinator_service.h"

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "coordinator/coordinator.h"
#include "coordinator/coordinator_testutil.h"
#include "coordinator/fake_worker_control.h"
#include "core/limits.h"
#include "core/testing/adversarial_layouts.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rpc/channel.h"
#include "rpc/convert.h"
#include "rpc/server.h"
#include "rpc/status.h"

namespace tessera {
namespace {

using ::tessera::testing::ChunkOver;
using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;
using ::tessera::testing::TestWorker;
using ::tessera::testing::WorkerAddress;
using ::testing::AllOf;
using ::testing::HasSubstr;

// The listing of the most workers any coordinator keeps fits in one message
// with room to spare, whatever their names and addresses.
static_assert(kMaxWorkersCeiling * kWorkerInfoBytesBound <
                  static_cast<size_t>(kMaxMessageBytes) / 2,
              "ListWorkers must fit in one message");

constexpr int kWorkers = 3;

class CoordinatorServiceTest : public ::testing::Test {
 protected:
  void Start(CoordinatorOptions options = {}) {
    auto workers = std::make_unique<FakeWorkerControl>();
    for (int i = 0; i < kWorkers; ++i) workers->AddWorker(WorkerAddress(i));
    coordinator_ =
        std::make_unique<Coordinator>(std::move(options), std::move(workers));
    ASSERT_OK(coordinator_->Recover());
    for (int i = 0; i < kWorkers; ++i) {
      ASSERT_OK(coordinator_->RegisterWorker(TestWorker(i), {}));
    }
    service_ = std::make_unique<CoordinatorService>(coordinator_.get());
    absl::StatusOr<RunningServer> server =
        StartServer("127.0.0.1:0", {service_.get()});
    ASSERT_OK(server);
    server_ = *std::move(server);
    stub_ = v1::Coordinator::NewStub(
        MakeChannel(WithPort("127.0.0.1:0", server_.port)));
  }

  void TearDown() override {
    if (server_.server != nullptr) server_.Stop(absl::ZeroDuration());
  }

  absl::StatusOr<v1::ListWorkersResponse> ListWorkers() {
    grpc::ClientContext context;
    v1::ListWorkersResponse response;
    absl::Status status = FromGrpcStatus(
        stub_->ListWorkers(&context, v1::ListWorkersRequest(), &response));
    if (!status.ok()) return status;
    return response;
  }

  absl::StatusOr<v1::GetTensorResponse> Describe(const std::string& name,
                                                 bool packed) {
    grpc::ClientContext context;
    v1::GetTensorRequest request;
    request.set_name(name);
    request.set_packed_reply(packed);
    v1::GetTensorResponse response;
    absl::Status status =
        FromGrpcStatus(stub_->GetTensor(&context, request, &response));
    if (!status.ok()) return status;
    return response;
  }

  static v1::CreateTensorRequest CreateRequest(const std::string& name,
                                               const Shape& shape,
                                               const LayoutSpec& spec,
                                               bool packed) {
    v1::CreateTensorRequest request;
    request.set_name(name);
    request.mutable_shape()->Assign(shape.begin(), shape.end());
    request.mutable_properties()->set_dtype(DTypeToProto(DType::kFloat32));
    LayoutSpecToProto(spec, request.mutable_spec());
    request.set_packed_reply(packed);
    return request;
  }

  absl::StatusOr<v1::CreateTensorResponse> Create(
      const v1::CreateTensorRequest& request,
      absl::Duration timeout = absl::InfiniteDuration()) {
    grpc::ClientContext context;
    if (timeout != absl::InfiniteDuration()) {
      context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    }
    v1::CreateTensorResponse response;
    absl::Status status =
        FromGrpcStatus(stub_->CreateTensor(&context, request, &response));
    if (!status.ok()) return status;
    return response;
  }

  // Placements round robin over the workers.
  static LayoutSpec RoundRobin(int64_t shards) {
    std::vector<int32_t> ranks;
    for (int64_t i = 0; i < shards; ++i) ranks.push_back(i % kWorkers);
    return ChunkOver(ranks);
  }

  // Defined below, beside the adversarial create it times.
  absl::Duration WarmCreateTime();
  // The fake workers never heartbeat: for tests that run creates of
  // seconds each, on a loaded machine too.
  static CoordinatorOptions LongLease() {
    CoordinatorOptions options;
    options.lease = absl::Minutes(10);
    return options;
  }

  bool Listed(const std::string& name) const {
    for (const TensorSummary& t : coordinator_->ListTensors()) {
      if (t.name == name) return true;
    }
    return false;
  }

  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<CoordinatorService> service_;
  RunningServer server_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
};

// A registration whose every field takes the most bytes it can.
WorkerRegistration Longest(int i) {
  WorkerRegistration r;
  const std::string index = absl::StrCat(i);
  r.worker.name = std::string(64 - index.size(), 'n') + index;
  const std::string port = ":65535";
  r.worker.address =
      std::string(kMaxAddressBytes - port.size() - index.size(), 'a') + index +
      port;
  r.worker.device.kind = Device::Kind::kCuda;
  r.worker.device.index = std::numeric_limits<int>::max();
  r.worker.capacity_bytes = std::numeric_limits<int64_t>::max();
  r.worker.bytes_used = -1;  // ten bytes as a varint
  return r;
}

TEST_F(CoordinatorServiceTest, ListingTheMostWorkersFitsInOneMessage) {
  Start();
  const size_t most = coordinator_->options().max_workers;
  ASSERT_EQ(most, kDefaultMaxWorkers);
  for (size_t i = kWorkers; i < most; ++i) {
    ASSERT_OK(coordinator_->RegisterWorker(Longest(static_cast<int>(i)), {}));
  }
  absl::StatusOr<v1::ListWorkersResponse> listed = ListWorkers();
  ASSERT_OK(listed);
  ASSERT_EQ(static_cast<size_t>(listed->workers_size()), most);
  for (const v1::WorkerInfo& w : listed->workers()) {
    ASSERT_LE(w.ByteSizeLong() + 3, kWorkerInfoBytesBound) << w.name();
  }
  EXPECT_LE(listed->ByteSizeLong(), most * kWorkerInfoBytesBound);
  // One more is refused, over the wire too, and the listing is unchanged.
  grpc::ClientContext context;
  v1::RegisterWorkerRequest request;
  request.set_name("one-more");
  request.set_address("h:1");
  v1::RegisterWorkerResponse response;
  EXPECT_THAT(
      FromGrpcStatus(stub_->RegisterWorker(&context, request, &response)),
      StatusIs(absl::StatusCode::kResourceExhausted,
               AllOf(HasSubstr("'one-more'"), HasSubstr("max_workers"))));
  EXPECT_EQ(ListWorkers()->workers_size(), listed->workers_size());
}

TEST_F(CoordinatorServiceTest, AHugeAddressIsRefusedAndEveryoneCanStillList) {
  Start();
  for (int attempt = 0; attempt < 2; ++attempt) {
    grpc::ClientContext context;
    v1::RegisterWorkerRequest request;
    request.set_name(absl::StrCat("big", attempt));
    request.set_address(std::string(33 << 20, 'a') + ":1");
    v1::RegisterWorkerResponse response;
    EXPECT_THAT(
        FromGrpcStatus(stub_->RegisterWorker(&context, request, &response)),
        StatusIs(absl::StatusCode::kInvalidArgument,
                 HasSubstr("longer than 255 bytes")));
  }
  absl::StatusOr<v1::ListWorkersResponse> listed = ListWorkers();
  ASSERT_OK(listed);
  EXPECT_EQ(listed->workers_size(), kWorkers);
}

TEST_F(CoordinatorServiceTest, AGpuWorkersUuidIsCheckedAndKept) {
  Start();
  auto register_gpu = [&](const std::string& uuid) {
    grpc::ClientContext context;
    v1::RegisterWorkerRequest request;
    request.set_name("gpu");
    request.set_address("gpuhost:1");
    request.mutable_device()->set_kind(v1::Device::CUDA);
    request.set_gpu_uuid(uuid);
    v1::RegisterWorkerResponse response;
    return FromGrpcStatus(stub_->RegisterWorker(&context, request, &response));
  };
  EXPECT_THAT(register_gpu(std::string(1 << 20, 'G')),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("invalid GPU UUID")));
  EXPECT_EQ(ListWorkers()->workers_size(), kWorkers);
  const std::string uuid = "GPU-5e1f009a-b23c-4d0e-ff01-23456789abcd";
  ASSERT_OK(register_gpu(uuid));
  int found = 0;
  for (const WorkerRecord& w : coordinator_->ListWorkers()) {
    if (w.name != "gpu") continue;
    ++found;
    EXPECT_EQ(w.gpu_uuid, uuid);
  }
  EXPECT_EQ(found, 1);
}

TEST_F(CoordinatorServiceTest, PackedDescribesStayWithinTheirBound) {
  Start();
  struct Case {
    Shape shape;
    int64_t shards;
  };
  // Rows, columns, chunks past the end of a short dim, a deep tensor.
  const std::vector<Case> cases = {{{1000, 4}, 1000},
                                   {{3, 5}, 100},
                                   {{100000, 8}, 2000},
                                   {Shape(12, 3), 3},
                                   {{int64_t{1} << 40, 1}, 500}};
  int n = 0;
  for (const Case& c : cases) {
    const std::string name = absl::StrCat("t", n++);
    SCOPED_TRACE(name);
    v1::CreateTensorRequest request =
        CreateRequest(name, c.shape, RoundRobin(c.shards), /*packed=*/true);
    request.mutable_init()->set_kind(v1::InitMode::EMPTY);
    absl::StatusOr<v1::CreateTensorResponse> created = Create(request);
    ASSERT_OK(created);
    const int64_t bound = PackedDescribeBytesBound(c.shape, c.shards, kWorkers);
    EXPECT_LE(static_cast<int64_t>(created->ByteSizeLong()), bound);
    absl::StatusOr<v1::GetTensorResponse> described = Describe(name, true);
    ASSERT_OK(described);
    EXPECT_LE(static_cast<int64_t>(described->ByteSizeLong()), bound);
  }
}

TEST_F(CoordinatorServiceTest, RepliesLargerThanTheLimitFailClearly) {
  CoordinatorOptions options;
  options.max_reply_bytes = 128 << 10;
  Start(options);
  // 3000 shards describe packed within the limit, but not shard by shard.
  ASSERT_OK(Create(CreateRequest("t", {3000, 2}, RoundRobin(3000), true)));
  absl::StatusOr<v1::GetTensorResponse> packed = Describe("t", true);
  ASSERT_OK(packed);
  EXPECT_EQ(packed->tensor().packed_shards().shard_ids_size(), 3000);
  EXPECT_THAT(Describe("t", false),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("metadata of tensor 't' (3000 shards)"),
                             HasSubstr("(131072 bytes)"),
                             HasSubstr("ask for a packed reply"))));
  EXPECT_THAT(Create(CreateRequest("u", {3000, 2}, RoundRobin(3000), false)),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("tensor 'u' was created"),
                             HasSubstr("describe it with a packed reply"))));
  // A layout whose packed describe could exceed the limit is refused before
  // anything is made.
  EXPECT_THAT(
      Create(CreateRequest("v", {10000, 2}, RoundRobin(10000), true)),
      StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("to describe")));
  EXPECT_FALSE(Listed("v"));
}

TEST_F(CoordinatorServiceTest, HugeSpecsAreSizedBeforeTheyAreConverted) {
  Start();
  // 2^20 placements on a rank-32 tensor: a 4 MiB request.
  v1::CreateTensorRequest request;
  request.set_name("huge");
  for (int d = 0; d < 32; ++d) request.add_shape(1);
  request.mutable_properties()->set_dtype(DTypeToProto(DType::kInt8));
  v1::ShardingSpec::Chunk* chunk = request.mutable_spec()->mutable_chunk();
  for (int i = 0; i < (1 << 20); ++i) chunk->add_placements()->set_rank(0);
  const absl::Time start = absl::Now();
  EXPECT_THAT(Create(request),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("1048576 shards of rank 32"),
                             HasSubstr("max_tensor_metadata_bytes"))));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  // So are reshards, whose tensor's dims the service does not know.
  ASSERT_OK(Create(CreateRequest("t", {4, 2}, RoundRobin(2), true)));
  grpc::ClientContext context;
  v1::ReshardTensorRequest reshard;
  reshard.set_name("t");
  v1::ShardingSpec::PackedShards* packed =
      reshard.mutable_spec()->mutable_enumerable()->mutable_packed();
  packed->add_placements()->set_rank(0);
  for (int i = 0; i < (1 << 20) + 1; ++i) packed->add_placement_of(0);
  v1::ReshardTensorResponse response;
  EXPECT_THAT(
      FromGrpcStatus(stub_->ReshardTensor(&context, reshard, &response)),
      StatusIs(absl::StatusCode::kResourceExhausted,
               HasSubstr("too many shards: 1048577")));
}

// A valid tiling of [m]^4 whose overlap search is the costliest of the
// adversarial layouts (core/testing/adversarial_layouts.h), all on rank 0.
v1::CreateTensorRequest AdversarialCreate(const std::string& name, int64_t m) {
  std::vector<Box> boxes = Suffixes(m, /*fill=*/true);
  Placement rank0;
  rank0.rank = 0;
  std::vector<Placement> placements(boxes.size(), rank0);
  v1::CreateTensorRequest request;
  request.set_name(name);
  for (int d = 0; d < 4; ++d) request.add_shape(m);
  request.mutable_properties()->set_dtype(DTypeToProto(DType::kInt8));
  LayoutSpecToProto(LayoutSpec::Enumerable(std::move(boxes), placements),
                    request.mutable_spec());
  request.set_packed_reply(true);
  return request;
}

constexpr int64_t kSlowM = 300;

// How long the whole adversarial create takes when nobody gives up, warm
// (the faster of two: on a loaded machine the first can take far longer).
// Its validation (layout and placement) is about the first half; the
// allocation after it runs to its end once begun, so the tests below give
// up an eighth of the way in.
absl::Duration CoordinatorServiceTest::WarmCreateTime() {
  absl::Duration whole = absl::InfiniteDuration();
  for (const char* name : {"whole", "whole_again"}) {
    const absl::Time start = absl::Now();
    EXPECT_OK(Create(AdversarialCreate(name, kSlowM)));
    whole = std::min(whole, absl::Now() - start);
  }
  return whole;
}

TEST_F(CoordinatorServiceTest, ALongValidationStopsWhenItsCallerGivesUp) {
  Start(LongLease());
  const absl::Duration whole = WarmCreateTime();
  RecordProperty("create_ms",
                 static_cast<int>(absl::ToInt64Milliseconds(whole)));

  // A caller whose deadline passes an eighth of the way in, well within the
  // validation: nothing is made.
  EXPECT_THAT(Create(AdversarialCreate("late", kSlowM), whole / 8),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  // A caller that cancels an eighth of the way in: nothing is made either.
  {
    grpc::ClientContext context;
    v1::CreateTensorResponse response;
    std::thread cancel([&] {
      absl::SleepFor(whole / 8);
      context.TryCancel();
    });
    const grpc::Status status = stub_->CreateTensor(
        &context, AdversarialCreate("cancelled", kSlowM), &response);
    cancel.join();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::CANCELLED);
  }
  // Had the coordinator carried on, both would be listed by now.
  absl::SleepFor(whole * 2);
  EXPECT_FALSE(Listed("late"));
  EXPECT_FALSE(Listed("cancelled"));
}

TEST_F(CoordinatorServiceTest, ShutdownIsNotHeldUpByALongValidation) {
  Start(LongLease());
  const absl::Duration whole = WarmCreateTime();
  std::thread call([&] {
    // Fails once the server shuts down.
    (void)Create(AdversarialCreate("slow", kSlowM));
  });
  // Well within the validation.
  absl::SleepFor(whole / 8);
  // Calls in flight are cancelled at once; the handler must notice.
  const absl::Time stop_start = absl::Now();
  const bool stopped = server_.Stop(absl::ZeroDuration(), whole / 3);
  const absl::Duration stopping = absl::Now() - stop_start;
  call.join();
  RecordProperty("stop_ms",
                 static_cast<int>(absl::ToInt64Milliseconds(stopping)));
  EXPECT_TRUE(stopped) << "stopping took " << stopping << "; a create takes "
                       << whole;
  if (!stopped) absl::SleepFor(whole * 2);  // let the handler finish first
  EXPECT_FALSE(Listed("slow"));
  server_.server = nullptr;
}

}  // namespace
}  // namespace tessera
