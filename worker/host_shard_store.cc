#include "worker/host_shard_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "core/errors.h"
#include "core/status_macros.h"
#include "core/strided_copy.h"

namespace tessera {

struct HostShardStore::Shard {
  ShardDesc desc;
  int64_t bytes = 0;
  // calloc'd, or mapped from `segment`: either way fresh pages read as zero.
  char* data = nullptr;
  std::string segment;  // shared-memory name; empty for calloc'd memory
  size_t mapped_bytes = 0;
  ~Shard() {
    if (segment.empty()) {
      std::free(data);
      return;
    }
    munmap(data, mapped_bytes);
    shm_unlink(segment.c_str());  // no-op (ENOENT) when Free already did
  }
};

namespace {

constexpr char kSegmentPrefix[] = "tessera-";

// "tessera-<pid namespace inode>-<pid>-": pids are only comparable within
// one pid namespace, and /dev/shm is often shared across them (sandboxes,
// containers on one host).
const std::string& SegmentOwnerPrefix() {
  static const std::string* prefix = [] {
    struct stat st {};
    const unsigned long long ns =
        stat("/proc/self/ns/pid", &st) == 0 ? st.st_ino : 0;
    return new std::string(absl::StrCat(kSegmentPrefix, ns, "-"));
  }();
  return *prefix;
}

// Removes segments left by workers of this pid namespace that died without
// freeing them (their pid no longer runs).
void RemoveStaleSegments() {
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return;
  const std::string& mine = SegmentOwnerPrefix();
  while (dirent* entry = readdir(dir)) {
    const std::string name = entry->d_name;
    if (name.rfind(mine, 0) != 0) continue;
    const pid_t pid = static_cast<pid_t>(std::atol(name.c_str() + mine.size()));
    if (pid > 0 && kill(pid, 0) != 0 && errno == ESRCH)
      shm_unlink(("/" + name).c_str());
  }
  closedir(dir);
}

// Maps `bytes` of a fresh, zeroed shared-memory segment; false (nothing
// left behind) when there is no room, so the caller uses private memory.
bool MapSegment(uint64_t id, int64_t bytes, std::string* name, char** data) {
  static std::mt19937_64 rng{std::random_device{}()};
  static absl::Mutex rng_mu;
  uint64_t nonce;
  {
    absl::MutexLock lock(&rng_mu);
    nonce = rng();
  }
  *name = absl::StrCat("/", SegmentOwnerPrefix(), getpid(), "-", id, "-",
                       absl::Hex(nonce));
  const int fd = shm_open(name->c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) return false;
  // Reserve the pages now: a full /dev/shm then fails here, not later as
  // SIGBUS on first touch.
  void* map = MAP_FAILED;
  if (posix_fallocate(fd, 0, bytes) == 0) {
    map = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE,
               MAP_SHARED, fd, 0);
  }
  close(fd);
  if (map == MAP_FAILED) {
    shm_unlink(name->c_str());
    return false;
  }
  *data = static_cast<char*>(map);
  return true;
}

}  // namespace

HostShardStore::HostShardStore(int64_t capacity_bytes)
    : HostShardStore(HostShardStoreOptions{capacity_bytes}) {}

HostShardStore::HostShardStore(HostShardStoreOptions options)
    : options_(options), table_(options.capacity_bytes, "") {
  if (!options_.shared_memory) return;
  RemoveStaleSegments();
  // Held locked for the life of the process: the kernel drops the lock when
  // the process dies, however it dies.
  liveness_ = absl::StrCat("/", SegmentOwnerPrefix(), getpid(), "-alive");
  liveness_fd_ = shm_open(liveness_.c_str(), O_RDWR | O_CREAT, 0600);
  if (liveness_fd_ < 0 || flock(liveness_fd_, LOCK_EX | LOCK_NB) != 0)
    liveness_.clear();
}

HostShardStore::~HostShardStore() {
  if (liveness_fd_ >= 0) {
    if (!liveness_.empty()) shm_unlink(liveness_.c_str());
    close(liveness_fd_);
  }
}

absl::Status HostShardStore::Allocate(uint64_t id, const ShardDesc& desc,
                                      const InitSpec& init) {
  auto shard = std::make_shared<Shard>();
  shard->desc = desc;
  shard->bytes = desc.ByteSize();
  TESSERA_RETURN_IF_ERROR(table_.Reserve(id, shard->bytes));
  auto unreserve = absl::MakeCleanup([&] { table_.Unreserve(shard->bytes); });
  if (options_.shared_memory &&
      shard->bytes >= options_.shared_memory_min_bytes &&
      MapSegment(id, shard->bytes, &shard->segment, &shard->data)) {
    shard->mapped_bytes = static_cast<size_t>(shard->bytes);
  } else {
    shard->segment.clear();
    shard->data =
        static_cast<char*>(std::calloc(std::max<int64_t>(shard->bytes, 1), 1));
  }
  if (shard->data == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("out of host memory allocating ", shard->bytes, " bytes"));
  }
  if (init.kind != InitSpec::Kind::kEmpty &&
      init.kind != InitSpec::Kind::kZeros) {
    TESSERA_RETURN_IF_ERROR(
        FillBox(init, desc.dtype, desc.tensor_shape, desc.box, shard->data));
  }
  TESSERA_RETURN_IF_ERROR(table_.Insert(id, shard));
  std::move(unreserve).Cancel();
  return absl::OkStatus();
}

