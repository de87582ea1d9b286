#include "rpc/listener_guard.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <limits>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "core/rate_limited_log.h"
#include "spdlog/spdlog.h"

namespace tessera {
namespace {

using Accept4Fn = int (*)(int, sockaddr*, socklen_t*, int);

Accept4Fn RealAccept4() {
  static const Accept4Fn real =
      reinterpret_cast<Accept4Fn>(dlsym(RTLD_NEXT, "accept4"));
  return real;
}

int CallRealAccept4(int fd, sockaddr* addr, socklen_t* len, int flags) {
  Accept4Fn real = RealAccept4();
  if (real == nullptr) {
    errno = ENOSYS;
    return -1;
  }
  return real(fd, addr, len, flags);
}

constexpr int kMaxGuarded = 8;
constexpr absl::Duration kPruneEvery = absl::Milliseconds(100);

// A connection's peer host: the address bytes (4 or 16) of its IP, or
// empty when it has none (the bound per peer does not apply).
std::string PeerOf(const sockaddr* addr, socklen_t len) {
  if (addr == nullptr) return std::string();
  if (addr->sa_family == AF_INET && len >= sizeof(sockaddr_in)) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(addr);
    return std::string(reinterpret_cast<const char*>(&in->sin_addr), 4);
  }
  if (addr->sa_family == AF_INET6 && len >= sizeof(sockaddr_in6)) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(addr);
    // An IPv4 peer on a dual-stack port is the same host as over IPv4.
    if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) {
      return std::string(reinterpret_cast<const char*>(&in6->sin6_addr) + 12,
                         4);
    }
    return std::string(reinterpret_cast<const char*>(&in6->sin6_addr), 16);
  }
  return std::string();
}

// The peer of accepted connection `fd` (when accept4 was not asked for it).
std::string PeerOfDescriptor(int fd) {
  sockaddr_storage addr;
  socklen_t len = sizeof(addr);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return std::string();
  }
  return PeerOf(reinterpret_cast<const sockaddr*>(&addr), len);
}

struct Guarded {
  std::atomic<int> port{0};  // 0: a free slot
  std::atomic<int> max_connections{0};
  std::atomic<int> max_per_peer{0};
  std::atomic<const char*> what{""};
  std::atomic<int64_t> accepted{0};
  std::atomic<int64_t> refused_over_limit{0};
  std::atomic<int64_t> refused_no_descriptors{0};
  std::atomic<int64_t> refused_per_peer{0};
  RateLimitedLog limit_log;
  RateLimitedLog peer_log;
  RateLimitedLog descriptor_log;

  struct Connection {
    ino_t inode;
    std::string peer;
  };
  // Invariant: `open` maps each descriptor accepted on the port (and not
  // seen closed) to its socket's inode and peer host; an entry whose
  // descriptor now names another inode, or none, is a closed connection
  // not pruned yet. `per_peer` counts the entries of `open` by peer (none
  // for an empty peer).
  absl::Mutex mu;
  absl::flat_hash_map<int, Connection> open ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<std::string, int64_t> per_peer ABSL_GUARDED_BY(mu);
  absl::Time last_prune ABSL_GUARDED_BY(mu) = absl::InfinitePast();

  void EraseLocked(absl::flat_hash_map<int, Connection>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (!it->second.peer.empty()) {
      auto count = per_peer.find(it->second.peer);
      if (count != per_peer.end() && --count->second <= 0) {
        per_peer.erase(count);
      }
    }
    open.erase(it);
  }

  void PruneLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    for (auto it = open.begin(); it != open.end();) {
      struct stat st;
      auto here = it++;
      if (fstat(here->first, &st) != 0 || st.st_ino != here->second.inode) {
        EraseLocked(here);
      }
    }
    last_prune = absl::Now();
  }

  enum class Verdict { kAdmitted, kPortFull, kPeerFull };

  // Records `fd`, just accepted from `peer`; kPortFull or kPeerFull when
  // the port or that peer is at its bound (the caller closes it).
  Verdict Admit(int fd, const std::string& peer) {
    struct stat st;
    const ino_t inode = fstat(fd, &st) == 0 ? st.st_ino : 0;
    const int max = max_connections.load();
    const int peer_max = max_per_peer.load();
    absl::MutexLock lock(&mu);
    // A reused descriptor replaces the closed connection it named.
    if (auto old = open.find(fd); old != open.end()) EraseLocked(old);
    auto full = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      if (max > 0 && static_cast<int64_t>(open.size()) >= max) {
        return Verdict::kPortFull;
      }
      if (peer_max > 0 && !peer.empty()) {
        auto count = per_peer.find(peer);
        if (count != per_peer.end() && count->second >= peer_max) {
          return Verdict::kPeerFull;
        }
      }
      return Verdict::kAdmitted;
    };
    Verdict verdict = full();
    if (verdict != Verdict::kAdmitted &&
        absl::Now() - last_prune >= kPruneEvery) {
      PruneLocked();
      verdict = full();
    }
    if (verdict != Verdict::kAdmitted) return verdict;
    open[fd] = Connection{inode, peer};
    if (!peer.empty()) ++per_peer[peer];
    return Verdict::kAdmitted;
  }

  void Reset(int new_port, int max, int peer_max, const char* name) {
    {
      absl::MutexLock lock(&mu);
      open.clear();
      per_peer.clear();
      last_prune = absl::InfinitePast();
    }
    accepted = 0;
    refused_over_limit = 0;
    refused_no_descriptors = 0;
    refused_per_peer = 0;
    max_connections = max;
    max_per_peer = peer_max;
    what = name;
    port = new_port;
  }
};

