#include "coordinator/file_metadata_store.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "proto/metadata.pb.h"
#include "rpc/convert.h"

namespace tessera {
namespace {

constexpr char kSnapshotMagic[4] = {'T', 'S', 'N', 'P'};
// A record larger than this is corrupt, not real (100k-shard tensors are ~10
// MB).
constexpr uint32_t kMaxRecordBytes = 1u << 30;

absl::Status PosixError(absl::string_view context, int err) {
  return absl::InternalError(absl::StrCat(context, ": ", std::strerror(err)));
}

uint32_t Checksum(const std::string& bytes) {
  return static_cast<uint32_t>(
      crc32(0L, reinterpret_cast<const Bytef*>(bytes.data()),
            static_cast<uInt>(bytes.size())));
}

void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i)
    out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutU64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i)
    out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint64_t GetLE(const char* p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i)
    v |= static_cast<uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path,
                                          bool* exists) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) {
      *exists = false;
      return std::string();
    }
    return PosixError(absl::StrCat("opening ", path), errno);
  }
  *exists = true;
  std::string data;
  char buf[1 << 16];
  while (true) {
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      close(fd);
      return PosixError(absl::StrCat("reading ", path), err);
    }
    if (n == 0) break;
    data.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return data;
}

absl::Status WriteAll(int fd, const std::string& data, absl::string_view path) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return PosixError(absl::StrCat("writing ", path), errno);
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status FsyncDir(const std::string& dir) {
  int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return PosixError(absl::StrCat("opening ", dir), errno);
  int rc = fsync(fd);
  int err = errno;
  close(fd);
  return rc == 0 ? absl::OkStatus()
                 : PosixError(absl::StrCat("syncing ", dir), err);
}

v1::WorkerInfo WorkerToProto(const WorkerInfo& w) {
  v1::WorkerInfo out;
  out.set_name(w.name);
  out.set_rank(w.rank);
  out.set_address(w.address);
  *out.mutable_device() = DeviceToProto(w.device);
  out.set_capacity_bytes(w.capacity_bytes);
  return out;
}

absl::StatusOr<WorkerInfo> WorkerFromProto(const v1::WorkerInfo& w) {
  WorkerInfo out;
  out.name = w.name();
  out.rank = w.rank();
  out.address = w.address();
  TESSERA_ASSIGN_OR_RETURN(out.device, DeviceFromProto(w.device()));
  out.capacity_bytes = w.capacity_bytes();
  return out;
}

v1::MetadataRecord ChangeToProto(const MetadataChange& change) {
  v1::MetadataRecord record;
  switch (change.kind) {
    case MetadataChange::Kind::kWorker:
      *record.mutable_worker() = WorkerToProto(change.worker);
      break;
    case MetadataChange::Kind::kTensor:
      TensorMetadataToProto(*change.tensor, record.mutable_tensor(),
                            ShardEncoding::kPacked);
      break;
    case MetadataChange::Kind::kDeletedTensor:
      record.set_deleted_tensor(change.deleted_tensor);
      break;
    case MetadataChange::Kind::kShardIdHighWater:
      record.set_shard_id_high_water(change.shard_id_high_water);
      break;
  }
  return record;
}

absl::StatusOr<MetadataChange> ChangeFromProto(
    const v1::MetadataRecord& record) {
  MetadataChange change;
  switch (record.change_case()) {
    case v1::MetadataRecord::kWorker: {
      change.kind = MetadataChange::Kind::kWorker;
      TESSERA_ASSIGN_OR_RETURN(change.worker, WorkerFromProto(record.worker()));
      return change;
    }
    case v1::MetadataRecord::kTensor: {
      change.kind = MetadataChange::Kind::kTensor;
      TESSERA_ASSIGN_OR_RETURN(TensorMetadata tensor,
                               TensorMetadataFromProto(record.tensor()));
      change.tensor = std::make_shared<const TensorMetadata>(std::move(tensor));
      return change;
    }
    case v1::MetadataRecord::kDeletedTensor:
      change.kind = MetadataChange::Kind::kDeletedTensor;
      change.deleted_tensor = record.deleted_tensor();
      return change;
    case v1::MetadataRecord::kShardIdHighWater:
      change.kind = MetadataChange::Kind::kShardIdHighWater;
      change.shard_id_high_water = record.shard_id_high_water();
      return change;
    default:
      return absl::DataLossError("metadata record of unknown kind");
  }
}

}  // namespace

