// tessera_bench: starts a local cluster (the real coordinator and 4 worker
// binaries on 127.0.0.1) and measures the data plane and the control plane,
// each figure next to a reference measured in the same run (raw TCP
// loopback, memcpy, a bare gRPC unary call), printed as a ratio. Run through
// bench/run.sh, which builds everything first.
//
// Flags are plain argv: --quick (smaller sizes, for a smoke run), --only=1,3
// (some figures: 1-4, 7 for the cost of TLS, 8 for UCX, 9 row gathers, 10
// updates, 11 the CLI's get into a file, 14 replicas: replicated puts,
// reads while a worker dies, repair, 21 publishing to mirror hosts),
// --transport=ucx|grpc|auto|shm (the gather of figure 1 through that transport
// alone; default: gRPC, same-host shared memory and UCX each), --reps=N (figure
// 1's gathers per transport, the best kept; default 3), --verbose (each of them
// on stderr).
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/bench.grpc.pb.h"
#include "bench/hosts.h"
#include "bench/loopback.h"
#include "bench/tls_reference.h"
#include "client/connection.h"
#include "client/data_plane.h"
#include "client/safetensors_io.h"
#include "client/tessera_client.h"
#include "coordinator/etcd_testutil.h"
#include "core/auth.h"
#include "core/layout_spec.h"
#include "core/placement.h"
#include "rpc/channel.h"
#include "rpc/server.h"
#include "tests/cluster.h"
#include "transport/shared_memory_arena.h"

