// write(2) until every byte is written, for the files a worker writes
// (checkpoints, --store_dir records).
#ifndef TESSERA_WORKER_WRITE_FULLY_H_
#define TESSERA_WORKER_WRITE_FULLY_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace tessera {

// Writes all of `bytes` to `fd` (retrying short writes and EINTR). A full
// disk or quota is RESOURCE_EXHAUSTED "<what>: the disk is full"; any other
// failure INTERNAL "<what>: write: <strerror>".
absl::Status WriteFully(int fd, absl::string_view bytes,
                        absl::string_view what);

}  // namespace tessera

#endif  // TESSERA_WORKER_WRITE_FULLY_H_