FileMetadataStore::FileMetadataStore(std::string dir) : dir_(std::move(dir)) {}

FileMetadataStore::~FileMetadataStore() {
  absl::MutexLock lock(&mu_);
  if (log_fd_ >= 0) close(log_fd_);
  if (lock_fd_ >= 0) close(lock_fd_);  // releases the flock
}

std::string FileMetadataStore::Describe() const {
  return absl::StrCat("log and snapshot in ", dir_);
}

absl::StatusOr<MetadataState> FileMetadataStore::Load() {
  absl::MutexLock lock(&mu_);
  if (mkdir(dir_.c_str(), 0755) != 0 && errno != EEXIST) {
    return PosixError(absl::StrCat("creating --data_dir ", dir_), errno);
  }
  const std::string lock_path = absl::StrCat(dir_, "/LOCK");
  lock_fd_ = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd_ < 0)
    return PosixError(absl::StrCat("opening ", lock_path), errno);
  if (flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("--data_dir ", dir_, " is in use by another coordinator"));
  }

  MetadataState state;
  const std::string snapshot_path = absl::StrCat(dir_, "/snapshot");
  bool exists = false;
  TESSERA_ASSIGN_OR_RETURN(std::string snapshot,
                           ReadWholeFile(snapshot_path, &exists));
  if (exists) {
    if (snapshot.size() < 16 ||
        std::memcmp(snapshot.data(), kSnapshotMagic, 4) != 0 ||
        GetLE(snapshot.data() + 8, 8) != snapshot.size() - 16) {
      return absl::DataLossError(
          absl::StrCat(snapshot_path, " is not a complete snapshot"));
    }
    const std::string payload = snapshot.substr(16);
    v1::MetadataSnapshot proto;
    if (Checksum(payload) != GetLE(snapshot.data() + 4, 4) ||
        !proto.ParseFromString(payload)) {
      return absl::DataLossError(
          absl::StrCat(snapshot_path, " fails its checksum"));
    }
    for (const v1::WorkerInfo& w : proto.workers()) {
      TESSERA_ASSIGN_OR_RETURN(WorkerInfo worker, WorkerFromProto(w));
      state.workers[worker.name] = worker;
    }
    for (const v1::ShardedTensorMetadata& t : proto.tensors()) {
      TESSERA_ASSIGN_OR_RETURN(TensorMetadata tensor,
                               TensorMetadataFromProto(t));
      std::string name = tensor.name;
      state.tensors[name] =
          std::make_shared<const TensorMetadata>(std::move(tensor));
    }
    state.shard_id_high_water = proto.shard_id_high_water();
  }

  const std::string log_path = absl::StrCat(dir_, "/log");
  TESSERA_ASSIGN_OR_RETURN(std::string log, ReadWholeFile(log_path, &exists));
  size_t good = 0;
  records_recovered_ = 0;
  while (log.size() - good >= 8) {
    const uint32_t length = static_cast<uint32_t>(GetLE(log.data() + good, 4));
    const uint32_t crc = static_cast<uint32_t>(GetLE(log.data() + good + 4, 4));
    if (length > kMaxRecordBytes || log.size() - good - 8 < length) break;
    const std::string payload = log.substr(good + 8, length);
    v1::MetadataRecord record;
    if (Checksum(payload) != crc || !record.ParseFromString(payload)) break;
    absl::StatusOr<MetadataChange> change = ChangeFromProto(record);
    if (!change.ok()) break;
    state.Apply(*change);
    good += 8 + length;
    ++records_recovered_;
  }
  torn_bytes_dropped_ = static_cast<int64_t>(log.size() - good);

  log_fd_ = open(log_path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (log_fd_ < 0) return PosixError(absl::StrCat("opening ", log_path), errno);
  if (torn_bytes_dropped_ > 0) {
    if (ftruncate(log_fd_, static_cast<off_t>(good)) != 0 ||
        fsync(log_fd_) != 0) {
      return PosixError(absl::StrCat("truncating the torn tail of ", log_path),
                        errno);
    }
  }
  if (lseek(log_fd_, static_cast<off_t>(good), SEEK_SET) < 0) {
    return PosixError(absl::StrCat("seeking in ", log_path), errno);
  }
  log_size_ = good;
  return state;
}

