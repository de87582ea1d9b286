// ShardTransport: the one interface that moves shard bytes between
// processes. It reads a box of a remote shard into a destination, writes a
// host array into a remote shard, and moves a batch of pieces between two
// workers. Shared memory (same host) and gRPC (everywhere) implement it;
// TransportChain picks among them, falls back and counts bytes. Clients
// (gather, fetch, put) and workers (reshard pulls) all move bytes through it.
//
// Error contract, the same for every implementation (transport_contract_test.h
// checks it):
//   FAILED_PRECONDITION  this transport cannot do it from here (another host,
//                        memory not shared, feature missing): try another.
//   NOT_FOUND            the shard is not held by the worker (freed).
//   UNAVAILABLE          the worker cannot be reached.
//   anything else        the worker's own answer (OUT_OF_RANGE, ...).
// Implementations are thread-safe: one object serves concurrent calls.
#ifndef TESSERA_TRANSPORT_SHARD_TRANSPORT_H_
#define TESSERA_TRANSPORT_SHARD_TRANSPORT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/box.h"
#include "core/tensor_metadata.h"
#include "core/transfer.h"

namespace tessera {

// Receives elements [first, first + count) of the box being read, in
// row-major order over the box, from `data` (count whole elements). Calls
// arrive in order, never overlap, and together cover the box.
using ElementSink =
    std::function<absl::Status(int64_t first, int64_t count, const char* data)>;

// Counters that bytes are added to as they move (progress): a caller's and
// a transport chain's. A small value; the counters must outlive its use.
class ProgressCounters {
 public:
  // These counters and `counter` too (at most two in all; a third is
  // ignored).
  ProgressCounters With(std::atomic<int64_t>* counter) const {
    ProgressCounters more = *this;
    for (auto*& slot : more.counters_) {
      if (slot == nullptr) {
        slot = counter;
        break;
      }
    }
    return more;
  }
  void Add(int64_t bytes) const {
    for (auto* counter : counters_) {
      if (counter != nullptr)
        counter->fetch_add(bytes, std::memory_order_relaxed);
    }
  }

 private:
  std::atomic<int64_t>* counters_[2] = {nullptr, nullptr};
};

// Where the bytes of a read land: a row-major host array, the box landing at
// `offsets` of an array of `shape` (the caller keeps the memory alive and has
// checked that the box fits), or, for memory the host cannot address, a
// sink receiving flat element ranges. A small value; copyable.
class ReadTarget {
 public:
  static ReadTarget HostArray(char* data, absl::Span<const int64_t> shape,
                              absl::Span<const int64_t> offsets);
  static ReadTarget Sink(ElementSink sink);

  bool is_host_array() const { return sink_ == nullptr; }
  // Host array only.
  char* data() const { return data_; }
  const Shape& shape() const { return shape_; }
  const std::vector<int64_t>& offsets() const { return offsets_; }

  // Places elements [first, first + count) of the row-major box of
  // `box_sizes` from the contiguous `src`: into the array, or to the sink.
  // Counts them as landed.
  absl::Status Deliver(absl::Span<const int64_t> box_sizes, int64_t first,
                       int64_t count, const char* src, size_t item) const;

  // Progress: the same target, also counting the bytes that land into
  // `landed` (which must outlive the read) as they land; a caller's counter
  // and a transport chain's can both count. A transport that writes a host
  // array itself, not through Deliver, calls Landed after each part.
  ReadTarget CountingInto(std::atomic<int64_t>* landed) const;
  void Landed(int64_t bytes) const { landed_.Add(bytes); }

 private:
  ReadTarget() = default;

  char* data_ = nullptr;
  Shape shape_;
  std::vector<int64_t> offsets_;
  ElementSink sink_;
  ProgressCounters landed_;
};

// What a write sends: the box at `offsets` of the row-major host array
// `data` of `shape`, whose sizes are the destination shard's (a put sends
// each shard's box of the whole tensor).
struct WriteSource {
  const char* data = nullptr;
  Shape shape;
  std::vector<int64_t> offsets;
  // Progress: bytes counted as they leave (transports call Sent after each
  // part), into each counter given (ProgressCounters::With).
  ProgressCounters sent;