namespace tessera {
namespace {

constexpr int kWorkers = 4;

// ---------------------------------------------------------------- reporting

struct Row {
  std::string figure;
  std::string value;
  std::string reference;
  double ratio = 0;
  std::string target;  // e.g. ">= 1.0x"
  bool higher_is_better = true;
  double threshold = 0;     // ratio target; 0: none
  std::optional<bool> met;  // for absolute targets (`target` says which)
};

std::vector<Row>& Rows() {
  static std::vector<Row> rows;
  return rows;
}

void Add(Row row) {
  std::printf("  %-44s %-16s %-22s %6.2fx\n", row.figure.c_str(),
              row.value.c_str(), row.reference.c_str(), row.ratio);
  std::fflush(stdout);
  Rows().push_back(std::move(row));
}

void Info(const std::string& figure, const std::string& value) {
  Row row;
  row.figure = figure;
  row.value = value;
  row.reference = "-";
  Add(row);
}

std::string GBps(double bytes, double seconds) {
  return absl::StrFormat("%.2f GB/s", bytes / seconds / 1e9);
}

void PrintTable() {
  std::printf(
      "\n| figure | value | reference (same run) | ratio | target | met? |\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (const Row& r : Rows()) {
    std::string target = "-", met = "-", ratio = "-";
    if (r.reference != "-") ratio = absl::StrFormat("%.2fx", r.ratio);
    if (r.threshold > 0) {
      target = absl::StrFormat("%s %.2fx",
                               r.higher_is_better ? ">=" : "<=", r.threshold);
      const bool ok =
          r.higher_is_better ? r.ratio >= r.threshold : r.ratio <= r.threshold;
      met = ok ? "yes" : "**no**";
    } else if (r.met.has_value()) {
      target = r.target;
      met = *r.met ? "yes" : "**no**";
    }
    std::printf("| %s | %s | %s | %s | %s | %s |\n", r.figure.c_str(),
                r.value.c_str(), r.reference.c_str(), ratio.c_str(),
                target.c_str(), met.c_str());
  }
}

// ------------------------------------------------------------- references

template <typename T>
T ValueOrDie(absl::StatusOr<T> v, const char* what) {
  if (!v.ok()) {
    std::fprintf(stderr, "%s failed: %s\n", what,
                 v.status().ToString().c_str());
    std::exit(1);
  }
  return std::move(*v);
}

// Raw TCP loopback: `streams` sender/receiver pairs move `total` bytes, each
// receiver reading straight into its part of `dst`. Returns seconds.
// `pair(i)` makes stream i's connected pair (default: on 127.0.0.1).
using PairMaker =
    std::function<absl::StatusOr<std::pair<int, int>>(int stream)>;
double RawTcpSeconds(
    int streams, int64_t total, char* dst,
    const PairMaker& pair = [](int) { return LoopbackPair(); },
    const char* src = nullptr) {
  std::vector<int> senders(streams), receivers(streams);
  for (int i = 0; i < streams; ++i) {
    std::tie(senders[i], receivers[i]) =
        ValueOrDie(pair(i), "a connected TCP pair");
  }
  const int64_t part = total / streams;
  std::vector<char> source(1 << 20, 'x');
  std::vector<std::thread> threads;
  const absl::Time start = absl::Now();
  for (int i = 0; i < streams; ++i) {
    threads.emplace_back([&, i] {
      for (int64_t sent = 0; sent < part;) {
        // From one cache-hot MiB, or (`src`) stream i from its own part of
        // `src`, as a worker sends its shard.
        const char* from =
            src != nullptr ? src + i * part + sent : source.data();
        const ssize_t n = send(
            senders[i], from, std::min<int64_t>(source.size(), part - sent), 0);
        if (n <= 0) return;
        sent += n;
      }
    });
    threads.emplace_back([&, i] {
      char* out = dst + i * part;
      for (int64_t got = 0; got < part;) {
        const ssize_t n = recv(receivers[i], out + got, part - got, 0);
        if (n <= 0) return;
        got += n;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  for (int i = 0; i < streams; ++i) {
    close(senders[i]);
    close(receivers[i]);
  }
  return seconds;
}

double MemcpySeconds(char* dst, const char* src, int64_t bytes) {
  const absl::Time start = absl::Now();
  std::memcpy(dst, src, bytes);
  return absl::ToDoubleSeconds(absl::Now() - start);
}

// The bare unary reference: returns a payload of the size asked for.
class EchoService final : public bench::Echo::Service {
 public:
  grpc::Status Get(grpc::ServerContext*, const bench::EchoRequest* request,
                   bench::EchoReply* reply) override {
    reply->mutable_data()->assign(static_cast<size_t>(request->bytes()), 'e');
    return grpc::Status::OK;
  }
};

struct Latency {
  double p50_us = 0;
  double p99_us = 0;
  double qps = 0;
};

// Runs `call` from `callers` threads for `duration`; call(caller, i).
// Latencies of every call made, and the seconds the callers ran.
struct Samples {
  std::vector<double> us;
  double seconds = 0;
  bool failed = false;
};

// `callers` threads call `call` back to back for `duration`; appends to
// `into`.
void RunCallers(int callers, absl::Duration duration,
                const std::function<bool(int, int64_t)>& call, Samples* into) {
  for (int w = 0; w < 20; ++w) call(0, w);  // warm up channels
  std::vector<std::vector<double>> samples(callers);
  std::atomic<bool> failed{false};
  std::vector<std::thread> threads;
  const absl::Time start = absl::Now();
  const absl::Time end = start + duration;
  for (int c = 0; c < callers; ++c) {
    threads.emplace_back([&, c] {
      for (int64_t i = 0; absl::Now() < end; ++i) {
        const absl::Time t0 = absl::Now();
        if (!call(c, i)) failed = true;
        samples[c].push_back(absl::ToDoubleMicroseconds(absl::Now() - t0));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  into->seconds += absl::ToDoubleSeconds(absl::Now() - start);
  for (auto& s : samples) into->us.insert(into->us.end(), s.begin(), s.end());
  into->failed |= failed.load();
}

Latency Summarize(Samples samples) {
  Latency l;
  if (samples.failed) std::fprintf(stderr, "warning: some calls failed\n");
  std::vector<double>& all = samples.us;
  if (all.empty()) return l;
  std::sort(all.begin(), all.end());
  l.p50_us = all[all.size() / 2];
  l.p99_us = all[std::min(all.size() - 1, all.size() * 99 / 100)];
  l.qps = all.size() / samples.seconds;
  return l;
}

// Many callers: reference and measured runs alternate in short rounds, so
// the slow drift of a shared machine hits both alike.
std::pair<Latency, Latency> MeasureInRounds(
    int callers, absl::Duration duration,
    const std::function<bool(int, int64_t)>& ref,
    const std::function<bool(int, int64_t)>& got) {
  constexpr int kRounds = 6;
  Samples ref_samples, got_samples;
  for (int r = 0; r < kRounds; ++r) {
    const bool ref_first = r % 2 == 0;
    RunCallers(callers, duration / kRounds, ref_first ? ref : got,
               ref_first ? &ref_samples : &got_samples);
    RunCallers(callers, duration / kRounds, ref_first ? got : ref,
               ref_first ? &got_samples : &ref_samples);
  }
  return {Summarize(std::move(ref_samples)), Summarize(std::move(got_samples))};
}

// One caller alternating a reference call and a measured call, so that both
// see the same machine state (drift on a shared VM is larger than the gap
// being measured). QPS is one over the mean latency.
std::pair<Latency, Latency> MeasureAlternating(
    absl::Duration duration, const std::function<bool(int, int64_t)>& ref,
    const std::function<bool(int, int64_t)>& got) {
  for (int w = 0; w < 20; ++w) {
    ref(0, w);
    got(0, w);
  }
  // Each side's seconds are the time spent in its own calls.
  Samples samples[2];
  const absl::Time end = absl::Now() + duration;
  for (int64_t i = 0; absl::Now() < end; ++i) {
    for (int k = 0; k < 2; ++k) {
      const absl::Time t0 = absl::Now();
      if (!(k == 0 ? ref : got)(0, i)) samples[k].failed = true;
      const absl::Duration took = absl::Now() - t0;
      samples[k].us.push_back(absl::ToDoubleMicroseconds(took));
      samples[k].seconds += absl::ToDoubleSeconds(took);
    }
  }
  return {Summarize(std::move(samples[0])), Summarize(std::move(samples[1]))};
}

// ---------------------------------------------------------------- helpers

std::vector<Placement> Ranks(int n) {
  std::vector<Placement> p(n);
  for (int i = 0; i < n; ++i) p[i].rank = i;
  return p;
}

// The coordinator's pid, found by its --listen flag (for its resident memory).
pid_t FindPid(const std::string& needle) {
  DIR* dir = opendir("/proc");
  if (dir == nullptr) return -1;
  pid_t found = -1;
  while (dirent* e = readdir(dir)) {
    const pid_t pid = static_cast<pid_t>(std::atol(e->d_name));
    if (pid <= 0) continue;
    std::ifstream in(absl::StrCat("/proc/", pid, "/cmdline"));
    std::string cmdline((std::istreambuf_iterator<char>(in)),
                        std::istreambuf_iterator<char>());
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    if (cmdline.find("tessera-coordinator") != std::string::npos &&
        cmdline.find(needle) != std::string::npos) {
      found = pid;
      break;
    }
  }
  closedir(dir);
  return found;
}

// What UCX_TLS says UCX may use, for the figures' names.
std::string UcxTlsName() {
  const char* tls = std::getenv("UCX_TLS");
  return tls != nullptr && *tls != '\0' ? absl::StrCat("UCX_TLS=", tls)
                                        : "UCX's own choice";
}

// CPU seconds (user + system) a process has used, from /proc/PID/stat;
// -1 when it cannot be read.
double CpuSeconds(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream fields(stat.substr(close + 2));
  std::string field;
  long long utime = -1, stime = -1;
  // Fields after the name start at 3 (state); utime is 14, stime 15.
  for (int i = 3; i <= 15 && fields >> field; ++i) {
    if (i == 14) utime = std::atoll(field.c_str());
    if (i == 15) stime = std::atoll(field.c_str());
  }
  if (utime < 0 || stime < 0) return -1;
  return static_cast<double>(utime + stime) / sysconf(_SC_CLK_TCK);
}

int64_t ResidentBytes(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0)
      return std::atoll(line.c_str() + 6) * 1024;
  }
  return -1;
}

#define CHECK_OK(expr)                                                       \
  do {                                                                       \
    absl::Status _s = (expr);                                                \
    if (!_s.ok()) {                                                          \
      std::fprintf(stderr, "%s failed: %s\n", #expr, _s.ToString().c_str()); \
      std::exit(1);                                                          \
    }                                                                        \
  } while (0)

struct Env {
  std::unique_ptr<TestCluster> cluster;
  std::unique_ptr<Client> client;
  // One echo server per worker: a reference call goes to the server the
  // same-numbered fetch would, so both pay the same cross-process spread.
  std::vector<std::string> echo_addresses;
  bool quick = false;
  int reps = 3;  // --reps: gathers of figure 1 per transport (best kept)
  bool verbose = false;   // --verbose: every rep's time on stderr
  std::string transport;  // --transport: figure 1 through this one alone
};

// The bytes `stats` counts for `transport`.
int64_t MovedBy(const DataPlaneStats& stats, const std::string& transport) {
  auto it = stats.bytes.find(transport);
  return it == stats.bytes.end() ? 0 : it->second;
}

// ---------------------------------------------------------------- figures

// 1. Gather a chunk-sharded float32 tensor into the client.
void GatherFigure(Env& env) {
  const int64_t rows =
      env.quick ? 16384 : 262144;  // x 1024 float32: 64 MiB / 1 GiB
  const Shape shape = {rows, 1024};
  const int64_t bytes = rows * 1024 * 4;
  ValueOrDie(env.client->Create("gather", shape, DType::kFloat32,
                                LayoutSpec::Chunk(0, Ranks(kWorkers)),
                                InitSpec{InitSpec::Kind::kOnes}),
             "create gather tensor");
  std::unique_ptr<char[]> out(new char[bytes]);
  std::unique_ptr<char[]> src(new char[bytes]);
  std::memset(out.get(), 1, bytes);
  std::memset(src.get(), 2, bytes);
  const int reps = env.reps;
  double tcp = 1e9, grpc_path = 1e9, shm_path = 1e9, copy = 1e9;
  for (int r = 0; r < reps; ++r)
    tcp = std::min(tcp, RawTcpSeconds(kWorkers, bytes, out.get()));
  for (int r = 0; r < reps; ++r)
    copy = std::min(copy, MemcpySeconds(out.get(), src.get(), bytes));
  double ucx_path = 1e9, auto_path = 1e9, tcp_path = 1e9;
  // "shm" is the automatic chain as it was before UCX: shared memory on
  // this host, gRPC for the rest.
  std::vector<std::string> modes = {"grpc", "shm", "ucx", "tcp"};
  if (!env.transport.empty()) modes = {env.transport};
  for (const std::string& mode : modes) {
    ClientOptions options;
    options.transport = mode == "shm" ? "auto" : mode;
    if (mode == "shm") options.shared_memory = true;
    auto client =
        ValueOrDie(Client::Connect(env.cluster->coordinator_address(), options),
                   "connect");
    double& best = mode == "grpc"  ? grpc_path
                   : mode == "shm" ? shm_path
                   : mode == "ucx" ? ucx_path
                   : mode == "tcp" ? tcp_path
                                   : auto_path;
    for (int r = 0; r < reps; ++r) {
      std::memset(out.get(), 0, 4096);
      const absl::Time start = absl::Now();
      CHECK_OK(client->GetInto("gather", std::nullopt, out.get(), bytes));
      const double s = absl::ToDoubleSeconds(absl::Now() - start);
      float first, last;
      std::memcpy(&first, out.get(), 4);
      std::memcpy(&last, out.get() + bytes - 4, 4);
      if (first != 1.0f || last != 1.0f) {
        std::fprintf(stderr, "gather returned wrong values\n");
        std::exit(1);
      }
      best = std::min(best, s);
      if (env.verbose) {
        std::fprintf(stderr, "figure 1 %s rep %d: %.3f s (%.2f GB/s)\n",
                     mode.c_str(), r, s, bytes / s / 1e9);
      }
    }
    if (mode == "ucx" && MovedBy(client->TransferStats(), "ucx") < bytes) {
      std::fprintf(
          stderr,
          "warning: the UCX gather moved %lld of %lld bytes "
          "over UCX\n",
          static_cast<long long>(MovedBy(client->TransferStats(), "ucx")),
          static_cast<long long>(bytes));
    }
  }
  const std::string size = env.quick ? "64 MiB" : "1 GiB";
  if (grpc_path < 1e9) {
    Add({absl::StrCat("1. gather ", size, ", 4 workers, gRPC"),
         GBps(bytes, grpc_path), absl::StrCat("TCP x4 ", GBps(bytes, tcp)),
         tcp / grpc_path, "", true, 1.0});
  }
  if (shm_path < 1e9) {
    Add({absl::StrCat("1. gather ", size, ", 4 workers, same-host shm"),
         GBps(bytes, shm_path), absl::StrCat("memcpy x1 ", GBps(bytes, copy)),
         copy / shm_path, "", true, 0.7});
  }
  if (ucx_path < 1e9) {
    Add({absl::StrCat("1. gather ", size, ", 4 workers, UCX (", UcxTlsName(),
                      ")"),
         GBps(bytes, ucx_path), absl::StrCat("TCP x4 ", GBps(bytes, tcp)),
         tcp / ucx_path, "", true, 1.0});
  }
  if (tcp_path < 1e9) {
    Add({absl::StrCat("1. gather ", size, ", 4 workers, TCP data ports"),
         GBps(bytes, tcp_path), absl::StrCat("TCP x4 ", GBps(bytes, tcp)),
         tcp / tcp_path, ">= 0.9x", true, 0.9});
    // The reference above sends one cache-hot MiB again and again; the
    // workers send a quarter of the tensor each, from memory. The same
    // streams sending from as much memory (src, touched) tell the wire's
    // share from the memory's.
    double tcp_from_memory = 1e9;
    for (int r = 0; r < reps; ++r) {
      tcp_from_memory = std::min(
          tcp_from_memory, RawTcpSeconds(
                               kWorkers, bytes, out.get(),
                               [](int) { return LoopbackPair(); }, src.get()));
    }
    Add({absl::StrCat("1. gather ", size,
                      ", 4 workers, TCP data ports vs TCP from memory"),
         GBps(bytes, tcp_path),
         absl::StrCat("TCP x4 from ", size, " ", GBps(bytes, tcp_from_memory)),
         tcp_from_memory / tcp_path, "", true, 0});
  }
  if (auto_path < 1e9) {
    Add({absl::StrCat("1. gather ", size, ", 4 workers, auto"),
         GBps(bytes, auto_path), absl::StrCat("TCP x4 ", GBps(bytes, tcp)),
         tcp / auto_path, "", true, 0});
  }
  CHECK_OK(env.client->Delete("gather"));
}

// 2. Small region fetches: row ranges of 4 KiB and 64 KiB.
void SmallFetchFigure(Env& env) {
  const int64_t rows = 16384;  // x 1024 float32 = 64 MiB, 4096 rows per worker
  ValueOrDie(env.client->Create("small", {rows, 1024}, DType::kFloat32,
                                LayoutSpec::Chunk(0, Ranks(kWorkers)),
                                InitSpec{InitSpec::Kind::kArange}),
             "create small tensor");
  const TensorMetadata meta =
      ValueOrDie(env.client->Describe("small"), "describe small");
  std::vector<std::unique_ptr<bench::Echo::Stub>> echoes;
  for (const std::string& address : env.echo_addresses)
    echoes.push_back(bench::Echo::NewStub(MakeChannel(address)));
  const absl::Duration duration = absl::Milliseconds(env.quick ? 500 : 1500);
  for (int64_t fetch_rows : {1, 16}) {
    // Rows aligned to the fetch size never straddle two shards.
    auto start_row = [&](int c, int64_t i) {
      return ((c * 7919 + i * 104729) % (rows / fetch_rows)) * fetch_rows;
    };
    const int64_t payload = fetch_rows * 1024 * 4;
    for (const std::string mode : {"grpc", "tcp", "auto"}) {
      const bool shm = mode == "auto";
      ClientOptions options;
      // gRPC alone, the workers' TCP data ports alone, or the automatic
      // chain (shared memory for large reads, UCX or TCP for these small
      // ones).
      options.transport = mode;
      options.shared_memory = shm;
      std::shared_ptr<Connection> shared = ValueOrDie(
          Connection::Make(env.cluster->coordinator_address(), options),
          "connect");
      Connection& connection = *shared;
      for (int callers : {1, 16}) {
        std::vector<std::vector<char>> outs(callers,
                                            std::vector<char>(payload));
        auto ref_call = [&](int c, int64_t i) {
          grpc::ClientContext context;
          bench::EchoRequest request;
          request.set_bytes(payload);
          bench::EchoReply reply;
          const int64_t server = start_row(c, i) * kWorkers / rows;
          return echoes[server]->Get(&context, request, &reply).ok();
        };
        auto fetch_call = [&](int c, int64_t i) {
          Box box{{start_row(c, i), 0}, {fetch_rows, 1024}};
          return GatherRegion(connection, meta, box, outs[c].data()).ok();
        };
        Latency ref, got;
        if (callers == 1) {
          std::tie(ref, got) =
              MeasureAlternating(duration, ref_call, fetch_call);
        } else {
          std::tie(ref, got) =
              MeasureInRounds(callers, duration, ref_call, fetch_call);
        }
        const std::string what =
            absl::StrCat("2. fetch ", payload / 1024, " KiB, ", callers,
                         callers == 1 ? " caller" : " callers",
                         shm             ? ", auto"
                         : mode == "tcp" ? ", TCP"
                                         : ", gRPC");
        if (callers == 1) {
          Add({what + " p50", absl::StrFormat("%.0f us", got.p50_us),
               absl::StrFormat("unary %.0f us", ref.p50_us),
               got.p50_us / ref.p50_us, "", false, mode == "tcp" ? 1.0 : 1.3});
          Add({what + " p99", absl::StrFormat("%.0f us", got.p99_us),
               absl::StrFormat("unary %.0f us", ref.p99_us),
               got.p99_us / ref.p99_us, "", false, 0});
        } else {
          Add({what + " p50", absl::StrFormat("%.0f us", got.p50_us),
               absl::StrFormat("unary %.0f us", ref.p50_us),
               got.p50_us / ref.p50_us, "", false, 0});
        }
        Add({what + " QPS", absl::StrFormat("%.0f/s", got.qps),
             absl::StrFormat("unary %.0f/s", ref.qps), got.qps / ref.qps, "",
             true, callers == 16 ? (mode == "tcp" ? 1.0 : 0.9) : 0});
      }
    }
  }
  // Through the SDK's Get, which asks the coordinator for metadata each call.
  {
    std::vector<char> out(4096);
    const auto [ref, got] = MeasureAlternating(
        duration,
        [&](int, int64_t i) {
          grpc::ClientContext context;
          bench::EchoRequest request;
          request.set_bytes(4096);
          bench::EchoReply reply;
          const int64_t server = (i * 104729) % rows * kWorkers / rows;
          return echoes[server]->Get(&context, request, &reply).ok();
        },
        [&](int, int64_t i) {
          Box box{{(i * 104729) % rows, 0}, {1, 1024}};
          return env.client->GetInto("small", box, out.data(), out.size()).ok();
        });
    Add({"2. Client::GetInto 4 KiB (describe + fetch) p50",
         absl::StrFormat("%.0f us", got.p50_us),
         absl::StrFormat("unary %.0f us", ref.p50_us), got.p50_us / ref.p50_us,
         "", false, 0});
  }
  CHECK_OK(env.client->Delete("small"));
}

// Reshards `name` (rows x 1024 float32, chunked over rows) rows -> cols,
// then back and forth `rounds` more times, 0.5 s apart. The first reshard
// provisions new memory on every worker; the later ones find the pages of the
// shards the one before freed (workers reuse them: shared_memory_arena.h), as a
// trainer's repeated reshards would.
struct ReshardRounds {
  double first = 0;         // seconds
  double steady = 0;        // median seconds of the later reshards
  int64_t bytes_moved = 0;  // per reshard (the same each way)
};
ReshardRounds TimeReshards(Client& client, const std::string& name,
                           int rounds) {
  ReshardRounds out;
  std::vector<double> later;
  for (int r = 0; r <= rounds; ++r) {
    const int dim = r % 2 == 0 ? 1 : 0;
    const absl::Time start = absl::Now();
    const ReshardStats stats = ValueOrDie(
        client.Reshard(name, LayoutSpec::Chunk(dim, Ranks(kWorkers))),
        "reshard");
    const double wall = absl::ToDoubleSeconds(absl::Now() - start);
    // The coordinator's retire loop frees the replaced version within 0.1 s
    // (handles taken before the reshard keep reading it until then); a
    // trainer's reshards are a step apart, not back to back.
    absl::SleepFor(absl::Milliseconds(500));
    if (r == 0) {
      out.first = wall;
      out.bytes_moved = stats.bytes_moved;
    } else {
      later.push_back(wall);
    }
  }
  std::sort(later.begin(), later.end());
  out.steady = later.empty() ? out.first : later[later.size() / 2];
  return out;
}

// Creates `name` (1 GiB, or 64 MiB when quick: rows x 1024 float32 chunked
// over the rows of every worker), times its reshards (TimeReshards, 4 after
// the first) and deletes it.
ReshardRounds TimeNewTensorReshards(Client& client, const std::string& name,
                                    bool quick) {
  const int64_t rows = quick ? 16384 : 262144;
  ValueOrDie(client.Create(name, {rows, 1024}, DType::kFloat32,
                           LayoutSpec::Chunk(0, Ranks(kWorkers)),
                           InitSpec{InitSpec::Kind::kOnes}),
             ("create " + name).c_str());
  const ReshardRounds moved = TimeReshards(client, name, 4);
  CHECK_OK(client.Delete(name));
  return moved;
}

// Raw TCP with 4 streams moving `bytes` into memory already touched: the
// reference of figures 3 and 8 (best of 3).
double TcpReference(
    int64_t bytes, const PairMaker& pair = [](int) { return LoopbackPair(); }) {
  std::unique_ptr<char[]> out(new char[bytes]);
  std::memset(out.get(), 1, bytes);
  double tcp = 1e9;
  for (int r = 0; r < 3; ++r)
    tcp = std::min(tcp, RawTcpSeconds(kWorkers, bytes, out.get(), pair));
  return tcp;
}

// The floor of bytes landing in new memory: `bytes` of a fresh anonymous
// mapping written once, one slice per core (mmap, first touch, munmap). On
// a VM whose balloon reports freed pages to the host (free page reporting),
// a first touch also takes a fault on the host, so this varies from run to
// run far more than any copy: the best and the worst of the tries are
// kept. The reference of the "first" rows of figures 3 and 11.
struct NewMemory {
  double best = 1e9;
  double worst = 0;
  std::string Text(int64_t bytes) const {
    return absl::StrFormat("new memory %.3f s (%s; worst of 3 %.3f s)", best,
                           GBps(bytes, best), worst);
  }
};
void NewMemoryOnce(int64_t bytes, NewMemory* out) {
  const int64_t page = sysconf(_SC_PAGESIZE);
  const int64_t cores = std::max<long>(1, sysconf(_SC_NPROCESSORS_ONLN));
  const int64_t slice = (bytes / cores + page - 1) / page * page;
  const absl::Time start = absl::Now();
  void* mapped =
      mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE,
           MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapped == MAP_FAILED) {
    std::fprintf(stderr, "mmap of %lld bytes failed\n",
                 static_cast<long long>(bytes));
    std::exit(1);
  }
  char* data = static_cast<char*>(mapped);
  std::vector<std::thread> threads;
  for (int64_t begin = 0; begin < bytes; begin += slice) {
    const size_t n = static_cast<size_t>(std::min(slice, bytes - begin));
    threads.emplace_back([data, begin, n] { std::memset(data + begin, 1, n); });
  }
  for (std::thread& t : threads) t.join();
  munmap(mapped, static_cast<size_t>(bytes));
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  out->best = std::min(out->best, seconds);
  out->worst = std::max(out->worst, seconds);
}
NewMemory NewMemoryReference(int64_t bytes) {
  NewMemory out;
  for (int r = 0; r < 3; ++r) NewMemoryOnce(bytes, &out);
  return out;
}

// Long enough for a balloon's free page reporting (2 s after pages are
// freed) to hand what the last step freed back to the host: each step of
// figure 11 then meets memory as a process started after a pause does,
// instead of the pages the step before it just freed.
void IdleForPageReporting() { absl::SleepFor(absl::Seconds(4)); }

// Rows of figures 3, 8 and 20: the first reshard, and the later ones against
// `target` (0: none), the wire reference named `wire`.
void AddReshardRows(const std::string& figure, const std::string& what,
                    const ReshardRounds& got, double tcp, double target,
                    const std::string& wire = "TCP x4") {
  Add({absl::StrCat(figure, " reshard ", what, ", first (new memory)"),
       absl::StrFormat("%.3f s", got.first), "-", 0, "", true, 0});
  Add({absl::StrCat(figure, " reshard GB/s of moved bytes, first"),
       GBps(got.bytes_moved, got.first),
       absl::StrCat(wire, " ", GBps(got.bytes_moved, tcp)), tcp / got.first, "",
       true, 0});
  Add({absl::StrCat(figure, " reshard ", what, ", again (median)"),
       absl::StrFormat("%.3f s", got.steady), "-", 0, "", true, 0});
  Add({absl::StrCat(figure, " reshard GB/s of moved bytes, again"),
       GBps(got.bytes_moved, got.steady),
       absl::StrCat(wire, " ", GBps(got.bytes_moved, tcp)), tcp / got.steady,
       "", true, target});
}

// 3. Reshard rows -> columns.
void ReshardFigure(Env& env) {
  const int64_t rows = env.quick ? 16384 : 262144;
  ValueOrDie(env.client->Create("reshard", {rows, 1024}, DType::kFloat32,
                                LayoutSpec::Chunk(0, Ranks(kWorkers)),
                                InitSpec{InitSpec::Kind::kOnes}),
             "create reshard tensor");
  const ReshardRounds got = TimeReshards(*env.client, "reshard", 4);
  const double tcp = TcpReference(got.bytes_moved);
  const std::string size = env.quick ? "64 MiB" : "1 GiB";
  Info("3. reshard bytes moved between workers", absl::StrCat(got.bytes_moved));
  AddReshardRows("3.", absl::StrCat(size, " rows<->cols, 4 workers"), got, tcp,
                 0.8);
  CHECK_OK(env.client->Delete("reshard"));
  // The first reshard writes a whole new copy of the tensor: its floor is
  // touching that much new memory, which the wire reference skips.
  const int64_t tensor_bytes = rows * 1024 * 4;
  const NewMemory fresh = NewMemoryReference(tensor_bytes);
  Add({"3. reshard, first, against touching as much new memory",
       absl::StrFormat("%.3f s", got.first), fresh.Text(tensor_bytes),
       fresh.best / got.first, "", true, 0});

  // The first reshard again, of a tensor of a size no freed shard matches,
  // this time 3 s after its create: what a user's first reshard of freshly
  // loaded weights meets once the workers idled a moment (their warm blocks,
  // --shard_warm_bytes, made with the spare CPU). Above, the reshard comes
  // at once and faults its pages in.
  const int64_t warm_rows = rows + rows / 64;
  ValueOrDie(
      env.client->Create("reshard_warm", {warm_rows, 1024}, DType::kFloat32,
                         LayoutSpec::Chunk(0, Ranks(kWorkers)),
                         InitSpec{InitSpec::Kind::kOnes}),
      "create reshard_warm tensor");
  absl::SleepFor(absl::Seconds(3));
  const ReshardRounds warm = TimeReshards(*env.client, "reshard_warm", 0);
  Add({absl::StrCat("3. reshard ", size,
                    " rows<->cols, first, 3 s after the create (warm blocks)"),
       absl::StrFormat("%.3f s", warm.first), "-", 0, "", true, 0});
  Add({"3. reshard GB/s of moved bytes, first after 3 s",
       GBps(warm.bytes_moved, warm.first),
       absl::StrCat("TCP x4 ", GBps(got.bytes_moved, tcp)),
       tcp * warm.bytes_moved / got.bytes_moved / warm.first, "", true, 0.8});
  Add({"3. reshard, first after 3 s, against touching as much new memory",
       absl::StrFormat("%.3f s", warm.first), fresh.Text(tensor_bytes),
       fresh.best * warm_rows / rows / warm.first, "", true, 0});
  CHECK_OK(env.client->Delete("reshard_warm"));
}

// 4. Control plane: 100k-shard enumerable tensor, describe, memory, GetTensor
// QPS.
void ControlFigure(Env& env) {
  const int64_t shards = env.quick ? 10000 : 100000;
  std::vector<Box> boxes;
  std::vector<Placement> placements;
  boxes.reserve(shards);
  for (int64_t i = 0; i < shards; ++i) {
    boxes.push_back(Box{{i, 0}, {1, 8}});
    Placement p;
    p.rank = static_cast<int32_t>(i % kWorkers);
    placements.push_back(p);
  }
  const LayoutSpec spec = LayoutSpec::Enumerable(boxes, placements);
  const pid_t coordinator =
      FindPid(absl::StrCat("--listen=", env.cluster->coordinator_address()));
  const int64_t rss_before = ResidentBytes(coordinator);
  absl::Time start = absl::Now();
  ValueOrDie(LayoutBoxes({shards, 8}, spec), "validate layout");
  const double validate = absl::ToDoubleSeconds(absl::Now() - start);
  start = absl::Now();
  ValueOrDie(env.client->Create("many", {shards, 8}, DType::kFloat32, spec),
             "create 100k");
  const double create = absl::ToDoubleSeconds(absl::Now() - start);
  start = absl::Now();
  const TensorMetadata many =
      ValueOrDie(env.client->Describe("many"), "describe 100k");
  const double describe = absl::ToDoubleSeconds(absl::Now() - start);
  // What the coordinator keeps, not the reply buffers in flight: it hands
  // those back within 0.2 s of a reply for this many shards.
  absl::SleepFor(absl::Milliseconds(500));
  const int64_t rss_after = ResidentBytes(coordinator);
  const std::string n = env.quick ? "10k" : "100k";
  Row create_row{absl::StrCat("4. create+validate ", n, " shards (cluster)"),
                 absl::StrFormat("%.3f s", create),
                 "-",
                 0,
                 "<= 0.2 s",
                 true,
                 0,
                 create <= 0.2};
  Add(create_row);
  Info(absl::StrCat("4. validate ", n, " shards in core/ only"),
       absl::StrFormat("%.3f s", validate));
  Info(absl::StrCat("4. describe ", n, " shards"),
       absl::StrFormat("%.3f s (%zu shards)", describe, many.shards.size()));
  const double per_shard = static_cast<double>(rss_after - rss_before) / shards;
  Row mem_row{"4. coordinator RSS per shard",
              absl::StrFormat("%.0f B", per_shard),
              "-",
              0,
              "<= 300 B",
              true,
              0,
              per_shard <= 300};
  Add(mem_row);
  CHECK_OK(env.client->Delete("many"));

  ValueOrDie(env.client->Create("tiny", {16, 16}, DType::kFloat32,
                                LayoutSpec::Chunk(0, Ranks(kWorkers))),
             "create tiny");
  auto echo = bench::Echo::NewStub(MakeChannel(env.echo_addresses.front()));
  const absl::Duration duration = absl::Milliseconds(env.quick ? 500 : 1500);
  for (int callers : {1, 16}) {
    const auto [ref, got] = MeasureInRounds(
        callers, duration,
        [&](int, int64_t) {
          grpc::ClientContext context;
          bench::EchoRequest request;
          request.set_bytes(0);
          bench::EchoReply reply;
          return echo->Get(&context, request, &reply).ok();
        },
        [&](int, int64_t) { return env.client->Describe("tiny").ok(); });
    Add({absl::StrCat("4. GetTensor (describe) small, ", callers,
                      " caller(s) QPS"),
         absl::StrFormat("%.0f/s", got.qps),
         absl::StrFormat("unary %.0f/s", ref.qps), got.qps / ref.qps, "", true,
         0});
  }
  CHECK_OK(env.client->Delete("tiny"));
}

// 8. UCX: a 4 KiB fetch through UCX alone against a bare gRPC unary call,
// a reshard whose workers pull over UCX alone (a second cluster run with
// --peer_transport=ucx), and what an idle worker of that cluster costs
// after serving it (CPU over 10 s, from /proc).
void UcxFigure(Env& env) {
  const int64_t rows = 16384;  // x 1024 float32: 64 MiB, 4096 rows a worker
  ValueOrDie(env.client->Create("ucx_small", {rows, 1024}, DType::kFloat32,
                                LayoutSpec::Chunk(0, Ranks(kWorkers)),
                                InitSpec{InitSpec::Kind::kArange}),
             "create ucx_small");
  const TensorMetadata meta =
      ValueOrDie(env.client->Describe("ucx_small"), "describe ucx_small");
  std::vector<std::unique_ptr<bench::Echo::Stub>> echoes;
  for (const std::string& address : env.echo_addresses)
    echoes.push_back(bench::Echo::NewStub(MakeChannel(address)));
  ClientOptions options;
  options.transport = "ucx";
  std::shared_ptr<Connection> connection = ValueOrDie(
      Connection::Make(env.cluster->coordinator_address(), options), "connect");
  std::vector<char> out(4096);
  auto row = [&](int64_t i) { return (i * 104729) % rows; };
  const auto [ref, got] = MeasureAlternating(
      absl::Milliseconds(env.quick ? 500 : 3000),
      [&](int, int64_t i) {
        grpc::ClientContext context;
        bench::EchoRequest request;
        request.set_bytes(4096);
        bench::EchoReply reply;
        return echoes[row(i) * kWorkers / rows]
            ->Get(&context, request, &reply)
            .ok();
      },
      [&](int, int64_t i) {
        return GatherRegion(*connection, meta, Box{{row(i), 0}, {1, 1024}},
                            out.data())
            .ok();
      });
  const DataPlaneStats fetched = connection->data_plane().Stats();
  if (MovedBy(fetched, "ucx") == 0) {
    std::fprintf(stderr, "warning: no fetch went over UCX\n");
  }
  const std::string tls = UcxTlsName();
  Add({absl::StrCat("8. fetch 4 KiB, 1 caller, UCX (", tls, ") p50"),
       absl::StrFormat("%.0f us", got.p50_us),
       absl::StrFormat("unary %.0f us", ref.p50_us), got.p50_us / ref.p50_us,
       "", false, 1.0});
  Add({absl::StrCat("8. fetch 4 KiB, 1 caller, UCX (", tls, ") p99"),
       absl::StrFormat("%.0f us", got.p99_us),
       absl::StrFormat("unary %.0f us", ref.p99_us), got.p99_us / ref.p99_us,
       "", false, 0});
  CHECK_OK(env.client->Delete("ucx_small"));

  // Reshard on a cluster whose workers pull from each other over UCX only.
  TestClusterOptions cluster_options;
  cluster_options.num_workers = kWorkers;
  cluster_options.worker_flags = {"--peer_transport=ucx"};
  std::unique_ptr<TestCluster> cluster =
      ValueOrDie(TestCluster::Start(cluster_options), "start the UCX cluster");
  std::unique_ptr<Client> client = ValueOrDie(
      Client::Connect(cluster->coordinator_address()), "connect (UCX cluster)");
  const ReshardRounds moved =
      TimeNewTensorReshards(*client, "reshard_ucx", env.quick);
  const double tcp = TcpReference(moved.bytes_moved);
  const std::string size = env.quick ? "64 MiB" : "1 GiB";
  AddReshardRows("8.",
                 absl::StrCat(size, " rows<->cols, pulls over UCX (", tls, ")"),
                 moved, tcp, /*target=*/0);  // figure 20's counts

  // An idle worker that has served UCX: its progress thread must sleep.
  // After a burst of moves a worker has work of its own to finish, once:
  // its warmer (nice 19) makes the blocks the reshards' sizes will want (a
  // second or more of touching new pages on this VM), and blocks parked
  // for reuse are released 30 s after they were freed. Idle is measured
  // after both: once the parked blocks are gone, at most 30 s more for
  // every worker to use under 2 % of a core over 2 s (a thread that spins
  // never does, and shows in the row).
  const absl::Time settle_start = absl::Now();
  absl::SleepFor(SharedMemoryArenaOptions().reuse_for + absl::Seconds(1));
  for (bool settled = false;
       !settled && absl::Now() - settle_start < absl::Seconds(61);) {
    std::vector<double> at(kWorkers);
    for (int i = 0; i < kWorkers; ++i)
      at[i] = CpuSeconds(cluster->worker_pid(i));
    absl::SleepFor(absl::Seconds(2));
    settled = true;
    for (int i = 0; i < kWorkers; ++i) {
      if (CpuSeconds(cluster->worker_pid(i)) - at[i] >= 0.04) settled = false;
    }
  }
  Info(
      "8. idle worker CPU: settled after the reshards (warm blocks made, "
      "parked ones released)",
      absl::StrFormat("%.1f s",
                      absl::ToDoubleSeconds(absl::Now() - settle_start)));
  std::vector<double> before(kWorkers);
  for (int i = 0; i < kWorkers; ++i)
    before[i] = CpuSeconds(cluster->worker_pid(i));
  const absl::Time idle_start = absl::Now();
  absl::SleepFor(absl::Seconds(10));
  const double idle_wall = absl::ToDoubleSeconds(absl::Now() - idle_start);
  double worst = 0;
  for (int i = 0; i < kWorkers; ++i) {
    const double used = CpuSeconds(cluster->worker_pid(i)) - before[i];
    worst = std::max(worst, used / idle_wall * 100);
  }
  Row idle{"8. idle worker CPU over 10 s (busiest of 4, UCX on)",
           absl::StrFormat("%.2f %% of a core", worst),
           "-",
           0,
           "< 1 %",
           true,
           0,
           worst < 1.0};
  Add(idle);
}

// Kills worker `victim` of `cluster` and waits until every shard of
// `tensor` has its R again; returns the kill, when it was seen dead, when R
// was restored, the victim's bytes (exactly what the repair must copy),
// and the repair's own log line.
struct Repaired {
  absl::Time killed, dead = absl::InfiniteFuture(),
                     restored = absl::InfiniteFuture();
  int64_t victim_bytes = 0;
  std::string line;
  // The repair's own time, from its log line ("repaired 'T' version 1: N
  // new replica(s), B bytes copied, K shard(s) still short, S s (plan ...,
  // allocate ..., move ..., record ...)"): without the wait for the lease
  // or the repair pass. From dead to restored when the line says none.
  double CopySeconds(long long* bytes) const {
    double seconds = 0;
    const size_t at = line.find("replica(s), ");
    const size_t end = line.find("still short, ");
    if (at != std::string::npos && end != std::string::npos &&
        std::sscanf(line.c_str() + at, "replica(s), %lld", bytes) == 1 &&
        std::sscanf(line.c_str() + end, "still short, %lf", &seconds) == 1 &&
        seconds > 0) {
      return seconds;
    }
    return absl::ToDoubleSeconds(restored - dead);
  }
};
Repaired KillAndRepair(TestCluster& cluster, Client& client,
                       const std::string& tensor, int victim) {
  Repaired out;
  const std::string name = absl::StrCat("w", victim);
  for (const WorkerInfo& w : ValueOrDie(client.Workers(), "workers")) {
    if (w.name == name) out.victim_bytes = w.bytes_used;
  }
  const size_t log_before = cluster.coordinator_log().size();
  out.killed = absl::Now();
  cluster.StopWorker(victim, SIGKILL);
  while (absl::Now() - out.killed < absl::Seconds(120)) {
    if (out.dead == absl::InfiniteFuture()) {
      for (const WorkerInfo& w : ValueOrDie(client.Workers(), "workers")) {
        if (w.name == name && !w.alive) out.dead = absl::Now();
      }
    }
    const TensorMetadata meta = ValueOrDie(client.Describe(tensor), "describe");
    bool full = true;
    for (const ShardInfo& shard : meta.shards) {
      for (const Replica& r : shard.replicas)
        full = full && r.available && r.worker != name;
    }
    if (full) {
      out.restored = absl::Now();
      break;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  const std::string log = cluster.coordinator_log().substr(log_before);
  const size_t at = log.rfind(absl::StrCat("repaired '", tensor, "'"));
  if (at != std::string::npos)
    out.line = log.substr(at, log.find('\n', at) - at);
  return out;
}

// Figure 20 over the data ports: the reshard and the repairs of
// CrossHostFigure on `hosts`, each worker pulling over tcp. `huge_pages`:
// each host's /dev/shm a tmpfs of its own on transparent huge pages
// (huge=within_size, as README's host tuning), so that what shard memory
// costs on 4 KiB pages (on a VM, touching pages idle for seconds, or new
// ones) is out of the way of the transport. `tcp_per_byte`: the seconds per
// byte of 4 raw TCP streams between the hosts.
void TcpBetweenHosts(Env& env, const NetnsHosts& hosts,
                     TestClusterOptions options, double tcp_per_byte,
                     bool huge_pages) {
  const std::string on = huge_pages ? ", huge pages" : "";
  options.coordinator_flags = {"--insecure", "--lease_ms=2000",
                               "--heartbeat_ms=200", "--retire_grace_ms=200"};
  options.worker_prefix = [&hosts, huge_pages](int i) {
    std::vector<std::string> argv = hosts.Exec(i);
    if (huge_pages) {
      // `ip netns exec` gives the command a mount namespace of its own:
      // the tmpfs is this worker's alone and goes with it.
      for (const char* arg :
           {"/bin/sh", "-c",
            "mount -t tmpfs -o huge=within_size,size=50% tmpfs /dev/shm && "
            "exec \"$@\"",
            "sh"}) {
        argv.push_back(arg);
      }
    }
    return argv;
  };
  options.worker_flags = {"--insecure", "--peer_transport=tcp"};
  absl::StatusOr<std::unique_ptr<TestCluster>> started =
      TestCluster::Start(options);
  if (!started.ok() && huge_pages) {
    // A kernel whose tmpfs takes no huge= option: the rows above stand.
    Info("20. tcp between hosts, huge pages",
         absl::StrCat("not run: ", started.status().message()));
    return;
  }
  std::unique_ptr<TestCluster> cluster =
      ValueOrDie(std::move(started), "start the cross-host cluster (tcp)");
  std::unique_ptr<Client> client =
      ValueOrDie(Client::Connect(cluster->coordinator_address()),
                 "connect (cross-host cluster, tcp)");
  const std::string size = env.quick ? "64 MiB" : "1 GiB";
  const ReshardRounds over_tcp =
      TimeNewTensorReshards(*client, "reshard_hosts_tcp", env.quick);
  AddReshardRows(
      "20.",
      absl::StrCat(size, " rows<->cols between hosts, pulls over tcp", on),
      over_tcp, tcp_per_byte * over_tcp.bytes_moved, 0.8,
      "TCP x4 between hosts");
  {
    // The reference sends one cache-hot MiB again and again; the workers
    // send their pieces from shard memory. The same streams between the
    // same hosts, each sending its own part of as much touched memory,
    // tell the wire's share from the memory's (as figure 1 does).
    const int64_t moved_bytes = over_tcp.bytes_moved;
    std::unique_ptr<char[]> src(new char[moved_bytes]);
    std::unique_ptr<char[]> dst(new char[moved_bytes]);
    std::memset(src.get(), 1, moved_bytes);
    std::memset(dst.get(), 1, moved_bytes);
    // The best of 3 runs of `streams` raw TCP streams, stream i from host
    // from(i) to host to(i), each sending its own part of `src`.
    auto best_of_3 = [&](int streams, auto from, auto to) {
      double best = 1e9;
      for (int r = 0; r < 3; ++r) {
        best = std::min(best, RawTcpSeconds(
                                  streams, moved_bytes, dst.get(),
                                  [&](int i) {
                                    return TcpPair(hosts.ip(to(i)),
                                                   hosts.path(to(i)),
                                                   hosts.path(from(i)));
                                  },
                                  src.get()));
      }
      return best;
    };
    const double from_memory = best_of_3(
        kWorkers, [](int i) { return i; },
        [&hosts](int i) { return (i + 1) % hosts.count(); });
    Add({absl::StrCat("20. reshard GB/s of moved bytes over tcp", on,
                      ", again, vs TCP from memory"),
         GBps(moved_bytes, over_tcp.steady),
         absl::StrCat("TCP x4 between hosts from memory ",
                      GBps(moved_bytes, from_memory)),
         from_memory / over_tcp.steady, "", true, 0});
    // A reshard's pulls are all to all: every host sends to the 3 others
    // and receives from them at once (12 streams), not one stream each.
    // The same pattern in raw TCP, each stream its own part of as much
    // touched memory, tells the wire's share from the pattern's.
    const int streams = kWorkers * (kWorkers - 1);
    const double all_to_all = best_of_3(
        streams, [](int i) { return i / (kWorkers - 1); },
        [](int i) {
          return (i / (kWorkers - 1) + 1 + i % (kWorkers - 1)) % kWorkers;
        });
    Add({absl::StrCat("20. reshard GB/s of moved bytes over tcp", on,
                      ", again, vs TCP all to all from memory"),
         GBps(moved_bytes, over_tcp.steady),
         absl::StrCat("TCP x", streams,
                      " between hosts, all to all, from memory ",
                      GBps(moved_bytes, all_to_all)),
         all_to_all / over_tcp.steady, "", true, 0});
  }
  {
    // Where the last round's time went (plan, allocate, move).
    const std::string log = cluster->coordinator_log();
    const size_t at = log.rfind("resharded 'reshard_hosts_tcp'");
    if (at != std::string::npos) {
      Info(absl::StrCat("20. the last tcp reshard's log line", on),
           log.substr(at, log.find('\n', at) - at));
    }
  }
  const int64_t rows = env.quick ? 16384 : 131072;  // 64 or 512 MiB, R=2
  LayoutSpec spec = LayoutSpec::Chunk(0, Ranks(kWorkers));
  spec.replicas = 2;
  ValueOrDie(client->Create("repair_hosts", {rows, 1024}, DType::kFloat32, spec,
                            InitSpec{InitSpec::Kind::kOnes}),
             "create the replicated tensor");
  const Repaired repaired =
      KillAndRepair(*cluster, *client, "repair_hosts", kWorkers - 1);
  long long copied = 0;
  const double copy = repaired.CopySeconds(&copied);
  const double lost = static_cast<double>(repaired.victim_bytes);
  const double wire = TcpReference(repaired.victim_bytes, [&hosts](int i) {
    const int to = (i + 1) % hosts.count();
    return TcpPair(hosts.ip(to), hosts.path(to), hosts.path(i));
  });
  Add({absl::StrFormat("20. repair of a dead worker's %.0f MiB between "
                       "hosts, over tcp%s, at once (new memory)",
                       lost / (1 << 20), on),
       GBps(lost, copy),
       absl::StrCat("TCP x4 between hosts ", GBps(lost, wire)), wire / copy, "",
       true, 0});
  // New replicas land in memory the workers never touched: on a VM whose
  // balloon takes freed pages back, touching that much is itself a floor.
  const NewMemory fresh = NewMemoryReference(repaired.victim_bytes);
  Add({absl::StrCat("20. repair at once", on,
                    ", against touching as much new memory"),
       absl::StrFormat("%.3f s", copy), fresh.Text(repaired.victim_bytes),
       fresh.best / copy, "", true, 0});
  Info(absl::StrCat("20. the repair's log line", on, ", at once"),
       repaired.line);

  // The repair as a cluster meets it once its workers idled a moment after
  // the tensor's create: their warm blocks (--shard_warm_bytes, made with
  // the spare CPU for shards of the sizes they lately made) take the new
  // replicas, so what is left is the transport. The victim comes back
  // empty first, and the tensor's size matches no freed shard.
  CHECK_OK(cluster->RestartWorker(kWorkers - 1));
  ValueOrDie(
      client->Create("repair_hosts_warm", {rows + rows / 64, 1024},
                     DType::kFloat32, spec, InitSpec{InitSpec::Kind::kOnes}),
      "create the second replicated tensor");
  absl::SleepFor(absl::Seconds(3));
  const Repaired warm =
      KillAndRepair(*cluster, *client, "repair_hosts_warm", kWorkers - 1);
  long long warm_copied = 0;
  const double warm_copy = warm.CopySeconds(&warm_copied);
  // What the repair copied (its log line), not the victim's bytes_used,
  // which may still count shards it re-attached on its return.
  const double warm_lost =
      static_cast<double>(warm_copied > 0 ? warm_copied : warm.victim_bytes);
  Add({absl::StrFormat("20. repair of a dead worker's %.0f MiB between "
                       "hosts, over tcp%s, 3 s after the create (warm "
                       "blocks)",
                       warm_lost / (1 << 20), on),
       GBps(warm_lost, warm_copy),
       absl::StrCat("TCP x4 between hosts ", GBps(lost, wire)),
       wire * warm_lost / lost / warm_copy, ">= 0.8x", true, 0.8});
  Info(absl::StrCat("20. the repair's log line", on, ", warm blocks"),
       warm.line);
}

// 20. Figure 8's reshard pulls between hosts: each worker on a host of its
// own (bench/hosts.h: network namespaces on a bridge, veth, MTU 9000),
// pulling from the others over UCX on TCP (UCX_TLS=tcp, --trusted_fabric,
// as on a cluster's trusted network), against 4 raw TCP streams between
// the same hosts, each into memory already touched. No shared memory, CMA
// or loopback between workers: what is left of the pulls is what crosses
// a network.
void CrossHostFigure(Env& env) {
  absl::StatusOr<std::unique_ptr<NetnsHosts>> made = NetnsHosts::Make(kWorkers);
  if (!made.ok()) {
    Info("20. reshard pulls over UCX between hosts",
         absl::StrCat("not run: ", made.status().message()));
    return;
  }
  const NetnsHosts& hosts = **made;
  TestClusterOptions options;
  options.num_workers = kWorkers;
  options.coordinator_host = NetnsHosts::BridgeIp();
  options.coordinator_flags = {"--insecure"};
  options.worker_host = [&hosts](int i) { return hosts.ip(i); };
  options.worker_prefix = [&hosts](int i) {
    std::vector<std::string> argv = hosts.Exec(i);
    for (const char* arg :
         {"/usr/bin/env", "UCX_TLS=tcp", "UCX_NET_DEVICES=eth0"}) {
      argv.push_back(arg);
    }
    return argv;
  };
  options.worker_flags = {"--insecure", "--peer_transport=ucx",
                          "--trusted_fabric"};
  std::unique_ptr<TestCluster> cluster =
      ValueOrDie(TestCluster::Start(options), "start the cross-host cluster");
  std::unique_ptr<Client> client =
      ValueOrDie(Client::Connect(cluster->coordinator_address()),
                 "connect (cross-host cluster)");
  const ReshardRounds moved =
      TimeNewTensorReshards(*client, "reshard_hosts", env.quick);
  // Stream i from host i to host i+1, as a reshard's pulls cross the bridge.
  const double tcp = TcpReference(moved.bytes_moved, [&hosts](int i) {
    const int to = (i + 1) % hosts.count();
    return TcpPair(hosts.ip(to), hosts.path(to), hosts.path(i));
  });
  const std::string size = env.quick ? "64 MiB" : "1 GiB";
  AddReshardRows(
      "20.",
      absl::StrCat(size, " rows<->cols between hosts, pulls over UCX on TCP"),
      moved, tcp, 0.8, "TCP x4 between hosts");
  client.reset();
  cluster.reset();

  // The same hosts, the workers pulling over their data ports instead; then
  // the repair of a dead worker's replicas, copied over them too. Once as
  // the hosts are, once with each host's /dev/shm on transparent huge pages.
  const double tcp_per_byte = tcp / moved.bytes_moved;
  TcpBetweenHosts(env, hosts, options, tcp_per_byte, /*huge_pages=*/false);
  TcpBetweenHosts(env, hosts, options, tcp_per_byte, /*huge_pages=*/true);
}

// 21. Publishing to an inference fleet: a tensor of one shard put on w0
// with a mirror group of K hosts (K = 1, 2, 4, 8), each worker on a host of
// its own (bench/hosts.h) whose outgoing link `tc tbf` shapes to
// kPublishRate, so the wire is the limit and not the 2 cores. Each publish
// (the put, until its commit) against one link-time: one TCP stream between
// two of these hosts moving the same bytes. The relay chains the copies, so
// K copies should take about one link-time and no worker send the tensor
// more than twice (the writes' "sent"). Then 16 waiters' wake-up after an
// update's commit.
void PublishFigure(Env& env) {
  constexpr int kMirrorHosts = 8;
  constexpr const char* kPublishRate = "400mbit";
  absl::StatusOr<std::unique_ptr<NetnsHosts>> made =
      NetnsHosts::Make(kMirrorHosts + 1);
  if (!made.ok()) {
    Info("21. publish to K mirror hosts",
         absl::StrCat("not run: ", made.status().message()));
    return;
  }
  const NetnsHosts& hosts = **made;
  for (int i = 0; i < hosts.count(); ++i) {
    std::vector<std::string> argv = hosts.Exec(i);
    for (const char* arg :
         {"tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate",
          kPublishRate, "burst", "256kb", "latency", "100ms"}) {
      argv.push_back(arg);
    }
    std::string out, err;
    if (TestCluster::Run(argv, &out, &err) != 0) {
      Info("21. publish to K mirror hosts",
           absl::StrCat("not run: tc tbf: ", err));
      return;
    }
  }
  TestClusterOptions options;
  options.num_workers = hosts.count();
  options.coordinator_host = NetnsHosts::BridgeIp();
  options.coordinator_flags = {"--insecure"};
  options.worker_host = [&hosts](int i) { return hosts.ip(i); };
  options.worker_prefix = [&hosts](int i) { return hosts.Exec(i); };
  options.worker_flags = {"--insecure", "--peer_transport=tcp"};
  // Worker i (1..8) is in the groups k1, k2, k4, k8 whose size K >= i.
  options.per_worker_flags = [](int i) {
    std::vector<std::string> labels;
    for (int k = 1; k <= kMirrorHosts; k *= 2) {
      if (i >= 1 && i <= k) labels.push_back(absl::StrCat("k", k, "=1"));
    }
    return labels.empty() ? std::vector<std::string>{}
                          : std::vector<std::string>{absl::StrCat(
                                "--labels=", absl::StrJoin(labels, ","))};
  };
  std::unique_ptr<TestCluster> cluster =
      ValueOrDie(TestCluster::Start(options), "start the publish cluster");
  std::unique_ptr<Client> client =
      ValueOrDie(Client::Connect(cluster->coordinator_address()),
                 "connect (publish cluster)");
  const int64_t rows = env.quick ? 8192 : 65536;  // 32 or 256 MiB
  HostArray array = HostArray::Allocate(DType::kFloat32, {rows, 1024});
  std::memset(array.data(), 3, static_cast<size_t>(array.num_bytes));
  const int64_t bytes = array.num_bytes;
  // One link-time: host 0 sends the bytes to host 1 over one stream.
  std::unique_ptr<char[]> landing(new char[bytes]);
  std::memset(landing.get(), 1, static_cast<size_t>(bytes));
  const double link = RawTcpSeconds(1, bytes, landing.get(), [&hosts](int) {
    return TcpPair(hosts.ip(1), hosts.path(1), hosts.path(0));
  });
  const std::string size = absl::StrFormat("%.0f MiB", bytes / 1048576.0);
  for (int k = 1; k <= kMirrorHosts; k *= 2) {
    const std::string name = absl::StrCat("publish_k", k);
    LayoutSpec spec = LayoutSpec::Chunk(0, Ranks(1));
    spec.mirror = absl::StrCat("k", k, "=1");
    const SentBytes before = client->TransferStats().workers_sent;
    const absl::Time start = absl::Now();
    ValueOrDie(client->Put(name, array, spec), ("publish " + name).c_str());
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    int64_t most = 0;
    for (const auto& [worker, sent] : client->TransferStats().workers_sent) {
      auto it = before.find(worker);
      most = std::max(most, sent - (it == before.end() ? 0 : it->second));
    }
    Add({absl::StrFormat("21. publish %s to %d mirror host%s", size.c_str(), k,
                         k == 1 ? "" : "s"),
         absl::StrFormat("%.2f s", seconds),
         absl::StrFormat("1 link-time %.2f s (%s)", link, kPublishRate),
         seconds / link, "<= 1.3x", false, 1.3});
    Add({absl::StrFormat("21. most one worker sent, K=%d", k),
         absl::StrFormat("%.2fx the tensor", static_cast<double>(most) / bytes),
         "-", static_cast<double>(most) / bytes, "<= 2x", false, 2.0});
  }
  // 16 waiters on the K=8 tensor, each on its own connection, woken by an
  // update's commit: how long after the writer's commit returned.
  const std::string name = absl::StrCat("publish_k", kMirrorHosts);
  constexpr int kWaiters = 16;
  std::vector<absl::Time> woke(kWaiters, absl::InfinitePast());
  std::vector<std::thread> waiters;
  std::atomic<int> ready{0};
  for (int w = 0; w < kWaiters; ++w) {
    waiters.emplace_back([&, w] {
      std::unique_ptr<Client> reader = ValueOrDie(
          Client::Connect(cluster->coordinator_address()), "connect a waiter");
      ++ready;
      if (reader->WaitForVersion(name, 2, absl::Minutes(2)).ok()) {
        woke[w] = absl::Now();
      }
    });
  }
  while (ready.load() < kWaiters) absl::SleepFor(absl::Milliseconds(10));
  absl::SleepFor(absl::Milliseconds(300));  // the waits reach the coordinator
  std::memset(array.data(), 5, static_cast<size_t>(array.num_bytes));
  ValueOrDie(client->Update(name, array), "update the published tensor");
  const absl::Time committed = absl::Now();
  for (std::thread& t : waiters) t.join();
  std::vector<double> after_ms;
  for (absl::Time t : woke) {
    if (t != absl::InfinitePast()) {
      after_ms.push_back(absl::ToDoubleMilliseconds(t - committed));
    }
  }
  std::sort(after_ms.begin(), after_ms.end());
  Info("21. 16 waiters woken after the commit returned (ms: min, median, max)",
       after_ms.empty()
           ? std::string("none woke")
           : absl::StrFormat("%.1f, %.1f, %.1f (%zu woke)", after_ms.front(),
                             after_ms[after_ms.size() / 2], after_ms.back(),
                             after_ms.size()));
  // An update in which 2 % of the elements change, scattered (a trainer's
  // step): what the relay carried per hop against the changed bytes and a
  // 4-byte offset each, and every copy checked against the update.
  auto* f = reinterpret_cast<float*>(array.data());
  const int64_t elements = bytes / 4;
  int64_t changed = 0;
  uint64_t state = 2026;
  for (int64_t i = 0; i < elements; ++i) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    if ((state >> 33) % 50 == 0) {
      f[i] += 1.0f;
      ++changed;
    }
  }
  const absl::Time update_start = absl::Now();
  const UpdateStats stats =
      ValueOrDie(client->Update(name, array), "update 2 % of the tensor");
  const double update_seconds =
      absl::ToDoubleSeconds(absl::Now() - update_start);
  const double per_hop =
      static_cast<double>(stats.relayed_bytes) / kMirrorHosts;
  const double changes = static_cast<double>(changed) * (4 + 4);
  Add({absl::StrFormat("21. 2%% of %s changed, relayed per hop (K=%d)",
                       size.c_str(), kMirrorHosts),
       absl::StrFormat("%.2f MiB", per_hop / 1048576.0),
       absl::StrFormat("changed bytes + 4-byte offsets %.2f MiB",
                       changes / 1048576.0),
       per_hop / changes, "<= 1.1x", false, 1.1});
  Add({absl::StrFormat("21. update of 2%% to %d mirror hosts", kMirrorHosts),
       absl::StrFormat("%.2f s", update_seconds),
       absl::StrFormat("1 link-time %.2f s (%s)", link, kPublishRate),
       update_seconds / link, "-", false, 0});
  // Each hop checked every chunk's CRC-32 against its source's;
  // mirror_test reads each copy alone. Here: a read after the update.
  const HostArray got = ValueOrDie(client->Get(name), "read the update");
  Info("21. a read after the 2% update",
       std::memcmp(got.data(), array.data(), static_cast<size_t>(bytes)) == 0
           ? "bit for bit"
           : "DIFFERS");
}

// The echo reference's own process: serves until killed, after writing its
// port to `port_fd`.
[[noreturn]] void ServeEcho(int port_fd) {
  EchoService service;
  absl::StatusOr<RunningServer> server = StartServer("127.0.0.1:0", {&service});
  const int port = server.ok() ? server->port : -1;
  if (write(port_fd, &port, sizeof(port)) != sizeof(port)) _exit(1);
  close(port_fd);
  if (server.ok()) server->server->Wait();  // until the parent kills us
  _exit(0);
}

// Runs the echo reference in a process of its own, started as the workers
// are (a fresh exec, not a bare fork), so the unary reference pays the same
// cross-process wake-ups and process costs: a forked child of this benchmark
// served 16 callers 25-30 % faster than the same server exec'd, which made
// the reference, not the read, the thing measured. Returns its port.
int StartEchoProcess(pid_t* child) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  const pid_t parent = getpid();
  *child = fork();
  if (*child == 0) {
    // Dies with the benchmark, even when it is killed (kept across exec).
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
    close(fds[0]);
    const std::string port_fd = absl::StrCat("--echo_server=", fds[1]);
    execl("/proc/self/exe", "tessera_bench", port_fd.c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  close(fds[1]);
  int port = -1;
  if (read(fds[0], &port, sizeof(port)) != sizeof(port)) port = -1;
  close(fds[0]);
  return port;
}

// 7. What mutual TLS and tokens cost: the same gather (over gRPC) and 4 KiB
// fetch against a second cluster that runs with TLS and tokens
// (deploy/make-certs.sh), the plaintext cluster of this run as reference.
void TlsFigure(Env& env) {
  const std::string dir = absl::StrCat(
      std::getenv("TMPDIR") != nullptr ? std::getenv("TMPDIR") : "/tmp",
      "/tessera-bench-tls-", getpid());
  std::string out;
  if (TestCluster::Run({"/bin/bash", "deploy/make-certs.sh", dir, "--workers",
                        std::to_string(kWorkers)},
                       &out, &out) != 0) {
    std::fprintf(stderr, "deploy/make-certs.sh failed:\n%s\n", out.c_str());
    std::exit(1);
  }
  auto file = [&](const std::string& name) {
    return absl::StrCat(dir, "/", name);
  };
  TestClusterOptions options;
  options.num_workers = kWorkers;
  options.coordinator_flags = {
      absl::StrCat("--tls_ca=", file("ca.crt")),
      absl::StrCat("--tls_cert=", file("coordinator.crt")),
      absl::StrCat("--tls_key=", file("coordinator.key")),
      absl::StrCat("--tokens=", file("tokens"))};
  options.worker_flags = {absl::StrCat("--tls_ca=", file("ca.crt")),
                          absl::StrCat("--tls_cert=", dir, "/{name}.crt"),
                          absl::StrCat("--tls_key=", dir, "/{name}.key"),
                          absl::StrCat("--token_file=", dir, "/{name}.token")};
  options.client.tls_ca = file("ca.crt");
  options.client.tls_cert = file("user.crt");
  options.client.tls_key = file("user.key");
  options.client.token =
      ValueOrDie(ReadTokenFile(file("admin.token")), "token");
  options.client.shared_memory = false;  // every byte through the TLS link
  options.client.transport = "grpc";
  std::unique_ptr<TestCluster> secure =
      ValueOrDie(TestCluster::Start(options), "start the TLS cluster");
  // The same cluster's data ports, in mutual TLS too.
  ClientOptions tcp_options = options.client;
  tcp_options.transport = "tcp";
  std::unique_ptr<Client> tls_tcp =
      ValueOrDie(Client::Connect(secure->coordinator_address(), tcp_options),
                 "connect with TLS over tcp");
  ClientOptions plain_options;
  plain_options.shared_memory = false;
  plain_options.transport = "grpc";  // the same path as the TLS cluster's
  std::unique_ptr<Client> plain = ValueOrDie(
      Client::Connect(env.cluster->coordinator_address(), plain_options),
      "connect");
  std::unique_ptr<Client> tls =
      ValueOrDie(Client::Connect(secure->coordinator_address(), options.client),
                 "connect with TLS");

  const int64_t rows = env.quick ? 4096 : 65536;  // x 1024 float32
  const int64_t bytes = rows * 1024 * 4;
  for (Client* c : {plain.get(), tls.get()}) {
    ValueOrDie(c->Create("tls", {rows, 1024}, DType::kFloat32,
                         LayoutSpec::Chunk(0, Ranks(kWorkers)),
                         InitSpec{InitSpec::Kind::kArange}),
               "create tls tensor");
  }
  std::unique_ptr<char[]> buffer(new char[bytes]);
  double plain_s = 1e9, tls_s = 1e9, tls_tcp_s = 1e9;
  for (int r = 0; r < 3; ++r) {
    for (Client* c : {plain.get(), tls.get(), tls_tcp.get()}) {
      const absl::Time start = absl::Now();
      CHECK_OK(c->GetInto("tls", std::nullopt, buffer.get(), bytes));
      double& best = c == tls.get()       ? tls_s
                     : c == tls_tcp.get() ? tls_tcp_s
                                          : plain_s;
      best = std::min(best, absl::ToDoubleSeconds(absl::Now() - start));
    }
  }
  const DataPlaneStats tcp_moved = tls_tcp->TransferStats();
  if (tcp_moved.bytes.count("tcp") == 0 || tcp_moved.bytes.size() != 1) {
    std::fprintf(stderr, "7. the TLS tcp gather did not go over tcp alone\n");
    std::exit(1);
  }
  const std::string size = env.quick ? "16 MiB" : "256 MiB";
  Add({absl::StrCat("7. gather ", size, ", gRPC, mutual TLS"),
       GBps(bytes, tls_s), absl::StrCat("plaintext ", GBps(bytes, plain_s)),
       plain_s / tls_s, "", true, 0});
  // The same bytes over 4 bare TLS 1.3 streams (OpenSSL alone, AES-GCM), as
  // the gather's 4 workers send them: what encryption itself costs here.
  double openssl_s = 1e9;
  std::string cipher;
  for (int r = 0; r < 3; ++r) {
    const TlsStreamsResult streams = ValueOrDie(
        OpenSslTlsStreams(kWorkers, bytes, buffer.get()), "TLS reference");
    openssl_s = std::min(openssl_s, streams.seconds);
    cipher = streams.cipher;
  }
  Add({absl::StrCat("7. gather ", size, ", gRPC, mutual TLS vs bare TLS"),
       GBps(bytes, tls_s), absl::StrCat("OpenSSL x4 ", GBps(bytes, openssl_s)),
       openssl_s / tls_s, "", true, 0.8});
  Add({absl::StrCat("7. gather ", size, ", tcp, mutual TLS vs bare TLS"),
       GBps(bytes, tls_tcp_s),
       absl::StrCat("OpenSSL x4 ", GBps(bytes, openssl_s)),
       openssl_s / tls_tcp_s, ">= 0.85x", true, 0.85});
  Add({absl::StrCat("7. gather ", size, ", tcp vs gRPC, both mutual TLS"),
       GBps(bytes, tls_tcp_s), absl::StrCat("gRPC+TLS ", GBps(bytes, tls_s)),
       tls_s / tls_tcp_s, ">= 2x", true, 2.0});
  Info("7. the bare TLS streams' suite", cipher);
  // This machine's kernel may lack the tls module: say which path ran.
  Info("7. the data port's TLS", "1.3, AES-128-GCM, kTLS asked for");

  const TensorMetadata plain_meta =
      ValueOrDie(plain->Describe("tls"), "describe");
  const TensorMetadata tls_meta = ValueOrDie(tls->Describe("tls"), "describe");
  std::shared_ptr<Connection> plain_conn = ValueOrDie(
      Connection::Make(env.cluster->coordinator_address(), plain_options),
      "connect");
  std::shared_ptr<Connection> tls_conn = ValueOrDie(
      Connection::Make(secure->coordinator_address(), options.client),
      "connect with TLS");
  std::vector<char> a(4096), b(4096);
  auto row = [&](int64_t i) { return (i * 104729) % rows; };
  const auto [ref, got] = MeasureAlternating(
      absl::Milliseconds(env.quick ? 500 : 1500),
      [&](int, int64_t i) {
        return GatherRegion(*plain_conn, plain_meta,
                            Box{{row(i), 0}, {1, 1024}}, a.data())
            .ok();
      },
      [&](int, int64_t i) {
        return GatherRegion(*tls_conn, tls_meta, Box{{row(i), 0}, {1, 1024}},
                            b.data())
            .ok();
      });
  Add({"7. fetch 4 KiB, 1 caller, gRPC, mutual TLS p50",
       absl::StrFormat("%.0f us", got.p50_us),
       absl::StrFormat("plaintext %.0f us", ref.p50_us),
       got.p50_us / ref.p50_us, "", false, 0});
  Add({"7. fetch 4 KiB, 1 caller, gRPC, mutual TLS p99",
       absl::StrFormat("%.0f us", got.p99_us),
       absl::StrFormat("plaintext %.0f us", ref.p99_us),
       got.p99_us / ref.p99_us, "", false, 0});
  CHECK_OK(plain->Delete("tls"));
  TestCluster::Run({"/bin/rm", "-rf", dir}, &out, &out);
}

// 9. Row gather: 4096 random rows of 1 KiB from a 1 GiB table on 4 workers,
// against bare unary calls carrying the same bytes per worker (one call to
// each worker's echo server, in parallel, as the gather makes them).
void RowsFigure(Env& env) {
  const int64_t rows = env.quick ? 65536 : 1048576;  // x 1 KiB: 64 MiB / 1 GiB
  const int64_t row_bytes = 1024;
  const int64_t per_call = 4096;
  ValueOrDie(env.client->Create("rows", {rows, row_bytes / 4}, DType::kFloat32,
                                LayoutSpec::Chunk(0, Ranks(kWorkers)),
                                InitSpec{InitSpec::Kind::kArange}),
             "create rows table");
  std::vector<std::unique_ptr<bench::Echo::Stub>> echoes;
  for (const std::string& address : env.echo_addresses)
    echoes.push_back(bench::Echo::NewStub(MakeChannel(address)));
  const absl::Duration duration = absl::Milliseconds(env.quick ? 600 : 2000);
  // Index lists drawn once (a multiplicative walk over the table).
  std::vector<std::vector<int64_t>> lists(64);
  for (size_t l = 0; l < lists.size(); ++l) {
    for (int64_t i = 0; i < per_call; ++i)
      lists[l].push_back(((l * 7919 + i) * 2654435761u) % rows);
  }
  // What each worker sends for one list: its rows, 1 KiB each.
  std::vector<int64_t> per_worker_bytes(kWorkers, 0);
  for (int64_t r : lists[0]) per_worker_bytes[r * kWorkers / rows] += row_bytes;
  for (const char* transport : {"grpc", "tcp", "auto"}) {
    ClientOptions options;
    options.transport = transport;
    std::unique_ptr<Client> client =
        ValueOrDie(Client::Connect(env.cluster->coordinator_address(), options),
                   "connect");
    const int64_t out_bytes = per_call * row_bytes;
    for (int callers : {1, 16}) {
      std::vector<std::vector<char>> outs(callers,
                                          std::vector<char>(out_bytes));
      auto ref_call = [&](int, int64_t) {
        std::atomic<bool> ok{true};
        std::vector<std::thread> threads;
        auto one = [&](int w) {
          grpc::ClientContext context;
          bench::EchoRequest request;
          request.set_bytes(per_worker_bytes[w]);
          bench::EchoReply reply;
          if (!echoes[w]->Get(&context, request, &reply).ok()) ok = false;
        };
        for (int w = 1; w < kWorkers; ++w) threads.emplace_back(one, w);
        one(0);
        for (std::thread& t : threads) t.join();
        return ok.load();
      };
      auto rows_call = [&](int c, int64_t i) {
        const std::vector<int64_t>& list = lists[(c * 31 + i) % lists.size()];
        return client->GatherRowsInto("rows", list, outs[c].data(), out_bytes)
            .ok();
      };
      Latency ref, got;
      if (callers == 1) {
        std::tie(ref, got) = MeasureAlternating(duration, ref_call, rows_call);
      } else {
        std::tie(ref, got) =
            MeasureInRounds(callers, duration, ref_call, rows_call);
      }
      const std::string what =
          absl::StrCat("9. rows 4096 x 1 KiB, ", callers,
                       callers == 1 ? " caller, " : " callers, ", transport);
      Add({what + " rows/s", absl::StrFormat("%.0f", got.qps * per_call),
           absl::StrFormat("unary %.0f", ref.qps * per_call), got.qps / ref.qps,
           "", true, 0});
      if (callers == 1) {
        Add({what + " p50", absl::StrFormat("%.0f us", got.p50_us),
             absl::StrFormat("unary %.0f us", ref.p50_us),
             got.p50_us / ref.p50_us, "", false, 0});
      }
    }
  }
  CHECK_OK(env.client->Delete("rows"));
}

// 10. Updates of a 1 GiB tensor on 4 workers: a 1% regional update (rows
// spanning one shard's edge) against a full update of the same tensor.
void UpdateFigure(Env& env) {
  const int64_t rows = env.quick ? 16384 : 262144;  // x 1024 float32
  const Shape shape = {rows, 1024};
  const int64_t bytes = rows * 1024 * 4;
  ValueOrDie(env.client->Create("updated", shape, DType::kFloat32,
                                LayoutSpec::Chunk(0, Ranks(kWorkers)),
                                InitSpec{InitSpec::Kind::kOnes}),
             "create updated tensor");
  std::unique_ptr<char[]> full(new char[bytes]);
  std::memset(full.get(), 3, bytes);
  const int64_t region_rows = rows / 100;
  // Across the edge of shards 0 and 1: both are patched, 2 and 3 kept.
  const Box region({rows / kWorkers - region_rows / 2, 0}, {region_rows, 1024});
  std::unique_ptr<char[]> patch(new char[region_rows * 1024 * 4]);
  std::memset(patch.get(), 4, region_rows * 1024 * 4);
  double full_s = 1e9, region_s = 1e9;
  int64_t full_written = 0, region_written = 0, kept = 0;
  for (int r = 0; r < 3; ++r) {
    absl::Time start = absl::Now();
    const UpdateStats f = ValueOrDie(
        env.client->Update("updated", shape, DType::kFloat32, full.get()),
        "full update");
    full_s = std::min(full_s, absl::ToDoubleSeconds(absl::Now() - start));
    full_written = f.bytes_written;
    start = absl::Now();
    const UpdateStats g =
        ValueOrDie(env.client->Update("updated", ToShape(region.sizes),
                                      DType::kFloat32, patch.get(), region),
                   "regional update");
    region_s = std::min(region_s, absl::ToDoubleSeconds(absl::Now() - start));
    region_written = g.bytes_written;
    kept = g.shards_kept;
  }
  const std::string n = env.quick ? "64 MiB" : "1 GiB";
  Add({absl::StrCat("10. 1% regional update of ", n, ": bytes written"),
       absl::StrFormat("%.1f MiB", region_written / 1048576.0),
       absl::StrFormat("full %.1f MiB", full_written / 1048576.0),
       static_cast<double>(region_written) / full_written, "", false, 0});
  Add({absl::StrCat("10. 1% regional update of ", n, ": wall time"),
       absl::StrFormat("%.3f s", region_s),
       absl::StrFormat("full %.3f s", full_s), region_s / full_s, "", false,
       0});
  Info("10. regional update: shards kept (no copy)", absl::StrCat(kept));
  Info(absl::StrCat("10. full update of ", n, " rate"),
       GBps(static_cast<double>(bytes), full_s));
  CHECK_OK(env.client->Delete("updated"));
}

// Peak RssAnon (kB -> bytes) of a child process while it runs, polled every
// millisecond, and its wall time; -1 on failure.
struct ChildRun {
  double seconds = -1;
  int64_t peak_anon_bytes = -1;
  int exit_code = -1;
};
ChildRun RunAndWatch(const std::vector<std::string>& argv) {
  ChildRun run;
  std::vector<char*> args;
  for (const std::string& a : argv)
    args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const absl::Time start = absl::Now();
  const pid_t pid = fork();
  if (pid == 0) {
    const int devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, 1);
    dup2(devnull, 2);
    execv(args[0], args.data());
    _exit(127);
  }
  if (pid < 0) return run;
  int64_t peak = 0;
  int status = 0;
  // Until execv, the child is a copy of this process (and of its buffers).
  const std::string program = argv[0].substr(argv[0].rfind('/') + 1);
  while (waitpid(pid, &status, WNOHANG) == 0) {
    std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
    std::string line;
    std::getline(in, line);  // "Name:\t<comm>"
    if (line != "Name:\t" + program.substr(0, 15)) continue;
    while (std::getline(in, line)) {
      if (line.rfind("RssAnon:", 0) == 0) {
        peak = std::max<int64_t>(peak, std::atoll(line.c_str() + 8) * 1024);
      }
    }
    absl::SleepFor(absl::Milliseconds(1));
  }
  run.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  run.peak_anon_bytes = peak;
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

// 11. The CLI's `get` of 1 GiB into a file: the whole process's wall time
// against the SDK's gather of the same tensor (in this process, into
// memory), and the CLI's peak private memory.
void CliGetFigure(Env& env) {
  const int64_t rows = env.quick ? 16384 : 262144;  // x 1024 float32
  ValueOrDie(env.client->Create("cli_get", {rows, 1024}, DType::kFloat32,
                                LayoutSpec::Chunk(0, Ranks(kWorkers)),
                                InitSpec{InitSpec::Kind::kOnes}),
             "create cli_get tensor");
  const std::string file =
      absl::StrCat(std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp",
                   "/tessera_bench_cli_get.npy");
  const std::string cli = TestCluster::BinaryPath("client/tessera");
  double sdk = 1e9, wall = 1e9, sdk_fresh = 1e9, write = 1e9;
  int64_t peak = 0;
  const int64_t bytes = rows * 1024 * 4;
  // The floors of a get into a new file, measured in turn with it, each
  // after the same pause (IdleForPageReporting): the same bytes written from
  // memory into a new file in the same directory (8 MiB pwrites), and as
  // much new memory touched (NewMemoryOnce); the wire (4-stream TCP into
  // memory already touched) is below.
  NewMemory fresh;
  std::vector<char> from(static_cast<size_t>(bytes), 1);
  for (int r = 0; r < 3; ++r) {
    // The SDK's gather as a program would make it: into a new array.
    absl::Time start = absl::Now();
    CHECK_OK(env.client->Get("cli_get").status());
    sdk = std::min(sdk, absl::ToDoubleSeconds(absl::Now() - start));
    IdleForPageReporting();
    NewMemoryOnce(bytes, &fresh);
    IdleForPageReporting();
    start = absl::Now();
    const int fd = open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) {
      std::fprintf(stderr, "cannot create %s\n", file.c_str());
      std::exit(1);
    }
    constexpr int64_t kStep = int64_t{8} << 20;
    for (int64_t at = 0; at < bytes; at += kStep) {
      const size_t step = static_cast<size_t>(std::min(kStep, bytes - at));
      if (pwrite(fd, from.data() + at, step, at) !=
          static_cast<ssize_t>(step)) {
        std::fprintf(stderr, "writing %s failed\n", file.c_str());
        std::exit(1);
      }
    }
    close(fd);
    write = std::min(write, absl::ToDoubleSeconds(absl::Now() - start));
    std::remove(file.c_str());
    IdleForPageReporting();
    const ChildRun run =
        RunAndWatch({cli, "--coordinator=" + env.cluster->coordinator_address(),
                     "get", "cli_get", "--output=" + file});
    if (run.exit_code != 0) {
      std::fprintf(stderr, "tessera get failed (exit %d)\n", run.exit_code);
      std::exit(1);
    }
    wall = std::min(wall, run.seconds);
    peak = std::max(peak, run.peak_anon_bytes);
    std::remove(file.c_str());
    // Extra reference (not the figure's): the SDK's gather from a Client
    // connected just for it, so no worker mapping is cached yet, as in a
    // CLI process. Connect is outside the timing.
    std::unique_ptr<Client> fresh_client =
        ValueOrDie(Client::Connect(env.cluster->coordinator_address()),
                   "connect fresh client");
    start = absl::Now();
    CHECK_OK(fresh_client->Get("cli_get").status());
    sdk_fresh = std::min(sdk_fresh, absl::ToDoubleSeconds(absl::Now() - start));
  }
  const std::string n = env.quick ? "64 MiB" : "1 GiB";
  const double tcp = TcpReference(bytes);
  Add({absl::StrCat("11. CLI get ", n, " into a new file, rate"),
       GBps(bytes, wall), absl::StrCat("TCP x4 ", GBps(bytes, tcp)), tcp / wall,
       "", true, 0.8});
  Add({absl::StrCat("11. CLI get ", n, " vs writing it into a new file"),
       absl::StrFormat("%.3f s", wall), absl::StrFormat("pwrite %.3f s", write),
       write / wall, "-", true, 0});
  Add({absl::StrCat("11. CLI get ", n, " against touching as much new memory"),
       absl::StrFormat("%.3f s", wall), fresh.Text(bytes), fresh.best / wall,
       "", true, 0});
  Add({absl::StrCat("11. CLI get ", n, " into a file: process wall"),
       absl::StrFormat("%.3f s", wall),
       absl::StrFormat("SDK gather %.3f s", sdk), wall / sdk, "", false, 1.3});
  Add({absl::StrCat("11x. (extra, not the target) CLI get ", n,
                    " vs SDK gather on a fresh Client"),
       absl::StrFormat("%.3f s", wall),
       absl::StrFormat("fresh-client SDK %.3f s", sdk_fresh), wall / sdk_fresh,
       "-", false, 0});
  Row mem{absl::StrCat("11. CLI get ", n, ": peak RssAnon"),
          absl::StrFormat("%.1f MiB", peak / 1048576.0),
          "-",
          0,
          "<= 64 MiB",
          false,
          0,
          peak <= (int64_t{64} << 20)};
  Add(mem);
  CHECK_OK(env.client->Delete("cli_get"));
}

// The most RssAnon (private memory) any of `pids` reaches above its value
// when the watch started, polled every millisecond until `done`.
int64_t WatchAnonGrowth(const std::vector<pid_t>& pids,
                        const std::atomic<bool>& done) {
  auto anon = [](pid_t pid) -> int64_t {
    std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("RssAnon:", 0) == 0) {
        return int64_t{std::atoll(line.c_str() + 8)} * 1024;
      }
    }
    return int64_t{0};
  };
  std::vector<int64_t> base;
  for (pid_t pid : pids) base.push_back(anon(pid));
  int64_t growth = 0;
  while (!done.load()) {
    for (size_t i = 0; i < pids.size(); ++i)
      growth = std::max(growth, anon(pids[i]) - base[i]);
    absl::SleepFor(absl::Milliseconds(1));
  }
  return growth;
}

// 16. Load a model directory (one safetensors file) under the workers'
// --checkpoint_root into a row layout and a column layout: the load's rate
// against reading the same file with read(2) (cat to /dev/null, page cache
// warm for both), the bytes the workers read against the bytes needed, and
// the workers' private memory while they load.
void LoadFigure(Env& env, const std::string& root) {
  const int64_t rows = env.quick ? 4096 : 65536;  // x 4096 float32
  const int64_t bytes = rows * 4096 * 4;
  const std::string n = env.quick ? "64 MiB" : "1 GiB";
  ValueOrDie(env.client->Create("ck/w", {rows, 4096}, DType::kFloat32,
                                LayoutSpec::Chunk(0, Ranks(kWorkers)),
                                InitSpec{InitSpec::Kind::kRand, "", 7}),
             "create ck/w");
  const std::string dir = root + "/model";
  mkdir(dir.c_str(), 0755);
  const std::string file = dir + "/model.safetensors";
  CHECK_OK(
      ExportSafetensors(*env.client, file, SafetensorsSelection::Prefix("ck/"))
          .status());
  CHECK_OK(env.client->Delete("ck/w"));
  // cat: the file through read(2) in 8 MiB steps, best of 3.
  double cat = 1e9;
  {
    std::vector<char> buffer(size_t{8} << 20);
    for (int r = 0; r < 3; ++r) {
      const absl::Time start = absl::Now();
      const int fd = open(file.c_str(), O_RDONLY);
      while (fd >= 0 && read(fd, buffer.data(), buffer.size()) > 0) {
      }
      close(fd);
      cat = std::min(cat, absl::ToDoubleSeconds(absl::Now() - start));
    }
  }
  std::vector<pid_t> workers;
  for (int i = 0; i < kWorkers; ++i)
    workers.push_back(env.cluster->worker_pid(i));
  struct Layout {
    const char* what;
    int64_t dim;
  };
  for (const Layout& layout : {Layout{"rows", 0}, Layout{"columns", -1}}) {
    double best = 1e9;
    int64_t read = 0, needed = 0, growth = 0;
    for (int r = 0; r < 3; ++r) {
      // Loads are not back to back in a cluster: the workers get the
      // second they take to warm memory for shards of the sizes they
      // lately made (--shard_warm_bytes), as before a first load. Without
      // it a load runs at the rate of faulting fresh shared memory in
      // (0.48 s per GiB on 4 workers here, whatever the layout).
      absl::SleepFor(absl::Seconds(1.5));
      std::atomic<bool> done{false};
      int64_t peak = 0;
      std::thread watch([&] { peak = WatchAnonGrowth(workers, done); });
      const absl::Time start = absl::Now();
      absl::StatusOr<Client::LoadStats> stats = LoadCheckpoint(
          *env.client, "model",
          [&](const Shape&) {
            return absl::StatusOr<LayoutSpec>(
                LayoutSpec::Chunk(layout.dim, Ranks(kWorkers)));
          },
          "ld/");
      const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
      done = true;
      watch.join();
      CHECK_OK(stats.status());
      best = std::min(best, seconds);
      read = stats->bytes_read;
      needed = stats->bytes;
      growth = std::max(growth, peak);
      CHECK_OK(env.client->Delete("ld/w"));
    }
    Add({absl::StrCat("16. load ", n, " into ", layout.what, ", rate"),
         GBps(bytes, best), absl::StrCat("cat ", GBps(bytes, cat)), cat / best,
         "", true, 0.8});
    Add({absl::StrCat("16. load into ", layout.what, ": bytes read / needed"),
         absl::StrFormat("%.3f", static_cast<double>(read) / needed), "-", 0,
         layout.dim == 0 ? "<= 1.05" : "<= 1.25", false, 0,
         static_cast<double>(read) / needed <=
             (layout.dim == 0 ? 1.05 : 1.25)});
    Add({absl::StrCat("16. load into ", layout.what,
                      ": worker heap growth (RssAnon, most of 4)"),
         absl::StrFormat("%.1f MiB", growth / 1048576.0), "-", 0, "<= 64 MiB",
         false, 0, growth <= (int64_t{64} << 20)});
  }
  std::remove(file.c_str());
  rmdir(dir.c_str());
}

// 17. Save: a 1 GiB tensor on the four workers saved into a directory
// (each worker writing its rows into its own file, synced, CRC-32 per
// piece) against writing and syncing the same bytes from one buffer
// (what dd does), best of 3 each.
void SaveFigure(Env& env, const std::string& root) {
  const int64_t rows = env.quick ? 4096 : 65536;  // x 4096 float32
  const int64_t bytes = rows * 4096 * 4;
  const std::string n = env.quick ? "64 MiB" : "1 GiB";
  ValueOrDie(env.client->Create("sv/w", {rows, 4096}, DType::kFloat32,
                                LayoutSpec::Chunk(0, Ranks(kWorkers)),
                                InitSpec{InitSpec::Kind::kRand, "", 7}),
             "create sv/w");
  double dd = 1e9;
  {
    const std::string file = root + "/dd.bin";
    std::vector<char> buffer(size_t{8} << 20, 'x');
    for (int r = 0; r < 3; ++r) {
      const absl::Time start = absl::Now();
      const int fd = open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      for (int64_t at = 0; fd >= 0 && at < bytes;
           at += static_cast<int64_t>(buffer.size())) {
        if (write(fd, buffer.data(), buffer.size()) < 0) break;
      }
      fsync(fd);
      close(fd);
      dd = std::min(dd, absl::ToDoubleSeconds(absl::Now() - start));
      std::remove(file.c_str());
    }
  }
  double best = 1e9;
  int64_t files = 0;
  for (int r = 0; r < 3; ++r) {
    const absl::Time start = absl::Now();
    Client::SaveStats stats =
        ValueOrDie(env.client->SaveCheckpoint("saved", {"sv/w"}), "save sv/w");
    best = std::min(best, absl::ToDoubleSeconds(absl::Now() - start));
    files = stats.files;
  }
  Add({absl::StrCat("17. save ", n, " from 4 workers (", files, " files)"),
       GBps(bytes, best), absl::StrCat("dd ", GBps(bytes, dd)), dd / best, "",
       true, 0});
  // The saved checkpoint loaded back by columns: read from the pieces.
  const absl::Time start = absl::Now();
  absl::StatusOr<Client::LoadStats> loaded = LoadCheckpoint(
      *env.client, "saved",
      [&](const Shape&) {
        return absl::StatusOr<LayoutSpec>(
            LayoutSpec::Chunk(-1, Ranks(kWorkers)));
      },
      "back/");
  const double load = absl::ToDoubleSeconds(absl::Now() - start);
  CHECK_OK(loaded.status());
  Add({"17. load the saved checkpoint into columns, rate", GBps(bytes, load),
       absl::StrCat("save ", GBps(bytes, best)), best / load, "", false, 0});
  CHECK_OK(env.client->Delete("back/sv/w"));
  CHECK_OK(env.client->Delete("sv/w"));
  // The checkpoint's files go with the directory.
  const std::string dir = root + "/saved";
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] != '.') std::remove((dir + "/" + e->d_name).c_str());
    }
    closedir(d);
  }
  rmdir(dir.c_str());
}

// 18. Restart-safe workers: a worker with --store_dir holding 1,000 shards
// of 1 MiB is killed (SIGKILL) and started again; how long until the
// coordinator shows every shard available again, how long the worker's own
// re-attach took (from its log), and what it copied (nothing: its metrics
// and the coordinator's repair bytes), against reading the same files
// (cat, warm page cache).
void ReattachFigure(Env& env, const std::string& root) {
  const int shards = env.quick ? 200 : 1000;
  const std::string store = root + "/store";
  TestClusterOptions options;
  options.num_workers = 1;
  options.durable = true;
  options.coordinator_flags = {"--heartbeat_ms=200"};
  const int metrics = PickFreePort();
  options.worker_flags = {"--store_dir=" + store,
                          absl::StrCat("--metrics_listen=127.0.0.1:", metrics)};
  std::unique_ptr<TestCluster> cluster =
      ValueOrDie(TestCluster::Start(options), "start the store cluster");
  std::unique_ptr<Client> client = ValueOrDie(
      Client::Connect(cluster->coordinator_address()), "connect (store)");
  std::vector<Placement> on_w0(static_cast<size_t>(shards));
  for (Placement& p : on_w0) p.rank = 0;
  ValueOrDie(client->Create("ra/w", {int64_t{256} * shards, 1024},
                            DType::kFloat32, LayoutSpec::Chunk(0, on_w0),
                            InitSpec{InitSpec::Kind::kRand, "", 11}),
             "create ra/w");
  const int64_t bytes = int64_t{shards} << 20;
  // cat: every shard file read, warm, best of 3.
  double cat = 1e9;
  {
    std::vector<std::string> files;
    if (DIR* d = opendir((store + "/shards").c_str())) {
      while (dirent* e = readdir(d)) {
        if (absl::EndsWith(e->d_name, ".data"))
          files.push_back(store + "/shards/" + e->d_name);
      }
      closedir(d);
    }
    std::vector<char> buffer(size_t{8} << 20);
    for (int r = 0; r < 3; ++r) {
      const absl::Time start = absl::Now();
      for (const std::string& f : files) {
        const int fd = open(f.c_str(), O_RDONLY);
        while (fd >= 0 && read(fd, buffer.data(), buffer.size()) > 0) {
        }
        close(fd);
      }
      cat = std::min(cat, absl::ToDoubleSeconds(absl::Now() - start));
    }
  }
  cluster->StopWorker(0, SIGKILL);
  const absl::Time start = absl::Now();
  CHECK_OK(cluster->RestartWorker(0));
  double back = 0;
  for (;;) {
    absl::StatusOr<TensorMetadata> meta = client->Describe("ra/w");
    bool all = meta.ok();
    for (size_t i = 0; all && i < meta->shards.size(); ++i)
      all = meta->shards[i].replicas.front().available;
    if (all) {
      back = absl::ToDoubleSeconds(absl::Now() - start);
      break;
    }
    if (absl::Now() - start > absl::Seconds(60)) {
      std::fprintf(stderr, "figure 18: the shards did not come back\n");
      std::exit(1);
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  // The worker's own count of the re-attach ("... in S s").
  double reattach = -1;
  const std::string log = cluster->worker_log(0);
  const size_t at = log.rfind("nothing copied) in ");
  if (at != std::string::npos) {
    reattach =
        std::strtod(log.c_str() + at + strlen("nothing copied) in "), nullptr);
  }
  const std::string scrape = FetchMetrics(metrics);
  auto metric = [&](const std::string& name) {
    const size_t p = scrape.find("\n" + name + " ");
    return p == std::string::npos
               ? -1.0
               : std::strtod(scrape.c_str() + p + name.size() + 2, nullptr);
  };
  Add({absl::StrCat("18. restart with ", shards,
                    " shards of 1 MiB: worker re-attach (CRC of every byte)"),
       absl::StrFormat("%.3f s", reattach), absl::StrFormat("cat %.3f s", cat),
       cat / reattach, "<= 2 s", false, 0, reattach >= 0 && reattach <= 2});
  Add({"18. restart: kill to every shard available at the coordinator",
       absl::StrFormat("%.3f s", back), "-", 0, "", false, 0});
  const double reattached = metric("tessera_worker_reattached_bytes");
  Add({"18. restart: bytes re-attached / bytes copied",
       absl::StrFormat("%.0f / %.0f", reattached,
                       static_cast<double>(bytes) - reattached),
       "-", 0, "copied 0", false, 0, reattached == static_cast<double>(bytes)});
  CHECK_OK(client->Delete("ra/w"));
  cluster.reset();
  std::remove((store + "/lock").c_str());
  rmdir((store + "/shards").c_str());
  rmdir(store.c_str());
}

// 19. Highly available coordinator: three etcd members, two coordinators
// (--leader_lease=2s), two workers and one SDK client, all given both
// coordinator addresses. The leader is killed (SIGKILL) again and again,
// each time started again as a standby once the other leads; each kill's
// time to the first create the client gets acknowledged, p50 and p99
// against the lease, then a graceful handover (SIGTERM). Every create
// acknowledged is there at the end (lost: 0). Creates per second with etcd
// against a coordinator with --data_dir, the same run.
// Creates per second of one-shard tensors through `client`.
double CreateRate(Client& client, const std::string& prefix, int n) {
  Placement w0;
  w0.rank = 0;
  const absl::Time start = absl::Now();
  for (int i = 0; i < n; ++i) {
    CHECK_OK(client
                 .Create(absl::StrCat(prefix, i), {16}, DType::kFloat32,
                         LayoutSpec::Chunk(0, {w0}), InitSpec{})
                 .status());
  }
  return n / absl::ToDoubleSeconds(absl::Now() - start);
}

// Describes per second of `name` from `callers` threads sharing `client`
// for `seconds`.
double DescribeQps(Client& client, const std::string& name, int callers,
                   double seconds) {
  std::atomic<bool> stop{false};
  std::atomic<int64_t> done{0};
  std::vector<std::thread> threads;
  const absl::Time start = absl::Now();
  for (int t = 0; t < callers; ++t) {
    threads.emplace_back([&] {
      int64_t mine = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        CHECK_OK(client.Describe(name).status());
        ++mine;
      }
      done += mine;
    });
  }
  absl::SleepFor(absl::Seconds(seconds));
  stop = true;
  for (std::thread& t : threads) t.join();
  return done.load() / absl::ToDoubleSeconds(absl::Now() - start);
}

// Seconds to create a tensor of `shards` one-element shards over ranks 0
// and 1.
double BigCreateSeconds(Client& client, const std::string& name, int shards) {
  std::vector<Placement> placements(static_cast<size_t>(shards));
  for (int i = 0; i < shards; ++i) placements[i].rank = i % 2;
  const absl::Time start = absl::Now();
  CHECK_OK(client
               .Create(name, {shards}, DType::kFloat32,
                       LayoutSpec::Chunk(0, std::move(placements)), InitSpec{})
               .status());
  return absl::ToDoubleSeconds(absl::Now() - start);
}

void FailoverFigure(Env& env, const std::string& root) {
  const char* loops_env = std::getenv("TESSERA_BENCH_FAILOVERS");
  const int kills = loops_env != nullptr ? std::atoi(loops_env)
                    : env.quick          ? 3
                                         : 10;
  testing::EtcdCluster etcd(3, "bench-etcd");
  if (!etcd.ready()) {
    std::fprintf(stderr, "figure 19: etcd did not start\n");
    std::exit(1);
  }
  const std::string coordinator =
      TestCluster::BinaryPath("coordinator/tessera-coordinator");
  int ports[2] = {PickFreePort(), PickFreePort()};
  pid_t pids[2] = {-1, -1};
  auto start = [&](int i) {
    pids[i] =
        SpawnDaemon({coordinator, absl::StrCat("--listen=127.0.0.1:", ports[i]),
                     "--metadata=" + etcd.url("bench"), "--leader_lease=2s",
                     "--lease_ms=3000", "--heartbeat_ms=250"},
                    absl::StrCat(root, "/bench-coordinator", i, ".log"));
  };
  const std::string both =
      absl::StrCat("127.0.0.1:", ports[0], ",127.0.0.1:", ports[1]);
  start(0);
  // Alone, it leads once it has won its election in etcd; until then it
  // answers as a standby with no leader (UNAVAILABLE).
  absl::StatusOr<std::unique_ptr<Client>> first;
  for (const absl::Time until = absl::Now() + absl::Seconds(30);;) {
    first = Client::Connect(absl::StrCat("127.0.0.1:", ports[0]));
    if (first.ok() || !absl::IsUnavailable(first.status()) ||
        absl::Now() > until) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  std::unique_ptr<Client> client =
      ValueOrDie(std::move(first), "connect to the first coordinator");
  client.reset();
  start(1);
  std::vector<pid_t> workers;
  for (int w = 0; w < 2; ++w) {
    workers.push_back(
        SpawnDaemon({TestCluster::BinaryPath("worker/tessera-worker"),
                     "--coordinator=" + both, absl::StrCat("--name=w", w),
                     "--listen=127.0.0.1:0"},
                    absl::StrCat(root, "/bench-w", w, ".log")));
  }
  client = ValueOrDie(Client::Connect(both), "connect to both");
  for (;;) {
    absl::StatusOr<std::vector<WorkerInfo>> ws = client->Workers();
    if (ws.ok() && ws->size() == 2 && (*ws)[0].alive && (*ws)[1].alive) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  const double etcd_rate = CreateRate(*client, "ha/r", env.quick ? 50 : 200);
  constexpr int kCallers = 8;
  const double describe_seconds = env.quick ? 0.5 : 2.0;
  const double etcd_describes =
      DescribeQps(*client, "ha/r0", kCallers, describe_seconds);
  const int big_shards = env.quick ? 10000 : 100000;
  const double etcd_big = BigCreateSeconds(*client, "ha/big", big_shards);
  double file_rate = 0, file_describes = 0, file_big = 0;
  {
    TestClusterOptions options;
    options.num_workers = 2;
    options.durable = true;
    std::unique_ptr<TestCluster> single =
        ValueOrDie(TestCluster::Start(options), "start the --data_dir cluster");
    std::unique_ptr<Client> c = ValueOrDie(
        Client::Connect(single->coordinator_address()), "connect (data_dir)");
    file_rate = CreateRate(*c, "dd/r", env.quick ? 50 : 200);
    file_describes = DescribeQps(*c, "dd/r0", kCallers, describe_seconds);
    file_big = BigCreateSeconds(*c, "dd/big", big_shards);
  }
  Add({"19. creates/s with etcd (3 members)",
       absl::StrFormat("%.0f/s", etcd_rate),
       absl::StrFormat("--data_dir %.0f/s", file_rate), etcd_rate / file_rate,
       "", true, 0});
  Add({absl::StrCat("19. describes/s, ", kCallers,
                    " callers, leader with a standby (etcd)"),
       absl::StrFormat("%.0f/s", etcd_describes),
       absl::StrFormat("--data_dir %.0f/s", file_describes),
       etcd_describes / file_describes, "", true, 0});
  Add({absl::StrCat("19. create of a ", big_shards,
                    "-shard tensor with etcd (chunked)"),
       absl::StrFormat("%.2f s", etcd_big),
       absl::StrFormat("--data_dir %.2f s", file_big), file_big / etcd_big, "",
       true, 0});

  // A coordinator that exits on its own (a leader that lost its lease, a
  // failed start) is started again, as Kubernetes would; counted.
  int exited = 0;
  auto restart_exited = [&] {
    for (int i = 0; i < 2; ++i) {
      int status = 0;
      if (pids[i] > 0 && waitpid(pids[i], &status, WNOHANG) == pids[i]) {
        ++exited;
        std::fprintf(stderr, "figure 19: coordinator %d exited (status %d)\n",
                     i, status);
        start(i);
      }
    }
  };
  // The leader: the coordinator listed first.
  auto leader = [&]() -> int {
    for (;;) {
      restart_exited();
      absl::StatusOr<std::vector<CoordinatorStatus>> list =
          client->Coordinators();
      if (list.ok() && !list->empty() && list->front().role == "leader") {
        int alive = 0;
        for (const CoordinatorStatus& c : *list) alive += c.alive;
        if (alive == 2) {
          return list->front().address == absl::StrCat("127.0.0.1:", ports[0])
                     ? 0
                     : 1;
        }
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
  };
  Placement w1;
  w1.rank = 1;
  int acknowledged = 0;
  // Creates until one is acknowledged; the time it took.
  auto first_write = [&](absl::Time since) {
    for (;;) {
      const absl::Status made =
          client
              ->Create(absl::StrCat("ha/f", acknowledged), {16},
                       DType::kFloat32, LayoutSpec::Chunk(0, {w1}), InitSpec{})
              .status();
      if (made.ok()) {
        ++acknowledged;
        return absl::ToDoubleSeconds(absl::Now() - since);
      }
      if (env.verbose) {
        std::fprintf(stderr, "%.3f s: %s\n",
                     absl::ToDoubleSeconds(absl::Now() - since),
                     std::string(made.message()).c_str());
      }
      if (absl::Now() - since > absl::Seconds(60)) {
        std::fprintf(stderr, "figure 19: no write within 60 s of the kill\n");
        std::exit(1);
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
  };
  // Readers through shard handles taken before the kills: they never need
  // the coordinator, so they go on while no one leads.
  CHECK_OK(client
               ->Create("ha/read", {64, 16}, DType::kFloat32,
                        LayoutSpec::Chunk(0, Ranks(2)),
                        InitSpec{InitSpec::Kind::kOnes})
               .status());
  const std::vector<ShardHandle> handles =
      ValueOrDie(client->Handles("ha/read"), "handles of ha/read");
  std::atomic<bool> stop_reading{false};
  std::atomic<int64_t> handle_reads{0}, handle_failures{0};
  std::vector<std::thread> readers;
  for (int r = 0; r < 2; ++r) {
    readers.emplace_back([&] {
      while (!stop_reading) {
        for (const ShardHandle& h : handles) {
          if (h.ToHere().ok()) {
            ++handle_reads;
          } else {
            ++handle_failures;
          }
        }
        absl::SleepFor(absl::Milliseconds(5));
      }
    });
  }
  std::vector<double> times;
  for (int k = 0; k < kills; ++k) {
    const int l = leader();
    kill(pids[l], SIGKILL);
    waitpid(pids[l], nullptr, 0);
    times.push_back(first_write(absl::Now()));
    start(l);  // stands by
  }
  std::sort(times.begin(), times.end());
  auto pct = [&](double q) {
    return times[std::min(times.size() - 1,
                          static_cast<size_t>(q * times.size()))];
  };
  Add({absl::StrCat("19. kill -9 of the leader to the first write, p50 (",
                    kills, " kills)"),
       absl::StrFormat("%.2f s", pct(0.5)), "lease 2.00 s", pct(0.5) / 2.0, "",
       false, 0});
  Add({absl::StrCat("19. kill -9 of the leader to the first write, p99 (",
                    kills, " kills)"),
       absl::StrFormat("%.2f s", pct(0.99)), "lease 2.00 s", pct(0.99) / 2.0,
       "<= 3 s", false, 0, pct(0.99) <= 3.0});
  // Graceful: SIGTERM resigns the lease at once.
  // (Writes the old leader still acknowledges while it stops do not count:
  // the time is to the first write with the other one leading.)
  const int l = leader();
  const std::string other = absl::StrCat("127.0.0.1:", ports[1 - l]);
  const absl::Time term = absl::Now();
  kill(pids[l], SIGTERM);
  double handover = 0;
  for (;;) {
    first_write(term);
    absl::StatusOr<std::vector<CoordinatorStatus>> list =
        client->Coordinators();
    if (list.ok() && !list->empty() && list->front().address == other &&
        list->front().role == "leader") {
      handover = absl::ToDoubleSeconds(absl::Now() - term);
      break;
    }
  }
  waitpid(pids[l], nullptr, 0);
  Add({"19. SIGTERM of the leader to the first write",
       absl::StrFormat("%.3f s", handover), "lease 2.00 s", handover / 2.0,
       "<= 0.5 s", false, 0, handover <= 0.5});
  stop_reading = true;
  for (std::thread& t : readers) t.join();
  Add({"19. coordinators that exited on their own (started again)",
       absl::StrFormat("%d", exited), "-", 0, "", false, 0});
  Add({"19. shard-handle reads during the kills (2 readers): failed / made",
       absl::StrFormat("%d / %d", handle_failures.load(), handle_reads.load()),
       "-", 0, "failed 0", false, 0,
       handle_failures.load() == 0 && handle_reads.load() > 0});
  // Nothing acknowledged is lost.
  absl::StatusOr<std::vector<TensorInfo>> listed = client->List();
  int found = 0;
  if (listed.ok()) {
    for (const TensorInfo& t : *listed)
      found += absl::StartsWith(t.name, "ha/f");
  }
  Add({"19. creates acknowledged across the kills / found after",
       absl::StrFormat("%d / %d", acknowledged, found), "-", 0, "lost 0", false,
       0, found == acknowledged});
  client.reset();
  for (pid_t pid : workers) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
  for (pid_t pid : pids) {
    if (pid > 0 && kill(pid, SIGKILL) == 0) waitpid(pid, nullptr, 0);
  }
}

// 14. Replicas: a replicated put against one replica, the repair of a
// killed worker's shards against raw TCP, and what 16 readers see while it
// dies. Its own cluster: 6 workers in 3 zones, a 2 s lease.
// 22. Tenants: tenant B's 4 KiB reads while tenant A gathers a 256 MiB
// tensor back to back from 2 threads, over the data ports, on a cluster of
// its own with tokens. With --principal_read_rate A is held to its rate on
// each worker; the figure is B's p99 then against B's p99 alone (same
// cluster, same run: after a warm-up, half before A starts and half after
// it stops). The same against a cluster without pacing says what
// the pacing buys.
void TenantFigure(Env& env) {
  const std::string dir = absl::StrCat(
      std::getenv("TMPDIR") != nullptr ? std::getenv("TMPDIR") : "/tmp",
      "/tessera-bench-tenants-", getpid());
  mkdir(dir.c_str(), 0700);
  auto secret = [](const std::string& name) {
    return absl::StrCat(name, "-bench-secret-0123456789");
  };
  auto write = [](const std::string& path, const std::string& text) {
    std::ofstream(path) << text;
    chmod(path.c_str(), 0600);
  };
  write(dir + "/tokens",
        absl::StrCat("a write ", secret("a"), "\nb write ", secret("b"),
                     "\nw* worker ", secret("w"), "\n"));
  write(dir + "/w.token", secret("w"));
  constexpr int kTenantWorkers = 2;
  const char* kRate = "100M";  // per principal, per worker
  const int64_t bulk_rows = env.quick ? 16384 : 65536;  // x 1 KiB float32
  const absl::Duration duration = absl::Seconds(env.quick ? 2 : 5);
  // B's p99 alone and with A gathering, and A's GB/s meanwhile.
  struct Run {
    Latency alone, shared;
    double a_gbps = 0;
  };
  auto run = [&](bool paced) {
    TestClusterOptions options;
    options.num_workers = kTenantWorkers;
    options.coordinator_flags = {absl::StrCat("--tokens=", dir, "/tokens")};
    options.worker_flags = {absl::StrCat("--token_file=", dir, "/w.token")};
    if (paced)
      options.worker_flags.push_back(
          absl::StrCat("--principal_read_rate=", kRate));
    options.client.token = secret("a");
    std::unique_ptr<TestCluster> cluster =
        ValueOrDie(TestCluster::Start(options), "start the tenants' cluster");
    auto connect = [&](const std::string& who) {
      ClientOptions client;
      client.token = secret(who);
      client.transport = "tcp";  // between hosts, as tenants read
      client.shared_memory = false;
      return ValueOrDie(Client::Connect(cluster->coordinator_address(), client),
                        "connect");
    };
    std::unique_ptr<Client> a = connect("a");
    std::unique_ptr<Client> b = connect("b");
    ValueOrDie(a->Create("bulk", {bulk_rows, 256}, DType::kFloat32,
                         LayoutSpec::Chunk(0, Ranks(kTenantWorkers)),
                         InitSpec{InitSpec::Kind::kArange}),
               "create bulk");
    ValueOrDie(b->Create("small", {1024}, DType::kFloat32,
                         LayoutSpec::Chunk(0, Ranks(1)),
                         InitSpec{InitSpec::Kind::kArange}),
               "create small");
    std::vector<char> out(4096);
    auto read_small = [&](int, int64_t) {
      return b->GetInto("small", std::nullopt, out.data(), 4096).ok();
    };
    Run r;
    // B alone: after a second of reads that warm its path up, and again
    // once A has stopped; both halves make the reference.
    Samples warm_up, alone;
    RunCallers(1, absl::Seconds(1), read_small, &warm_up);
    RunCallers(1, duration / 2, read_small, &alone);
    std::atomic<bool> stop{false};
    std::atomic<int64_t> gathered{0};
    std::vector<std::thread> gatherers;
    const int64_t bulk_bytes = bulk_rows * 256 * 4;
    const absl::Time start = absl::Now();
    for (int t = 0; t < 2; ++t) {
      gatherers.emplace_back([&] {
        std::vector<char> buffer(static_cast<size_t>(bulk_bytes));
        while (!stop.load()) {
          if (a->GetInto("bulk", std::nullopt, buffer.data(), bulk_bytes).ok())
            gathered += bulk_bytes;
        }
      });
    }
    absl::SleepFor(absl::Milliseconds(500));  // A at full flow first
    Samples shared;
    RunCallers(1, duration, read_small, &shared);
    r.shared = Summarize(shared);
    stop = true;
    for (std::thread& t : gatherers) t.join();
    r.a_gbps =
        gathered.load() / absl::ToDoubleSeconds(absl::Now() - start) / 1e9;
    RunCallers(1, duration / 2, read_small, &alone);
    r.alone = Summarize(alone);
    return r;
  };
  const Run paced = run(true);
  const Run unpaced = run(false);
  Add({absl::StrCat("22. tenant B 4 KiB read p99, A gathering at ", kRate,
                    "/s per worker"),
       absl::StrFormat("%.0f us", paced.shared.p99_us),
       absl::StrFormat("B alone %.0f us", paced.alone.p99_us),
       paced.shared.p99_us / paced.alone.p99_us, "", false, 1.1});
  Add({"22. tenant B 4 KiB read p50, A at its rate",
       absl::StrFormat("%.0f us", paced.shared.p50_us),
       absl::StrFormat("B alone %.0f us", paced.alone.p50_us),
       paced.shared.p50_us / paced.alone.p50_us});
  Add({"22. tenant A's gather, paced", GBps(paced.a_gbps * 1e9, 1),
       absl::StrFormat("cap %.2f GB/s", 2 * 100.0 * (1 << 20) / 1e9),
       paced.a_gbps / (2 * 100.0 * (1 << 20) / 1e9)});
  Add({"22. tenant B 4 KiB read p99, A unpaced (no limit)",
       absl::StrFormat("%.0f us", unpaced.shared.p99_us),
       absl::StrFormat("B alone %.0f us", unpaced.alone.p99_us),
       unpaced.shared.p99_us / unpaced.alone.p99_us});
  Add({"22. tenant A's gather, unpaced", GBps(unpaced.a_gbps * 1e9, 1), "-",
       0});
  std::string ignored;
  TestCluster::Run({"/bin/rm", "-rf", dir}, &ignored, &ignored);
}

void ReplicaFigure(Env& env) {
  constexpr int kReplicaWorkers = 6;
  constexpr int kLeaseMs = 2000;
  TestClusterOptions options;
  options.num_workers = kReplicaWorkers;
  options.coordinator_flags = {absl::StrCat("--lease_ms=", kLeaseMs),
                               "--heartbeat_ms=200", "--retire_grace_ms=200"};
  options.per_worker_flags = [](int i) -> std::vector<std::string> {
    return {absl::StrCat("--zone=z", i % 3)};
  };
  std::unique_ptr<TestCluster> cluster =
      ValueOrDie(TestCluster::Start(options), "start the replica cluster");
  std::unique_ptr<Client> client = ValueOrDie(
      Client::Connect(cluster->coordinator_address()), "connect (replicas)");
  const int64_t rows = env.quick ? 32768 : 262144;  // 128 MiB or 1 GiB
  const std::string size = env.quick ? "128 MiB" : "1 GiB";
  HostArray data = HostArray::Allocate(DType::kFloat32, {rows, 1024});
  for (int64_t i = 0; i < data.num_bytes / 4; ++i)
    reinterpret_cast<float*>(data.data())[i] = static_cast<float>(i % 9973);
  auto put_seconds = [&](int replicas) {
    LayoutSpec spec = LayoutSpec::Chunk(0, Ranks(kReplicaWorkers));
    spec.replicas = replicas;
    double best = 1e9;
    for (int r = 0; r < 2; ++r) {
      // A quiet moment first: the workers populate their warm blocks only
      // after a second without allocations, so each put starts on the same
      // footing, not on memory the previous one left cold.
      absl::SleepFor(absl::Seconds(2));
      const absl::Time start = absl::Now();
      ValueOrDie(client->Put("rep_put", data, spec), "replicated put");
      best = std::min(best, absl::ToDoubleSeconds(absl::Now() - start));
      CHECK_OK(client->Delete("rep_put"));
    }
    return best;
  };
  // Every R (R=3 forwarded by a chain, a fan-out and the relay) on a restarted
  // coordinator, in one order and then the reverse, the best of each: the
  // memory one put leaves warm favours whichever runs next, so no R may
  // always run first or last.
  struct Run {
    int replicas;
    const char* forward;
    double best = 1e9;
  };
  std::vector<Run> runs = {
      {1, "fanout"}, {2, "fanout"}, {3, "chain"}, {3, "fanout"}, {3, "relay"}};
  for (int round = 0; round < 2; ++round) {
    for (size_t k = 0; k < runs.size(); ++k) {
      Run& run = runs[round == 0 ? k : runs.size() - 1 - k];
      CHECK_OK(cluster->RestartCoordinator(
          {absl::StrCat("--replica_forward=", run.forward)}));
      client = ValueOrDie(Client::Connect(cluster->coordinator_address()),
                          "connect (forward)");
      run.best = std::min(run.best, put_seconds(run.replicas));
    }
  }
  // The repairs below start from the memory an R=3 put leaves, as a
  // worker that has served puts has: one more, untimed.
  put_seconds(3);
  const double one = runs[0].best, two = runs[1].best;
  const double chain = runs[2].best, fan_out = runs[3].best;
  const double relay = runs[4].best;
  Add({absl::StrCat("14. put ", size, " R=1"), absl::StrFormat("%.3f s", one),
       "-", 0, "", true, 0});
  Add({absl::StrCat("14. put ", size, " R=2"), absl::StrFormat("%.3f s", two),
       absl::StrFormat("R=1 %.3f s", one), two / one, "", false, 0});
  Add({absl::StrCat("14. put ", size, " R=3 (chain)"),
       absl::StrFormat("%.3f s", chain), absl::StrFormat("R=1 %.3f s", one),
       chain / one, "", false, 0});
  Add({absl::StrCat("14. put ", size, " R=3 (fan-out)"),
       absl::StrFormat("%.3f s", fan_out),
       absl::StrFormat("chain %.3f s", chain), fan_out / chain, "", false, 0});
  Add({absl::StrCat("14. put ", size, " R=3 (relay)"),
       absl::StrFormat("%.3f s", relay), absl::StrFormat("R=1 %.3f s", one),
       relay / one, "", false, 0});
  CHECK_OK(cluster->RestartCoordinator());
  client = ValueOrDie(Client::Connect(cluster->coordinator_address()),
                      "connect (replicas)");

  // The tensor 16 readers read while a worker dies.
  LayoutSpec spec = LayoutSpec::Chunk(0, Ranks(kReplicaWorkers));
  spec.replicas = 2;
  ValueOrDie(client->Put("rep", data, spec), "put the read tensor");
  std::atomic<bool> stop{false};
  std::vector<std::vector<std::pair<absl::Time, double>>> lat(16);
  std::atomic<int64_t> failed{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 16; ++t) {
    readers.emplace_back([&, t] {
      std::unique_ptr<Client> c =
          ValueOrDie(Client::Connect(cluster->coordinator_address()), "reader");
      uint64_t x = 88172645463325252ull + t;
      while (!stop.load()) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        const int64_t row = static_cast<int64_t>(x % rows);
        const absl::Time start = absl::Now();
        // Region reads and row gathers, in turn.
        const bool ok =
            (x & 1) != 0
                ? c->Get("rep", Box{{row, 0}, {1, 1024}}).ok()
                : c->GatherRows("rep", {row, (row * 7 + 1) % rows}).ok();
        if (!ok) ++failed;
        lat[t].push_back(
            {start, absl::ToDoubleSeconds(absl::Now() - start) * 1e3});
      }
    });
  }
  absl::SleepFor(absl::Seconds(2));
  const Repaired busy = KillAndRepair(*cluster, *client, "rep", 1);
  absl::SleepFor(absl::Seconds(1));
  stop = true;
  for (std::thread& t : readers) t.join();
  std::vector<double> before, during;
  for (const auto& thread : lat) {
    for (const auto& [at, ms] : thread) {
      if (at < busy.killed) {
        before.push_back(ms);
      } else if (at < busy.restored) {
        during.push_back(ms);
      }
    }
  }
  auto percentile = [](std::vector<double> v, double p) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
  };
  const double p99_before = percentile(before, 0.99);
  const double p99_during = percentile(during, 0.99);
  const double max_during = percentile(during, 1.0);
  Add({"14. 4 KiB region / 8 KiB rows p99 while a replica dies",
       absl::StrFormat("%.1f ms", p99_during),
       absl::StrFormat("before %.1f ms", p99_before),
       p99_during / std::max(p99_before, 1e-3), "<= 250 ms", false, 0,
       p99_during <= 250});
  Info("14. read max while it dies, failed reads",
       absl::StrFormat("%.1f ms, %lld failed of %zu", max_during,
                       static_cast<long long>(failed.load()), during.size()));
  // The repair's own time, from its log line ("repaired 'rep' version 1: N
  // new replica(s), B bytes copied, K shard(s) still short, S s (plan ...,
  // allocate ..., move ..., record ...)"): without the wait for the lease
  // or the repair pass.
  auto report = [&](const std::string& when, const Repaired& r) {
    long long bytes = 0;
    const double copy = r.CopySeconds(&bytes);
    const size_t phases = r.line.find("(plan ");
    Info(
        absl::StrCat("14. repair ", when, ": copied, lost bytes; phases"),
        absl::StrCat(bytes, ", ", r.victim_bytes, "; ",
                     phases == std::string::npos ? "" : r.line.substr(phases)));
    const double tcp = TcpReference(r.victim_bytes);
    Add({absl::StrFormat("14. repair %s of a dead worker's %.0f MiB",
                         when.c_str(),
                         static_cast<double>(r.victim_bytes) / (1 << 20)),
         GBps(static_cast<double>(r.victim_bytes), copy),
         absl::StrCat("TCP x4 ",
                      GBps(static_cast<double>(r.victim_bytes), tcp)),
         // The goal is the repair's own rate; under the readers it has a
         // share of the 2 cores and the reference (measured idle) does not.
         tcp / copy, when == "idle" ? ">= 0.8x" : "", true,
         when == "idle" ? 0.8 : 0});
    const double total = absl::ToDoubleSeconds(r.restored - r.killed);
    const double goal = kLeaseMs / 1e3 + 2 * tcp;
    Add({absl::StrCat("14. kill to R restored, ", when),
         absl::StrFormat("%.3f s", total),
         absl::StrFormat("lease+2xTCP %.3f s", goal), total / goal,
         "<= lease + 2x copy", false, 0, total <= kLeaseMs / 1e3 + 2 * copy});
  };
  report("under 16 readers", busy);
  // A second worker, nothing else running: the repair's own rate.
  report("idle", KillAndRepair(*cluster, *client, "rep", 2));
  CHECK_OK(client->Delete("rep"));
}

int Main(int argc, char** argv) {
  // The echo reference's process (StartEchoProcess).
  if (absl::string_view arg = argc == 2 ? argv[1] : "";
      absl::ConsumePrefix(&arg, "--echo_server=")) {
    int port_fd = -1;
    if (!absl::SimpleAtoi(arg, &port_fd)) return 2;
    ServeEcho(port_fd);
  }
  Env env;
  std::string only;  // --only=1,3: run just these figures (for profiling)
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--quick") env.quick = true;
    if (arg == "--verbose") env.verbose = true;
    if (arg.rfind("--reps=", 0) == 0) {
      env.reps = std::atoi(arg.c_str() + 7);
      if (env.reps < 1 || env.reps > 100) {
        std::fprintf(stderr, "--reps: give 1 to 100\n");
        return 2;
      }
    }
    if (arg.rfind("--only=", 0) == 0) only = arg.substr(7);
    if (arg.rfind("--transport=", 0) == 0) {
      env.transport = arg.substr(12);
      if (env.transport != "ucx" && env.transport != "grpc" &&
          env.transport != "auto" && env.transport != "shm" &&
          env.transport != "tcp") {
        std::fprintf(stderr, "--transport: use ucx, grpc, tcp, auto or shm\n");
        return 2;
      }
    }
  }
  std::set<std::string> figures;
  for (absl::string_view f : absl::StrSplit(only, ',', absl::SkipEmpty()))
    figures.insert(std::string(f));
  auto wanted = [&](int figure) {
    return figures.empty() || figures.count(absl::StrCat(figure)) > 0;
  };
  // Started before any gRPC state exists in this process.
  std::vector<pid_t> echo_pids(kWorkers, -1);
  for (pid_t& pid : echo_pids) {
    const int port = StartEchoProcess(&pid);
    if (port <= 0) {
      std::fprintf(stderr, "cannot start the echo reference server\n");
      return 1;
    }
    env.echo_addresses.push_back(absl::StrCat("127.0.0.1:", port));
  }
  TestClusterOptions cluster_options;
  cluster_options.num_workers = kWorkers;
  // Figures 16 and 17 load and save checkpoints here.
  const std::string checkpoint_root =
      absl::StrCat(std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp",
                   "/tessera_bench_ckpt_", getpid());
  mkdir(checkpoint_root.c_str(), 0755);
  cluster_options.worker_flags = {"--checkpoint_root=" + checkpoint_root};
  env.cluster =
      ValueOrDie(TestCluster::Start(cluster_options), "start cluster");
  env.client = ValueOrDie(Client::Connect(env.cluster->coordinator_address()),
                          "connect");

  std::printf("  %-44s %-16s %-22s %s\n", "figure", "value", "reference",
              "ratio");
  if (wanted(1)) GatherFigure(env);
  if (wanted(2)) SmallFetchFigure(env);
  if (wanted(3)) ReshardFigure(env);
  if (wanted(4)) ControlFigure(env);
  if (wanted(7)) TlsFigure(env);
  if (wanted(8)) UcxFigure(env);
  if (wanted(9)) RowsFigure(env);
  if (wanted(10)) UpdateFigure(env);
  if (wanted(11)) CliGetFigure(env);
  if (wanted(16)) LoadFigure(env, checkpoint_root);
  if (wanted(17)) SaveFigure(env, checkpoint_root);
  if (wanted(18)) ReattachFigure(env, checkpoint_root);
  if (wanted(19)) FailoverFigure(env, checkpoint_root);
  if (wanted(14)) ReplicaFigure(env);
  if (wanted(20)) CrossHostFigure(env);
  if (wanted(21)) PublishFigure(env);
  if (wanted(22)) TenantFigure(env);
  rmdir(checkpoint_root.c_str());
  PrintTable();
  for (pid_t pid : echo_pids) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
  return 0;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) { return tessera::Main(argc, argv); }
