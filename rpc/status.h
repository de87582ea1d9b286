// Maps between absl::Status (used everywhere inside tessera) and grpc::Status
// (used only at the service edge). The canonical codes are identical, so the
// mapping is 1:1 and checked at compile time in status.cc.
#ifndef TESSERA_RPC_STATUS_H_
#define TESSERA_RPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace tessera {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace tessera

#endif  // TESSERA_RPC_STATUS_H_
