// Coordinator restarts from its --data_dir on real processes: any number of
// restarts in a row, and changes on both sides of each restart at every
// snapshot interval. Every acknowledged change survives, with its data.
#include <signal.h>

#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/tessera_client.h"
#include "core/testing/status_matchers.h"
#include "core/testing/temp_files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cluster.h"
#include "tests/test_arrays.h"

namespace tessera {
namespace {

using ::tessera::testing::ReadFileToString;
using ::tessera::testing::StatusIs;
using ::tessera::testing::WriteStringToFile;
using ::testing::HasSubstr;

TestClusterOptions DurableOptions(std::vector<std::string> coordinator_flags) {
  TestClusterOptions options;
  options.num_workers = 2;
  options.durable = true;
  options.coordinator_flags = std::move(coordinator_flags);
  options.coordinator_flags.push_back("--retire_grace_ms=100");
  return options;
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
        ASSERT_OK(
            client->Put(name, array, LayoutSpec::Chunk(0, Ranks({0, 1}))));
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

// The byte offset of the first record of the metadata log (u32 length, u32
// checksum, payload) whose payload contains `word`; -1 if none.
int64_t RecordWith(const std::string& log, const std::string& word) {
  size_t pos = 0;
  while (log.size() - pos >= 8) {
    uint32_t length = 0;
    for (int i = 0; i < 4; ++i) {
      length |= static_cast<uint32_t>(static_cast<unsigned char>(log[pos + i]))
                << (8 * i);
    }
    if (log.size() - pos - 8 < length) break;
    if (log.substr(pos + 8, length).find(word) != std::string::npos)
      return static_cast<int64_t>(pos);
    pos += 8 + length;
  }
  return -1;
}

// A damaged record in the middle of the metadata log (a bad block) used to
// be taken for a torn tail: the acknowledged records after it were dropped
// and the workers told to free their shards. Now the coordinator refuses to
// start, naming the offset, and frees nothing; the operator may then drop
// the rest of the log with --recover_truncate_log_at.
TEST(RestartTest, DamageInTheMiddleOfTheLogStopsTheStartAndFreesNothing) {
  auto cluster = TestCluster::Start(DurableOptions({}));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  std::map<std::string, HostArray> want;
  {
    auto client = Connect(**cluster);
    ASSERT_NE(client, nullptr);
    for (const char* name : {"before", "damaged", "after"}) {
      HostArray array = Iota(DType::kInt32, {8, 3}, want.size());
      ASSERT_OK(client->Put(name, array, LayoutSpec::Chunk(0, Ranks({0, 1}))));
      want.emplace(name, std::move(array));
    }
  }
  EXPECT_EQ((*cluster)->StopCoordinator(SIGTERM), 0);
  const std::string log_path = (*cluster)->data_dir() + "/log";
  const std::string intact = ReadFileToString(log_path);
  const int64_t at = RecordWith(intact, "damaged");
  ASSERT_GE(at, 0);
  std::string damaged = intact;
  damaged[intact.find("damaged", at)] ^= 0x01;
  WriteStringToFile(log_path, damaged);

  // On the cluster's address, so that the workers would register with it.
  std::vector<std::string> argv = {"/usr/bin/timeout", "60"};
  for (const std::string& arg : (*cluster)->CoordinatorCommand())
    argv.push_back(arg);
  std::string out, err;
  EXPECT_EQ(TestCluster::Run(argv, &out, &err), 1) << out << err;
  const std::string said = out + err;
  EXPECT_THAT(said, HasSubstr(absl::StrCat("damaged at byte offset ", at)));
  EXPECT_THAT(said, HasSubstr(absl::StrCat("--recover_truncate_log_at=", at)));
  EXPECT_EQ(ReadFileToString(log_path), damaged);

  // Nothing was freed: with the log repaired, every tensor is whole.
  WriteStringToFile(log_path, intact);
  ASSERT_OK((*cluster)->RestartCoordinator());
  {
    auto client = Connect(**cluster);
    ASSERT_NE(client, nullptr);
    ExpectExactly(*client, want);
  }

  // The operator's way on: drop the log from the damaged record on. (The
  // restart snapshotted the log away, so it is damaged anew.)
  {
    auto client = Connect(**cluster);
    ASSERT_NE(client, nullptr);
    for (const char* name : {"damaged_again", "after_again"}) {
      ASSERT_OK(client->Put(name, Iota(DType::kInt32, {8, 3}, 7),
                            LayoutSpec::Chunk(0, Ranks({0, 1}))));
    }
  }
  EXPECT_EQ((*cluster)->StopCoordinator(SIGTERM), 0);
  const std::string log = ReadFileToString(log_path);
  const int64_t again = RecordWith(log, "damaged_again");
  ASSERT_GE(again, 0);
  damaged = log;
  damaged[log.find("damaged_again", again)] ^= 0x01;
  WriteStringToFile(log_path, damaged);
  ASSERT_OK((*cluster)->RestartCoordinator(
      {absl::StrCat("--recover_truncate_log_at=", again)}));
  EXPECT_EQ(ReadFileToString(
                absl::StrCat((*cluster)->data_dir(), "/log.damaged-", again)),
            damaged);
  auto client = Connect(**cluster);
  ASSERT_NE(client, nullptr);
  // What the log held before the damaged record is kept; after it, gone.
  ExpectExactly(*client, want);
}

}  // namespace
}  // namespace tessera
