// The GPU suite: a real coordinator and two workers whose shards live on
// cuda:0 (two workers share one GPU, as CUDA IPC allows), driven through the
// SDK and checked byte for byte against arrays built on the host. Built only
// with --config=cuda and run by scripts/test_gpu.sh on a machine with a GPU.
#include <cuda_runtime_api.h>

#include <csignal>
#include <thread>
#include <vector>

#include "client/device_reader.h"
#include "client/tessera_client.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cluster.h"
#include "tests/test_arrays.h"

namespace tessera {
namespace {

using ::tessera::testing::StatusIs;
using ::testing::HasSubstr;

// Device memory for one test, freed with it.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(int64_t bytes) : bytes_(bytes) {
    EXPECT_EQ(cudaMalloc(&data_, static_cast<size_t>(bytes)), cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(data_); }
  void* data() const { return data_; }
  int64_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  int64_t bytes_;
};

// `bytes` of device memory at `src`, copied to a host array of `shape`.
HostArray FromDevice(const void* src, DType dtype, const Shape& shape) {
  HostArray out = HostArray::Allocate(dtype, shape);
  EXPECT_EQ(cudaMemcpy(out.data(), src, static_cast<size_t>(out.num_bytes),
                       cudaMemcpyDeviceToHost),
            cudaSuccess);
  return out;
}

class GpuTest : public ClusterSuite<GpuTest> {
 public:
  static TestClusterOptions ClusterOptions() {
    TestClusterOptions options;
    options.num_workers = 2;
    // A short export hold, so the test can watch one end, and a capacity
    // that shows what the hold keeps.
    options.worker_flags = {"--device=cuda:0", "--device_export_hold=3s",
                            "--capacity_bytes=67108864"};
    return options;
  }

 protected:
  void SetUp() override { ASSERT_OK(CheckCudaAvailable()); }
};

// The workers as soon as both have reported their device memory (a
// heartbeat after registering).
std::vector<WorkerInfo> WorkersWithDeviceMemory(Client& client) {
  std::vector<WorkerInfo> workers;
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline) {
    absl::StatusOr<std::vector<WorkerInfo>> now = client.Workers();
    if (now.ok()) workers = *now;
    bool reported = !workers.empty();
    for (const WorkerInfo& w : workers) {
      reported = reported && w.device_total_bytes > 0;
    }
    if (reported) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  return workers;
}

TEST_F(GpuTest, WorkersHoldShardsOnTheGpuAndShowItsMemory) {
  const std::vector<WorkerInfo> workers = WorkersWithDeviceMemory(*client_);
  ASSERT_EQ(workers.size(), 2u);
  for (const WorkerInfo& w : workers) {
    EXPECT_EQ(w.device.ToString(), "cuda:0");
    EXPECT_GT(w.device_total_bytes, 0) << w.name;
    EXPECT_GT(w.device_free_bytes, 0) << w.name;
    EXPECT_LE(w.device_free_bytes, w.device_total_bytes) << w.name;
  }
  const HostArray array = Iota(DType::kFloat32, {1024, 256});
  ASSERT_OK(
      client_->Put("gpu_placed", array, LayoutSpec::Chunk(0, Ranks({0, 1}))));
  ASSERT_OK_AND_ASSIGN(TensorMetadata meta, client_->Describe("gpu_placed"));
  for (const ShardInfo& shard : meta.shards) {
    EXPECT_EQ(shard.replicas[0].device.ToString(), "cuda:0");
  }
  ASSERT_OK(client_->Delete("gpu_placed"));
}

TEST_F(GpuTest, PutGetRegionAndRowsAreExactForEveryTransport) {
  ClientOptions grpc_only;
  grpc_only.transport = "grpc";
  ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<Client> over_grpc,
      Client::Connect(cluster_->coordinator_address(), grpc_only));
  for (DType dtype :
       {DType::kFloat32, DType::kInt32, DType::kBFloat16, DType::kFloat64}) {
    SCOPED_TRACE(DTypeName(dtype));
    const HostArray array = Iota(dtype, {1000, 300}, 7);
    ASSERT_OK(
        client_->Put("gpu_exact", array, LayoutSpec::Chunk(0, Ranks({0, 1}))));
    for (Client* client : {client_, over_grpc.get()}) {
      ASSERT_OK_AND_ASSIGN(HostArray whole, client->Get("gpu_exact"));
      EXPECT_TRUE(SameBytes(whole, array));
      const Box region{{17, 5}, {900, 201}};
      ASSERT_OK_AND_ASSIGN(HostArray part, client->Get("gpu_exact", region));
      EXPECT_TRUE(SameBytes(part, Slice(array, region)));
      const std::vector<int64_t> rows = {5, 999, -1, 5, 500, 0};
      ASSERT_OK_AND_ASSIGN(HostArray got,
                           client->GatherRows("gpu_exact", rows));
      for (size_t i = 0; i < rows.size(); ++i) {
        const int64_t r = rows[i] < 0 ? 1000 + rows[i] : rows[i];
        EXPECT_TRUE(
            SameBytes(Slice(got, Box{{static_cast<int64_t>(i), 0}, {1, 300}}),
                      Slice(array, Box{{r, 0}, {1, 300}})))
            << "row " << rows[i];
      }
    }
    ASSERT_OK(client_->Delete("gpu_exact"));
  }
  // Same host: the default client staged the device shards through shared
  // memory; the forced one used gRPC alone.
  EXPECT_GT(client_->TransferStats().bytes["shm"], 0);
  EXPECT_EQ(over_grpc->TransferStats().bytes["shm"], 0);
  EXPECT_GT(over_grpc->TransferStats().bytes["grpc"], 0);
}