absl::Status FileMetadataStore::Append(
    absl::Span<const MetadataChange> changes) {
  std::string records;
  for (const MetadataChange& change : changes) {
    std::string payload;
    if (!ChangeToProto(change).SerializeToString(&payload)) {
      return absl::InternalError("cannot serialize a metadata record");
    }
    PutU32(&records, static_cast<uint32_t>(payload.size()));
    PutU32(&records, Checksum(payload));
    records += payload;
  }
  absl::MutexLock lock(&mu_);
  TESSERA_RETURN_IF_ERROR(CheckWritable());
  const std::string path = absl::StrCat(dir_, "/log");
  if (absl::Status status = WriteAll(log_fd_, records, path); !status.ok()) {
    // Take back whatever part of the batch was written, so that none of it
    // is replayed after a restart.
    if (ftruncate(log_fd_, static_cast<off_t>(log_size_)) != 0 ||
        lseek(log_fd_, static_cast<off_t>(log_size_), SEEK_SET) < 0) {
      broken_ = Annotate(status, "the log could not be cut back after");
    }
    return status;
  }
  if (fdatasync(log_fd_) != 0) {
    // What reached the disk is unknown now: refuse everything after.
    broken_ = PosixError(absl::StrCat("syncing ", path), errno);
    return broken_;
  }
  log_size_ += records.size();
  return absl::OkStatus();
}

absl::Status FileMetadataStore::CheckWritable() const {
  if (log_fd_ < 0)
    return absl::FailedPreconditionError("metadata store is not loaded");
  if (!broken_.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the metadata log in ", dir_,
                     " refuses changes after an earlier failure: ",
                     broken_.message()));
  }
  return absl::OkStatus();
}

absl::Status FileMetadataStore::Snapshot(const MetadataState& state) {
  v1::MetadataSnapshot proto;
  for (const auto& [name, worker] : state.workers)
    *proto.add_workers() = WorkerToProto(worker);
  for (const auto& [name, tensor] : state.tensors)
    TensorMetadataToProto(*tensor, proto.add_tensors(), ShardEncoding::kPacked);
  proto.set_shard_id_high_water(state.shard_id_high_water);
  std::string payload;
  if (!proto.SerializeToString(&payload)) {
    return absl::InternalError("cannot serialize a metadata snapshot");
  }
  std::string file(kSnapshotMagic, 4);
  PutU32(&file, Checksum(payload));
  PutU64(&file, payload.size());
  file += payload;

  absl::MutexLock lock(&mu_);
  TESSERA_RETURN_IF_ERROR(CheckWritable());
  const std::string path = absl::StrCat(dir_, "/snapshot");
  const std::string tmp = path + ".tmp";
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return PosixError(absl::StrCat("creating ", tmp), errno);
  absl::Status status = WriteAll(fd, file, tmp);
  if (status.ok() && fsync(fd) != 0)
    status = PosixError(absl::StrCat("syncing ", tmp), errno);
  close(fd);
  TESSERA_RETURN_IF_ERROR(status);
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    return PosixError(absl::StrCat("renaming ", tmp), errno);
  }
  TESSERA_RETURN_IF_ERROR(FsyncDir(dir_));
  // The snapshot holds everything the log held.
  if (ftruncate(log_fd_, 0) != 0 || lseek(log_fd_, 0, SEEK_SET) < 0 ||
      fsync(log_fd_) != 0) {
    // The snapshot holds every record, so replaying what is left of the log
    // over it is harmless; but where the next record lands is unknown.
    broken_ = PosixError(absl::StrCat("truncating ", dir_, "/log"), errno);
    return broken_;
  }
  log_size_ = 0;
  return absl::OkStatus();
}

}  // namespace tessera
