// Soak: 16 concurrent clients doing a mix of create, put, get, region fetch,
// reshard and rm against one cluster for a bounded time. Every read is
// checked against what was written; at the end every byte is freed.
// TESSERA_SOAK_SECONDS sets the duration (default 8 s; the long run uses 60).
#include <atomic>
#include <cstdlib>
#include <random>
#include <thread>

#include "client/tessera_client.h"
#include "core/testing/status_matchers.h"
#include "gtest/gtest.h"
#include "tests/cluster.h"
#include "tests/test_arrays.h"

namespace tessera {
namespace {

int SoakSeconds() {
  const char* env = std::getenv("TESSERA_SOAK_SECONDS");
  return env != nullptr ? std::max(1, std::atoi(env)) : 8;
}

TEST(SoakTest, SixteenClientsMixedWorkloadNoErrorsAndNoLeaks) {
  TestClusterOptions options;
  options.coordinator_flags = {"--retire_grace_ms=300"};
  auto cluster = TestCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto admin = Client::Connect((*cluster)->coordinator_address());
  ASSERT_OK(admin);
  const int64_t coordinator_rss_start =
      TestCluster::ResidentBytes((*cluster)->coordinator_pid());

  const absl::Time deadline = absl::Now() + absl::Seconds(SoakSeconds());
  std::atomic<int64_t> ops{0}, errors{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < 16; ++c) {
    clients.emplace_back([&, c] {
      auto client = Client::Connect((*cluster)->coordinator_address());
      if (!client.ok()) {
        ++errors;
        ADD_FAILURE() << client.status();
        return;
      }
      std::mt19937 rng(c);
      auto fail = [&](const std::string& what, const absl::Status& status) {
        ++errors;
        ADD_FAILURE() << "client " << c << " " << what << ": " << status;
      };
      for (int round = 0; absl::Now() < deadline; ++round) {
        const std::string name =
            "soak/" + std::to_string(c) + "/" + std::to_string(round);
        const Shape shape = {static_cast<int64_t>(16 + rng() % 200),
                             static_cast<int64_t>(1 + rng() % 64)};
        const DType dtype = AllDTypes()[rng() % AllDTypes().size()];
        HostArray data = Iota(dtype, shape, rng());
        const int workers = 1 + rng() % 4;
        std::vector<Placement> placements;
        for (int i = 0; i < workers; ++i)
          placements.push_back(Ranks({static_cast<int>(rng() % 4)})[0]);
        if (rng() % 4 == 0) {
          // create + check the init values of a region
          InitSpec init;
          init.kind = InitSpec::Kind::kArange;
          auto meta =
              (*client)->Create(name, shape, DType::kInt64,
                                LayoutSpec::Chunk(rng() % 2, placements), init);
          ++ops;
          if (!meta.ok()) {
            fail("create", meta.status());
            continue;
          }
          auto row =
              (*client)->Get(name, Box{{shape[0] / 2, 0}, {1, shape[1]}});
          ++ops;
          if (!row.ok()) {
            fail("get row", row.status());
          } else {
            for (int64_t j = 0; j < shape[1]; ++j) {
              if (row->As<int64_t>()[j] != (shape[0] / 2) * shape[1] + j) {
                fail("arange value", absl::DataLossError("wrong value"));
                break;
              }
            }
          }
        } else {
          auto meta = (*client)->Put(name, data,
                                     LayoutSpec::Chunk(rng() % 2, placements));
          ++ops;
          if (!meta.ok()) {
            fail("put", meta.status());
            continue;
          }
          for (int k = 0; k < 3; ++k) {
            Box region;
            for (int64_t n : shape) {
              int64_t lo = rng() % (n + 1);
              region.offsets.push_back(lo);
              region.sizes.push_back(rng() % (n - lo + 1));
            }
            auto got = (*client)->Get(name, region);
            ++ops;
            if (!got.ok()) {
              fail("region", got.status());
            } else if (!SameBytes(*got, Slice(data, region))) {
              fail("region data", absl::DataLossError(region.ToString()));
            }
          }
          if (rng() % 2 == 0) {
            auto stats = (*client)->Reshard(
                name, LayoutSpec::Chunk(rng() % 2, Ranks({3, 1, 0})));
            ++ops;
            if (!stats.ok()) fail("reshard", stats.status());
            auto whole = (*client)->Get(name);
            ++ops;
            if (!whole.ok()) {
              fail("get after reshard", whole.status());
            } else if (!SameBytes(*whole, data)) {
              fail("data after reshard", absl::DataLossError(name));
            }
          }
        }
        absl::Status removed = (*client)->Delete(name);
        ++ops;
        if (!removed.ok()) fail("rm", removed);
      }
    });
  }
  for (std::thread& t : clients) t.join();

  // Everything was removed: the list is empty and, once retired versions
  // pass their grace period, every worker holds 0 bytes.
  auto list = (*admin)->List();
  ASSERT_OK(list);
  EXPECT_TRUE(list->empty());
  int64_t held = -1;
  for (int i = 0; i < 60 && held != 0; ++i) {
    absl::SleepFor(absl::Milliseconds(100));
    auto workers = (*admin)->Workers();
    ASSERT_OK(workers);
    held = 0;
    for (const WorkerInfo& w : *workers) held += w.bytes_used;
  }
  EXPECT_EQ(held, 0);
  const int64_t coordinator_rss_end =
      TestCluster::ResidentBytes((*cluster)->coordinator_pid());
  std::printf(
      "soak: %d s, %lld operations, %lld errors; coordinator RSS %lld -> %lld "
      "KiB\n",
      SoakSeconds(), static_cast<long long>(ops.load()),
      static_cast<long long>(errors.load()),
      static_cast<long long>(coordinator_rss_start / 1024),
      static_cast<long long>(coordinator_rss_end / 1024));
  EXPECT_EQ(errors.load(), 0);
  EXPECT_GT(ops.load(), 100);
}

}  // namespace
}  // namespace tessera
