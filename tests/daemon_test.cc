// The daemons as objects, in one process: a CoordinatorDaemon and
// WorkerDaemons started, used through the SDK, and stopped, with no
// process boundary between them.
#include <unistd.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/tessera_client.h"
#include "coordinator/coordinator_daemon.h"
#include "coordinator/etcd_testutil.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cluster.h"
#include "tests/processes.h"
#include "tests/test_arrays.h"
#include "worker/worker_daemon.h"

namespace tessera {
namespace {

using ::tessera::testing::EtcdCluster;
using ::testing::HasSubstr;
using ::tessera::testing::StatusIs;

CoordinatorDaemonOptions SmallCoordinator() {
  CoordinatorDaemonOptions options;
  options.coordinator.lease = absl::Seconds(2);
  options.coordinator.heartbeat_interval = absl::Milliseconds(200);
  return options;
}

std::unique_ptr<WorkerDaemon> StartWorker(const std::string& coordinator,
                                          const std::string& name) {
  WorkerDaemonOptions options;
  options.coordinator = coordinator;
  options.name = name;
  options.zone = name;
  absl::StatusOr<std::unique_ptr<WorkerDaemon>> worker =
      WorkerDaemon::Start(options);
  EXPECT_OK(worker.status());
  return worker.ok() ? *std::move(worker) : nullptr;
}

bool Eventually(const std::function<bool()>& done,
                absl::Duration timeout = absl::Seconds(20)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return true;
}

size_t Alive(Client& client) {
  absl::StatusOr<std::vector<WorkerInfo>> workers = client.Workers();
  if (!workers.ok()) return 0;
  size_t alive = 0;
  for (const WorkerInfo& w : *workers) alive += w.alive ? 1 : 0;
  return alive;
}

TEST(DaemonTest, ACoordinatorAndWorkersInOneProcessServeTensors) {
  absl::StatusOr<std::unique_ptr<CoordinatorDaemon>> coordinator =
      CoordinatorDaemon::Start(SmallCoordinator());
  ASSERT_OK(coordinator.status());
  ASSERT_TRUE((*coordinator)->WaitUntilServing(absl::Seconds(1)));
  const std::string at = (*coordinator)->address();
  std::vector<std::unique_ptr<WorkerDaemon>> workers;
  for (int i = 0; i < 3; ++i) {
    workers.push_back(StartWorker(at, absl::StrCat("w", i)));
    ASSERT_NE(workers.back(), nullptr);
    EXPECT_NE(workers.back()->port(), 0);
  }
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(at);
  ASSERT_OK(client.status());
  ASSERT_TRUE(Eventually([&] { return Alive(**client) == 3; }));

  const HostArray array = Iota(DType::kFloat32, {96, 40});
  ASSERT_OK((*client)
                ->Put("t", array, LayoutSpec::Chunk(0, Ranks({0, 1, 2})))
                .status());
  absl::StatusOr<HostArray> back = (*client)->Get("t");
  ASSERT_OK(back.status());
  EXPECT_TRUE(SameBytes(array, *back));
  // This program links no GPU side (//client:gpu_side): device reads say
  // so, in every build.
  std::vector<char> device_buffer(8);
  EXPECT_THAT((*client)->GetIntoDevice("t", std::nullopt, device_buffer.data(),
                                       8, 0),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("this SDK was built without CUDA")));
  EXPECT_THAT((*client)->MapDevice("t").status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("this SDK was built without CUDA")));

  // A worker stopped in-process is seen dead, as a killed one is.
  ASSERT_TRUE(workers[2]->Stop(absl::ZeroDuration()));
  EXPECT_OK(workers[2]->Wait());  // stopped, not failed
  ASSERT_TRUE(Eventually([&] { return Alive(**client) == 2; }));
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(workers[i]->Stop(absl::Seconds(1)));
  EXPECT_TRUE((*coordinator)->Stop(absl::Seconds(1)));
  EXPECT_OK((*coordinator)->Wait());
}

