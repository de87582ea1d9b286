#include "transport/ucx_common.h"

#include <ucs/debug/log_def.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace tessera {

namespace {

ucs_status_t DropMessage(void*, const void*, size_t, void*, size_t,
                         const ucp_am_recv_param_t*) {
  return UCS_OK;
}

// The value of environment variable `name` as a yes/no: `unset` when it is
// not set, else true unless it is 0, false, off or no.
bool EnvironmentSwitch(const char* name, bool unset) {
  const char* value = std::getenv(name);
  if (value == nullptr) return unset;
  const std::string v = absl::AsciiStrToLower(value);
  return !(v.empty() || v == "0" || v == "false" || v == "off" || v == "no");
}

// UCX's own log lines, through spdlog (stderr, or the daemon's log) instead
// of UCX's default handler, which prints to stdout: a CLI's stdout carries
// only data and --json. UCX's errors here are mostly a transport it could
// not use, which tessera then falls back from: warnings.
ucs_log_func_rc_t LogThroughSpdlog(const char* file, unsigned line, const char*,
                                   ucs_log_level_t level,
                                   const ucs_log_component_config_t*,
                                   const char* format, va_list ap) {
  // UCX calls handlers only for levels its UCX_LOG_LEVEL lets through.
  char message[1024];
  vsnprintf(message, sizeof(message), format, ap);
  const spdlog::level::level_enum to =
      level <= UCS_LOG_LEVEL_ERROR  ? spdlog::level::warn
      : level == UCS_LOG_LEVEL_WARN ? spdlog::level::info
      : level == UCS_LOG_LEVEL_INFO ? spdlog::level::debug
                                    : spdlog::level::trace;
  spdlog::log(to, "UCX ({}:{}): {}", file != nullptr ? file : "?", line,
              message);
  return UCS_LOG_FUNC_RC_STOP;
}

}  // namespace

void RouteUcxLogs() {
  static std::once_flag once;
  std::call_once(once, [] { ucs_log_push_handler(&LogThroughSpdlog); });
}

bool UcxAllowedByEnvironment() {
  static const bool allowed = EnvironmentSwitch("TESSERA_UCX", true);
  return allowed;
}

bool TrustedFabricByEnvironment() {
  static const bool trusted =
      EnvironmentSwitch("TESSERA_TRUSTED_FABRIC", false);
  return trusted;
}

