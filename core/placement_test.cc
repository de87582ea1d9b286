#include "core/placement.h"

#include <string>

#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::SizeIs;

TEST(PlacementTest, DevicesParseAndPrint) {
  auto cpu = ParseDevice("cpu");
  ASSERT_THAT(cpu, IsOk());
  EXPECT_EQ(cpu->kind, Device::Kind::kCpu);
  EXPECT_EQ(cpu->ToString(), "cpu");
  auto cuda = ParseDevice("cuda:3");
  ASSERT_THAT(cuda, IsOk());
  EXPECT_EQ(cuda->kind, Device::Kind::kCuda);
  EXPECT_EQ(cuda->index, 3);
  EXPECT_EQ(cuda->ToString(), "cuda:3");
  auto bare = ParseDevice("cuda");
  ASSERT_THAT(bare, IsOk());
  EXPECT_EQ(bare->ToString(), "cuda:0");
  for (const char* bad : {"", "gpu", "cuda:", "cuda:-1", "cuda:x", "CPU",
                          "cuda:1x", "cuda:99999999999"}) {
    EXPECT_THAT(ParseDevice(bad), StatusIs(absl::StatusCode::kInvalidArgument,
                                           HasSubstr("expected cpu or cuda:N")))
        << bad;
  }
}

TEST(PlacementTest, AllFourFormsParse) {
  auto p = ParsePlacement("rank:0/cpu");
  ASSERT_THAT(p, IsOk());
  EXPECT_EQ(p->rank, 0);
  EXPECT_EQ(p->worker, "");
  EXPECT_EQ(p->device->ToString(), "cpu");
  EXPECT_EQ(p->ToString(), "rank:0/cpu");

  p = ParsePlacement("w1/cuda:1");
  ASSERT_THAT(p, IsOk());
  EXPECT_FALSE(p->rank.has_value());
  EXPECT_EQ(p->worker, "w1");
  EXPECT_EQ(p->ToString(), "w1/cuda:1");

  p = ParsePlacement("rank:3");
  ASSERT_THAT(p, IsOk());
  EXPECT_EQ(p->rank, 3);
  EXPECT_FALSE(p->device.has_value());
  EXPECT_EQ(p->ToString(), "rank:3");

  p = ParsePlacement("worker-0.a_b");
  ASSERT_THAT(p, IsOk());
  EXPECT_EQ(p->worker, "worker-0.a_b");
  EXPECT_FALSE(p->device.has_value());
  EXPECT_EQ(p->ToString(), "worker-0.a_b");
}

TEST(PlacementTest, MalformedPlacementsAreInvalidArguments) {
  for (const char* bad : {"", "rank:", "rank:-1", "rank:x", "rank:1/gpu", "w1/",
                          "/cpu", "w 1", "w1/cpu/cpu", "rank:99999999999",
                          "rank:1:2", "w@1", "rank:1/cuda:-2"}) {
    EXPECT_THAT(ParsePlacement(bad),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("invalid placement")))
        << bad;
  }
  EXPECT_THAT(ParsePlacement(std::string(65, 'a')),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParsePlacement(std::string(64, 'a')), IsOk());
}

