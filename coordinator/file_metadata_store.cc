#include "coordinator/file_metadata_store.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cstring>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "coordinator/metadata_codec.h"
#include "core/status_macros.h"
#include "proto/metadata.pb.h"
#include "spdlog/spdlog.h"

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

absl::Status WriteAll(const FileOps& ops, int fd, const std::string& data,
                      absl::string_view path) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ops.write(fd, data.data() + done, data.size() - done);
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

// Writes `data` to `path` whole or not at all: into a 0600 temporary file,
// synced, renamed over `path`, and the directory synced. A temporary file
// that is not renamed is removed: on a full disk it would hold the space
// that the next start needs.
absl::Status WriteFileAtomically(const FileOps& ops, const std::string& dir,
                                 const std::string& path,
                                 const std::string& data) {
  const std::string tmp = path + ".tmp";
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return PosixError(absl::StrCat("creating ", tmp), errno);
  absl::Status status = WriteAll(ops, fd, data, tmp);
  if (status.ok() && ops.sync(fd) != 0)
    status = PosixError(absl::StrCat("syncing ", tmp), errno);
  if (close(fd) != 0 && status.ok())
    status = PosixError(absl::StrCat("closing ", tmp), errno);
  if (status.ok() && rename(tmp.c_str(), path.c_str()) != 0)
    status = PosixError(absl::StrCat("renaming ", tmp), errno);
  if (!status.ok()) {
    unlink(tmp.c_str());
    return status;
  }
  return FsyncDir(dir);
}

// The record that starts at `pos` of `log`, when one lies there whole: its
// length is plausible, its checksum holds and it parses. `*size` is its
// size with the header.
absl::StatusOr<MetadataChange> RecordAt(const std::string& log, size_t pos,
                                        size_t* size) {
  if (log.size() - pos < 8) return absl::DataLossError("cut short");
  const uint32_t length = static_cast<uint32_t>(GetLE(log.data() + pos, 4));
  const uint32_t crc = static_cast<uint32_t>(GetLE(log.data() + pos + 4, 4));
  if (length > kMaxRecordBytes || log.size() - pos - 8 < length) {
    return absl::DataLossError("cut short");
  }
  const char* payload = log.data() + pos + 8;
  if (crc32(0L, reinterpret_cast<const Bytef*>(payload),
            static_cast<uInt>(length)) != crc) {
    return absl::DataLossError("bad checksum");
  }
  v1::MetadataRecord record;
  if (!record.ParseFromArray(payload, static_cast<int>(length))) {
    return absl::DataLossError("not a metadata record");
  }
  absl::StatusOr<MetadataChange> change = ChangeFromProto(record);
  if (!change.ok()) return absl::DataLossError("not a valid metadata record");
  *size = 8 + length;
  return change;
}

// Whether a record could start at `pos`, judged by its header and first
// payload byte alone: a length that fits the log and, since every record
// sets exactly one field of MetadataRecord's oneof, the tag of field 1, 2
// or 3 (length-delimited) or 4 (varint). Cheap, so that a scan checksums
// only a few candidates.
bool MayBeRecordAt(const std::string& log, size_t pos) {
  if (log.size() - pos < 9) return false;
  const uint64_t length = GetLE(log.data() + pos, 4);
  if (length == 0 || length > kMaxRecordBytes || log.size() - pos - 8 < length)
    return false;
  const unsigned char tag = static_cast<unsigned char>(log[pos + 8]);
  return tag == 0x0a || tag == 0x12 || tag == 0x1a || tag == 0x20;
}

// Most payload bytes a scan for records after a damaged one checksums (a
// few tenths of a second); past it, it gives up and says so.
constexpr uint64_t kScanBudgetBytes = uint64_t{256} << 20;

struct DamageScan {
  bool undecided = false;   // the budget ran out before an answer
  size_t first_valid = 0;   // offset of the first valid record after it
  int64_t valid_after = 0;  // valid records from first_valid on, in a row
};

