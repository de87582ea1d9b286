#include "client/testing/local_cluster.h"

#include <signal.h>
#include <stdlib.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace tessera {

absl::StatusOr<std::unique_ptr<LocalCluster>> LocalCluster::Start(
    int num_workers) {
  std::unique_ptr<LocalCluster> local(new LocalCluster());
  TestClusterOptions options;
  options.num_workers = num_workers;
  absl::StatusOr<std::unique_ptr<TestCluster>> cluster =
      TestCluster::Start(options);
  if (!cluster.ok()) return cluster.status();
  local->cluster_ = *std::move(cluster);
  local->address_ = local->cluster_->coordinator_address();
  absl::StatusOr<std::unique_ptr<Client>> client =
      Client::Connect(local->address_);
  if (!client.ok()) return client.status();
  local->client_ = *std::move(client);
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string dir =
      absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/local_cluster_XXXXXX");
  if (mkdtemp(dir.data()) == nullptr) {
    return absl::InternalError("mkdtemp failed");
  }
  local->dir_ = dir;
  return local;
}

LocalCluster::~LocalCluster() = default;

void LocalCluster::KillWorker(int i) { cluster_->StopWorker(i, SIGKILL); }

std::string LocalCluster::BinaryPath(const std::string& target) {
  return TestCluster::BinaryPath(target);
}

LocalCluster::Result LocalCluster::Run(const std::vector<std::string>& argv) {
  Result result;
  result.code = TestCluster::Run(argv, &result.out, &result.err);
  return result;
}

LocalCluster::Result LocalCluster::Tessera(
    const std::vector<std::string>& args) const {
  std::vector<std::string> argv = {BinaryPath("client/tessera"),
                                   absl::StrCat("--coordinator=", address_)};
  argv.insert(argv.end(), args.begin(), args.end());
  return Run(argv);
}

}  // namespace tessera
