#include "coordinator/reconciliation.h"

#include "absl/container/flat_hash_set.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

TEST(ReconciliationTest, SortsEveryShardIntoFoundLostOrUnreferenced) {
  const absl::flat_hash_set<uint64_t> referenced = {1, 2, 3, 7};
  Reconciliation r = ReconcileShards(
      /*expected=*/{1, 2, 3}, /*held=*/{3, 1, 5, 7, 8},
      [&](uint64_t id) { return referenced.contains(id); });
  EXPECT_THAT(r.found, ElementsAre(1u, 3u));
  EXPECT_THAT(r.lost, ElementsAre(2u));
  // 7 is referenced (another worker's version, or an allocation under way).
  EXPECT_THAT(r.unreferenced, ElementsAre(5u, 8u));
}

TEST(ReconciliationTest, AnEmptyWorkerLosesEverythingItShouldHold) {
  Reconciliation r = ReconcileShards({4, 9}, {}, [](uint64_t) { return true; });
  EXPECT_THAT(r.lost, ElementsAre(4u, 9u));
  EXPECT_THAT(r.found, IsEmpty());
  EXPECT_THAT(r.unreferenced, IsEmpty());
}

TEST(ReconciliationTest, AWorkerNobodyExpectsFreesAllItHolds) {
  Reconciliation r =
      ReconcileShards({}, {10, 11}, [](uint64_t) { return false; });
  EXPECT_THAT(r.unreferenced, ElementsAre(10u, 11u));
  EXPECT_THAT(r.lost, IsEmpty());
}

}  // namespace
}  // namespace tessera