// Looks for a whole, valid record after the damaged one at `damaged`. A
// crash tears only the end of the log (the last write), so none should
// follow; one that does means the damage is in the middle.
DamageScan ScanAfterDamage(const std::string& log, size_t damaged) {
  DamageScan scan;
  uint64_t budget = kScanBudgetBytes;
  auto valid_at = [&](size_t pos, size_t* size) {
    if (!MayBeRecordAt(log, pos)) return false;
    const uint64_t length = GetLE(log.data() + pos, 4);
    if (length > budget) {
      scan.undecided = true;
      return false;
    }
    budget -= length;
    return RecordAt(log, pos, size).ok();
  };
  size_t size = 0;
  bool found = false;
  // Where the next record starts if only the damaged one's payload is bad
  // (a flipped bit): checked first, since then it costs one checksum.
  if (log.size() - damaged >= 8) {
    const uint64_t length = GetLE(log.data() + damaged, 4);
    if (length <= log.size() - damaged - 8 &&
        valid_at(damaged + 8 + length, &size)) {
      scan.first_valid = damaged + 8 + length;
      found = true;
    }
  }
  // Else anywhere after it (a damaged length, a zeroed block).
  for (size_t pos = damaged + 1; !found && !scan.undecided && pos < log.size();
       ++pos) {
    if (valid_at(pos, &size)) {
      scan.first_valid = pos;
      found = true;
    }
  }
  if (!found) return scan;
  scan.undecided = false;
  for (size_t pos = scan.first_valid;
       pos < log.size() && RecordAt(log, pos, &size).ok(); pos += size) {
    ++scan.valid_after;
  }
  return scan;
}

}  // namespace

absl::Status PrepareDataDir(const std::string& dir) {
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return PosixError(absl::StrCat("creating --data_dir ", dir), errno);
  }
  struct stat st;
  if (stat(dir.c_str(), &st) != 0) {
    return PosixError(absl::StrCat("checking --data_dir ", dir), errno);
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("--data_dir ", dir, " is not a directory"));
  }
  if (st.st_uid != geteuid()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--data_dir ", dir, " belongs to uid ", st.st_uid,
        ", not to this user (uid ", geteuid(),
        "): the cluster's metadata and secret must be private to the "
        "coordinator's user"));
  }
  if ((st.st_mode & 0777) != 0700) {
    if (chmod(dir.c_str(), 0700) != 0) {
      return PosixError(
          absl::StrCat("making --data_dir ", dir, " private (mode 0700)"),
          errno);
    }
    spdlog::warn("--data_dir {} had mode {:04o}; tightened to 0700", dir,
                 st.st_mode & 07777);
  }
  DIR* listing = opendir(dir.c_str());
  if (listing == nullptr) {
    return PosixError(absl::StrCat("listing --data_dir ", dir), errno);
  }
  absl::Status status;
  while (const dirent* entry = readdir(listing)) {
    const std::string path = absl::StrCat(dir, "/", entry->d_name);
    struct stat file;
    if (lstat(path.c_str(), &file) != 0 || !S_ISREG(file.st_mode)) continue;
    if ((file.st_mode & 0177) == 0) continue;
    if (chmod(path.c_str(), 0600) != 0) {
      status = PosixError(absl::StrCat("making ", path, " private (mode 0600)"),
                          errno);
      break;
    }
    spdlog::warn("{} had mode {:04o}; tightened to 0600", path,
                 file.st_mode & 07777);
  }
  closedir(listing);
  return status;
}

