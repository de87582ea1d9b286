// Coordinator restarts from its --data_dir on real processes: any number of
// restarts in a row, and changes on both sides of each restart at every
// snapshot interval. Every acknowledged change survives, with its data.
#include <signal.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/tessera_client.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cluster.h"
#include "tests/test_arrays.h"

namespace tessera {
namespace {

using ::tessera::testing::StatusIs;

TestClusterOptions DurableOptions(std::vector<std::string> coordinator_flags) {
  TestClusterOptions options;
  options.num_workers = 2;
  options.durable = true;
  options.coordinator_flags = std::move(coordinator_flags);
  options.coordinator_flags.push_back("--retire_grace_ms=100");
  return options;
}

std::unique_ptr<Client> Connect(const TestCluster& cluster) {
  auto client = Client::Connect(cluster.coordinator_address());
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

// The tensors a client lists, and each one's bytes equal to `want`.
void ExpectExactly(Client& client,
                   const std::map<std::string, HostArray>& want) {
  auto list = client.List();
  ASSERT_TRUE(list.ok()) << list.status();
  std::vector<std::string> names;
  for (const TensorInfo& t : *list) names.push_back(t.name);
  std::vector<std::string> want_names;
  for (const auto& [name, array] : want) want_names.push_back(name);
  EXPECT_THAT(names, ::testing::UnorderedElementsAreArray(want_names));
  for (const auto& [name, array] : want) {
    auto got = client.Get(name);
    ASSERT_TRUE(got.ok()) << name << ": " << got.status();
    EXPECT_TRUE(SameBytes(*got, array)) << name;
  }
}

// Restarting used to write a snapshot from a state whose tensors had been
// moved out, so the third start could not load it.
TEST(RestartTest, CoordinatorRestartsManyTimesFromItsDataDir) {
  auto cluster = TestCluster::Start(DurableOptions({}));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  std::map<std::string, HostArray> want;
  for (int start = 0; start < 4; ++start) {
    SCOPED_TRACE(absl::StrCat("after ", start, " restart(s)"));
    auto client = Connect(**cluster);
    ASSERT_NE(client, nullptr);
    ExpectExactly(*client, want);
    const std::string name = absl::StrCat("t", start);
    HostArray array = Iota(DType::kFloat32, {12, 5}, start);
    ASSERT_OK(client->Put(name, array, LayoutSpec::Chunk(0, Ranks({0, 1}))));
    want.emplace(name, std::move(array));
    client.reset();
    ASSERT_OK((*cluster)->RestartCoordinator());
  }
}

// Snapshots used to be written (and the log cut) before the change that
// triggered them was applied, so that change was lost at the next start.
TEST(RestartTest, EveryChangeSurvivesAtEverySnapshotInterval) {
  for (int every = 1; every <= 3; ++every) {
    SCOPED_TRACE(absl::StrCat("--snapshot_every=", every));
    auto cluster = TestCluster::Start(
        DurableOptions({absl::StrCat("--snapshot_every=", every)}));
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    std::map<std::string, HostArray> want;
    {
      auto client = Connect(**cluster);
      ASSERT_NE(client, nullptr);
      for (int i = 0; i < 4; ++i) {
        const std::string name = absl::StrCat("a", i);
        HostArray array = Iota(DType::kInt32, {8, 3}, i);
        ASSERT_OK(client->Put(name, array, LayoutSpec::Chunk(0, Ranks({0, 1}))));
        want.emplace(name, std::move(array));
      }
      ASSERT_OK(client->Reshard("a1", LayoutSpec::Chunk(1, Ranks({1, 0, 1}))));
      ASSERT_OK(client->Delete("a2"));
      want.erase("a2");
    }
    EXPECT_EQ((*cluster)->StopCoordinator(SIGKILL), 128 + SIGKILL);
    ASSERT_OK((*cluster)->RestartCoordinator());
    {
      auto client = Connect(**cluster);
      ASSERT_NE(client, nullptr);
      ExpectExactly(*client, want);
      auto meta = client->Describe("a1");
      ASSERT_OK(meta);
      EXPECT_EQ(meta->version, 2u);
      ASSERT_OK(client->Delete("a0"));
      want.erase("a0");
      HostArray array = Iota(DType::kInt32, {6, 2}, 99);
      ASSERT_OK(client->Put("b", array, LayoutSpec::Chunk(0, Ranks({1}))));
      want.emplace("b", std::move(array));
      ASSERT_OK(client->Reshard("a3", LayoutSpec::Chunk(0, Ranks({1}))));
    }
    EXPECT_EQ((*cluster)->StopCoordinator(SIGTERM), 0);
    ASSERT_OK((*cluster)->RestartCoordinator());
    auto client = Connect(**cluster);
    ASSERT_NE(client, nullptr);
    ExpectExactly(*client, want);
    EXPECT_THAT(client->Describe("a0").status(),
                StatusIs(absl::StatusCode::kNotFound));
  }
}

}  // namespace
}  // namespace tessera