TEST(PlacementTest, ListsAreCommaSeparatedAndNonEmpty) {
  auto list = ParsePlacementList("rank:0/cpu,rank:1,w2,rank:0/cpu");
  ASSERT_THAT(list, IsOk());
  ASSERT_THAT(*list, SizeIs(4));
  EXPECT_EQ((*list)[2].worker, "w2");
  EXPECT_EQ((*list)[3], (*list)[0]);
  EXPECT_THAT(ParsePlacementList(""),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("empty")));
  EXPECT_THAT(ParsePlacementList("rank:0,"),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParsePlacementList("rank:0,,rank:1"),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(PlacementTest, NameRules) {
  EXPECT_TRUE(IsValidTensorName("model.layers.0.q_proj.weight"));
  EXPECT_TRUE(IsValidTensorName("a/b-c_d.e"));
  EXPECT_TRUE(IsValidTensorName(std::string(255, 'x')));
  EXPECT_FALSE(IsValidTensorName(std::string(256, 'x')));
  EXPECT_FALSE(IsValidTensorName(""));
  EXPECT_FALSE(IsValidTensorName("a b"));
  EXPECT_FALSE(IsValidTensorName("a:b"));
  EXPECT_TRUE(IsValidWorkerName("w-0.x_y"));
  EXPECT_FALSE(IsValidWorkerName("w/0"));
  EXPECT_FALSE(IsValidWorkerName(std::string(65, 'w')));
  EXPECT_THAT(CheckTensorName("bad name"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("invalid tensor name 'bad name'")));
  EXPECT_THAT(CheckWorkerName(""), StatusIs(absl::StatusCode::kInvalidArgument,
                                            HasSubstr("invalid worker name")));
  EXPECT_THAT(CheckTensorName("emb"), IsOk());
  EXPECT_THAT(CheckWorkerName("w0"), IsOk());
}

TEST(CheckDialAddressTest, AcceptsHostsAndAddressesOthersCanDial) {
  EXPECT_THAT(CheckDialAddress("127.0.0.1:7071", "a"), IsOk());
  EXPECT_THAT(CheckDialAddress("worker-0.tessera.svc:7071", "a"), IsOk());
  EXPECT_THAT(CheckDialAddress("[::1]:7071", "a"), IsOk());
  EXPECT_THAT(CheckDialAddress("[fd00::1:2]:65535", "a"), IsOk());
}

TEST(CheckDialAddressTest, RefusesWhatCannotBeDialled) {
  for (const char* bad :
       {"", "host", "host:", ":7071", "host:0", "host:65536", "host:-1",
        "host:7o71", "0.0.0.0:7071", "[::]:7071", "ho st:7071", "h/x:1",
        "[zz::1]:7071", "host:0000007071"}) {
    EXPECT_THAT(
        CheckDialAddress(bad, "--advertise"),
        StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--advertise")))
        << bad;
  }
}

TEST(GpuUuidTest, WritesCudasBytesAsNvidiaSmiDoes) {
  const unsigned char bytes[16] = {0x5e, 0x1f, 0x00, 0x9a, 0xb2, 0x3c,
                                   0x4d, 0x0e, 0xff, 0x01, 0x23, 0x45,
                                   0x67, 0x89, 0xab, 0xcd};
  const std::string uuid = GpuUuid(bytes);
  EXPECT_EQ(uuid, "GPU-5e1f009a-b23c-4d0e-ff01-23456789abcd");
  EXPECT_THAT(CheckGpuUuid(uuid), IsOk());
}

TEST(GpuUuidTest, RefusesWhatIsNotOne) {
  EXPECT_THAT(CheckGpuUuid(""), IsOk());  // a host worker reports none
  for (const std::string& bad :
       {std::string("GPU-"), std::string("5e1f009a-b23c"),
        std::string("GPU-5e1f\n"), std::string("GPU-xyz"),
        std::string("GPU-") + std::string(65, 'a'),
        std::string("GPU-ab\0cd", 9)}) {
    EXPECT_THAT(CheckGpuUuid(bad), StatusIs(absl::StatusCode::kInvalidArgument,
                                            HasSubstr("invalid GPU UUID")))
        << bad;
  }
  EXPECT_THAT(CheckGpuUuid(std::string("GPU-") + std::string(64, 'a')), IsOk());
}

TEST(CheckDialAddressTest, RefusesAddressesLongerThan255Bytes) {
  const std::string host(251, 'a');
  EXPECT_THAT(CheckDialAddress(host + ":123", "a"), IsOk());  // 255 bytes
  EXPECT_THAT(CheckDialAddress(host + ":1234", "a"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("longer than 255 bytes")));
}

}  // namespace
}  // namespace tessera
