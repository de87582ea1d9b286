// TestCluster: starts the real tessera-coordinator and tessera-worker
// binaries on 127.0.0.1 (free ports), waits until every worker is alive, and
// stops them with SIGTERM at teardown. For end-to-end tests only.
#ifndef TESSERA_TESTS_CLUSTER_H_
#define TESSERA_TESTS_CLUSTER_H_

#include <sys/types.h>

#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/tessera_client.h"
#include "gtest/gtest.h"
#include "tests/processes.h"

namespace tessera {

struct TestClusterOptions {
  int num_workers = 4;
  // Extra flags for every worker (`{name}` becomes the worker's name) / the
  // coordinator.
  std::vector<std::string> worker_flags;
  // More flags for worker i alone (e.g. its own --metrics_listen port).
  std::function<std::vector<std::string>(int)> per_worker_flags;
  std::vector<std::string> coordinator_flags;
  // RLIMIT_NOFILE (soft and hard) of every worker; 0: this process's.
  uint64_t worker_open_files = 0;
  // Give the coordinator a --data_dir (durable metadata) inside the test's temp
  // dir.
  bool durable = false;
  // How the cluster's own readiness checks connect (TLS files, a token).
  ClientOptions client;
  // Where the daemons listen: the coordinator on `coordinator_host`, worker i
  // on worker_host(i) (unset: 127.0.0.1), started as worker_prefix(i)
  // followed by its own command line (e.g. `ip netns exec NS` to put it on
  // a host of its own; the prefix must exec the worker, so its pid is the
  // worker's).
  std::string coordinator_host = "127.0.0.1";
  // The worker's executable; empty: the one Bazel built (a copy elsewhere
  // lets a worker run as a user that cannot reach Bazel's output tree).
  std::string worker_binary;
  std::function<std::string(int)> worker_host;
  std::function<std::vector<std::string>(int)> worker_prefix;
};

// The --tls_ca, --tls_cert and --tls_key flags of daemon `name`
// ("coordinator", "w0", or "{name}" for every worker) with the certificates
// deploy/make-certs.sh made in `dir`.
std::vector<std::string> TlsFlags(const std::string& dir,
                                  const std::string& name);

class TestCluster {
 public:
  static absl::StatusOr<std::unique_ptr<TestCluster>> Start(
      TestClusterOptions options = {});
  ~TestCluster();

  const std::string& coordinator_address() const {
    return coordinator_address_;
  }
  int num_workers() const { return static_cast<int>(workers_.size()); }
  // Worker i is named "w<i>", has rank i, and listens on worker_address(i).
  std::string worker_name(int i) const { return "w" + std::to_string(i); }
  const std::string& worker_address(int i) const { return workers_[i].address; }

  // Sends `sig` to worker i and waits for it to exit.
  void StopWorker(int i, int sig);
  // Starts worker i again (same name, rank and address) and waits until alive.
  absl::Status RestartWorker(int i);
  // Sends `sig` to the coordinator and waits for its exit status.
  int StopCoordinator(int sig);
  // Starts the coordinator again (same address, flags and data dir, plus
  // `extra_flags` for this start only) and waits until every running worker
  // has registered with it again.
  absl::Status RestartCoordinator(
      const std::vector<std::string>& extra_flags = {});
  // The command line that starts the coordinator (without starting it).
  std::vector<std::string> CoordinatorCommand() const;

  // The coordinator's --data_dir ("" unless options.durable).
  const std::string& data_dir() const { return data_dir_; }
  pid_t coordinator_pid() const { return coordinator_.pid; }
  pid_t worker_pid(int i) const { return workers_[i].pid; }
  // What worker i / the coordinator logged so far.
  std::string worker_log(int i) const;
  std::string coordinator_log() const;
  // Resident memory of a process in bytes (from /proc), or -1.
  static int64_t ResidentBytes(pid_t pid);
  // Its private memory only (RssAnon): what a heap grows, not the shared
  // memory a worker keeps shards and warm blocks in.
  static int64_t AnonymousResidentBytes(pid_t pid);

