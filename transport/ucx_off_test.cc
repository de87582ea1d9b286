// With TESSERA_UCX=0 in the environment (this test's BUILD sets it), UCX is
// off everywhere: the automatic chain has no UCX link and reads go over
// gRPC; a transport forced to UCX declines, naming the transport and the
// worker.
#include <memory>
#include <string>
#include <vector>

#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "transport/transport_chain.h"
#include "transport/ucx_common.h"
#include "transport/ucx_testutil.h"
#include "transport/ucx_transport.h"

namespace tessera {
namespace testing {
namespace {

using ::testing::HasSubstr;

TEST(UcxOffTest, AutoChainReadsOverGrpc) {
  ASSERT_FALSE(UcxAllowedByEnvironment());
  LocalWorker worker(/*ucx=*/false);
  ChannelCache channels;
  DataPlaneOptions options;
  options.shared_memory = false;
  auto chain = TransportChain::Make(&channels, options);
  ASSERT_THAT(worker.Allocate(1, {1000}, DType::kInt32), IsOk());
  std::vector<char> out(4000);
  ASSERT_THAT(chain->Read(worker.At(1, {1000}, DType::kInt32), WholeBox({1000}),
                          ReadTarget::HostArray(out.data(), {1000}, {0})),
              IsOk());
  EXPECT_TRUE(std::string(out.data(), out.size()) == worker.Bytes(1));
  const DataPlaneStats stats = chain->Stats();
  EXPECT_EQ(stats.bytes.count("ucx"), 0u);
  EXPECT_EQ(stats.bytes.at("grpc"), 4000);
}

TEST(UcxOffTest, ForcedUcxDeclinesNamingTransportAndWorker) {
  LocalWorker worker(/*ucx=*/false);
  ChannelCache channels;
  DataPlaneOptions options;
  options.transport = "ucx";
  auto chain = TransportChain::Make(&channels, options);
  ASSERT_THAT(worker.Allocate(1, {1000}, DType::kInt32), IsOk());
  std::vector<char> out(4000);
  EXPECT_THAT(
      chain->Read(worker.At(1, {1000}, DType::kInt32), WholeBox({1000}),
                  ReadTarget::HostArray(out.data(), {1000}, {0})),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               ::testing::AllOf(HasSubstr("ucx transport"), HasSubstr("w0"),
                                HasSubstr("TESSERA_UCX"))));
}

}  // namespace
}  // namespace testing
}  // namespace tessera
