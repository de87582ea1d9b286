// ShardStore: where a worker keeps its shards' bytes. Host memory now; device
// memory (CUDA) sits behind the same interface, so the service never sees
// device specifics. Every implementation is safe for concurrent use, and a
// read that is running when its shard is freed finishes on the old bytes.
#ifndef TESSERA_WORKER_SHARD_STORE_H_
#define TESSERA_WORKER_SHARD_STORE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "core/box.h"
#include "core/dtype.h"
#include "core/init_fill.h"
#include "core/worker_info.h"

namespace tessera {

// A tensor's name as shards keep it: copies share one string, so the many
// shards of one allocation hold the name once (a request of 10^5 shards
// would otherwise keep 10^5 copies). Reads as a std::string.
class SharedName {
 public:
  SharedName() = default;
  SharedName(std::string name)  // NOLINT: implicit, as a string is
      : name_(std::make_shared<const std::string>(std::move(name))) {}
  SharedName(const char* name) : SharedName(std::string(name)) {}  // NOLINT

  const std::string& str() const { return name_ != nullptr ? *name_ : Empty(); }
  operator const std::string&() const { return str(); }  // NOLINT

  // Whether two names share one string (copies of one name do).
  bool SharesStorageWith(const SharedName& other) const {
    return name_ != nullptr && name_ == other.name_;
  }

  friend bool operator==(const SharedName& a, const SharedName& b) {
    return a.str() == b.str();
  }
  friend bool operator==(const SharedName& a, const std::string& b) {
    return a.str() == b;
  }
  friend bool operator==(const SharedName& a, const char* b) {
    return a.str() == b;
  }
  template <typename T>
  friend bool operator!=(const SharedName& a, const T& b) {
    return !(a == b);
  }

 private:
  static const std::string& Empty() {
    static const std::string* const kEmpty = new std::string();
    return *kEmpty;
  }
  std::shared_ptr<const std::string> name_;
};

// What a shard is: its tensor, element type, and box in the tensor.
struct ShardDesc {
  SharedName tensor;         // whose shard (capabilities name it)
  uint64_t version = 0;      // the tensor version it belongs to
  uint64_t incarnation = 0;  // the tensor's (capabilities name it)
  bool writable = false;     // a put's shard: its client may write it once
  // A writable shard's put or update: write capabilities must name it.
  uint64_t change = 0;
  // Every byte is copied in before anyone else can read the shard.
  bool filled_by_copies = false;
  DType dtype = DType::kFloat32;
  Shape tensor_shape;  // global shape
  Box box;             // the shard's box in the tensor

  int64_t NumElements() const { return box.NumElements(); }
  int64_t ByteSize() const {
    return box.NumElements() * static_cast<int64_t>(ItemSize(dtype));
  }
};

// A shard's bytes pinned in host memory: `keep_alive` keeps `data` valid
// after the shard is freed (a read in flight finishes on the old bytes).
struct PinnedShard {
  std::shared_ptr<void> keep_alive;
  // Keeps `data` mapped, though not the shard's bytes once it is freed (its
  // pages may then serve another shard: SharedBlock::KeepMapped), for a
  // holder that must never see the address unmapped yet checks that the
  // shard is held after each use. Null: keep_alive does both.
  std::shared_ptr<const void> keep_mapped;
  char* data = nullptr;  // row-major over desc.box
  int64_t bytes = 0;
  ShardDesc desc;
  // With --store_dir: the absolute path of the file holding the bytes.
  std::string file;
};

// The GPU that holds a device store's shards.
struct DeviceInfo {
  int index = 0;     // the CUDA ordinal in the worker's process
  std::string uuid;  // 16 bytes, the same in every process
};

// That GPU's memory now.
struct DeviceMemory {
  int64_t total_bytes = 0;  // the device's memory
  int64_t free_bytes = 0;   // not allocated by anyone, as CUDA reports it
};

class ShardStore {
 public:
  virtual ~ShardStore() = default;

  // Allocates shard `id` and fills it per `init` (values of the global
  // elements in desc.box; made for desc.dtype, else INVALID_ARGUMENT).
  // RESOURCE_EXHAUSTED past the capacity, ALREADY_EXISTS if `id` is taken
  // by a different shard.
  virtual absl::Status Allocate(uint64_t id, const ShardDesc& desc,
                                const InitFill& init) = 0;
  // The same with `init` checked and made ready for this one shard. (To
  // allocate many shards, make the InitFill once.)
  absl::Status Allocate(uint64_t id, const ShardDesc& desc,
                        const InitSpec& init) {
    absl::StatusOr<InitFill> fill = InitFill::Make(init, desc.dtype);
    if (!fill.ok()) return fill.status();
    return Allocate(id, desc, *fill);
  }

  // Copies `data` to bytes [byte_offset, byte_offset + size) of the shard
  // (row-major over its box). OUT_OF_RANGE past the end.
  virtual absl::Status Write(uint64_t id, int64_t byte_offset,
                             absl::string_view data) = 0;

