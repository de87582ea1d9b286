// What the two ends of the UCX data plane share (transport/ucx_server.h on
// the worker, transport/ucx_transport.h in readers): the switch that turns
// UCX off, the UCP context and worker set-up, the liveness-check messages
// they exchange as active messages, and the planning of a box as runs of
// contiguous bytes. Everything here is thread-safe unless it says
// otherwise.
#ifndef TESSERA_TRANSPORT_UCX_COMMON_H_
#define TESSERA_TRANSPORT_UCX_COMMON_H_

#include <ucp/api/ucp.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/box.h"

namespace tessera {

// False when the environment turns UCX off: TESSERA_UCX set to 0, false,
// off or no. Read once per process.
bool UcxAllowedByEnvironment();

// `what` failed with `status`, as an absl::Status: UNAVAILABLE for the
// failures of a peer or the network, INTERNAL for the rest.
absl::Status UcxError(absl::string_view what, ucs_status_t status);

// A UCP context with one-sided access, active messages and wake-ups,
// shared by several threads' workers. `loopback_only`: its network devices
// are the loopback one alone (unless UCX_NET_DEVICES says otherwise), for a
// worker that serves loopback only.
absl::StatusOr<ucp_context_h> MakeUcpContext(absl::string_view name,
                                             bool loopback_only = false);

// A worker of `context` for one thread at a time, with an event fd for
// sleeping until it has work (ucp_worker_get_efd).
struct UcpWorker {
  ucp_worker_h worker = nullptr;
  int efd = -1;
};
absl::StatusOr<UcpWorker> MakeUcpWorker(ucp_context_h context);

// The worker's own address, to hand to peers.
absl::StatusOr<std::string> UcpWorkerAddress(ucp_worker_h worker);

// Active message ids and bodies of the liveness check: after its gets, a
// reader asks the worker whether the shard its key names is still held, so
// that a read of a shard freed meanwhile fails (NOT_FOUND) instead of
// returning bytes the worker no longer vouches for.
inline constexpr unsigned kUcxCheckAm = 17;
inline constexpr unsigned kUcxCheckReplyAm = 18;
// The same check for a staging lease (UcxData.Stage), which also ends the
// lease: the reader's gets of it are done. Answered with kUcxCheckReplyAm.
inline constexpr unsigned kUcxCheckReleaseAm = 19;
inline constexpr uint64_t kUcxCheckMagic = 0x7465737365726131;  // "tessera1"

struct UcxCheckRequest {
  uint64_t magic = kUcxCheckMagic;
  uint64_t request_id = 0;
  uint64_t shard_id = 0;
  uint64_t registration = 0;
};

enum class UcxCheckAnswer : uint32_t {
  kHeld = 0,   // the key is good and the shard held: the gets read it
  kFreed = 1,  // the shard was freed
  kStale = 2,  // the key was withdrawn (evicted, a finished write): ask again
};

struct UcxCheckReply {
  uint64_t magic = kUcxCheckMagic;
  uint64_t request_id = 0;
  uint32_t answer = 0;  // UcxCheckAnswer
  uint32_t reserved = 0;
};

// A read of one contiguous range of a shard into one contiguous range of
// the reader's: the reader posts a tagged receive of `bytes` bytes (tag
// `request_id`) and asks the worker to send the range. Over TCP, UCX
// emulates a get with 8 KiB active messages, while a tagged send of a large
// message goes as a rendezvous straight between the two buffers
// (ucx_perftest on loopback: 1.1 against 4.1 GB/s on one endpoint). The
// worker answers a refusal with kUcxCheckReplyAm (kFreed, kStale) and
// sends nothing; the reader checks the key as after gets once the bytes
// are in. Offered when UcxDescribeResponse.sends says so.
inline constexpr unsigned kUcxSendAm = 20;

struct UcxSendRequest {
  uint64_t magic = kUcxCheckMagic;
  uint64_t request_id = 0;  // the tag of the reader's receive
  uint64_t shard_id = 0;
  uint64_t registration = 0;  // the read key's
  uint64_t offset = 0;        // shard bytes [offset, offset + bytes)
  uint64_t bytes = 0;
};

// A box copied between two row-major arrays as runs of contiguous elements:
// the trailing dims that the box covers whole in both arrays merge into one
// run, so a box of whole rows is one run. Made once, then walked in flat
// ranges. A value.
class RunPlan {
 public:
  // REQUIRES: the box (sizes `box_sizes`) lies at `src_offsets` in
  // `src_shape` and at `dst_offsets` in `dst_shape`, all of one rank >= 1.
  RunPlan(absl::Span<const int64_t> box_sizes,
          absl::Span<const int64_t> src_shape,
          absl::Span<const int64_t> src_offsets,
          absl::Span<const int64_t> dst_shape,
          absl::Span<const int64_t> dst_offsets);

  int64_t run() const { return run_; }      // elements per run
  int64_t total() const { return total_; }  // elements of the box
  int64_t runs() const { return run_ > 0 ? total_ / run_ : 0; }

  // Calls fn(src_element, dst_element, flat, count) for the pieces of box
  // elements [begin, begin + count) in row-major order: each piece lies in
  // one run (it is cut where a run ends).
  void ForEach(int64_t begin, int64_t count,
               const std::function<void(int64_t src, int64_t dst, int64_t flat,
                                        int64_t n)>& fn) const;

 private:
  int64_t run_ = 0;
  int64_t total_ = 0;
  std::vector<int64_t> outer_sizes_;  // box sizes of the dims before the run
  std::vector<int64_t> src_strides_;  // elements per step of those dims
  std::vector<int64_t> dst_strides_;
  int64_t src_base_ = 0;  // element of the box's first element
  int64_t dst_base_ = 0;
};

}  // namespace tessera

#endif  // TESSERA_TRANSPORT_UCX_COMMON_H_
