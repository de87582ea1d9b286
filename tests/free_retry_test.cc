// Frees that do not reach a worker are not lost: heartbeats carry a digest of
// what each worker holds, the coordinator asks for the list when it differs
// from what the worker should hold, and frees what no tensor references —
// without a restart of anything.
#include <signal.h>

#include <memory>
#include <string>
#include <thread>

#include "client/tessera_client.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cluster.h"
#include "tests/test_arrays.h"

namespace tessera {
namespace {

int64_t WorkerBytes(Client& client, const std::string& name) {
  auto workers = client.Workers();
  EXPECT_TRUE(workers.ok()) << workers.status();
  if (!workers.ok()) return -1;
  for (const WorkerInfo& w : *workers) {
    if (w.name == name) return w.bytes_used;
  }
  return -1;
}

TEST(FreeRetryTest, AFreeMissedWhileAWorkerWasStoppedIsDoneAfterItResumes) {
  TestClusterOptions options;
  options.num_workers = 2;
  options.durable = true;
  options.coordinator_flags = {"--heartbeat_ms=200", "--lease_ms=2500"};
  auto cluster = TestCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto client = Client::Connect((*cluster)->coordinator_address());
  ASSERT_OK(client);
  const HostArray array = Iota(DType::kInt32, {40, 10}, 1);
  ASSERT_OK((*client)->Put("t", array, LayoutSpec::Chunk(0, Ranks({0, 1}))));
  ASSERT_EQ(WorkerBytes(**client, "w1"), 20 * 10 * 4);

  // w1 sleeps through the whole rm: its free times out.
  const pid_t w1 = (*cluster)->worker_pid(1);
  ASSERT_EQ(kill(w1, SIGSTOP), 0);
  const absl::Time start = absl::Now();
  EXPECT_OK((*client)->Delete("t"));
  // Past the coordinator's free timeout (10 s), whatever rm took.
  absl::SleepFor(absl::Seconds(11) - (absl::Now() - start));
  ASSERT_EQ(kill(w1, SIGCONT), 0);

  // Within a few heartbeats (and no restart) its bytes are freed.
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  int64_t bytes = -1;
  while (absl::Now() < deadline) {
    bytes = WorkerBytes(**client, "w1");
    if (bytes == 0) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ(bytes, 0);
  EXPECT_EQ(WorkerBytes(**client, "w0"), 0);
}

}  // namespace
}  // namespace tessera
