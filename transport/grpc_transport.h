// The host data plane over gRPC: read a sub-box of a remote shard as a
// stream of bounded row-major chunks (or one unary call when it fits one
// message), or write a whole shard. GrpcTransport is the ShardTransport over
// these functions, used by the client (gather, region fetch, put) and by
// workers (pulling reshard pieces), so both move bytes the same way.
// Everything here is thread-safe; run one call per stream and as many
// streams in parallel as there are peers.
//
// Reads skip protobuf's string copies: responses arrive as grpc::ByteBuffer
// slices and the ReadRegionResponse wire format is walked in place, so each
// byte is copied once, from the receive buffer into the sink's destination.
#ifndef TESSERA_TRANSPORT_GRPC_TRANSPORT_H_
#define TESSERA_TRANSPORT_GRPC_TRANSPORT_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "core/box.h"
#include "core/limits.h"
#include "proto/worker.grpc.pb.h"
#include "rpc/channel.h"
#include "transport/shard_transport.h"
#include "transport/small_read_coalescer.h"

namespace tessera {

// Receives bytes [byte_offset, byte_offset + data.size()) of the row-major
// sub-box. Calls arrive in order and each covers whole elements (a multiple
// of the item size); one message may arrive in several calls.
using ChunkSink =
    std::function<absl::Status(int64_t byte_offset, absl::string_view data)>;

// Reads `box` (in the shard's own coordinates) of shard `shard_id`, whose
// elements are `item_bytes` wide, from the worker behind `channel` into
// `sink`: one unary call up to kChunkBytes, a stream of chunks beyond.
// INVALID_ARGUMENT when RegionBytes refuses the box or item size; DATA_LOSS
// when the stream ends early or a chunk falls outside the box's bytes
// (RegionReceiver). `context_text` prefixes errors ("reading shard 3 of
// 'emb' from w1"). `capability` is presented to the worker (core/capability.h).
absl::Status ReadRegion(const std::shared_ptr<grpc::Channel>& channel,
                        uint64_t shard_id, const Box& box, int64_t item_bytes,
                        absl::Duration timeout, const ChunkSink& sink,
                        absl::string_view context_text,
                        absl::string_view capability = {});

// Produces one outgoing chunk: fills `dst` with bytes
// [byte_offset, byte_offset + dst.size()) of the shard's row-major contents.
using ChunkSource =
    std::function<void(int64_t byte_offset, absl::Span<char> dst)>;

// Streams `size` bytes, produced chunk by chunk (kChunkBytes each) by
// `source`, as the full contents of shard `shard_id`. Each byte is copied once,
// straight into the outgoing message.
// With `part`, the bytes are those of that sub-box of the shard (shard
// coordinates), the rest of the shard left as it is.
absl::Status WriteShard(v1::Worker::StubInterface* stub, uint64_t shard_id,
                        int64_t size, const ChunkSource& source,
                        absl::Duration timeout, absl::string_view context_text,
                        absl::string_view capability = {},
                        const Box* part = nullptr);

// Writes the whole of `shard` (its shape, element size, shard id and
// capability) from `source` with WriteShard over `channel`.
absl::Status WriteWholeShard(const std::shared_ptr<grpc::Channel>& channel,
                             const RemoteShard& shard,
                             const WriteSource& source, absl::Duration timeout);

// Serializes a ReadRegionResponse whose `data` is the concatenation of
// `data` (slices that may point into a shard's memory: no copy is made) into
// `out`, in the wire format protobuf itself would produce.
void EncodeRegionChunk(int64_t offset, std::vector<grpc::Slice> data,
                       grpc::ByteBuffer* out);

// The inverse, without copying: `offset` and the byte ranges of `data` as
// they lie in `buffer`'s slices. The views stay valid while `slices` lives.
struct RegionChunkView {
  int64_t offset = 0;
  std::vector<grpc::Slice> slices;      // keeps the views alive
  std::vector<absl::string_view> data;  // the payload, in order
  int64_t size = 0;                     // total payload bytes
};
absl::StatusOr<RegionChunkView> DecodeRegionChunk(grpc::ByteBuffer* buffer);

// Largest element size a read handles (an element split across two slices
// is joined in a buffer of this size). Every dtype is far smaller.
inline constexpr int64_t kMaxItemBytes = 64;

// The byte size of `box` of `item_bytes`-wide elements, checked before a
// read asks for it: INVALID_ARGUMENT when the item size is not in
// [1, kMaxItemBytes], the box's offsets and sizes differ in rank, a size is
// negative, or the count or byte size overflows.
absl::StatusOr<int64_t> RegionBytes(const Box& box, int64_t item_bytes);

// The receiving side of a region read, without the network: checks every
// message a worker sends against the `total_bytes` of the requested box
// (each must continue the stream where the last ended, fit in what is left,
// and hold whole elements) and hands its payload to `sink` in whole
// elements. A message that does not fit is DATA_LOSS, and no byte outside
// [0, total_bytes) ever reaches the sink. ReadRegion runs every message of
// a read through one; fuzz/pull_reply_fuzzer.cc feeds one arbitrary bytes.
// `sink` is not copied and must outlive this. Not thread-safe: one per
// stream.
class RegionReceiver {
 public:
  // REQUIRES: total_bytes == RegionBytes(box, item_bytes) of the read.
  RegionReceiver(int64_t total_bytes, int64_t item_bytes, const ChunkSink& sink)
      : total_(total_bytes), item_(item_bytes), sink_(sink) {}