Guarded* Slots() {
  static Guarded* slots = new Guarded[kMaxGuarded];
  return slots;
}
// Ports guarded now; accept4 looks no further while it is 0.
std::atomic<int> guarded_ports{0};

// A descriptor kept open to be freed when the process runs out: it lets
// the guard accept (and close) connections that would otherwise wait.
absl::Mutex reserve_mu(absl::kConstInit);
int reserve_fd ABSL_GUARDED_BY(reserve_mu) = -1;

void OpenReserveLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(reserve_mu) {
  if (reserve_fd < 0) reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
}

int LocalPort(int fd) {
  sockaddr_storage addr;
  socklen_t len = sizeof(addr);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return 0;
  }
  if (addr.ss_family == AF_INET) {
    return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  }
  if (addr.ss_family == AF_INET6) {
    return ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
  }
  return 0;
}

Guarded* GuardFor(int listen_fd) {
  if (guarded_ports.load() == 0) return nullptr;
  const int port = LocalPort(listen_fd);
  if (port == 0) return nullptr;
  Guarded* slots = Slots();
  for (int i = 0; i < kMaxGuarded; ++i) {
    if (slots[i].port.load() == port) return &slots[i];
  }
  return nullptr;
}

// Out of descriptors: accepts and closes what is pending on `listen_fd`
// through the reserve, so that the backlog does not hold clients that can
// only time out; returns how many.
int64_t ShedPending(int listen_fd) {
  absl::MutexLock lock(&reserve_mu);
  if (reserve_fd >= 0) {
    close(reserve_fd);
    reserve_fd = -1;
  }
  int64_t shed = 0;
  for (int i = 0; i < 4096; ++i) {
    const int conn = CallRealAccept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) break;
    close(conn);
    ++shed;
  }
  OpenReserveLocked();
  return shed;
}

int GuardedAccept4(Guarded* guard, int listen_fd, sockaddr* addr,
                   socklen_t* len, int flags) {
  const socklen_t len_in = len != nullptr ? *len : 0;
  for (;;) {
    if (len != nullptr) *len = len_in;
    const int conn = CallRealAccept4(listen_fd, addr, len, flags);
    if (conn >= 0) {
      const std::string peer = addr != nullptr && len != nullptr
                                   ? PeerOf(addr, std::min(*len, len_in))
                                   : PeerOfDescriptor(conn);
      const Guarded::Verdict verdict = guard->Admit(conn, peer);
      if (verdict == Guarded::Verdict::kAdmitted) {
        guard->accepted.fetch_add(1);
        return conn;
      }
      close(conn);
      int64_t n = 0;
      if (verdict == Guarded::Verdict::kPortFull) {
        guard->refused_over_limit.fetch_add(1);
        if (guard->limit_log.Due(&n)) {
          spdlog::warn(
              "{} port {}: {} open, the most allowed (--max_connections): "
              "refused {} connection(s) since the last such message",
              guard->what.load(), guard->port.load(),
              guard->max_connections.load(), n);
        }
      } else {
        guard->refused_per_peer.fetch_add(1);
        if (guard->peer_log.Due(&n)) {
          spdlog::warn(
              "{} port {}: a peer holds {} connections, the most one host "
              "may (--max_connections_per_peer): refused {} connection(s) "
              "since the last such message",
              guard->what.load(), guard->port.load(),
              guard->max_per_peer.load(), n);
        }
      }
      continue;  // the next pending one, or EAGAIN
    }
    const int error = errno;
    switch (error) {
      case EAGAIN:
      case EINTR:
      case EBADF:
      case EINVAL:
      case ENOTSOCK:
      case EOPNOTSUPP:
        return -1;  // nothing pending, or the listener is being closed
      case ECONNABORTED:
        continue;  // a client gone before it was accepted
      case EMFILE:
      case ENFILE: {
        const int64_t shed = ShedPending(listen_fd);
        guard->refused_no_descriptors.fetch_add(shed);
        if (int64_t n = 0; guard->descriptor_log.Due(&n)) {
          struct rlimit limit {};
          getrlimit(RLIMIT_NOFILE, &limit);
          spdlog::error(
              "{} port {}: out of file descriptors ({}; limit {}): closed "
              "{} pending connection(s); the port accepts again once "
              "descriptors are free",
              guard->what.load(), guard->port.load(), std::strerror(error),
              static_cast<uint64_t>(limit.rlim_cur), shed);
        }
        errno = EAGAIN;
        return -1;
      }
      default:
        // ENOBUFS, ENOMEM, EPERM (a firewall), EPROTO: this connection
        // failed, the listener did not.
        errno = EAGAIN;
        return -1;
    }
  }
}

}  // namespace

