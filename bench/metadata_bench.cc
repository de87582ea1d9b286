// metadata_bench: the coordinator's durable record path under load. Starts
// two local clusters (tests/cluster.h: the real tessera-coordinator and two
// workers each): one whose coordinator keeps its metadata in a --data_dir
// (every change fsynced to its log before the call returns), and the same
// without --data_dir as the reference. Measured rounds alternate between
// the two so that machine drift hits both alike; each figure is the median
// over rounds, printed next to its same-run reference as a ratio:
//
//   1. creates/s, 1 client, --data_dir        vs the same without --data_dir
//   2. creates/s, 16 clients, --data_dir      vs the same without --data_dir
//   3. GetTensor p99 while 16 clients create  vs the same without --data_dir,
//      (--data_dir)                               and (3b) vs GetTensor p99
//                                                 with no writes
//
// Each create is a small one-shard tensor (the metadata path, not the data
// path); created tensors are deleted between rounds, untimed. Calls go
// straight through the Coordinator gRPC stub (no SDK metadata cache).
//
//   bazel build -c opt //bench:metadata_bench   (builds both daemons too)
//   TESSERA_BIN_DIR=$PWD/bazel-bin bazel-bin/bench/metadata_bench [--quick]
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/layout_spec.h"
#include "core/placement.h"
#include "proto/coordinator.grpc.pb.h"
#include "rpc/channel.h"
#include "rpc/convert.h"
#include "tests/cluster.h"

namespace tessera {
namespace {

constexpr int kWorkers = 2;
constexpr int kManyClients = 16;

struct Sizes {
  int rounds = 5;
  int creates_one_client = 1000;  // per round
  int creates_per_client = 100;   // per client per round, with 16 clients
  int reads_without_writes = 5000;
};

template <typename T>
T ValueOrDie(absl::StatusOr<T> v, const char* what) {
  if (!v.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, v.status().ToString().c_str());
    std::exit(1);
  }
  return *std::move(v);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(
      v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())));
  return v[i];
}

// One cluster and its stubs: one per client (separate channels).
struct Target {
  std::string label;
  std::unique_ptr<TestCluster> cluster;
  std::vector<std::unique_ptr<v1::Coordinator::Stub>> stubs;
  int64_t next_id = 0;

  v1::Coordinator::Stub& stub(int client) { return *stubs[client]; }
};

Target Start(const std::string& label, bool durable) {
  TestClusterOptions options;
  options.num_workers = kWorkers;
  options.durable = durable;
  Target target;
  target.label = label;
  target.cluster = ValueOrDie(TestCluster::Start(options), "starting cluster");
  for (int i = 0; i <= kManyClients; ++i) {
    target.stubs.push_back(v1::Coordinator::NewStub(
        MakeChannel(target.cluster->coordinator_address())));
  }
  return target;
}

v1::CreateTensorRequest CreateRequest(const std::string& name, int rank) {
  v1::CreateTensorRequest request;
  request.set_name(name);
  request.add_shape(64);
  request.mutable_properties()->set_dtype(DTypeToProto(DType::kFloat32));
  Placement placement;
  placement.rank = rank;
  LayoutSpecToProto(LayoutSpec::Chunk(0, {placement}), request.mutable_spec());
  return request;
}

void Create(Target& target, int client, const std::string& name) {
  v1::CreateTensorRequest request = CreateRequest(name, client % kWorkers);
  v1::CreateTensorResponse response;
  grpc::ClientContext context;
  grpc::Status s =
      target.stub(client).CreateTensor(&context, request, &response);
  if (!s.ok()) {
    std::fprintf(stderr, "create %s: %s\n", name.c_str(),
                 s.error_message().c_str());
    std::exit(1);
  }
}

// Deletes every tensor but the probe (untimed), 16 at a time.
void DeleteAll(Target& target) {
  v1::ListTensorsRequest request;
  v1::ListTensorsResponse response;
  grpc::ClientContext context;
  if (!target.stub(0).ListTensors(&context, request, &response).ok()) return;
  std::vector<std::string> names;
  for (const v1::TensorSummary& t : response.tensors()) {
    if (t.name() != "probe") names.push_back(t.name());
  }
  std::atomic<size_t> next{0};
  std::vector<std::thread> threads;
  for (int c = 0; c < kManyClients; ++c) {
    threads.emplace_back([&, c] {
      for (size_t i = next++; i < names.size(); i = next++) {
        v1::DeleteTensorRequest del;
        del.set_name(names[i]);
        v1::DeleteTensorResponse ignored;
        grpc::ClientContext ctx;
        target.stub(c).DeleteTensor(&ctx, del, &ignored);
      }
    });
  }
  for (std::thread& t : threads) t.join();
}

