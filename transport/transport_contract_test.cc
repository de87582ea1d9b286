// Runs the transport contract (transport_contract_test.h) against every
// implementation: gRPC, same-host shared memory (with and without its
// mapping cache), and the standard chain that picks between them.
#include "transport/transport_contract_test.h"

#include <memory>

#include "rpc/channel.h"
#include "transport/grpc_transport.h"
#include "transport/shared_memory.h"
#include "transport/transport_chain.h"

namespace tessera {
namespace testing {
namespace {

constexpr absl::Duration kTimeout = absl::Seconds(30);

INSTANTIATE_TEST_SUITE_P(
    Grpc, TransportContractTest,
    ::testing::Values(TransportFactory{
        "grpc",
        [](ChannelCache* channels) -> std::unique_ptr<ShardTransport> {
          return std::make_unique<GrpcTransport>(
              channels, GrpcTransportOptions{kTimeout});
        }}),
    FactoryName);

INSTANTIATE_TEST_SUITE_P(
    SharedMemory, TransportContractTest,
    ::testing::Values(
        TransportFactory{
            "cached",
            [](ChannelCache* channels) -> std::unique_ptr<ShardTransport> {
              return std::make_unique<SharedMemoryTransport>(
                  channels, SharedMemoryTransportOptions{kTimeout, true});
            },
            /*needs_shared_memory=*/true},
        TransportFactory{
            "uncached",
            [](ChannelCache* channels) -> std::unique_ptr<ShardTransport> {
              return std::make_unique<SharedMemoryTransport>(
                  channels, SharedMemoryTransportOptions{kTimeout, false});
            },
            /*needs_shared_memory=*/true}),
    FactoryName);

INSTANTIATE_TEST_SUITE_P(
    Chain, TransportContractTest,
    ::testing::Values(TransportFactory{
        "shm_then_grpc",
        [](ChannelCache* channels) -> std::unique_ptr<ShardTransport> {
          DataPlaneOptions options;
          options.timeout = kTimeout;
          return TransportChain::Make(channels, options);
        }}),
    FactoryName);

}  // namespace
}  // namespace testing
}  // namespace tessera