void GuardListener(int port, int max_connections, int max_per_peer,
                   const char* what) {
  if (port <= 0) return;
  {
    absl::MutexLock lock(&reserve_mu);
    OpenReserveLocked();
  }
  Guarded* slots = Slots();
  Guarded* free_slot = nullptr;
  for (int i = 0; i < kMaxGuarded; ++i) {
    if (slots[i].port.load() == port) {
      slots[i].Reset(port, max_connections, max_per_peer, what);
      return;
    }
    if (free_slot == nullptr && slots[i].port.load() == 0) {
      free_slot = &slots[i];
    }
  }
  if (free_slot == nullptr) {
    spdlog::warn("{} port {}: not guarded (more than {} ports guarded)", what,
                 port, kMaxGuarded);
    return;
  }
  free_slot->Reset(port, max_connections, max_per_peer, what);
  guarded_ports.fetch_add(1);
}

void ReleaseListener(int port) {
  if (port <= 0) return;
  Guarded* slots = Slots();
  for (int i = 0; i < kMaxGuarded; ++i) {
    int expected = port;
    if (slots[i].port.compare_exchange_strong(expected, 0)) {
      guarded_ports.fetch_sub(1);
      return;
    }
  }
}

ListenerStats GuardedListenerStats(int port) {
  ListenerStats stats;
  Guarded* slots = Slots();
  for (int i = 0; i < kMaxGuarded; ++i) {
    Guarded& g = slots[i];
    if (port <= 0 || g.port.load() != port) continue;
    stats.accepted = g.accepted.load();
    stats.refused_over_limit = g.refused_over_limit.load();
    stats.refused_no_descriptors = g.refused_no_descriptors.load();
    stats.refused_per_peer = g.refused_per_peer.load();
    absl::MutexLock lock(&g.mu);
    if (absl::Now() - g.last_prune >= kPruneEvery) g.PruneLocked();
    stats.open = static_cast<int64_t>(g.open.size());
    break;
  }
  return stats;
}

bool ListenerGuardActive() {
  return dlsym(RTLD_DEFAULT, "accept4") == reinterpret_cast<void*>(&accept4) &&
         RealAccept4() != nullptr;
}

absl::StatusOr<OpenFileLimit> RaiseOpenFileLimit() {
  struct rlimit limit {};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) {
    return absl::InternalError(absl::StrCat("cannot read the open file limit: ",
                                            std::strerror(errno)));
  }
  OpenFileLimit out;
  out.before = limit.rlim_cur;
  out.hard = limit.rlim_max;
  if (limit.rlim_cur < limit.rlim_max) {
    struct rlimit raised = limit;
    raised.rlim_cur = limit.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &raised) != 0) {
      return absl::InternalError(
          absl::StrCat("cannot raise the open file limit from ", limit.rlim_cur,
                       " to ", limit.rlim_max, ": ", std::strerror(errno)));
    }
    limit = raised;
  }
  out.now = limit.rlim_cur;
  return out;
}

int ConnectionBudget(int max_connections, uint64_t open_file_limit) {
  const uint64_t share = open_file_limit / 4 * 3;
  const uint64_t bound = std::max<uint64_t>(
      1,
      max_connections > 0 ? std::min<uint64_t>(max_connections, share) : share);
  return static_cast<int>(
      std::min<uint64_t>(bound, std::numeric_limits<int>::max()));
}

}  // namespace tessera

// The process's accept4 (see listener_guard.h): guarded ports go through
// the guard, everything else straight to libc.
extern "C" int accept4(int fd, sockaddr* addr, socklen_t* len, int flags) {
  tessera::Guarded* guard = tessera::GuardFor(fd);
  if (guard == nullptr) return tessera::CallRealAccept4(fd, addr, len, flags);
  return tessera::GuardedAccept4(guard, fd, addr, len, flags);
}
