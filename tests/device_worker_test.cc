// GPU workers on a machine without a GPU: in-process WorkerDaemons started
// with --device=cuda:0 whose stores keep their bytes in host memory but
// report a device (worker/testing/device_like_gpu.h). Every path a GPU
// worker takes that needs no CUDA copy runs here on every CI run: the
// device reports, host reads of device shards (staged by the worker for
// shared memory, streamed for gRPC and the data port), and reads that go
// from replica to replica when a shard's first worker is gone. The CUDA
// copies themselves run in tests/gpu_test on a GPU.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/tessera_client.h"
#include "coordinator/coordinator_daemon.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cluster.h"
#include "tests/test_arrays.h"
#include "worker/testing/device_like_gpu.h"
#include "worker/worker_daemon.h"

namespace tessera {
namespace {

class DeviceWorkerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    UseDeviceLikeGpu();
    CoordinatorDaemonOptions options;
    // A lease far longer than the test: a stopped worker stays listed
    // alive, as a killed one does until its lease runs out, so reads meet
    // it first and must go on to another replica.
    options.coordinator.lease = absl::Seconds(60);
    options.coordinator.heartbeat_interval = absl::Milliseconds(200);
    absl::StatusOr<std::unique_ptr<CoordinatorDaemon>> coordinator =
        CoordinatorDaemon::Start(options);
    ASSERT_OK(coordinator.status());
    coordinator_ = *std::move(coordinator);
    ASSERT_TRUE(coordinator_->WaitUntilServing(absl::Seconds(5)));
    for (int i = 0; i < 2; ++i) {
      WorkerDaemonOptions worker;
      worker.coordinator = coordinator_->address();
      worker.name = absl::StrCat("w", i);
      worker.rank = i;
      worker.zone = worker.name;
      worker.device.kind = Device::Kind::kCuda;
      worker.nccl = false;
      absl::StatusOr<std::unique_ptr<WorkerDaemon>> started =
          WorkerDaemon::Start(worker);
      ASSERT_OK(started.status());
      workers_.push_back(*std::move(started));
    }
    client_ = Connected("auto");
    ASSERT_NE(client_, nullptr);
    ASSERT_TRUE(Eventually(
        [&] {
          absl::StatusOr<std::vector<WorkerInfo>> workers = client_->Workers();
          if (!workers.ok() || workers->size() != 2) return false;
          for (const WorkerInfo& w : *workers) {
            if (!w.alive || w.device_total_bytes == 0) return false;
          }
          return true;
        },
        absl::Seconds(20)));
  }

  void TearDown() override {
    for (auto& worker : workers_) {
      if (worker != nullptr) worker->Stop(absl::Seconds(1));
    }
    if (coordinator_ != nullptr) coordinator_->Stop(absl::Seconds(1));
  }

  std::unique_ptr<Client> Connected(const std::string& transport) {
    ClientOptions options;
    options.transport = transport;
    absl::StatusOr<std::unique_ptr<Client>> client =
        Client::Connect(coordinator_->address(), options);
    EXPECT_OK(client.status());
    return client.ok() ? *std::move(client) : nullptr;
  }

  std::unique_ptr<CoordinatorDaemon> coordinator_;
  std::vector<std::unique_ptr<WorkerDaemon>> workers_;
  std::unique_ptr<Client> client_;
};

TEST_F(DeviceWorkerTest, GpuWorkersShowTheirDeviceAndHoldShardsThere) {
  ASSERT_OK_AND_ASSIGN(std::vector<WorkerInfo> workers, client_->Workers());
  for (const WorkerInfo& w : workers) {
    EXPECT_EQ(w.device.ToString(), "cuda:0") << w.name;
    EXPECT_EQ(w.device_total_bytes, int64_t{1} << 30) << w.name;
    EXPECT_EQ(w.device_free_bytes, int64_t{1} << 29) << w.name;
  }
  const HostArray array = Iota(DType::kFloat32, {512, 64});
  ASSERT_OK(client_->Put("placed", array, LayoutSpec::Chunk(0, Ranks({0, 1}))));
  ASSERT_OK_AND_ASSIGN(TensorMetadata meta, client_->Describe("placed"));
  ASSERT_EQ(meta.shards.size(), 2u);
  for (const ShardInfo& shard : meta.shards) {
    EXPECT_EQ(shard.replicas[0].device.ToString(), "cuda:0");
  }
}

// A host read of device shards goes from replica to replica on every
// transport: with the worker of each shard's first replica stopped (and
// still listed alive), every byte of the whole tensor, a region and rows
// comes from the other worker, exact.
TEST_F(DeviceWorkerTest, ReadsOfDeviceShardsFailOverToAnotherReplica) {
  const HostArray array = Iota(DType::kFloat32, {1024, 256}, 5);  // 1 MiB
  ASSERT_OK(client_->Put("twice", array, ReplicatedChunks({0, 1}, 2)));
  ASSERT_OK_AND_ASSIGN(TensorMetadata meta, client_->Describe("twice"));
  ASSERT_EQ(meta.shards.size(), 2u);
  ASSERT_EQ(meta.shards[0].replicas.size(), 2u);
  ASSERT_EQ(meta.shards[0].replicas[0].worker, "w0");
  ASSERT_EQ(meta.shards[1].replicas[0].worker, "w1");

  // Both read fine while both workers run: the shared-memory read of a
  // device shard is staged by its worker.
  {
    std::unique_ptr<Client> reader = Connected("shm");
    ASSERT_NE(reader, nullptr);
    ASSERT_OK_AND_ASSIGN(HostArray back, reader->Get("twice"));
    EXPECT_TRUE(SameBytes(back, array));
    EXPECT_EQ(reader->TransferStats().bytes["shm"], array.num_bytes);
  }

  ASSERT_TRUE(workers_[0]->Stop(absl::ZeroDuration()));
  workers_[0].reset();
  const Box region{{500, 10}, {40, 200}};
  const std::vector<int64_t> rows = {0, 511, 512, 1023, 3};
  for (const std::string& transport : {"shm", "grpc", "tcp", "auto"}) {
    SCOPED_TRACE(transport);
    std::unique_ptr<Client> reader = Connected(transport);
    ASSERT_NE(reader, nullptr);
    ASSERT_OK_AND_ASSIGN(HostArray back, reader->Get("twice"));
    EXPECT_TRUE(SameBytes(back, array));
    ASSERT_OK_AND_ASSIGN(HostArray part,
                         reader->GetRegion("twice", "500:540,10:210"));
    EXPECT_TRUE(SameBytes(part, Slice(array, region)));
    ASSERT_OK_AND_ASSIGN(HostArray gathered, reader->GatherRows("twice", rows));
    for (size_t i = 0; i < rows.size(); ++i) {
      EXPECT_TRUE(SameBytes(
          Slice(gathered, Box{{static_cast<int64_t>(i), 0}, {1, 256}}),
          Slice(array, Box{{rows[i], 0}, {1, 256}})))
          << "row " << rows[i];
    }
    const DataPlaneStats stats = reader->TransferStats();
    EXPECT_EQ(stats.served.count("w0"), 0u);
    EXPECT_GT(stats.served.at("w1"), 0);
    if (transport != "auto") {
      EXPECT_EQ(stats.bytes.size(), 1u) << "every byte over " << transport;
    }
  }
}

}  // namespace
}  // namespace tessera
