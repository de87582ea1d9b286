// The version a read reports is the version whose bytes it returned, under
// whole updates committed while readers loop: the CLI's `get --json`, the
// SDK's Get (HostArray::version) and GetInto, and row gathers. Updates
// alternate two contents, so a version's parity says which bytes it holds:
// a read that met a newer version (the one it started on was freed) reads
// that one whole and must say so.
#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/npy_file.h"
#include "client/tessera_client.h"
#include "gtest/gtest.h"
#include "tests/cluster.h"
#include "tests/test_arrays.h"

namespace tessera {
namespace {

constexpr int64_t kRows = 4096;
constexpr int64_t kCols = 1024;

// Version v holds v odd ? 1 : 2 in every element.
int32_t ValueOf(uint64_t version) { return version % 2 == 1 ? 1 : 2; }

// The "version" field of a get --json line.
uint64_t JsonVersion(const std::string& line) {
  const size_t at = line.find("\"version\": ");
  if (at == std::string::npos) return 0;
  return std::stoull(line.substr(at + 11));
}

class ReadVersionTest : public ClusterSuite<ReadVersionTest> {};

TEST_F(ReadVersionTest, EveryReadReportsTheVersionItsBytesCameFrom) {
  const std::vector<int32_t> ones(kRows * kCols, 1), twos(kRows * kCols, 2);
  ASSERT_TRUE(client_
                  ->Put("t", {kRows, kCols}, DType::kInt32,
                        reinterpret_cast<const char*>(ones.data()),
                        LayoutSpec::Chunk(0, Ranks({0, 1, 2, 3})))
                  .ok());
  std::atomic<bool> done{false};
  std::atomic<int> reads{0}, mismatches{0};
  auto check = [&](uint64_t version, int32_t first, int32_t last,
                   const std::string& who) {
    ++reads;
    if (version == 0 || first != ValueOf(version) || last != first) {
      ++mismatches;
      ADD_FAILURE() << who << " reported version " << version
                    << " with elements " << first << " .. " << last;
    }
  };
  std::vector<std::thread> readers;
  // Four CLI processes looping get --json, as a user scripts them (16 MiB:
  // a read long enough for updates to commit during it).
  const std::string cli = TestCluster::BinaryPath("client/tessera");
  for (int r = 0; r < 4; ++r) {
    readers.emplace_back([&, r] {
      const std::string path =
          absl::StrCat(std::getenv("TEST_TMPDIR"), "/get", r, ".npy");
      while (!done.load()) {
        std::string out, err;
        if (TestCluster::Run({cli,
                              absl::StrCat("--coordinator=",
                                           cluster_->coordinator_address()),
                              "get", "t", absl::StrCat("--output=", path),
                              "--json"},
                             &out, &err) != 0) {
          ADD_FAILURE() << err;
          continue;
        }
        absl::StatusOr<HostArray> file = ReadNpyFile(path, std::nullopt);
        ASSERT_TRUE(file.ok()) << file.status();
        check(JsonVersion(out), file->As<int32_t>()[0],
              file->As<int32_t>()[kRows * kCols - 1], "get --json");
      }
    });
  }
  // The SDK: Get, GetInto and a row gather.
  readers.emplace_back([&] {
    auto client = Client::Connect(cluster_->coordinator_address());
    ASSERT_TRUE(client.ok());
    std::vector<int32_t> buffer(kRows * kCols);
    const std::vector<int64_t> rows = {63, 0, 17};
    while (!done.load()) {
      absl::StatusOr<HostArray> got = (*client)->Get("t");
      ASSERT_TRUE(got.ok()) << got.status();
      check(got->version, got->As<int32_t>()[0],
            got->As<int32_t>()[kRows * kCols - 1], "Get");
      uint64_t version = 0;
      ASSERT_TRUE((*client)
                      ->GetInto("t", std::nullopt,
                                reinterpret_cast<char*>(buffer.data()),
                                kRows * kCols * 4, &version)
                      .ok());
      check(version, buffer[0], buffer.back(), "GetInto");
      absl::StatusOr<HostArray> gathered = (*client)->GatherRows("t", rows);
      ASSERT_TRUE(gathered.ok()) << gathered.status();
      check(gathered->version, gathered->As<int32_t>()[0],
            gathered->As<int32_t>()[3 * kCols - 1], "GatherRows");
    }
  });
  // Whole updates, alternating the two contents.
  for (uint64_t version = 2; version <= 41; ++version) {
    const std::vector<int32_t>& next = ValueOf(version) == 1 ? ones : twos;
    absl::StatusOr<UpdateStats> updated =
        client_->Update("t", {kRows, kCols}, DType::kInt32,
                        reinterpret_cast<const char*>(next.data()));
    ASSERT_TRUE(updated.ok()) << updated.status();
    ASSERT_EQ(updated->version, version);
  }
  done = true;
  for (std::thread& t : readers) t.join();
  std::printf("%d reads during 40 updates, %d reported another version\n",
              reads.load(), mismatches.load());
  EXPECT_GT(reads.load(), 20);
  EXPECT_EQ(mismatches.load(), 0);
}

}  // namespace
}  // namespace tessera