  // Takes the next message of the stream (a ReadRegionResponse).
  absl::Status Receive(grpc::ByteBuffer* message);
  // Takes the one message of a unary reply, which must hold all
  // `total_bytes`: a reply short or long is DATA_LOSS before any byte
  // reaches the sink, so a read asked again after it lands each byte once.
  absl::Status ReceiveWhole(grpc::ByteBuffer* message);
  // OK once all `total_bytes` arrived, else DATA_LOSS naming how many did.
  absl::Status Finish() const;
  int64_t received() const { return received_; }

 private:
  const int64_t total_;
  const int64_t item_;
  const ChunkSink& sink_;
  int64_t received_ = 0;
};

// The sink through which GrpcTransport::Read places the bytes of the
// row-major `box` (shard coordinates) into `target`. The three are
// referenced, not copied: they must outlive the sink.
ChunkSink SinkToTarget(const Box& box, int64_t item_bytes,
                       const ReadTarget& target);

struct GrpcTransportOptions {
  // Deadline of one read or write stream.
  absl::Duration timeout = absl::Minutes(30);
  // Calls of small reads (up to kChunkBytes) of one tensor version kept in
  // flight to one worker; reads past them wait and go out together, several
  // to a call (SmallReadCoalescer). 0: every read is its own call at once.
  // One measured best (bench/ figure 2, 16 callers of 4 KiB: 0.81-0.98x of
  // the echo reference's QPS, median 0.88x, against 0.78-0.81x with two and
  // 0.74-0.75x without coalescing).
  int small_reads_in_flight = 1;
};

// ShardTransport over the Worker service's ReadRegion / ReadSmallRegion /
// WriteShard calls: reaches any worker, so it ends every TransportChain.
// Never answers FAILED_PRECONDITION of its own. Thread-safe.
class GrpcTransport : public ShardTransport {
 public:
  // `channels` (not owned, outlives this) gives one channel per worker.
  GrpcTransport(ChannelCache* channels, GrpcTransportOptions options);

  const std::string& name() const override;
  absl::Status Read(const RemoteShard& shard, const Box& box,
                    const ReadTarget& target) override;
  absl::Status Write(const RemoteShard& shard,
                     const WriteSource& source) override;
  // Worker.ReadRows calls of up to kMaxChunkBytes and kMaxRowsPerRead rows
  // each; a row larger than kMaxChunkBytes is streamed by itself.
  absl::Status ReadRows(absl::Span<const ShardRows> entries,
                        const RowSink& sink) override;
  absl::Status WriteBox(const RemoteShard& shard, const Box& box,
                        const WriteSource& source) override;

  // Calls that carried more than one small read, over every worker.
  int64_t coalesced_calls();
  // Workers with a coalescer kept, and small reads waiting for a place in
  // one (for tests).
  size_t coalescers();
  int waiting_small_reads();

 private:
  // Sends one coalescer call: one read (ReadRegion), or several of one
  // worker, capability and element size (Worker.ReadSmallRegions).
  absl::Status SendSmallReads(absl::Span<SmallRead* const> reads);
  // The coalescer of small reads of the worker at `address`.
  std::shared_ptr<SmallReadCoalescer> CoalescerFor(const std::string& address);

  ChannelCache* const channels_;
  const GrpcTransportOptions options_;
  absl::Mutex mu_;
  // One per worker with small reads out; idle ones go when another
  // worker's is made (workers come and go over a long life).
  absl::flat_hash_map<std::string, std::shared_ptr<SmallReadCoalescer>>
      coalescers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera

#endif  // TESSERA_TRANSPORT_GRPC_TRANSPORT_H_
