#include "ops/process_metrics.h"

#include <dirent.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "ops/version.h"

namespace tessera {
namespace {

std::string ReadFile(const char* path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The fields of /proc/self/stat after the command name, from field 3
// (state) on: fields[0] is field 3.
std::vector<std::string> StatFields() {
  const std::string stat = ReadFile("/proc/self/stat");
  const size_t close = stat.rfind(')');
  if (close == std::string::npos || close + 2 > stat.size()) return {};
  return absl::StrSplit(stat.substr(close + 2), ' ', absl::SkipEmpty());
}

double Field(const std::vector<std::string>& fields, size_t number) {
  double value = 0;
  if (number >= 3 && number - 3 < fields.size()) {
    (void)absl::SimpleAtod(fields[number - 3], &value);
  }
  return value;
}

// Seconds since the epoch at boot (/proc/stat "btime").
double BootTime() {
  std::istringstream in(ReadFile("/proc/stat"));
  std::string line;
  while (std::getline(in, line)) {
    double value = 0;
    if (line.rfind("btime ", 0) == 0 &&
        absl::SimpleAtod(line.substr(6), &value))
      return value;
  }
  return 0;
}

int OpenFds() {
  int count = 0;
  if (DIR* dir = opendir("/proc/self/fd")) {
    while (dirent* entry = readdir(dir)) count += entry->d_name[0] != '.';
    closedir(dir);
    --count;  // the directory's own descriptor
  }
  return count;
}

}  // namespace

void AddProcessMetrics(MetricsRegistry* registry, const std::string& daemon) {
  registry
      ->Gauge("tessera_build_info",
              "Always 1; the labels say which build this daemon runs.",
              {{"daemon", daemon},
               {"version", kVersion},
               {"wire_protocol", kWireProtocol}})
      ->Set(1);
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
  const double boot = BootTime();
  registry->AddCollector([ticks, page, boot](MetricsRegistry& m) {
    const std::vector<std::string> stat = StatFields();
    // Fields (proc(5)): 20 num_threads, 22 starttime, 23 vsize, 24 rss
    // (pages).
    // The process's CPU clock, not /proc's utime + stime: those count 10 ms
    // ticks, so a daemon that just started reads 0.
    timespec cpu{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu);
    m.Counter("process_cpu_seconds_total",
              "User and system CPU time spent, in seconds.")
        ->Set(static_cast<double>(cpu.tv_sec) + cpu.tv_nsec / 1e9);
    m.Gauge("process_resident_memory_bytes", "Resident memory size in bytes.")
        ->Set(Field(stat, 24) * page);
    m.Gauge("process_virtual_memory_bytes", "Virtual memory size in bytes.")
        ->Set(Field(stat, 23));
    m.Gauge("process_threads", "Threads of this process.")
        ->Set(Field(stat, 20));
    m.Gauge("process_start_time_seconds",
            "Start time of the process since the Unix epoch, in seconds.")
        ->Set(boot + Field(stat, 22) / ticks);
    m.Gauge("process_open_fds", "Open file descriptors.")
        ->Set(static_cast<double>(OpenFds()));
    rlimit limit{};
    if (getrlimit(RLIMIT_NOFILE, &limit) == 0) {
      m.Gauge("process_max_fds", "The most open file descriptors allowed.")
          ->Set(static_cast<double>(limit.rlim_cur));
    }
  });
}

}  // namespace tessera
