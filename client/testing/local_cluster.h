// LocalCluster: the real tessera-coordinator and tessera-worker binaries on
// 127.0.0.1 for the client's end-to-end tests (a TestCluster, tests/
// cluster.h, which starts, waits for and stops them), a client connected
// to them, a scratch directory, and the `tessera` CLI run against it with
// its output collected; LocalClusterSuite, a fixture that shares one among
// the tests of a suite. Test-only; not thread-safe.
#ifndef TESSERA_CLIENT_TESTING_LOCAL_CLUSTER_H_
#define TESSERA_CLIENT_TESTING_LOCAL_CLUSTER_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "client/tessera_client.h"
#include "gtest/gtest.h"
#include "tests/cluster.h"

namespace tessera {

class LocalCluster {
 public:
  static absl::StatusOr<std::unique_ptr<LocalCluster>> Start(int num_workers);
  ~LocalCluster();

  const std::string& coordinator_address() const { return address_; }
  // A client connected to the coordinator, closed before the daemons stop.
  Client& client() const { return *client_; }
  // A directory for the test's files, removed with the cluster's temp dir
  // by Bazel.
  const std::string& dir() const { return dir_; }

  // Kills worker i (SIGKILL) and waits for it.
  void KillWorker(int i);

  // A binary built by Bazel, e.g. "client/tessera" ($TESSERA_BIN_DIR, else
  // the test's runfiles, else bazel-bin/).
  static std::string BinaryPath(const std::string& target);

  struct Result {
    int code = -1;  // exit status, or 128 + signal
    std::string out;
    std::string err;
  };
  // Runs `tessera --coordinator=ADDRESS ARGS...`.
  Result Tessera(const std::vector<std::string>& args) const;
  // Runs any command.
  static Result Run(const std::vector<std::string>& argv);

 private:
  LocalCluster() = default;

  std::unique_ptr<TestCluster> cluster_;
  std::unique_ptr<Client> client_;  // destroyed before cluster_
  std::string dir_;
  std::string address_;
};

// Base fixture: one LocalCluster of three workers, and its client, shared
// by every test of a suite.
class LocalClusterSuite : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto cluster = LocalCluster::Start(3);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = cluster->release();
    client_ = &cluster_->client();
  }
  static void TearDownTestSuite() { delete cluster_; }

  // `name` in the cluster's scratch directory.
  static std::string Path(const std::string& name) {
    return absl::StrCat(cluster_->dir(), "/", name);
  }

  static inline LocalCluster* cluster_ = nullptr;
  static inline Client* client_ = nullptr;
};

}  // namespace tessera

#endif  // TESSERA_CLIENT_TESTING_LOCAL_CLUSTER_H_