absl::StatusOr<std::string> LoadOrMakeClusterId(const std::string& dir,
                                                bool* created) {
  *created = false;
  const std::string path = absl::StrCat(dir, "/cluster_id");
  bool exists = false;
  TESSERA_ASSIGN_OR_RETURN(std::string text, ReadWholeFile(path, &exists));
  if (exists) {
    const std::string id(absl::StripAsciiWhitespace(text));
    if (id.size() != 32 ||
        id.find_first_not_of("0123456789abcdef") != std::string::npos) {
      return absl::DataLossError(absl::StrCat(
          path,
          " does not hold a cluster id (32 hex digits); refusing to "
          "start a coordinator whose cluster cannot be told"));
    }
    return id;
  }
  char random[16];
  if (getrandom(random, sizeof(random), 0) != sizeof(random)) {
    return PosixError("drawing a random cluster id", errno);
  }
  const std::string id =
      absl::BytesToHexString(absl::string_view(random, sizeof(random)));
  TESSERA_RETURN_IF_ERROR(WriteFileAtomically(FileOps(), dir, path, id + "\n"));
  *created = true;
  return id;
}

FileMetadataStore::FileMetadataStore(std::string dir, FileOps ops,
                                     RecoveryOptions recovery)
    : dir_(std::move(dir)), ops_(std::move(ops)), recovery_(recovery) {}

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
  TESSERA_RETURN_IF_ERROR(PrepareDataDir(dir_));
  const std::string lock_path = absl::StrCat(dir_, "/LOCK");
  lock_fd_ = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock_fd_ < 0)
    return PosixError(absl::StrCat("opening ", lock_path), errno);
  if (flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("--data_dir ", dir_, " is in use by another coordinator"));
  }

  MetadataState state;
  TESSERA_ASSIGN_OR_RETURN(state.cluster_id,
                           LoadOrMakeClusterId(dir_, &cluster_id_created_));
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
    if (Checksum(payload) != GetLE(snapshot.data() + 4, 4)) {
      return absl::DataLossError(
          absl::StrCat(snapshot_path, " fails its checksum"));
    }
    TESSERA_RETURN_IF_ERROR(
        Annotate(DecodeSnapshot(payload, &state), snapshot_path));
  }

  const std::string log_path = absl::StrCat(dir_, "/log");
  TESSERA_ASSIGN_OR_RETURN(std::string log, ReadWholeFile(log_path, &exists));
  size_t good = 0;
  records_recovered_ = 0;
  damaged_records_dropped_ = 0;
  while (good < log.size()) {
    size_t size = 0;
    absl::StatusOr<MetadataChange> change = RecordAt(log, good, &size);
    if (!change.ok()) break;
    state.Apply(*change);
    good += size;
    ++records_recovered_;
  }
  if (good < log.size()) {
    // Only the last write can be torn by a crash. A damaged record followed
    // by valid ones is damage in the middle of the log: dropping it and
    // what follows would lose acknowledged changes (and have the workers
    // free their shards), so that takes the operator's word.
    const DamageScan scan = ScanAfterDamage(log, good);
    if (scan.valid_after > 0 || scan.undecided) {
      if (recovery_.truncate_log_at != static_cast<int64_t>(good)) {
        return absl::DataLossError(absl::StrCat(
            log_path, " is damaged at byte offset ", good, " of ", log.size(),
            ", and ",
            scan.undecided
                ? std::string("whether valid records follow it could not "
                              "be told")
                : absl::StrCat(scan.valid_after,
                               " valid record(s) follow it (the first at "
                               "offset ",
                               scan.first_valid, ")"),
            ": that is not a torn tail from a crash, and dropping them "
            "would lose acknowledged changes. Refusing to start; nothing was "
            "changed or freed. To proceed, keep a copy of ",
            dir_,
            ", then restore the log from a backup, or start once with "
            "--recover_truncate_log_at=",
            good,
            " to drop everything from that offset on (the log is kept as "
            "log.damaged-",
            good,
            "; tensors recorded after the offset are forgotten, and their "
            "shards are freed when their workers report them)"));
      }
      // The operator's word: keep the whole log for inspection, then cut.
      TESSERA_RETURN_IF_ERROR(WriteFileAtomically(
          ops_, dir_, absl::StrCat(dir_, "/log.damaged-", good), log));
      damaged_records_dropped_ = scan.valid_after;
      spdlog::error(
          "--recover_truncate_log_at={}: dropping the last {} bytes of {}, "
          "from the damaged record at that offset on ({}); the whole log is "
          "kept as {}/log.damaged-{}",
          good, log.size() - good, log_path,
          scan.undecided
              ? std::string("records after it not checked")
              : absl::StrCat(scan.valid_after, " valid record(s) after it"),
          dir_, good);
    } else if (recovery_.truncate_log_at >= 0) {
      spdlog::warn(
          "--recover_truncate_log_at={} ignored: {} ends with a torn tail at "
          "offset {} (cut off as after any crash), not with damage there",
          recovery_.truncate_log_at, log_path, good);
    }
  } else if (recovery_.truncate_log_at >= 0) {
    spdlog::warn(
        "--recover_truncate_log_at={} ignored: {} holds no damage (its {} "
        "record(s) are whole)",
        recovery_.truncate_log_at, log_path, records_recovered_);
  }
  torn_bytes_dropped_ = static_cast<int64_t>(log.size() - good);

  log_fd_ = open(log_path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
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
  replays_records_ = good > 0;
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
  absl::Status status = WriteAll(ops_, log_fd_, records, path);
  if (status.ok() && ops_.sync(log_fd_) != 0) {
    status = PosixError(absl::StrCat("syncing ", path), errno);
  }
  if (status.ok()) {
    log_size_ += records.size();
    replays_records_ = true;
    return absl::OkStatus();
  }
  // Take back whatever part of the batch was written (whole records of it
  // too, whether or not they reached the disk), and make the cut durable, so
  // that none of it is replayed after a restart: the caller undoes the
  // change. The log then holds exactly the batches acknowledged before.
  if (ftruncate(log_fd_, static_cast<off_t>(log_size_)) == 0 &&
      lseek(log_fd_, static_cast<off_t>(log_size_), SEEK_SET) >= 0 &&
      ops_.sync(log_fd_) == 0) {
    return status;
  }
  // Whether the batch is on the disk is unknown: refuse everything after.
  broken_ = Annotate(status, "the log could not be cut back after");
  return absl::DataLossError(absl::StrCat(
      "the outcome of a metadata record is unknown: ", broken_.message()));
}