// Creates/s with `clients` concurrent clients each making `each` creates.
double CreatesPerSecond(Target& target, int clients, int each) {
  const int64_t base = target.next_id;
  target.next_id += static_cast<int64_t>(clients) * each;
  const absl::Time start = absl::Now();
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      for (int i = 0; i < each; ++i)
        Create(target, c, absl::StrCat("t", base + c * each + i));
    });
  }
  for (std::thread& t : threads) t.join();
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return clients * each / seconds;
}

// GetTensor("probe") latencies in seconds, back to back, until `stop`.
std::vector<double> ReadProbe(Target& target, const std::atomic<bool>& stop,
                              int max_reads) {
  std::vector<double> out;
  v1::GetTensorRequest request;
  request.set_name("probe");
  request.set_packed_reply(true);
  while (!stop.load() && static_cast<int>(out.size()) < max_reads) {
    v1::GetTensorResponse response;
    grpc::ClientContext context;
    const absl::Time start = absl::Now();
    grpc::Status s =
        target.stub(kManyClients).GetTensor(&context, request, &response);
    out.push_back(absl::ToDoubleSeconds(absl::Now() - start));
    if (!s.ok()) {
      std::fprintf(stderr, "get probe: %s\n", s.error_message().c_str());
      std::exit(1);
    }
  }
  return out;
}

void Row(const std::string& figure, const std::string& value,
         const std::string& reference, double ratio) {
  std::printf("| %s | %s | %s | %.2fx |\n", figure.c_str(), value.c_str(),
              reference.c_str(), ratio);
  std::fflush(stdout);
}

int Main(int argc, char** argv) {
  Sizes sizes;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      sizes.rounds = 3;
      sizes.creates_one_client = 100;
      sizes.creates_per_client = 10;
      sizes.reads_without_writes = 1000;
    } else {
      std::fprintf(stderr, "usage: metadata_bench [--quick]\n");
      return 2;
    }
  }
  Target durable = Start("--data_dir", /*durable=*/true);
  Target memory = Start("no --data_dir", /*durable=*/false);
  for (Target* t : {&durable, &memory}) Create(*t, 0, "probe");

  // [0]: --data_dir, [1]: without.
  std::vector<double> one[2], many[2], p99_writing[2], p99_idle;
  for (int round = 0; round < sizes.rounds; ++round) {
    // Alternate which goes first.
    Target* order[2] = {&durable, &memory};
    if (round % 2 == 1) std::swap(order[0], order[1]);
    for (Target* t : order) {
      const int k = t == &durable ? 0 : 1;
      one[k].push_back(CreatesPerSecond(*t, 1, sizes.creates_one_client));
      DeleteAll(*t);
      many[k].push_back(
          CreatesPerSecond(*t, kManyClients, sizes.creates_per_client));
      DeleteAll(*t);
      // Reads while 16 clients create.
      std::atomic<bool> stop{false};
      std::vector<double> latencies;
      std::thread reader([&] { latencies = ReadProbe(*t, stop, 1 << 30); });
      CreatesPerSecond(*t, kManyClients, sizes.creates_per_client);
      stop = true;
      reader.join();
      p99_writing[k].push_back(Percentile(latencies, 0.99));
      DeleteAll(*t);
    }
    // Reads of the durable coordinator with nothing else running.
    std::atomic<bool> stop{false};
    p99_idle.push_back(
        Percentile(ReadProbe(durable, stop, sizes.reads_without_writes), 0.99));
  }

  std::printf(
      "| figure (median of %d rounds) | value | reference (same run) | ratio "
      "|\n"
      "|---|---|---|---|\n",
      sizes.rounds);
  const double one_d = Median(one[0]), one_m = Median(one[1]);
  Row("1. creates/s, 1 client, --data_dir", absl::StrFormat("%.0f/s", one_d),
      absl::StrFormat("no --data_dir %.0f/s", one_m), one_d / one_m);
  const double many_d = Median(many[0]), many_m = Median(many[1]);
  Row("2. creates/s, 16 clients, --data_dir", absl::StrFormat("%.0f/s", many_d),
      absl::StrFormat("no --data_dir %.0f/s", many_m), many_d / many_m);
  const double w = Median(p99_writing[0]), w_m = Median(p99_writing[1]);
  const double idle = Median(p99_idle);
  Row("3. GetTensor p99 while 16 clients create, --data_dir",
      absl::StrFormat("%.2f ms", w * 1e3),
      absl::StrFormat("no --data_dir %.2f ms", w_m * 1e3), w / w_m);
  Row("3b. the same against reads with no writes",
      absl::StrFormat("%.2f ms", w * 1e3),
      absl::StrFormat("no writes %.2f ms", idle * 1e3), w / idle);
  return 0;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) { return tessera::Main(argc, argv); }
