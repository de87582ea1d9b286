// The headers nearly every source of the fuzz build parses, precompiled
// once per set of flags by fuzz/build.sh and read by every compile
// (-include-pch): most of a source's compile time is spent parsing these.
// Only what Debian installs and the generated protocol headers (built again
// when a .proto changes); none of tessera's own headers, which change far
// more often.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "grpcpp/grpcpp.h"
#include "proto/coordinator.grpc.pb.h"
#include "proto/data.pb.h"
#include "proto/health.grpc.pb.h"
#include "proto/metadata.pb.h"
#include "proto/tensor.pb.h"
#include "proto/ucx.grpc.pb.h"
#include "proto/worker.grpc.pb.h"
#include "spdlog/spdlog.h"
