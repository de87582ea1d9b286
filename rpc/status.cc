#include "rpc/status.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <limits>
#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/string_view.h"

namespace tessera {
namespace {

static_assert(static_cast<int>(absl::StatusCode::kOk) == grpc::StatusCode::OK);
static_assert(static_cast<int>(absl::StatusCode::kCancelled) ==
              grpc::StatusCode::CANCELLED);
static_assert(static_cast<int>(absl::StatusCode::kUnknown) ==
              grpc::StatusCode::UNKNOWN);
static_assert(static_cast<int>(absl::StatusCode::kInvalidArgument) ==
              grpc::StatusCode::INVALID_ARGUMENT);
static_assert(static_cast<int>(absl::StatusCode::kDeadlineExceeded) ==
              grpc::StatusCode::DEADLINE_EXCEEDED);
static_assert(static_cast<int>(absl::StatusCode::kNotFound) ==
              grpc::StatusCode::NOT_FOUND);
static_assert(static_cast<int>(absl::StatusCode::kAlreadyExists) ==
              grpc::StatusCode::ALREADY_EXISTS);
static_assert(static_cast<int>(absl::StatusCode::kPermissionDenied) ==
              grpc::StatusCode::PERMISSION_DENIED);
static_assert(static_cast<int>(absl::StatusCode::kResourceExhausted) ==
              grpc::StatusCode::RESOURCE_EXHAUSTED);
static_assert(static_cast<int>(absl::StatusCode::kFailedPrecondition) ==
              grpc::StatusCode::FAILED_PRECONDITION);
static_assert(static_cast<int>(absl::StatusCode::kAborted) ==
              grpc::StatusCode::ABORTED);
static_assert(static_cast<int>(absl::StatusCode::kOutOfRange) ==
              grpc::StatusCode::OUT_OF_RANGE);
static_assert(static_cast<int>(absl::StatusCode::kUnimplemented) ==
              grpc::StatusCode::UNIMPLEMENTED);
static_assert(static_cast<int>(absl::StatusCode::kInternal) ==
              grpc::StatusCode::INTERNAL);
static_assert(static_cast<int>(absl::StatusCode::kUnavailable) ==
              grpc::StatusCode::UNAVAILABLE);
static_assert(static_cast<int>(absl::StatusCode::kDataLoss) ==
              grpc::StatusCode::DATA_LOSS);
static_assert(static_cast<int>(absl::StatusCode::kUnauthenticated) ==
              grpc::StatusCode::UNAUTHENTICATED);

// A google.rpc.Status {code = 1, message = 2} in protobuf wire format.
std::string EncodeRpcStatus(int code, absl::string_view message) {
  std::string out;
  auto varint = [&out](uint64_t v) {
    while (v >= 0x80) {
      out.push_back(static_cast<char>((v & 0x7f) | 0x80));
      v >>= 7;
    }
    out.push_back(static_cast<char>(v));
  };
  out.push_back(0x08);
  varint(static_cast<uint64_t>(code));
  out.push_back(0x12);
  varint(message.size());
  out.append(message.data(), message.size());
  return out;
}

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  const int code = static_cast<int>(status.code());
  return grpc::Status(static_cast<grpc::StatusCode>(code),
                      std::string(status.message()),
                      EncodeRpcStatus(code, status.message()));
}

constexpr char kTransportFailureUrl[] = "tessera.dev/transport-failure";

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  absl::Status out(static_cast<absl::StatusCode>(status.error_code()),
                   status.error_message());
  if (IsTransportFailure(status))
    out.SetPayload(kTransportFailureUrl, absl::Cord());
  return out;
}

bool IsTransportFailure(const absl::Status& status) {
  return status.GetPayload(kTransportFailureUrl).has_value();
}

namespace {
// Nanoseconds since the Unix epoch; INT64_MAX: none.
std::atomic<int64_t> process_deadline_ns{std::numeric_limits<int64_t>::max()};
}  // namespace

void SetProcessDeadline(absl::Time deadline) {
  process_deadline_ns = deadline == absl::InfiniteFuture()
                            ? std::numeric_limits<int64_t>::max()
                            : absl::ToUnixNanos(deadline);
}

absl::Time ProcessDeadline() {
  const int64_t ns = process_deadline_ns.load(std::memory_order_relaxed);
  return ns == std::numeric_limits<int64_t>::max() ? absl::InfiniteFuture()
                                                   : absl::FromUnixNanos(ns);
}

void SetDeadline(grpc::ClientContext* context, absl::Duration timeout) {
  const absl::Time process = ProcessDeadline();
  if (process != absl::InfiniteFuture()) {
    timeout = std::max(absl::ZeroDuration(),
                       std::min(timeout, process - absl::Now()));
  }
  context->set_deadline(
      std::chrono::system_clock::now() +
      std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout)));
}

bool IsTransportFailure(const grpc::Status& status) {
  return (status.error_code() == grpc::StatusCode::UNAVAILABLE ||
          status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) &&
         status.error_details().empty();
}

absl::Status RetryTransportFailures(const std::function<absl::Status()>& call) {
  absl::Duration backoff = absl::Milliseconds(50);
  for (int attempt = 0;; ++attempt) {
    absl::Status status = call();
    if (!absl::IsUnavailable(status) || !IsTransportFailure(status) ||
        attempt == 2) {
      return status;
    }
    absl::SleepFor(backoff);
    backoff *= 3;
  }
}

}  // namespace tessera
