// CredentialWatch: a daemon's eye on the files its identity lives in, so
// that a renewed certificate or a rotated token takes effect without a
// restart (a restarted worker drops the shards it holds).
//
// Every `interval` one thread looks whether each watched file changed on
// disk (its inode, size, modification or change time; a Kubernetes Secret
// update swaps the files behind a symlink, which shows as a new inode) and
// calls that file's callback when it did. It also reads the daemon's own
// certificate (--tls_cert) as it is on disk now: its expiry is exported as
// tessera_tls_certificate_expiry_seconds, and the log warns when it is
// within `warn_before` (again every `warn_every` while it stays so) and
// says so as an error once it has expired. The TLS files themselves are
// reloaded by gRPC (rpc/security.h WatchTlsFiles); this only reports.
//
// Thread-safe. Watches are added before Start.
#ifndef TESSERA_OPS_CREDENTIAL_WATCH_H_
#define TESSERA_OPS_CREDENTIAL_WATCH_H_

#include <sys/types.h>

#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/metrics.h"

namespace tessera {

struct CredentialWatchOptions {
  absl::Duration interval = absl::Seconds(30);
  absl::Duration warn_before = absl::Hours(7 * 24);
  absl::Duration warn_every = absl::Hours(24);
  std::function<absl::Time()> clock = [] { return absl::Now(); };
};

class CredentialWatch {
 public:
  explicit CredentialWatch(CredentialWatchOptions options = {});
  // Stops the thread (a round in progress finishes first).
  ~CredentialWatch();
  CredentialWatch(const CredentialWatch&) = delete;
  CredentialWatch& operator=(const CredentialWatch&) = delete;

  // The daemon's own certificate: its expiry is reported (metric, log).
  // `on_change` runs when the file (or one of `related`: the key, the CA)
  // changed; it may be empty.
  void WatchCertificate(std::string path, std::vector<std::string> related,
                        std::function<void()> on_change)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Calls `on_change` each time `path` changed on disk.
  void WatchFile(std::string path, std::function<void()> on_change)
      ABSL_LOCKS_EXCLUDED(mu_);
  // tessera_tls_certificate_expiry_seconds, when a certificate is watched.
  void AddMetrics(MetricsRegistry* registry);

  // Reads the certificate once (and logs what it says), then checks every
  // `interval` on a thread of its own.
  void Start() ABSL_LOCKS_EXCLUDED(mu_);
  // One round now, on the caller's thread.
  void CheckNow() ABSL_LOCKS_EXCLUDED(mu_);

  // The expiry of the certificate as last read (nullopt: none read).
  std::optional<absl::Time> certificate_not_after() const
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Stamp {
    ino_t inode = 0;
    off_t size = -1;
    int64_t mtime_ns = -1;
    int64_t ctime_ns = -1;
    bool operator==(const Stamp& o) const {
      return inode == o.inode && size == o.size && mtime_ns == o.mtime_ns &&
             ctime_ns == o.ctime_ns;
    }
  };
  struct Watched {
    std::vector<std::string> paths;
    std::vector<Stamp> stamps;
    std::function<void()> on_change;
  };
  static Stamp StampOf(const std::string& path);
  // Reads the certificate, updates the expiry, logs what is due.
  void ReadCertificate(bool changed) ABSL_LOCKS_EXCLUDED(mu_);

  const CredentialWatchOptions options_;
  absl::Notification stop_;
  std::thread thread_;
  // Serializes rounds (the thread's and CheckNow's).
  absl::Mutex round_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable absl::Mutex mu_;
  std::vector<Watched> watched_ ABSL_GUARDED_BY(mu_);
  std::string certificate_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Time> not_after_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Time> last_warning_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera

#endif  // TESSERA_OPS_CREDENTIAL_WATCH_H_