absl::Status HostShardStore::Write(uint64_t id, int64_t byte_offset,
                                   absl::string_view data) {
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<Shard> shard, table_.Find(id));
  const int64_t size = static_cast<int64_t>(data.size());
  TESSERA_RETURN_IF_ERROR(CheckShardWrite(shard->bytes, byte_offset, size));
  if (size > 0)
    std::memcpy(shard->data + byte_offset, data.data(), data.size());
  return absl::OkStatus();
}

absl::Status HostShardStore::WriteBox(uint64_t id, const Box& box,
                                      int64_t flat_begin, int64_t count,
                                      const char* src) {
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<Shard> shard, table_.Find(id));
  TESSERA_RETURN_IF_ERROR(CheckShardRange(shard->desc, box, flat_begin, count));
  if (count == 0) return absl::OkStatus();
  CopyFlatRangeToBox(src, flat_begin, count, box.sizes, shard->data,
                     shard->desc.box.sizes, box.offsets,
                     ItemSize(shard->desc.dtype));
  return absl::OkStatus();
}

absl::Status HostShardStore::ReadBox(uint64_t id, const Box& box,
                                     int64_t flat_begin, int64_t count,
                                     char* dst) {
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<Shard> shard, table_.Find(id));
  TESSERA_RETURN_IF_ERROR(CheckShardRange(shard->desc, box, flat_begin, count));
  if (count == 0) return absl::OkStatus();
  CopyBoxToFlatRange(shard->data, shard->desc.box.sizes, box.offsets, box.sizes,
                     flat_begin, count, dst, ItemSize(shard->desc.dtype));
  return absl::OkStatus();
}

absl::Status HostShardStore::CopyLocal(uint64_t src_id, const Box& src_box,
                                       uint64_t dst_id,
                                       absl::Span<const int64_t> dst_offsets) {
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<Shard> src, table_.Find(src_id));
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<Shard> dst, table_.Find(dst_id));
  if (src->desc.dtype != dst->desc.dtype) {
    return absl::InvalidArgumentError(
        absl::StrCat("copy from a ", DTypeName(src->desc.dtype),
                     " shard into a ", DTypeName(dst->desc.dtype), " shard"));
  }
  TESSERA_RETURN_IF_ERROR(
      CheckWithin(src_box, src->desc.box.sizes, "source region"));
  Box dst_box{std::vector<int64_t>(dst_offsets.begin(), dst_offsets.end()),
              src_box.sizes};
  TESSERA_RETURN_IF_ERROR(
      CheckWithin(dst_box, dst->desc.box.sizes, "destination region"));
  if (src_box.NumElements() == 0) return absl::OkStatus();
  CopyBox(src->data, src->desc.box.sizes, src_box.offsets, dst->data,
          dst->desc.box.sizes, dst_offsets, src_box.sizes,
          ItemSize(src->desc.dtype));
  return absl::OkStatus();
}

absl::StatusOr<ShardDesc> HostShardStore::Describe(uint64_t id) const {
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<Shard> shard, table_.Find(id));
  return shard->desc;
}

absl::StatusOr<PinnedShard> HostShardStore::Pin(uint64_t id) {
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<Shard> shard, table_.Find(id));
  PinnedShard pinned;
  pinned.data = shard->data;
  pinned.bytes = shard->bytes;
  pinned.desc = shard->desc;
  pinned.segment = shard->segment;
  pinned.liveness = liveness_;
  pinned.keep_alive = std::move(shard);
  return pinned;
}

absl::Status HostShardStore::Free(uint64_t id) {
  // Memory is released when the last reader drops it, outside any lock.
  std::shared_ptr<Shard> shard = table_.Remove(id);
  // No new same-host mappings from now on; existing ones keep the old bytes.
  if (shard != nullptr && !shard->segment.empty())
    shm_unlink(shard->segment.c_str());
  return absl::OkStatus();
}

int64_t HostShardStore::BytesUsed() const { return table_.BytesUsed(); }

std::vector<uint64_t> HostShardStore::ShardIds() const { return table_.Ids(); }

}  // namespace tessera