  void Sent(int64_t bytes) const { sent.Add(bytes); }
};

// A shard as a transport addresses it.
struct RemoteShard {
  ShardLocation location;  // the worker, its address, the shard's id there
  int64_t item_bytes = 1;  // element size of the shard's dtype
  // The shard's box sizes from the metadata. Required to write; for a read,
  // a transport that maps the shard's memory checks it against what it
  // finds. Empty: not known (a worker pulling a reshard piece).
  Shape shape;
};

// Whole rows (dim 0, shard coordinates) of one shard, for ReadRows.
struct ShardRows {
  RemoteShard shard;  // shard.shape required: it gives the row size
  std::vector<int64_t> rows;
};

// Receives row `k` of entry `entry` of a ReadRows call: the row's bytes,
// whole, valid only during the call. Calls may come in any order, from one
// thread at a time; a row may be delivered again after a fallback.
using RowSink =
    std::function<void(size_t entry, size_t k, const char* row_bytes)>;

// Bytes of one whole row (dim 0) of a shard of `shape`; 0 for a 0-d shape.
int64_t RowBytes(absl::Span<const int64_t> shape, int64_t item_bytes);

// Where one piece of a transfer lands on the receiving worker.
struct PieceTarget {
  ReadTarget target;
  int64_t item_bytes = 1;
  std::shared_ptr<void> keep_alive;  // keeps the target's memory valid
};

// The receiving end of a transfer: the worker that holds the destination
// shards. Thread-safe if the transport calls it from several threads.
class TransferReceiver {
 public:
  virtual ~TransferReceiver() = default;
  // Where `piece` lands. NOT_FOUND when its destination shard is not held
  // here; OUT_OF_RANGE when the piece lies outside it.
  virtual absl::StatusOr<PieceTarget> TargetFor(const TransferPiece& piece) = 0;
};

class ShardTransport {
 public:
  virtual ~ShardTransport() = default;

  // Short name for counters and reports ("shm", "grpc").
  virtual const std::string& name() const = 0;

  // Reads `box` (in the shard's own coordinates) of `shard` into `target`.
  // An empty box still checks that the shard is held.
  virtual absl::Status Read(const RemoteShard& shard, const Box& box,
                            const ReadTarget& target) = 0;

  // Writes the whole of `shard` (shard.shape required) from `source`.
  virtual absl::Status Write(const RemoteShard& shard,
                             const WriteSource& source) = 0;

  // Reads whole rows of several shards that one worker holds, each row
  // handed to `sink`, in as few calls as the transport can (never one per
  // row): a row gather's share of that worker. The default declines
  // (FAILED_PRECONDITION).
  virtual absl::Status ReadRows(absl::Span<const ShardRows> entries,
                                const RowSink& sink);

  // Writes sub-box `box` (shard coordinates) of `shard` from `source`,
  // whose sizes are the box's: a regional update's patch of a shard whose
  // other bytes are already in place. The default declines
  // (FAILED_PRECONDITION).
  virtual absl::Status WriteBox(const RemoteShard& shard, const Box& box,
                                const WriteSource& source);

  // Moves every piece of `batch` from its source worker into destination
  // shards held by `receiver` (the batch's destination worker, the caller).
  // Returns the bytes moved. This default reads each piece from the source
  // with Read(); transports that need both ends to act (NCCL send/recv)
  // override it. Stops at the first failing piece.
  virtual absl::StatusOr<int64_t> Transfer(const TransferBatch& batch,
                                           TransferReceiver& receiver);
};

// One request of a row read: rows of shards of one worker, whose reply is
// every row, whole, in request order (`bytes` in all).
struct RowRequest {
  struct Shard {
    uint64_t shard_id = 0;
    std::vector<int64_t> rows;
  };
  std::vector<Shard> shards;
  int64_t bytes = 0;
};
// Sends one request; `reply` gets its bytes.
using RowRequestSender =
    std::function<absl::Status(const RowRequest& request, std::string* reply)>;

// A transport's ReadRows in requests a worker takes in one call each: at
// most kMaxRowsPerRead rows and kMaxChunkBytes bytes, and at most
// `max_shards` shards (0: no bound). A row larger than kMaxChunkBytes is
// read alone through `transport.Read`. A reply of other than the bytes
// asked for is DATA_LOSS, and no row of it is delivered.
absl::Status ReadRowsInRequests(ShardTransport& transport,
                                absl::Span<const ShardRows> entries,
                                const RowSink& sink, size_t max_shards,
                                const RowRequestSender& send);

}  // namespace tessera

#endif  // TESSERA_TRANSPORT_SHARD_TRANSPORT_H_
