#include "bench/hosts.h"

#include <unistd.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tests/cluster.h"

namespace tessera {
namespace {
constexpr char kIp[] = "/usr/sbin/ip";
}  // namespace

absl::Status NetnsHosts::Ip(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {kIp};
  argv.insert(argv.end(), args.begin(), args.end());
  std::string out, err;
  if (TestCluster::Run(argv, &out, &err) != 0) {
    return absl::UnavailableError(
        absl::StrCat("`", absl::StrJoin(argv, " "), "` failed: ", err));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<NetnsHosts>> NetnsHosts::Make(int count) {
  if (geteuid() != 0) {
    return absl::FailedPreconditionError("network namespaces need root");
  }
  if (access(kIp, X_OK) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("no ", kIp));
  }
  std::unique_ptr<NetnsHosts> hosts(new NetnsHosts());
  // Names of at most 15 bytes (IFNAMSIZ), this process's own.
  const std::string tag = absl::StrCat("tb", getpid() % 10000000);
  hosts->bridge_ = tag;
  if (absl::Status s = hosts->Ip({"link", "add", tag, "type", "bridge"});
      !s.ok()) {
    hosts->bridge_.clear();
    return s;
  }
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{
           {"addr", "add", BridgeIp() + "/24", "dev", tag},
           {"link", "set", tag, "mtu", "9000", "up"}}) {
    if (absl::Status s = hosts->Ip(args); !s.ok()) return s;
  }
  for (int i = 0; i < count; ++i) {
    const std::string ns = absl::StrCat("tessera-bench-", getpid(), "-", i);
    if (absl::Status s = hosts->Ip({"netns", "add", ns}); !s.ok()) return s;
    hosts->names_.push_back(ns);
    const std::string veth = absl::StrCat(tag, "v", i);
    if (absl::Status s =
            hosts->Ip({"link", "add", veth, "mtu", "9000", "type", "veth",
                       "peer", "name", "eth0", "mtu", "9000", "netns", ns});
        !s.ok()) {
      return s;
    }
    hosts->veths_.push_back(veth);
    for (const std::vector<std::string>& args :
         std::vector<std::vector<std::string>>{
             {"link", "set", veth, "master", tag, "up"},
             {"-n", ns, "addr", "add", hosts->ip(i) + "/24", "dev", "eth0"},
             {"-n", ns, "link", "set", "eth0", "up"},
             {"-n", ns, "link", "set", "lo", "up"}}) {
      if (absl::Status s = hosts->Ip(args); !s.ok()) return s;
    }
  }
  return hosts;
}

NetnsHosts::~NetnsHosts() {
  // A namespace's end of a veth pair goes with it, and takes the other end.
  for (const std::string& ns : names_) (void)Ip({"netns", "del", ns});
  for (const std::string& veth : veths_) {
    std::string out, err;
    TestCluster::Run({kIp, "link", "del", veth}, &out, &err);  // if left
  }
  if (!bridge_.empty()) (void)Ip({"link", "del", bridge_});
}

std::string NetnsHosts::ip(int i) const {
  return absl::StrCat("10.199.0.", 11 + i);
}

std::vector<std::string> NetnsHosts::Exec(int i) const {
  return {kIp, "netns", "exec", names_[i]};
}

}  // namespace tessera