TEST_F(GpuTest, ReshardAndRegionalUpdateKeepEveryByte) {
  const HostArray array = Iota(DType::kFloat32, {512, 1024}, 3);
  ASSERT_OK(
      client_->Put("gpu_moved", array, LayoutSpec::Chunk(0, Ranks({0, 1}))));
  ASSERT_OK(client_->Reshard("gpu_moved", LayoutSpec::Chunk(1, Ranks({0, 1}))));
  ASSERT_OK_AND_ASSIGN(HostArray after, client_->Get("gpu_moved"));
  EXPECT_TRUE(SameBytes(after, array));
  // Rows -> columns -> a grid of uneven boxes on both workers.
  ASSERT_OK(client_->Reshard(
      "gpu_moved", LayoutSpec::Enumerable(
                       {Box{{0, 0}, {300, 1024}}, Box{{300, 0}, {212, 700}},
                        Box{{300, 700}, {212, 324}}},
                       Ranks({1, 0, 1}))));
  ASSERT_OK_AND_ASSIGN(after, client_->Get("gpu_moved"));
  EXPECT_TRUE(SameBytes(after, array));

  const Box region{{250, 600}, {100, 300}};
  const HostArray patch = Iota(DType::kFloat32, {100, 300}, 99);
  ASSERT_OK(client_->Update("gpu_moved", patch, region));
  ASSERT_OK_AND_ASSIGN(after, client_->Get("gpu_moved"));
  EXPECT_TRUE(SameBytes(after, Patched(array, region, patch)));
  ASSERT_OK(client_->Delete("gpu_moved"));
}

TEST_F(GpuTest, GetIntoDeviceCopiesDeviceToDeviceThroughIpc) {
  const HostArray array = Iota(DType::kFloat32, {2048, 1024}, 5);
  ASSERT_OK(
      client_->Put("gpu_ipc", array, LayoutSpec::Chunk(0, Ranks({0, 1}))));
  const int64_t before = client_->TransferStats().bytes["cuda_ipc"];

  DeviceBuffer whole(array.num_bytes);
  ASSERT_OK(client_->GetIntoDevice("gpu_ipc", std::nullopt, whole.data(),
                                   whole.bytes(), 0));
  EXPECT_TRUE(
      SameBytes(FromDevice(whole.data(), array.dtype, array.shape), array));

  // A region across both shards, strided in both.
  const Box region{{1000, 100}, {100, 300}};
  DeviceBuffer part(100 * 300 * 4);
  ASSERT_OK(
      client_->GetIntoDevice("gpu_ipc", region, part.data(), part.bytes(), 0));
  EXPECT_TRUE(SameBytes(FromDevice(part.data(), DType::kFloat32, {100, 300}),
                        Slice(array, region)));
  EXPECT_EQ(client_->TransferStats().bytes["cuda_ipc"] - before,
            array.num_bytes + part.bytes());

  EXPECT_THAT(client_->GetIntoDevice("gpu_ipc", region, part.data(),
                                     part.bytes() - 4, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("needs")));
  ASSERT_OK(client_->Delete("gpu_ipc"));
}

