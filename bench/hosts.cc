#include "bench/hosts.h"

#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "tests/cluster.h"

namespace tessera {
namespace {
constexpr char kIp[] = "/usr/sbin/ip";
constexpr char kNamespacePrefix[] = "tessera-bench-";
constexpr char kBridgePrefix[] = "tb";

// True when `digits` is the pid of no process (the bench that made a name
// with it is gone).
bool DeadPid(absl::string_view digits) {
  int pid = 0;
  return absl::SimpleAtoi(digits, &pid) && pid > 0 && kill(pid, 0) != 0 &&
         errno == ESRCH;
}
}  // namespace

void NetnsHosts::SweepDead() {
  std::string out, err;
  // tessera-bench-PID-I
  if (DIR* dir = opendir("/run/netns")) {
    std::vector<std::string> dead;
    while (dirent* entry = readdir(dir)) {
      absl::string_view name = entry->d_name;
      if (!absl::ConsumePrefix(&name, kNamespacePrefix)) continue;
      if (DeadPid(name.substr(0, name.find('-')))) {
        dead.emplace_back(entry->d_name);
      }
    }
    closedir(dir);
    for (const std::string& ns : dead)
      TestCluster::Run({kIp, "netns", "del", ns}, &out, &err);
  }
  // tbPID bridges ("N: tbPID: <...>" from `ip -o link show type bridge`).
  if (TestCluster::Run({kIp, "-o", "link", "show", "type", "bridge"}, &out,
                       &err) != 0) {
    return;
  }
  for (absl::string_view line : absl::StrSplit(out, '\n')) {
    const std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::MaxSplits(": ", 2));
    if (fields.size() < 2) continue;
    absl::string_view name = fields[1];
    if (absl::ConsumePrefix(&name, kBridgePrefix) && DeadPid(name)) {
      std::string del_out, del_err;
      TestCluster::Run({kIp, "link", "del", std::string(fields[1])}, &del_out,
                       &del_err);
    }
  }
}

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
  // What a bench killed before its destructor ran left (its 10.199.0.1 would
  // clash with this one's).
  SweepDead();
  std::unique_ptr<NetnsHosts> hosts(new NetnsHosts());
  // Names of at most 15 bytes (IFNAMSIZ; pids are at most 7 digits), this
  // process's own.
  const std::string tag = absl::StrCat(kBridgePrefix, getpid());
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
    const std::string ns = absl::StrCat(kNamespacePrefix, getpid(), "-", i);
    if (absl::Status s = hosts->Ip({"netns", "add", ns}); !s.ok()) return s;
    hosts->names_.push_back(ns);
    const std::string veth = absl::StrCat(tag, "v", i);
    if (absl::Status s =
            hosts->Ip({"link", "add", veth, "mtu", "9000", "type", "veth",
                       "peer", "name", "eth0", "mtu", "9000", "netns", ns});
        !s.ok()) {
      return s;
    }
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
  if (!bridge_.empty()) (void)Ip({"link", "del", bridge_});
}

std::string NetnsHosts::ip(int i) const {
  return absl::StrCat("10.199.0.", 11 + i);
}

std::vector<std::string> NetnsHosts::Exec(int i) const {
  return {kIp, "netns", "exec", names_[i]};
}

}  // namespace tessera