TEST(DaemonTest, BadOptionsAreRefusedBeforeAnythingStarts) {
  CoordinatorDaemonOptions coordinator = SmallCoordinator();
  coordinator.coordinator.pending_lease = absl::Milliseconds(10);
  EXPECT_THAT(CoordinatorDaemon::Start(coordinator).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  coordinator = SmallCoordinator();
  coordinator.metadata = "etcd://127.0.0.1:1/p/";
  coordinator.data_dir = "/tmp/x";
  EXPECT_THAT(CoordinatorDaemon::Start(coordinator).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));

  WorkerDaemonOptions worker;
  worker.name = "bad name";
  EXPECT_THAT(WorkerDaemon::Start(worker).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  worker = WorkerDaemonOptions();
  worker.listen = "0.0.0.0:0";  // a wildcard, and no advertise
  EXPECT_THAT(WorkerDaemon::Start(worker).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  worker = WorkerDaemonOptions();
  worker.store_dir = "/tmp";
  worker.device.kind = Device::Kind::kCuda;
  EXPECT_THAT(WorkerDaemon::Start(worker).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  // This program links no GPU side (worker/gpu_support.h): a GPU worker is
  // refused with what to do, in every build.
  worker = WorkerDaemonOptions();
  worker.device.kind = Device::Kind::kCuda;
  EXPECT_THAT(WorkerDaemon::Start(worker).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("--device=cuda:0: this build has no CUDA "
                                 "support; run with --device=cpu")));
}

TEST(DaemonTest, WorkersAreListedWithTheirLabels) {
  absl::StatusOr<std::unique_ptr<CoordinatorDaemon>> coordinator =
      CoordinatorDaemon::Start(SmallCoordinator());
  ASSERT_OK(coordinator.status());
  ASSERT_TRUE((*coordinator)->WaitUntilServing(absl::Seconds(1)));
  WorkerDaemonOptions options;
  options.coordinator = (*coordinator)->address();
  options.name = "labelled";
  options.labels = {{"role", "inference"}, {"pool", "gpu-a"}};
  absl::StatusOr<std::unique_ptr<WorkerDaemon>> labelled =
      WorkerDaemon::Start(options);
  ASSERT_OK(labelled.status());
  std::unique_ptr<WorkerDaemon> plain =
      StartWorker((*coordinator)->address(), "plain");
  ASSERT_NE(plain, nullptr);
  absl::StatusOr<std::unique_ptr<Client>> client =
      Client::Connect((*coordinator)->address());
  ASSERT_OK(client.status());
  ASSERT_TRUE(Eventually([&] { return Alive(**client) == 2; }));
  absl::StatusOr<std::vector<WorkerInfo>> workers = (*client)->Workers();
  ASSERT_OK(workers.status());
  for (const WorkerInfo& w : *workers) {
    EXPECT_EQ(w.labels, w.name == "labelled" ? options.labels : Labels())
        << w.name;
  }

  // `workers --json` shows them as an object.
  std::string json;
  ASSERT_EQ(TestCluster::Run(
                {TestCluster::BinaryPath("client/tessera"),
                 absl::StrCat("--coordinator=", (*coordinator)->address()),
                 "workers", "--json"},
                &json, nullptr),
            0);
  EXPECT_THAT(json, ::testing::HasSubstr(
                        R"("labels": {"pool": "gpu-a", "role": "inference"})"));
  EXPECT_THAT(json, ::testing::HasSubstr(R"("labels": {})"));

  // Malformed labels are refused before a worker starts: as an option, and
  // as a flag (exit 2, naming the flag).
  options.labels = {{"bad key", "x"}};
  EXPECT_THAT(WorkerDaemon::Start(options).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::HasSubstr("label key 'bad key'")));
  std::string out, err;
  EXPECT_EQ(TestCluster::Run({TestCluster::BinaryPath("worker/tessera-worker"),
                              "--coordinator=127.0.0.1:1", "--labels=role"},
                             &out, &err),
            2);
  EXPECT_THAT(out + err,
              ::testing::HasSubstr("--labels: 'role' is not KEY=VALUE"));
  EXPECT_TRUE((*labelled)->Stop(absl::Seconds(1)));
  EXPECT_TRUE(plain->Stop(absl::Seconds(1)));
  EXPECT_TRUE((*coordinator)->Stop(absl::Seconds(1)));
}

TEST(DaemonTest, ARefusedWorkerFailsAndWaitSaysWhy) {
  absl::StatusOr<std::unique_ptr<CoordinatorDaemon>> coordinator =
      CoordinatorDaemon::Start(SmallCoordinator());
  ASSERT_OK(coordinator.status());
  const std::string at = (*coordinator)->address();
  WorkerDaemonOptions options;
  options.coordinator = at;
  options.rank = 0;
  options.name = "first";
  std::atomic<bool> told{false};
  absl::StatusOr<std::unique_ptr<WorkerDaemon>> first =
      WorkerDaemon::Start(options);
  ASSERT_OK(first.status());
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(at);
  ASSERT_OK(client.status());
  ASSERT_TRUE(Eventually([&] { return Alive(**client) == 1; }));
  // A second worker asking for the same rank under another name is
  // refused for good: the daemon fails, and says so.
  options.name = "second";
  options.on_fatal = [&told] { told = true; };
  absl::StatusOr<std::unique_ptr<WorkerDaemon>> second =
      WorkerDaemon::Start(options);
  ASSERT_OK(second.status());
  EXPECT_FALSE((*second)->Wait().ok());
  EXPECT_TRUE(told.load());
  EXPECT_FALSE((*second)->failure().ok());
}

TEST(DaemonTest, AStandbyCoordinatorTakesOverWhenTheLeaderStops) {
  EtcdCluster etcd(1, "etcd-daemons");
  ASSERT_TRUE(etcd.ready());
  const std::string metadata =
      etcd.url(absl::StrCat("daemons-", getpid(), "/"));
  std::vector<std::unique_ptr<CoordinatorDaemon>> coordinators;
  std::vector<int> metrics_ports;
  for (int i = 0; i < 2; ++i) {
    CoordinatorDaemonOptions options = SmallCoordinator();
    options.metadata = metadata;
    const int port = PickFreePort();
    options.listen = absl::StrCat("127.0.0.1:", port);
    metrics_ports.push_back(PickFreePort());
    options.metrics_listen = absl::StrCat("127.0.0.1:", metrics_ports.back());
    options.leader_lease = absl::Seconds(1);
    absl::StatusOr<std::unique_ptr<CoordinatorDaemon>> started =
        CoordinatorDaemon::Start(options);
    ASSERT_OK(started.status());
    coordinators.push_back(*std::move(started));
    if (i == 0) {
      ASSERT_TRUE(coordinators[0]->WaitUntilServing(absl::Seconds(20)));
    }
  }
  EXPECT_FALSE(coordinators[1]->WaitUntilServing(absl::Milliseconds(500)));
  // Which one leads, as a scrape of each sees it.
  auto leads = [&](int i) {
    return MetricSum(FetchMetrics(metrics_ports[static_cast<size_t>(i)]),
                     "tessera_coordinator_leader");
  };
  EXPECT_EQ(leads(0), 1);
  EXPECT_EQ(leads(1), 0);
  const std::string leader = coordinators[0]->address();
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(leader);
  ASSERT_OK(client.status());
  std::unique_ptr<WorkerDaemon> worker = StartWorker(leader, "w0");
  ASSERT_NE(worker, nullptr);
  ASSERT_TRUE(Eventually([&] { return Alive(**client) == 1; }));
  const HostArray array = Iota(DType::kInt32, {64, 8});
  ASSERT_OK(
      (*client)->Put("kept", array, LayoutSpec::Chunk(0, Ranks({0}))).status());

  // The leader steps down as it stops; the standby serves what it wrote.
  ASSERT_TRUE(coordinators[0]->Stop(absl::Seconds(1)));
  ASSERT_TRUE(coordinators[1]->WaitUntilServing(absl::Seconds(20)));
  EXPECT_EQ(leads(1), 1);
  absl::StatusOr<std::unique_ptr<Client>> next =
      Client::Connect(coordinators[1]->address());
  ASSERT_OK(next.status());
  absl::StatusOr<TensorMetadata> kept = (*next)->Describe("kept");
  ASSERT_OK(kept.status());
  EXPECT_EQ(kept->shape, (Shape{64, 8}));
  worker->Stop(absl::ZeroDuration());
  EXPECT_TRUE(coordinators[1]->Stop(absl::Seconds(1)));
}

}  // namespace
}  // namespace tessera
