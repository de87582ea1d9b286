// Real etcd members for tests (Debian's etcd-server, /usr/bin/etcd), on
// 127.0.0.1 ports picked free, data in the test's temp dir. A cluster of N
// members forms one raft group; members can be killed, stopped and started
// again on their data.
#ifndef TESSERA_COORDINATOR_ETCD_TESTUTIL_H_
#define TESSERA_COORDINATOR_ETCD_TESTUTIL_H_

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "coordinator/etcd_client.h"
#include "tests/processes.h"

namespace tessera {
namespace testing {

// PEM files of a TLS etcd: its server certificate (also the client's), key
// and CA; clients must present a certificate of the CA.
struct EtcdTls {
  std::string ca, cert, key;
};

inline std::string ReadPem(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Client credentials for a TLS etcd from the same files.
inline std::shared_ptr<grpc::ChannelCredentials> EtcdCredentials(
    const EtcdTls& tls) {
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = ReadPem(tls.ca);
  options.pem_cert_chain = ReadPem(tls.cert);
  options.pem_private_key = ReadPem(tls.key);
  return grpc::SslCredentials(options);
}

class EtcdCluster {
 public:
  // Starts `members` members and waits until the cluster answers (over
  // TLS with client-certificate auth when `tls` names files).
  explicit EtcdCluster(int members, const std::string& name = "etcd",
                       EtcdTls tls = {})
      : tls_(std::move(tls)) {
    const char* tmp = std::getenv("TEST_TMPDIR");
    static int made = 0;
    dir_ = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/", name, "-", getpid(),
                        "-", made++);
    mkdir(dir_.c_str(), 0700);
    std::vector<std::string> peers;
    for (int i = 0; i < members; ++i) {
      Member m;
      m.name = absl::StrCat("m", i);
      m.client_port = PickFreePort();
      m.peer_port = PickFreePort();
      peers.push_back(absl::StrCat(m.name, "=http://127.0.0.1:", m.peer_port));
      members_.push_back(m);
    }
    initial_cluster_ = absl::StrJoin(peers, ",");
    for (int i = 0; i < members; ++i) Start(i);
    ready_ = WaitReady(absl::Seconds(30));
  }
  // Stops the members and removes their data (a bench run outside a test's
  // TEST_TMPDIR left ~370 MB of WAL behind per cluster).
  ~EtcdCluster() {
    for (size_t i = 0; i < members_.size(); ++i) Kill(static_cast<int>(i));
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  bool ready() const { return ready_; }

  std::vector<std::string> endpoints() const {
    std::vector<std::string> out;
    for (const Member& m : members_)
      out.push_back(absl::StrCat("127.0.0.1:", m.client_port));
    return out;
  }
  std::string url(const std::string& prefix) const {
    return absl::StrCat("etcd://", absl::StrJoin(endpoints(), ","), "/",
                        prefix);
  }

  void Start(int i) {
    Member& m = members_[static_cast<size_t>(i)];
    const std::string data = absl::StrCat(dir_, "/", m.name);
    const std::string log = data + ".log";
    const std::string scheme = tls_.ca.empty() ? "http" : "https";
    std::vector<std::string> args = {
        "/usr/bin/etcd",
        "--name=" + m.name,
        "--data-dir=" + data,
        absl::StrCat("--listen-client-urls=", scheme,
                     "://127.0.0.1:", m.client_port),
        absl::StrCat("--advertise-client-urls=", scheme,
                     "://127.0.0.1:", m.client_port),
        absl::StrCat("--listen-peer-urls=http://127.0.0.1:", m.peer_port),
        absl::StrCat("--initial-advertise-peer-urls=http://127.0.0.1:",
                     m.peer_port),
        "--initial-cluster=" + initial_cluster_,
        "--initial-cluster-state=new",
        "--initial-cluster-token=" + absl::StrCat("t", getpid()),
        // Fast elections, so a lost member costs tests little time.
        "--heartbeat-interval=50",
        "--election-timeout=500",
        "--log-level=warn",
    };
    if (!tls_.ca.empty()) {
      args.push_back("--cert-file=" + tls_.cert);
      args.push_back("--key-file=" + tls_.key);
      args.push_back("--trusted-ca-file=" + tls_.ca);
      args.push_back("--client-cert-auth");
    }
    m.pid = SpawnDaemon(args, log);
  }
  void Kill(int i, int sig = SIGKILL) {
    Member& m = members_[static_cast<size_t>(i)];
    if (m.pid <= 0) return;
    kill(m.pid, sig);
    if (sig == SIGKILL || sig == SIGTERM) {
      waitpid(m.pid, nullptr, 0);
      m.pid = -1;
    }
  }
  pid_t pid(int i) const { return members_[static_cast<size_t>(i)].pid; }

  // Every member answers a read.
  bool WaitReady(absl::Duration timeout) const {
    const absl::Time deadline = absl::Now() + timeout;
    for (const std::string& endpoint : endpoints()) {
      EtcdClientOptions options;
      if (!tls_.ca.empty()) options.credentials = EtcdCredentials(tls_);
      EtcdClient client({endpoint}, options);
      for (;;) {
        const absl::Status probe = client.Range("probe").status();
        if (probe.ok()) break;
        if (absl::Now() > deadline) {
          std::cerr << "etcd member " << endpoint
                    << " does not answer: " << probe << "\n";
          return false;
        }
        absl::SleepFor(absl::Milliseconds(100));
      }
    }
    return true;
  }

 private:
  struct Member {
    std::string name;
    int client_port = 0;
    int peer_port = 0;
    pid_t pid = -1;
  };
  const EtcdTls tls_;
  std::string dir_;
  std::string initial_cluster_;
  std::vector<Member> members_;
  bool ready_ = false;
};

}  // namespace testing
}  // namespace tessera

#endif  // TESSERA_COORDINATOR_ETCD_TESTUTIL_H_