absl::Status FileMetadataStore::CheckWritable() const {
  if (log_fd_ < 0)
    return absl::FailedPreconditionError("metadata store is not loaded");
  if (!broken_.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the metadata log in ", dir_,
        " refuses changes after an earlier failure: ", broken_.message()));
  }
  return absl::OkStatus();
}

absl::Status FileMetadataStore::Snapshot(const MetadataState& state) {
  TESSERA_ASSIGN_OR_RETURN(const std::string payload, EncodeSnapshot(state));
  std::string file(kSnapshotMagic, 4);
  PutU32(&file, Checksum(payload));
  PutU64(&file, payload.size());
  file += payload;

  absl::MutexLock lock(&mu_);
  TESSERA_RETURN_IF_ERROR(CheckWritable());
  TESSERA_RETURN_IF_ERROR(
      WriteFileAtomically(ops_, dir_, absl::StrCat(dir_, "/snapshot"), file));
  // The snapshot holds everything the log held.
  if (ftruncate(log_fd_, 0) != 0 || lseek(log_fd_, 0, SEEK_SET) < 0 ||
      fsync(log_fd_) != 0) {
    // The snapshot holds every record, so replaying what is left of the log
    // over it is harmless; but where the next record lands is unknown.
    broken_ = PosixError(absl::StrCat("truncating ", dir_, "/log"), errno);
    return CheckWritable();
  }
  log_size_ = 0;
  replays_records_ = false;
  return absl::OkStatus();
}

bool FileMetadataStore::ReplaysRecords() const {
  absl::MutexLock lock(&mu_);
  return replays_records_;
}

}  // namespace tessera
