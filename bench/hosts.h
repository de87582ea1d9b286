// Hosts of their own on this machine, for the figures that must cross a
// network: Linux network namespaces joined by a bridge.
#ifndef TESSERA_BENCH_HOSTS_H_
#define TESSERA_BENCH_HOSTS_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace tessera {

// `count` network namespaces, each with its loopback and one veth (eth0,
// MTU 9000) on a bridge in this process's namespace: host i has address
// 10.199.0.<11+i>/24, this process's end of the bridge 10.199.0.1. Bytes
// between hosts go through each host's TCP/IP stack and the veth pair, as
// between machines; memory, CPUs and /dev/shm stay shared. Needs root and
// iproute2's `ip`; everything made is removed by the destructor, or, when
// the bench died first (a failed step exits), by the next bench's Make.
class NetnsHosts {
 public:
  static absl::StatusOr<std::unique_ptr<NetnsHosts>> Make(int count);
  ~NetnsHosts();
  NetnsHosts(const NetnsHosts&) = delete;
  NetnsHosts& operator=(const NetnsHosts&) = delete;

  int count() const { return static_cast<int>(names_.size()); }
  // The namespace's name, for `ip netns exec NAME`.
  const std::string& name(int i) const { return names_[i]; }
  // Its path, for setns (TcpPair).
  std::string path(int i) const { return "/run/netns/" + names_[i]; }
  std::string ip(int i) const;
  static std::string BridgeIp() { return "10.199.0.1"; }
  // The command that runs a program on host i (it execs the program).
  std::vector<std::string> Exec(int i) const;

 private:
  NetnsHosts() = default;
  absl::Status Ip(const std::vector<std::string>& args);
  // Removes the namespaces and bridges of benches no longer running.
  static void SweepDead();

  std::string bridge_;
  std::vector<std::string> names_;
};

}  // namespace tessera

#endif  // TESSERA_BENCH_HOSTS_H_