  // Writes elements [flat_begin, flat_begin + count) of the row-major sub-box
  // `box` (shard coordinates) from `src`.
  virtual absl::Status WriteBox(uint64_t id, const Box& box, int64_t flat_begin,
                                int64_t count, const char* src) = 0;

  // Reads elements [flat_begin, flat_begin + count) of the row-major sub-box
  // `box` (shard coordinates) into `dst`.
  virtual absl::Status ReadBox(uint64_t id, const Box& box, int64_t flat_begin,
                               int64_t count, char* dst) = 0;

  // Copies sub-box `src_box` of shard `src_id` into shard `dst_id` at
  // `dst_offsets` (both in the shards' own coordinates), in memory.
  virtual absl::Status CopyLocal(uint64_t src_id, const Box& src_box,
                                 uint64_t dst_id,
                                 absl::Span<const int64_t> dst_offsets) = 0;

  virtual absl::StatusOr<ShardDesc> Describe(uint64_t id) const = 0;

  // Direct access to a shard's bytes, for sending and receiving them
  // without copies (and for same-host reads, when the memory is shared).
  // UNIMPLEMENTED for stores whose memory the host cannot address (device
  // memory); callers then use ReadBox.
  virtual absl::StatusOr<PinnedShard> Pin(uint64_t id) {
    return absl::UnimplementedError("this shard store cannot pin host memory");
  }

  // Stores whose shards live in GPU memory: that GPU (cheap: every device
  // read asks). nullopt: host memory.
  virtual std::optional<DeviceInfo> Device() const { return std::nullopt; }
  // Its memory now (a driver call: heartbeats ask). nullopt: host memory.
  virtual std::optional<DeviceMemory> DeviceMemoryNow() const {
    return std::nullopt;
  }

  // The CUDA IPC handle (cudaIpcMemHandle_t bytes) of shard `id`'s device
  // memory, whose first byte is the shard's, for another process on this
  // host to map. The memory stays allocated at least `hold` from now, even
  // if the shard is freed meanwhile (counted as pinned until then), so such
  // a mapping never shows reused memory. FAILED_PRECONDITION for stores in
  // host memory; NOT_FOUND for a shard not held.
  virtual absl::StatusOr<std::string> ExportDevice(uint64_t id,
                                                   absl::Duration hold) {
    return absl::FailedPreconditionError(
        "shards are in host memory: there is no device handle");
  }

  // Page-locks host memory [data, data + bytes) so that ReadBox into it
  // copies from the device at full speed (a staging buffer), until the
  // returned handle is dropped; drop it before the memory goes. Host
  // stores have nothing to do and return null.
  virtual absl::StatusOr<std::shared_ptr<void>> RegisterStaging(void* data,
                                                                int64_t bytes) {
    return nullptr;
  }

  // The change that wrote shard `id` is committed: a store whose shards
  // outlive the process (--store_dir) syncs its bytes and records it, with
  // its checksum and `cluster_id`, so that a restart finds it again. Other
  // stores have nothing to do.
  virtual absl::Status Persist(uint64_t id, absl::string_view cluster_id) {
    return absl::OkStatus();
  }

  // Frees shard `id`; freeing an unknown id is OK (frees are retried).
  virtual absl::Status Free(uint64_t id) = 0;
  // Stops serving shard `id`, keeping its bytes where an operator can look
  // at them when the store keeps files (a shard that is not what the
  // coordinator placed under its id); a store in memory frees it.
  virtual absl::Status SetAside(uint64_t id) { return Free(id); }

  // Element bytes of all shards held.
  virtual int64_t BytesUsed() const = 0;
  // BytesUsed as the coordinator orders it (core/worker_info.h). The number
  // is drawn before the figure is read: a reading numbered after a change's
  // own reading was read after the change, so it includes it.
  BytesUsedReading ReadBytesUsed() const {
    const uint64_t seq = readings_.fetch_add(1, std::memory_order_acq_rel) + 1;
    return BytesUsedReading{BytesUsed(), seq};
  }
  // What counts against the capacity: each shard held charged its element
  // bytes but at least the store's per-shard charge (its bookkeeping), and
  // freed shards whose memory readers still pin, until they let go.
  virtual int64_t ChargedBytes() const { return BytesUsed(); }
  // The part of ChargedBytes that freed shards still pinned by readers hold.
  virtual int64_t PinnedBytes() const { return 0; }
  virtual std::vector<uint64_t> ShardIds() const = 0;

 private:
  // Numbers start at the store's creation time in nanoseconds: a restarted
  // worker's readings are newer than any its previous process sent (one
  // reading takes longer than a nanosecond), so a late answer from that
  // process cannot pass for news. Good until the year 2554.
  mutable std::atomic<uint64_t> readings_{
      static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()))};
};

}  // namespace tessera

#endif  // TESSERA_WORKER_SHARD_STORE_H_