absl::Status UcxError(absl::string_view what, ucs_status_t status) {
  const std::string message =
      absl::StrCat(what, ": ", ucs_status_string(status));
  switch (status) {
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_TIMED_OUT:
    case UCS_ERR_CANCELED:
    case UCS_ERR_REJECTED:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_IO_ERROR:
    case UCS_ERR_NO_RESOURCE:
    case UCS_ERR_BUSY:
    case UCS_ERR_SHMEM_SEGMENT:
      return absl::UnavailableError(message);
    case UCS_ERR_UNSUPPORTED:
    case UCS_ERR_NO_DEVICE:
      return absl::FailedPreconditionError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::StatusOr<ucp_context_h> MakeUcpContext(absl::string_view name,
                                             UcxReach reach) {
  RouteUcxLogs();
  ucp_config_t* config = nullptr;
  ucs_status_t status = ucp_config_read(nullptr, nullptr, &config);
  if (status != UCS_OK)
    return UcxError("reading the UCX configuration", status);
  auto modify = [&](const char* key, const char* value) {
    status = ucp_config_modify(config, key, value);
    return status == UCS_OK;
  };
  // Posix segments are attached through /proc, so UCX can tell a peer
  // died: exposing that lets endpoints on shared memory have peer-failure
  // handling, and only such an endpoint is destroyed when closed (UCX keeps
  // any other endpoint a peer connected, and what it maps of the peer,
  // until the worker goes).
  if (!modify("MM_ERROR_HANDLING", "y")) {
    ucp_config_release(config);
    return UcxError("letting UCX notice peers that die", status);
  }
  if (!reach.trusted_fabric) {
    // Whatever UCX_TLS says: no network transport reaches this process.
    if (!modify("TLS", kUcxSameHostTransports)) {
      ucp_config_release(config);
      return UcxError("keeping UCX on this host's shared memory", status);
    }
  } else if (reach.loopback_only && std::getenv("UCX_NET_DEVICES") == nullptr &&
             !modify("NET_DEVICES", "lo")) {
    ucp_config_release(config);
    return UcxError("keeping UCX on the loopback device", status);
  }
  const std::string context_name(name);
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES |
                      UCP_PARAM_FIELD_MT_WORKERS_SHARED | UCP_PARAM_FIELD_NAME;
  // No UCP_FEATURE_RMA (see ucx_common.h).
  params.features = UCP_FEATURE_AM | UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  params.mt_workers_shared = 1;
  params.name = context_name.c_str();
  ucp_context_h context = nullptr;
  status = ucp_init(&params, config, &context);
  ucp_config_release(config);
  if (status != UCS_OK) return UcxError("starting UCX (ucp_init)", status);
  return context;
}

absl::Status GuardMessageIds(ucp_worker_h worker, uint16_t last_id) {
  // UCX 1.13 leaves the handler slots it grows into uninitialised (but the
  // one registered) and reads a message id's slot before checking it: a
  // message with an id nobody registered calls through garbage. Each id
  // gets a handler that drops the message, in ascending order so each slot
  // is set after the table grows over it; the real handlers replace theirs.
  for (uint32_t id = 0; id <= last_id; ++id) {
    ucp_am_handler_param_t handler{};
    handler.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID |
                         UCP_AM_HANDLER_PARAM_FIELD_CB |
                         UCP_AM_HANDLER_PARAM_FIELD_ARG;
    handler.id = id;
    handler.cb = &DropMessage;
    handler.arg = nullptr;
    const ucs_status_t status =
        ucp_worker_set_am_recv_handler(worker, &handler);
    if (status != UCS_OK) {
      return UcxError("setting UCX's message handlers", status);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<UcpWorker> MakeUcpWorker(ucp_context_h context,
                                        uint16_t last_guarded_id) {
  ucp_worker_params_t params{};
  params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  params.thread_mode = UCS_THREAD_MODE_SINGLE;
  UcpWorker out;
  ucs_status_t status = ucp_worker_create(context, &params, &out.worker);
  if (status != UCS_OK) return UcxError("creating a UCX worker", status);
  status = ucp_worker_get_efd(out.worker, &out.efd);
  if (status != UCS_OK) {
    ucp_worker_destroy(out.worker);
    return UcxError("getting the UCX worker's event fd", status);
  }
  absl::Status guarded = GuardMessageIds(out.worker, last_guarded_id);
  if (!guarded.ok()) {
    ucp_worker_destroy(out.worker);
    return guarded;
  }
  return out;
}

absl::StatusOr<std::string> UcpWorkerAddress(ucp_worker_h worker) {
  ucp_worker_attr_t attr{};
  attr.field_mask = UCP_WORKER_ATTR_FIELD_ADDRESS;
  const ucs_status_t status = ucp_worker_query(worker, &attr);
  if (status != UCS_OK) return UcxError("querying the UCX address", status);
  std::string address(reinterpret_cast<const char*>(attr.address),
                      attr.address_length);
  ucp_worker_release_address(worker, attr.address);
  return address;
}

RunPlan::RunPlan(absl::Span<const int64_t> box_sizes,
                 absl::Span<const int64_t> src_shape,
                 absl::Span<const int64_t> src_offsets,
                 absl::Span<const int64_t> dst_shape,
                 absl::Span<const int64_t> dst_offsets) {
  const size_t rank = box_sizes.size();
  total_ = 1;
  for (int64_t s : box_sizes) total_ *= s;
  if (rank == 0 || total_ == 0) {
    run_ = total_ == 0 ? 0 : 1;
    return;
  }
  // Dims m.. form one run: every dim after m is whole in both arrays.
  size_t m = rank - 1;
  while (m > 0 && box_sizes[m] == src_shape[m] && box_sizes[m] == dst_shape[m])
    --m;
  run_ = 1;
  for (size_t d = m; d < rank; ++d) run_ *= box_sizes[d];
  std::vector<int64_t> src_stride(rank, 1), dst_stride(rank, 1);
  for (size_t d = rank - 1; d > 0; --d) {
    src_stride[d - 1] = src_stride[d] * src_shape[d];
    dst_stride[d - 1] = dst_stride[d] * dst_shape[d];
  }
  for (size_t d = 0; d < rank; ++d) {
    src_base_ += src_offsets[d] * src_stride[d];
    dst_base_ += dst_offsets[d] * dst_stride[d];
  }
  outer_sizes_.assign(box_sizes.begin(), box_sizes.begin() + m);
  src_strides_.assign(src_stride.begin(), src_stride.begin() + m);
  dst_strides_.assign(dst_stride.begin(), dst_stride.begin() + m);
}

void RunPlan::ForEach(
    int64_t begin, int64_t count,
    const std::function<void(int64_t, int64_t, int64_t, int64_t)>& fn) const {
  const int64_t end = std::min(total_, begin + count);
  for (int64_t f = begin; f < end;) {
    int64_t row = f / run_;
    const int64_t col = f % run_;
    int64_t src = src_base_ + col, dst = dst_base_ + col;
    for (size_t d = outer_sizes_.size(); d-- > 0;) {
      const int64_t index = row % outer_sizes_[d];
      row /= outer_sizes_[d];
      src += index * src_strides_[d];
      dst += index * dst_strides_[d];
    }
    const int64_t n = std::min(run_ - col, end - f);
    fn(src, dst, f, n);
    f += n;
  }
}

}  // namespace tessera
