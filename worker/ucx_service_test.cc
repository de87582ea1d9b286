// UcxDataService on a real gRPC server on 127.0.0.1: keys go only to callers
// holding the capability a read (MapShard) or a write (WriteShard) needs,
// requests are bounded, and FinishWrite seals the shard for every transport.
#include "worker/ucx_service.h"

#include <memory>
#include <string>

#include "absl/time/clock.h"
#include "core/capability.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/ucx.grpc.pb.h"
#include "rpc/channel.h"
#include "rpc/security.h"
#include "rpc/status.h"
#include "transport/ucx_testutil.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::LocalWorker;
using ::tessera::testing::StatusIs;
using ::testing::HasSubstr;

std::string Grant(uint32_t rights, const std::string& tensor = "t") {
  Capability grant;
  grant.worker = "w0";
  grant.tensor = tensor;
  grant.version = 1;
  grant.change = testing::kTestChange;
  grant.rights = rights;
  grant.expires_ms = absl::ToUnixMillis(absl::Now() + absl::Hours(1));
  return MintCapability(grant, LocalWorker::kKey);
}

class UcxServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_THAT(worker_.Allocate(1, {64, 64}, DType::kFloat32), IsOk());
    stub_ = v1::UcxData::NewStub(MakeChannel(worker_.address()));
  }

  absl::StatusOr<v1::UcxDescribeResponse> Describe(
      const std::string& capability, std::vector<uint64_t> ids, bool write) {
    grpc::ClientContext context;
    PresentCapability(&context, capability);
    v1::UcxDescribeRequest request;
    for (uint64_t id : ids) request.add_shard_ids(id);
    request.set_write(write);
    v1::UcxDescribeResponse response;
    const grpc::Status status = stub_->Describe(&context, request, &response);
    if (!status.ok()) return FromGrpcStatus(status);
    return response;
  }

  absl::Status FinishWrite(const std::string& capability, uint64_t id,
                           int64_t bytes) {
    grpc::ClientContext context;
    PresentCapability(&context, capability);
    v1::UcxFinishWriteRequest request;
    request.set_shard_id(id);
    request.set_bytes_written(bytes);
    v1::UcxFinishWriteResponse response;
    return FromGrpcStatus(stub_->FinishWrite(&context, request, &response));
  }

  LocalWorker worker_{/*ucx=*/true};
  std::unique_ptr<v1::UcxData::Stub> stub_;
};

TEST_F(UcxServiceTest, ReadKeysNeedAReadCapabilityForTheShardsTensor) {
  absl::StatusOr<v1::UcxDescribeResponse> keys =
      Describe(Grant(kRightRead), {1}, false);
  ASSERT_THAT(keys.status(), IsOk());
  EXPECT_FALSE(keys->worker_address().empty());
  ASSERT_EQ(keys->shards_size(), 1);
  EXPECT_EQ(keys->shards(0).bytes(), 64 * 64 * 4);
  EXPECT_NE(keys->shards(0).registration(), 0u);
  // A name, never where the shard lies or a key into the worker's memory.
  std::string wire;
  ASSERT_TRUE(keys->SerializeToString(&wire));
  v1::UcxDescribeResponse bare;
  bare.set_worker_address(keys->worker_address());
  v1::UcxShardKey* key = bare.add_shards();
  key->set_shard_id(1);
  key->set_bytes(keys->shards(0).bytes());
  key->set_registration(keys->shards(0).registration());
  key->mutable_shape()->CopyFrom(keys->shards(0).shape());
  key->set_item_bytes(keys->shards(0).item_bytes());
  EXPECT_EQ(wire, bare.SerializeAsString()) << "the reply carries more";
  EXPECT_THAT(keys->shards(0).shape(), ::testing::ElementsAre(64, 64));
  // No capability, another tensor's, or a write-only one: nothing handed out.
  EXPECT_THAT(Describe("", {1}, false).status(),
              StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(Describe(Grant(kRightRead, "other"), {1}, false).status(),
              StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(Describe(Grant(kRightWrite), {1}, false).status(),
              StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(Describe(Grant(kRightRead), {1}, true).status(),
              StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(Describe(Grant(kRightRead), {77}, false).status(),
              StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(UcxServiceTest, RequestsAreBounded) {
  EXPECT_THAT(Describe(Grant(kRightRead), {}, false).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  std::vector<uint64_t> many(kMaxUcxDescribeShards + 1, 1);
  EXPECT_THAT(
      Describe(Grant(kRightRead), many, false).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("shards")));
}

TEST_F(UcxServiceTest, FinishWriteSealsTheShardAndWithdrawsItsWriteKey) {
  const std::string write = Grant(kRightWrite);
  ASSERT_THAT(Describe(write, {1}, true).status(), IsOk());
  EXPECT_THAT(FinishWrite(write, 1, 100),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("does not cover")));
  EXPECT_EQ(worker_.ucx()->Counts().first, 1u);
  ASSERT_THAT(FinishWrite(write, 1, 64 * 64 * 4), IsOk());
  EXPECT_EQ(worker_.ucx()->Counts().first, 0u);
  // Sealed: no further write key, and no second seal.
  EXPECT_THAT(
      Describe(write, {1}, true).status(),
      StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("sealed")));
  EXPECT_THAT(FinishWrite(write, 1, 64 * 64 * 4),
              StatusIs(absl::StatusCode::kPermissionDenied));
  // Reads go on.
  EXPECT_THAT(Describe(Grant(kRightRead), {1}, false).status(), IsOk());
}

}  // namespace
}  // namespace tessera
