// The memory store against the MetadataStore contract ("same process"
// durability: a restart is a reload through the same object).
#include "coordinator/metadata_store.h"

#include <memory>

#include "coordinator/metadata_store_contract_test.h"

namespace tessera {
namespace testing {
namespace {

MetadataStoreFactory MemoryStoreFactory() {
  MetadataStoreFactory factory;
  factory.name = "Memory";
  factory.make = [] { return std::make_unique<MemoryMetadataStore>(); };
  factory.make_faulty = [](FaultPlan* faults) {
    return std::make_unique<FaultInjectingMetadataStore>(
        std::make_unique<MemoryMetadataStore>(), faults);
  };
  factory.reopen = [](std::unique_ptr<MetadataStore> store) { return store; };
  return factory;
}

INSTANTIATE_TEST_SUITE_P(Memory, MetadataStoreContractTest,
                         ::testing::Values(MemoryStoreFactory()),
                         MetadataStoreContractTest::Name);

TEST(MemoryMetadataStoreTest, ANewObjectStartsEmpty) {
  {
    MemoryMetadataStore store;
    auto tensor = std::make_shared<TensorMetadata>();
    tensor->name = "a";
    ASSERT_TRUE(store.Append(MetadataChange::Tensor(tensor)).ok());
  }
  MemoryMetadataStore store;
  auto state = store.Load();
  ASSERT_TRUE(state.ok());
  EXPECT_TRUE(state->tensors.empty());
}

}  // namespace
}  // namespace testing
}  // namespace tessera
