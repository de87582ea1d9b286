// Figures 12-13, GPU: a local cluster of two workers whose shards live on
// cuda:0, read through the SDK, each figure next to the CUDA copy it stands
// in for, measured in the same run on the same GPU:
//   12. 1 GiB into a device buffer through CUDA IPC (Client::GetIntoDevice)
//       against cudaMemcpy device to device of 1 GiB;
//   13. 1 GiB into host memory of a same-host client through pinned staging
//       (Client::GetInto) against cudaMemcpy device to pinned host of 1 GiB.
// Each value is the median of `--repeats` timed runs after one warm-up.
// Needs a GPU; without one it says so and exits 0.
//   bazel build --config=cuda //bench:gpu_bench && bazel-bin/bench/gpu_bench
#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "client/data_plane.h"
#include "client/device_reader.h"
#include "client/tessera_client.h"
#include "tests/cluster.h"
#include "transport/staged_read.h"

ABSL_FLAG(int64_t, bytes, int64_t{1} << 30, "tensor size in bytes");
ABSL_FLAG(int, repeats, 5, "timed runs per figure (the median is reported)");

namespace tessera {
namespace {

double Seconds(const std::function<void()>& body) {
  const auto start = std::chrono::steady_clock::now();
  body();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

// The median of `repeats` timed runs of `body`, after one untimed run.
double Median(int repeats, const std::function<void()>& body) {
  body();
  std::vector<double> times;
  for (int i = 0; i < repeats; ++i) times.push_back(Seconds(body));
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

void Check(const absl::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
    std::exit(1);
  }
}

struct Row {
  std::string figure, value, reference;
  double ratio;
  double target;
  bool higher_is_better;
};

std::string GBps(double bytes, double seconds) {
  return absl::StrFormat("%.1f GB/s", bytes / seconds / 1e9);
}

int Run() {
  if (absl::Status s = CheckCudaAvailable(); !s.ok()) {
    std::printf("gpu_bench: %s; nothing to measure\n",
                std::string(s.message()).c_str());
    return 0;
  }
  const int64_t bytes = absl::GetFlag(FLAGS_bytes);
  const int repeats = std::max(1, absl::GetFlag(FLAGS_repeats));
  const int64_t cols = 8192;
  const int64_t rows = bytes / (cols * 4);
  const double moved = static_cast<double>(rows * cols * 4);

  TestClusterOptions options;
  options.num_workers = 2;
  options.worker_flags = {"--device=cuda:0"};
  auto cluster = TestCluster::Start(options);
  Check(cluster.status(), "starting the cluster");
  auto client = Client::Connect((*cluster)->coordinator_address());
  Check(client.status(), "connecting");
  std::vector<Placement> ranks(2);
  ranks[0].rank = 0;
  ranks[1].rank = 1;
  InitSpec init;
  init.kind = InitSpec::Kind::kRand;
  init.seed = 7;
  Check((*client)
            ->Create("bench_gpu", {rows, cols}, DType::kFloat32,
                     LayoutSpec::Chunk(0, ranks), init)
            .status(),
        "creating the tensor");

  std::vector<Row> table;
  const auto add = [&](Row row) {
    std::printf("  %-52s %-14s %-24s %6.2fx\n", row.figure.c_str(),
                row.value.c_str(), row.reference.c_str(), row.ratio);
    std::fflush(stdout);
    table.push_back(std::move(row));
  };
  std::printf("  %-52s %-14s %-24s %s\n", "figure", "value", "reference",
              "ratio");

  // 12. Device to device.
  void* src = nullptr;
  void* dst = nullptr;
  Check(cudaSetDevice(0), "cudaSetDevice");
  Check(cudaMalloc(&src, static_cast<size_t>(moved)), "cudaMalloc");
  Check(cudaMalloc(&dst, static_cast<size_t>(moved)), "cudaMalloc");
  Check(cudaMemset(src, 1, static_cast<size_t>(moved)), "cudaMemset");
  const double d2d = Median(repeats, [&] {
    Check(cudaMemcpy(dst, src, static_cast<size_t>(moved),
                     cudaMemcpyDeviceToDevice),
          "cudaMemcpy D2D");
    // A device-to-device cudaMemcpy returns before the copy ends.
    Check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  });
  const double first_ipc = Seconds([&] {
    Check((*client)->GetIntoDevice("bench_gpu", std::nullopt, dst,
                                   static_cast<int64_t>(moved), 0),
          "GetIntoDevice");
  });
  const double ipc = Median(repeats, [&] {
    Check((*client)->GetIntoDevice("bench_gpu", std::nullopt, dst,
                                   static_cast<int64_t>(moved), 0),
          "GetIntoDevice");
  });
  add({"12. 1 GiB GPU -> own GPU buffer, CUDA IPC (SDK)", GBps(moved, ipc),
       "cudaMemcpy D2D " + GBps(moved, d2d), d2d / ipc, 0.9, true});
  add({"12. same, first call (opens the IPC handles)",
       absl::StrFormat("%.2f ms", first_ipc * 1e3),
       absl::StrFormat("D2D %.2f ms", d2d * 1e3), first_ipc / d2d, 0, false});
  Check(cudaFree(src), "cudaFree");

  // 13. Device to a host client.
  void* pinned = nullptr;
  Check(cudaMallocHost(&pinned, static_cast<size_t>(moved)), "cudaMallocHost");
  const double d2h = Median(repeats, [&] {
    Check(cudaMemcpy(pinned, dst, static_cast<size_t>(moved),
                     cudaMemcpyDeviceToHost),
          "cudaMemcpy D2H");
  });
  std::vector<char> host(static_cast<size_t>(moved));
  std::memset(host.data(), 0, host.size());  // touched, as a reused buffer is
  const double staged = Median(repeats, [&] {
    Check((*client)->GetInto("bench_gpu", std::nullopt, host.data(),
                             static_cast<int64_t>(moved)),
          "GetInto");
  });
  add({"13. 1 GiB GPU -> host client, pinned staging (SDK)",
       GBps(moved, staged), "cudaMemcpy D2H pinned " + GBps(moved, d2h),
       d2h / staged, 0.7, true});
  const double staged_pinned = Median(repeats, [&] {
    Check((*client)->GetInto("bench_gpu", std::nullopt,
                             static_cast<char*>(pinned),
                             static_cast<int64_t>(moved)),
          "GetInto");
  });
  add({"13. same, into the client's pinned buffer", GBps(moved, staged_pinned),
       "cudaMemcpy D2H pinned " + GBps(moved, d2h), d2h / staged_pinned, 0,
       true});
  ClientOptions grpc_only;
  grpc_only.transport = "grpc";
  auto over_grpc =
      Client::Connect((*cluster)->coordinator_address(), grpc_only);
  Check(over_grpc.status(), "connecting");
  const double grpc = Median(repeats, [&] {
    Check((*over_grpc)
              ->GetInto("bench_gpu", std::nullopt, host.data(),
                        static_cast<int64_t>(moved)),
          "GetInto over gRPC");
  });
  add({"13. same, forced over gRPC (another host's path)", GBps(moved, grpc),
       "cudaMemcpy D2H pinned " + GBps(moved, d2h), d2h / grpc, 0, true});
  Check(cudaFreeHost(pinned), "cudaFreeHost");

  // Where staging's time goes: the pieces of figure 13 one by one.
  {
    const int64_t part = int64_t{256} << 20;
    const std::string name = "/tessera-gpu-bench-" + std::to_string(getpid());
    const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    shm_unlink(name.c_str());
    if (fd < 0 || ftruncate(fd, part) != 0) return 1;
    char* shm = static_cast<char*>(
        mmap(nullptr, part, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    close(fd);
    std::memset(shm, 0, part);
    const double reg = Seconds([&] {
      Check(cudaHostRegister(shm, part, cudaHostRegisterPortable),
            "cudaHostRegister");
    });
    const double to_shm = Median(repeats, [&] {
      Check(cudaMemcpy(shm, dst, part, cudaMemcpyDeviceToHost), "D2H shm");
    });
    std::printf("  %-52s %-14s %-24s\n", "13x. D2H into registered shm",
                GBps(part, to_shm).c_str(),
                absl::StrFormat("register 256 MiB %.1f ms", reg * 1e3).c_str());
    for (int threads : {1, 2, 4, 8, 16}) {
      const double t = Median(repeats, [&] {
        std::vector<std::thread> workers;
        const int64_t each = part / threads;
        for (int k = 0; k < threads; ++k) {
          workers.emplace_back([&, k] {
            std::memcpy(host.data() + k * each, shm + k * each, each);
          });
        }
        for (std::thread& w : workers) w.join();
      });
      std::printf(
          "  %-52s %-14s\n",
          absl::StrFormat("13x. memcpy shm -> host, %d threads", threads)
              .c_str(),
          GBps(part, t).c_str());
    }
    Check(cudaHostUnregister(shm), "cudaHostUnregister");
    munmap(shm, part);

    auto meta = (*client)->Describe("bench_gpu");
    Check(meta.status(), "describe");
    const RemoteShard shard =
        ShardAt(*meta, 0, ReadLocations(*meta, 0).front());
    auto channel = grpc::CreateChannel(shard.location.address,
                                       grpc::InsecureChannelCredentials());
    const Box box = WholeBox(meta->shards[0].box.sizes);
    const double shard_bytes = static_cast<double>(box.NumElements() * 4);
    const std::vector<int64_t> zeros(box.rank(), 0);
    StagingMappings mappings;
    for (int streams : {2, 4, 8, 16}) {
      for (int64_t slot :
           {int64_t{4} << 20, int64_t{8} << 20, int64_t{16} << 20}) {
        StagedReadOptions staged_options;
        staged_options.mappings = &mappings;
        staged_options.max_streams = streams;
        staged_options.min_stream_bytes = 1;
        staged_options.slot_bytes = slot;
        const double t = Median(repeats, [&] {
          Check(StagedRead(channel, shard, box,
                           ReadTarget::HostArray(host.data(), box.sizes, zeros),
                           staged_options),
                "StagedRead");
        });
        std::printf(
            "  %-52s %-14s\n",
            absl::StrFormat("13x. one shard staged, %d streams, %d MiB slots",
                            streams, slot >> 20)
                .c_str(),
            GBps(shard_bytes, t).c_str());
      }
    }
  }
  Check(cudaFree(dst), "cudaFree");

  const DataPlaneStats stats = (*client)->TransferStats();
  std::printf("\n  bytes by transport (SDK client):");
  for (const auto& [name, n] : stats.bytes) {
    std::printf(" %s=%lld", name.c_str(), static_cast<long long>(n));
  }
  std::printf(
      "\n\n| figure | value | reference (same run) | ratio | target | met? "
      "|\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (const Row& r : table) {
    std::string target = "-", met = "-";
    if (r.target > 0) {
      target = absl::StrFormat("%s %.2fx",
                               r.higher_is_better ? ">=" : "<=", r.target);
      met = (r.higher_is_better ? r.ratio >= r.target : r.ratio <= r.target)
                ? "yes"
                : "**no**";
    }
    std::printf("| %s | %s | %s | %.2fx | %s | %s |\n", r.figure.c_str(),
                r.value.c_str(), r.reference.c_str(), r.ratio, target.c_str(),
                met.c_str());
  }
  return 0;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return tessera::Run();
}