TEST_F(GpuTest, MappedShardsStayReadableUntilTheirHoldEndsAfterADelete) {
  const HostArray array = Iota(DType::kFloat32, {1024, 512}, 11);
  ASSERT_OK(
      client_->Put("gpu_views", array, LayoutSpec::Chunk(0, Ranks({0, 1}))));
  ASSERT_OK_AND_ASSIGN(std::vector<DeviceShardView> views,
                       client_->MapDevice("gpu_views"));
  ASSERT_EQ(views.size(), 2u);
  for (const DeviceShardView& view : views) {
    EXPECT_TRUE(SameBytes(
        FromDevice(view.data, DType::kFloat32, ToShape(view.box.sizes)),
        Slice(array, view.box)));
    EXPECT_GT(view.valid_until, absl::Now());
  }
  // The tensor goes; the worker keeps the exported memory for its hold, so
  // a view still shows the tensor's bytes, never reused memory.
  ASSERT_OK(client_->Delete("gpu_views"));
  ASSERT_OK(client_->Put("gpu_views_next",
                         Iota(DType::kFloat32, {1024, 512}, 12),
                         LayoutSpec::Chunk(0, Ranks({0, 1}))));
  for (const DeviceShardView& view : views) {
    ASSERT_LT(absl::Now(), view.valid_until);
    EXPECT_TRUE(SameBytes(
        FromDevice(view.data, DType::kFloat32, ToShape(view.box.sizes)),
        Slice(array, view.box)));
  }
  EXPECT_THAT(client_->MapDevice("gpu_views").status(),
              StatusIs(absl::StatusCode::kNotFound));
  ASSERT_OK(client_->Delete("gpu_views_next"));
}

TEST_F(GpuTest, AnExportHoldsDeviceMemoryUntilItEnds) {
  // 48 MiB per worker of a 64 MiB capacity.
  const HostArray array = Iota(DType::kFloat32, {6144, 4096}, 13);
  ASSERT_OK(
      client_->Put("gpu_hold", array, LayoutSpec::Chunk(0, Ranks({0, 1}))));
  ASSERT_OK(client_->MapDevice("gpu_hold").status());
  ASSERT_OK(client_->Delete("gpu_hold"));
  // Still held for the export: a second tensor as large does not fit...
  EXPECT_THAT(
      client_->Put("gpu_hold_next", array, LayoutSpec::Chunk(0, Ranks({0, 1}))),
      StatusIs(absl::StatusCode::kResourceExhausted));
  // ... until the 3 s hold ends and the worker lets the memory go.
  absl::Status put = absl::UnknownError("not tried");
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (!put.ok() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(500));
    put = client_
              ->Put("gpu_hold_next", array, LayoutSpec::Chunk(0, Ranks({0, 1})))
              .status();
  }
  ASSERT_OK(put);
  ASSERT_OK_AND_ASSIGN(HostArray back, client_->Get("gpu_hold_next"));
  EXPECT_TRUE(SameBytes(back, array));
  ASSERT_OK(client_->Delete("gpu_hold_next"));
}

// A device read goes from replica to replica as a host read does: with the
// worker of each shard's first replica killed (the coordinator has not yet
// seen it go), every byte still comes device to device from the other.
// Last in the suite: w0 is restarted, but its shards are gone.
TEST_F(GpuTest, DeviceReadsFailOverToAnotherReplicaOfTheShard) {
  const HostArray array = Iota(DType::kFloat32, {1024, 256}, 17);
  ASSERT_OK(client_->Put("gpu_twice", array, ReplicatedChunks({0, 1}, 2)));
  ASSERT_OK_AND_ASSIGN(TensorMetadata meta, client_->Describe("gpu_twice"));
  ASSERT_EQ(meta.shards.size(), 2u);
  for (const ShardInfo& shard : meta.shards) {
    ASSERT_EQ(shard.replicas.size(), 2u);
  }
  ASSERT_EQ(meta.shards[0].replicas[0].worker, "w0");
  cluster_->StopWorker(0, SIGKILL);
  const int64_t before = client_->TransferStats().bytes["cuda_ipc"];

  DeviceBuffer whole(array.num_bytes);
  ASSERT_OK(client_->GetIntoDevice("gpu_twice", std::nullopt, whole.data(),
                                   whole.bytes(), 0));
  EXPECT_TRUE(
      SameBytes(FromDevice(whole.data(), array.dtype, array.shape), array));
  EXPECT_EQ(client_->TransferStats().bytes["cuda_ipc"] - before,
            array.num_bytes);

  ASSERT_OK_AND_ASSIGN(std::vector<DeviceShardView> views,
                       client_->MapDevice("gpu_twice"));
  ASSERT_EQ(views.size(), 2u);
  for (const DeviceShardView& view : views) {
    EXPECT_EQ(view.worker, "w1");
    EXPECT_TRUE(
        SameBytes(FromDevice(view.data, array.dtype, ToShape(view.box.sizes)),
                  Slice(array, view.box)));
  }
  views.clear();
  ASSERT_OK(cluster_->RestartWorker(0));
  ASSERT_OK(client_->Delete("gpu_twice"));
}

}  // namespace
}  // namespace tessera
