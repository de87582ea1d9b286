// LocalCluster: the real tessera-coordinator and tessera-worker binaries on
// 127.0.0.1 (free ports) for the client's end-to-end tests; waits until
// every worker is alive and stops them with SIGTERM when destroyed. Also
// runs the `tessera` CLI and collects its output. Test-only; not
// thread-safe.
#ifndef TESSERA_CLIENT_TESTING_LOCAL_CLUSTER_H_
#define TESSERA_CLIENT_TESTING_LOCAL_CLUSTER_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tessera {

class LocalCluster {
 public:
  static absl::StatusOr<std::unique_ptr<LocalCluster>> Start(int num_workers);
  ~LocalCluster();

  const std::string& coordinator_address() const { return address_; }
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
  absl::Status WaitAlive(int num_workers);

  std::string dir_;
  std::string address_;
  pid_t coordinator_ = -1;
  std::vector<pid_t> workers_;
};

}  // namespace tessera

#endif  // TESSERA_CLIENT_TESTING_LOCAL_CLUSTER_H_