  // Path of a binary built by Bazel, e.g. "client/tessera".
  static std::string BinaryPath(const std::string& target);
  // Runs a command, capturing stdout and stderr; returns the exit status.
  static int Run(const std::vector<std::string>& argv, std::string* out,
                 std::string* err);

 private:
  struct Process {
    pid_t pid = -1;
    std::string address;
    std::string log;
  };
  TestCluster() = default;
  absl::Status StartCoordinator(
      const std::vector<std::string>& extra_flags = {});
  absl::Status StartWorker(int i);
  // host:port for worker i, on a port free now.
  std::string NewWorkerAddress(int i) const;
  absl::Status WaitAlive(absl::Duration timeout);

  TestClusterOptions options_;
  std::string dir_;
  std::string data_dir_;
  std::string coordinator_address_;
  Process coordinator_;
  std::vector<Process> workers_;
};

// GET http://127.0.0.1:PORT/metrics: the response ("" on failure; what
// came within 20 s when the port does not answer).
std::string FetchMetrics(int port);
// The sum of every sample of `metric` whose labels contain `labels` (e.g.
// `transport="ucx"`; empty: all) in a FetchMetrics response.
double MetricSum(const std::string& text, const std::string& metric,
                 const std::string& labels = "");

// A client of `cluster`'s coordinator with default options; null, and the
// test failing, when it cannot connect.
std::unique_ptr<Client> Connect(const TestCluster& cluster);

// Checks `done` every 100 ms until it holds or `timeout` has passed, and
// once more then: whether it held.
bool Eventually(const std::function<bool()>& done, absl::Duration timeout);

// Creates `name` through `client`: int32 values 0, 1, 2, ... of `shape`,
// in chunks along dim 0 over `ranks`.
absl::Status CreateArange(Client& client, const std::string& name,
                          const Shape& shape, std::initializer_list<int> ranks);

// Sum of bytes_used over every worker, as `workers` reports it.
int64_t TotalBytesUsed(Client& client);
// TotalBytesUsed once it equals `want`, or its last reading after 3 s:
// bytes_used is current within 2 s (a heartbeat sampled just before a free
// can land after the free's own answer).
int64_t TotalBytesUsedBecomes(Client& client, int64_t want);

// Base fixture: one real cluster and one connected client shared by every
// test of a suite. A suite picks its cluster by hiding ClusterOptions().
template <typename Suite>
class ClusterSuite : public ::testing::Test {
 public:
  static TestClusterOptions ClusterOptions() { return {}; }

 protected:
  static void SetUpTestSuite() {
    auto cluster = TestCluster::Start(Suite::ClusterOptions());
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = cluster->release();
    auto client = Client::Connect(cluster_->coordinator_address());
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = client->release();
  }
  static void TearDownTestSuite() {
    delete client_;
    delete cluster_;
    client_ = nullptr;
    cluster_ = nullptr;
  }
  static int64_t BytesUsed() { return TotalBytesUsed(*client_); }

  static inline TestCluster* cluster_ = nullptr;
  static inline Client* client_ = nullptr;
};

// What `command` (a shell command line) printed on a terminal (a
// pseudo-terminal from script(1), its transcript kept in `log`) while
// process `worker` was stopped for its first 2.5 s, and its exit status.
struct TerminalRun {
  int code = -1;
  std::string text;
};
TerminalRun RunOnTerminalWithWorkerStopped(const std::string& command,
                                           pid_t worker,
                                           const std::string& log);

// The progress lines containing `label` that `text` redrew ('\r'), and
// whether one showed a share strictly between 0 and 100 %.
struct ProgressLines {
  std::vector<std::string> lines;
  bool partial = false;
};
ProgressLines ProgressOf(const std::string& text, const std::string& label);

}  // namespace tessera

#endif  // TESSERA_TESTS_CLUSTER_H_
