#include "ops/credential_watch.h"

#include <sys/stat.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "rpc/security.h"
#include "spdlog/spdlog.h"

namespace tessera {
namespace {

std::string When(absl::Time t) {
  return absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", t, absl::UTCTimeZone());
}

std::string HowLong(absl::Duration d) {
  if (d >= absl::Hours(48)) {
    return absl::StrFormat("%.1f days", absl::ToDoubleHours(d) / 24);
  }
  return absl::FormatDuration(absl::Trunc(d, absl::Seconds(1)));
}

}  // namespace

CredentialWatch::CredentialWatch(CredentialWatchOptions options)
    : options_(std::move(options)) {}

CredentialWatch::~CredentialWatch() {
  stop_.Notify();
  if (thread_.joinable()) thread_.join();
}

CredentialWatch::Stamp CredentialWatch::StampOf(const std::string& path) {
  Stamp stamp;
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return stamp;  // missing: all -1/0
  stamp.inode = st.st_ino;
  stamp.size = st.st_size;
  stamp.mtime_ns = int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
  stamp.ctime_ns = int64_t{st.st_ctim.tv_sec} * 1000000000 + st.st_ctim.tv_nsec;
  return stamp;
}

void CredentialWatch::WatchCertificate(std::string path,
                                       std::vector<std::string> related,
                                       std::function<void()> on_change) {
  Watched w;
  w.paths.push_back(path);
  for (std::string& p : related) w.paths.push_back(std::move(p));
  for (const std::string& p : w.paths) w.stamps.push_back(StampOf(p));
  w.on_change = std::move(on_change);
  absl::MutexLock lock(&mu_);
  certificate_ = std::move(path);
  watched_.push_back(std::move(w));
}

void CredentialWatch::WatchFile(std::string path,
                                std::function<void()> on_change) {
  Watched w;
  w.stamps.push_back(StampOf(path));
  w.paths.push_back(std::move(path));
  w.on_change = std::move(on_change);
  absl::MutexLock lock(&mu_);
  watched_.push_back(std::move(w));
}

void CredentialWatch::AddMetrics(MetricsRegistry* registry) {
  registry->AddCollector([this](MetricsRegistry& m) {
    const std::optional<absl::Time> not_after = certificate_not_after();
    if (!not_after.has_value()) return;
    m.Gauge("tessera_tls_certificate_expiry_seconds",
            "Seconds until this daemon's TLS certificate (--tls_cert as it "
            "is on disk now) expires; negative once it has.")
        ->Set(absl::ToDoubleSeconds(*not_after - options_.clock()));
  });
}

void CredentialWatch::Start() {
  {
    absl::MutexLock round(&round_mu_);
    ReadCertificate(/*changed=*/false);
  }
  if (options_.interval <= absl::ZeroDuration()) return;
  thread_ = std::thread([this] {
    while (!stop_.WaitForNotificationWithTimeout(options_.interval)) {
      CheckNow();
    }
  });
}

void CredentialWatch::CheckNow() {
  absl::MutexLock round(&round_mu_);
  std::vector<std::function<void()>> due;
  bool certificate_changed = false;
  {
    absl::MutexLock lock(&mu_);
    for (Watched& w : watched_) {
      bool changed = false;
      for (size_t i = 0; i < w.paths.size(); ++i) {
        Stamp now = StampOf(w.paths[i]);
        if (!(now == w.stamps[i])) {
          w.stamps[i] = now;
          changed = true;
        }
      }
      if (!changed) continue;
      if (w.on_change) due.push_back(w.on_change);
      if (!certificate_.empty() && w.paths[0] == certificate_) {
        certificate_changed = true;
      }
    }
  }
  // Outside the lock: a callback reads files and logs.
  for (const std::function<void()>& on_change : due) on_change();
  ReadCertificate(certificate_changed);
}

void CredentialWatch::ReadCertificate(bool changed) {
  std::string path;
  {
    absl::MutexLock lock(&mu_);
    path = certificate_;
  }
  if (path.empty()) return;
  absl::StatusOr<CertificateInfo> info = ReadCertificateInfo(path);
  if (!info.ok()) {
    if (changed) {
      spdlog::error(
          "TLS certificate {} changed on disk but cannot be read ({}); new "
          "connections fail until it is fixed",
          path, std::string(info.status().message()));
    }
    return;
  }
  const absl::Time now = options_.clock();
  const absl::Duration left = info->not_after - now;
  bool tell = false;
  bool warn = false;
  {
    absl::MutexLock lock(&mu_);
    tell = changed || !not_after_.has_value();
    not_after_ = info->not_after;
    if (left > options_.warn_before) {
      last_warning_.reset();
    } else if (changed || !last_warning_.has_value() ||
               now - *last_warning_ >= options_.warn_every) {
      last_warning_ = now;
      warn = true;
    }
  }
  if (tell) {
    spdlog::info("TLS certificate {}{}: {}, valid until {} ({} left)", path,
                 changed ? " changed on disk; new connections use it" : "",
                 info->subject, When(info->not_after),
                 left > absl::ZeroDuration() ? HowLong(left) : "none");
  }
  if (!warn) return;
  const std::string renew =
      absl::StrCat("write a renewed certificate (same CA) over ", path,
                   options_.interval > absl::ZeroDuration()
                       ? absl::StrCat(": it is read again within ",
                                      absl::FormatDuration(options_.interval),
                                      ", without a restart")
                       : std::string(" and restart (--reload_interval=0)"));
  if (left <= absl::ZeroDuration()) {
    spdlog::error(
        "TLS certificate {} ({}) expired at {}: peers refuse new connections "
        "to and from this daemon; {}",
        path, info->subject, When(info->not_after), renew);
  } else {
    spdlog::warn("TLS certificate {} ({}) expires in {}, at {}; {}", path,
                 info->subject, HowLong(left), When(info->not_after), renew);
  }
}

std::optional<absl::Time> CredentialWatch::certificate_not_after() const {
  absl::MutexLock lock(&mu_);
  return not_after_;
}

}  // namespace tessera
