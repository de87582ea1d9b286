// What every daemon tells Prometheus about itself: which build it is
// (tessera_build_info) and the standard process_* series that Prometheus'
// client libraries export (CPU, memory, file descriptors, threads, start
// time), read from /proc at each scrape.
#ifndef TESSERA_OPS_PROCESS_METRICS_H_
#define TESSERA_OPS_PROCESS_METRICS_H_

#include <string>

#include "core/metrics.h"

namespace tessera {

// `daemon`: "coordinator" or "worker" (a label of tessera_build_info).
void AddProcessMetrics(MetricsRegistry* registry, const std::string& daemon);

}  // namespace tessera

#endif  // TESSERA_OPS_PROCESS_METRICS_H_
