#include "coordinator/etcd_metadata_store.h"

#include <sys/random.h>

#include <algorithm>
#include <utility>

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "coordinator/metadata_codec.h"
#include "core/crc32.h"
#include "core/status_macros.h"

namespace tessera {
namespace {

constexpr absl::string_view kFormat = "tessera-metadata 1";
constexpr absl::string_view kLogMagic = "TLG1";
constexpr absl::string_view kSnapshotMagic = "TSN1";
constexpr absl::string_view kManifestMagic = "TSM1";
constexpr absl::string_view kVoid = "void";
constexpr int64_t kMaxChunks = int64_t{1} << 20;

void PutLE(std::string* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i)
    out->push_back(static_cast<char>(v >> (8 * i)));
}
uint64_t GetLE(absl::string_view in, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i)
    v = (v << 8) | static_cast<unsigned char>(in[at + static_cast<size_t>(i)]);
  return v;
}

etcdserverpb::RequestOp Put(std::string key, std::string value) {
  etcdserverpb::RequestOp op;
  op.mutable_request_put()->set_key(std::move(key));
  op.mutable_request_put()->set_value(std::move(value));
  return op;
}
etcdserverpb::RequestOp DeleteRange(std::string key, std::string end) {
  etcdserverpb::RequestOp op;
  op.mutable_request_delete_range()->set_key(std::move(key));
  op.mutable_request_delete_range()->set_range_end(std::move(end));
  return op;
}
// The key does not exist yet.
etcdserverpb::Compare Absent(std::string key) {
  etcdserverpb::Compare c;
  c.set_result(etcdserverpb::Compare::EQUAL);
  c.set_target(etcdserverpb::Compare::CREATE);
  c.set_key(std::move(key));
  c.set_create_revision(0);
  return c;
}

bool Ambiguous(const absl::Status& s) {
  return absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s) ||
         absl::IsCancelled(s) || absl::IsUnknown(s) || absl::IsInternal(s);
}

}  // namespace

absl::StatusOr<StoredValue> ParseStoredValue(absl::string_view value,
                                             absl::string_view magic,
                                             int64_t max_bytes) {
  if (value.size() < 9 || !absl::StartsWith(value, magic)) {
    return absl::DataLossError("is not one of tessera's values");
  }
  StoredValue out;
  out.crc32 = static_cast<uint32_t>(GetLE(value, 5, 4));
  if (value[4] == 'I') {
    out.inline_bytes = value.substr(9);
    return out;
  }
  if (value[4] != 'C') {
    return absl::DataLossError("is not one of tessera's values");
  }
  if (value.size() != 21) {
    return absl::DataLossError("has a damaged chunk list");
  }
  out.chunked = true;
  out.total_bytes = GetLE(value, 9, 8);
  out.chunks = GetLE(value, 17, 4);
  if (out.total_bytes > static_cast<uint64_t>(max_bytes) || out.chunks == 0 ||
      out.chunks > static_cast<uint64_t>(kMaxChunks) ||
      out.chunks > out.total_bytes) {
    return absl::DataLossError(absl::StrCat("names ", out.chunks, " chunks of ",
                                            out.total_bytes,
                                            " bytes, past its bounds"));
  }
  return out;
}

EtcdMetadataStore::EtcdMetadataStore(std::shared_ptr<const EtcdClient> etcd,
                                     EtcdStoreOptions options)
    : etcd_(std::move(etcd)), options_(std::move(options)) {}

void EtcdMetadataStore::SetFence(std::string key, int64_t revision) {
  absl::MutexLock lock(&mu_);
  fence_key_ = std::move(key);
  fence_revision_ = revision;
}

std::string EtcdMetadataStore::Describe() const {
  return absl::StrCat("etcd (", absl::StrJoin(etcd_->endpoints(), ","),
                      ") under prefix ", options_.prefix);
}

std::string EtcdMetadataStore::LogKey(uint64_t seq) const {
  return absl::StrFormat("%slog/%020u", options_.prefix, seq);
}

std::string EtcdMetadataStore::ChunkKey(absl::string_view kind, uint64_t id,
                                        int64_t k) const {
  std::string key = absl::StrFormat("%s%s/%020u/", options_.prefix, kind, id);
  if (k >= 0) absl::StrAppendFormat(&key, "%06d", k);
  return key;
}

absl::StatusOr<bool> EtcdMetadataStore::Commit(
    etcdserverpb::TxnRequest request) {
  if (!fence_key_.empty()) {
    etcdserverpb::Compare* fence = request.add_compare();
    fence->set_result(etcdserverpb::Compare::EQUAL);
    fence->set_target(etcdserverpb::Compare::CREATE);
    fence->set_key(fence_key_);
    fence->set_create_revision(fence_revision_);
  }
  TESSERA_ASSIGN_OR_RETURN(etcdserverpb::TxnResponse response,
                           etcd_->Txn(request));
  return response.succeeded();
}

absl::Status EtcdMetadataStore::Fenced() {
  if (!fence_key_.empty()) {
    absl::StatusOr<std::vector<mvccpb::KeyValue>> fence =
        etcd_->Range(fence_key_);
    if (fence.ok() && (fence->empty() ||
                       fence->front().create_revision() != fence_revision_)) {
      broken_ = absl::FailedPreconditionError(absl::StrCat(
          "no longer the leader of etcd prefix ", options_.prefix,
          ": another coordinator took over, so nothing more is written"));
      return broken_;
    }
  }
  broken_ = absl::FailedPreconditionError(
      absl::StrCat("another writer changed the log under etcd prefix ",
                   options_.prefix, ": nothing more is written"));
  return broken_;
}

absl::StatusOr<std::string> EtcdMetadataStore::Stage(absl::string_view magic,
                                                     absl::string_view kind,
                                                     uint64_t id,
                                                     const std::string& bytes) {
  std::string value(magic);
  const int64_t total = static_cast<int64_t>(bytes.size());
  if (total <= options_.chunk_bytes) {
    value.push_back('I');
    PutLE(&value, ExtendCrc32(0, bytes), 4);
    value += bytes;
    return value;
  }
  const int64_t chunks =
      (total + options_.chunk_bytes - 1) / options_.chunk_bytes;
  for (int64_t k = 0; k < chunks; ++k) {
    etcdserverpb::TxnRequest txn;
    *txn.add_success() =
        Put(ChunkKey(kind, id, k),
            bytes.substr(static_cast<size_t>(k * options_.chunk_bytes),
                         static_cast<size_t>(options_.chunk_bytes)));
    TESSERA_ASSIGN_OR_RETURN(const bool done, Commit(std::move(txn)));
    if (!done) return Fenced();
  }
  value.push_back('C');
  PutLE(&value, ExtendCrc32(0, bytes), 4);
  PutLE(&value, static_cast<uint64_t>(total), 8);
  PutLE(&value, static_cast<uint64_t>(chunks), 4);
  return value;
}

absl::StatusOr<std::string> EtcdMetadataStore::Unstage(
    absl::string_view magic, absl::string_view kind, uint64_t id,
    const std::string& value, absl::string_view what) const {
  auto damaged = [&](absl::string_view why) {
    return absl::DataLossError(
        absl::StrCat(what, " under etcd prefix ", options_.prefix, " ", why));
  };
  absl::StatusOr<StoredValue> stored =
      ParseStoredValue(value, magic, options_.max_value_bytes);
  if (!stored.ok()) return damaged(stored.status().message());
  const uint32_t crc = stored->crc32;
  std::string bytes;
  if (!stored->chunked) {
    bytes = std::string(stored->inline_bytes);
  } else {
    const uint64_t total = stored->total_bytes;
    const uint64_t chunks = stored->chunks;
    const std::string dir = ChunkKey(kind, id, -1);
    TESSERA_ASSIGN_OR_RETURN(std::vector<mvccpb::KeyValue> parts,
                             etcd_->Range(dir, PrefixEnd(dir)));
    // Chunks 0..chunks-1 in order; any after them are left from a write
    // that did not finish.
    for (uint64_t k = 0; k < chunks; ++k) {
      if (k >= parts.size() ||
          parts[k].key() != ChunkKey(kind, id, static_cast<int64_t>(k))) {
        return damaged(absl::StrCat("misses chunk ", k));
      }
      if (bytes.size() + parts[k].value().size() > total) {
        return damaged("has chunks longer than it says");
      }
      bytes += parts[k].value();
    }
    if (bytes.size() != total) {
      return damaged("has chunks shorter than it says");
    }
  }
  if (ExtendCrc32(0, bytes) != crc) return damaged("fails its checksum");
  return bytes;
}

absl::StatusOr<MetadataState> EtcdMetadataStore::Load() {
  absl::MutexLock lock(&mu_);
  const std::string& p = options_.prefix;
  if (loaded_) return absl::FailedPreconditionError("Load called twice");
  TESSERA_ASSIGN_OR_RETURN(std::vector<mvccpb::KeyValue> format,
                           etcd_->Range(p + "format"));
  if (format.empty()) {
    // A new prefix: refused if anything else lives there.
    TESSERA_RETURN_IF_ERROR(CheckNewPrefix());
    uint8_t raw[16];
    if (getrandom(raw, sizeof(raw), 0) != static_cast<ssize_t>(sizeof(raw))) {
      return absl::InternalError("cannot draw a cluster id");
    }
    const std::string id = absl::BytesToHexString(
        absl::string_view(reinterpret_cast<const char*>(raw), sizeof(raw)));
    etcdserverpb::TxnRequest txn;
    *txn.add_compare() = Absent(p + "format");
    *txn.add_success() = Put(p + "format", std::string(kFormat));
    *txn.add_success() = Put(p + "cluster_id", id);
    TESSERA_ASSIGN_OR_RETURN(const bool made, Commit(std::move(txn)));
    if (!made) {
      // Another coordinator made it first, or this one is not the leader:
      // read what is there.
      TESSERA_ASSIGN_OR_RETURN(format, etcd_->Range(p + "format"));
      if (format.empty()) return Fenced();
    } else {
      format.emplace_back().set_value(std::string(kFormat));
    }
  }
  if (format.front().value() != kFormat) {
    return absl::FailedPreconditionError(
        absl::StrCat("etcd prefix ", p, " holds metadata of format '",
                     absl::CHexEscape(format.front().value().substr(0, 64)),
                     "', not '", kFormat, "'"));
  }
  TESSERA_ASSIGN_OR_RETURN(std::vector<mvccpb::KeyValue> id,
                           etcd_->Range(p + "cluster_id"));
  if (id.empty() || id.front().value().size() != 32 ||
      !absl::c_all_of(id.front().value(),
                      [](char c) { return absl::ascii_isxdigit(c); })) {
    return absl::DataLossError(absl::StrCat(
        "etcd prefix ", p, " has no valid cluster_id (32 hex digits)"));
  }

  TESSERA_RETURN_IF_ERROR(CatchUp(/*stop_at_gap=*/false));
  MetadataState state = std::move(followed_);
  state.cluster_id = id.front().value();
  // The leader appends from here on; what was followed is handed over.
  followed_ = MetadataState();
  loaded_ = true;
  return state;
}

absl::Status EtcdMetadataStore::CheckNewPrefix() const {
  const std::string& p = options_.prefix;
  // The election's keys and the cluster secret may be there already.
  std::optional<std::string> any;
  std::string from = p;
  // (In key order.)
  for (const std::string& allowed :
       {p + kSecretKey, p + kElectionDir, PrefixEnd(p)}) {
    TESSERA_ASSIGN_OR_RETURN(any, etcd_->FirstKey(from, allowed));
    if (any.has_value()) break;
    from = PrefixEnd(allowed);
  }
  if (any.has_value()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "etcd prefix ", p, " holds keys that are not tessera's metadata (",
        absl::CHexEscape(any->substr(0, 128)),
        "...): give a prefix of its own"));
  }
  return absl::OkStatus();
}

absl::Status EtcdMetadataStore::CheckPrefix() const {
  const std::string& p = options_.prefix;
  // Inside another cluster's prefix (its log, its election): a key written
  // there would be read as that cluster's.
  for (size_t slash = p.find('/'); slash + 1 < p.size();
       slash = p.find('/', slash + 1)) {
    const std::string outer = p.substr(0, slash + 1);
    TESSERA_ASSIGN_OR_RETURN(std::vector<mvccpb::KeyValue> format,
                             etcd_->Range(outer + "format"));
    if (!format.empty() && format.front().value() == kFormat) {
      return absl::FailedPreconditionError(absl::StrCat(
          "etcd prefix ", p, " lies inside the tessera metadata of prefix ",
          outer, ": give a prefix of its own, outside every other"));
    }
  }
  TESSERA_ASSIGN_OR_RETURN(std::vector<mvccpb::KeyValue> format,
                           etcd_->Range(p + "format"));
  if (format.empty()) {
    const absl::Status fresh = CheckNewPrefix();
    if (fresh.ok()) return fresh;
    // A leader may have made the prefix between the two reads (its format
    // and cluster_id go in one transaction): the key found may be its
    // cluster_id. Only a prefix still without a format is another's.
    TESSERA_ASSIGN_OR_RETURN(format, etcd_->Range(p + "format"));
    if (format.empty()) return fresh;
  }
  if (format.front().value() != kFormat) {
    return absl::FailedPreconditionError(
        absl::StrCat("etcd prefix ", p, " holds metadata of format '",
                     absl::CHexEscape(format.front().value().substr(0, 64)),
                     "', not '", kFormat, "'"));
  }
  return absl::OkStatus();
}

absl::Status EtcdMetadataStore::Follow() {
  absl::MutexLock lock(&mu_);
  if (loaded_) return absl::OkStatus();
  const std::string& p = options_.prefix;
  TESSERA_ASSIGN_OR_RETURN(std::vector<mvccpb::KeyValue> format,
                           etcd_->Range(p + "format"));
  if (format.empty()) return absl::OkStatus();  // nothing written yet
  if (format.front().value() != kFormat) {
    return absl::FailedPreconditionError(
        absl::StrCat("etcd prefix ", p, " holds metadata of format '",
                     absl::CHexEscape(format.front().value().substr(0, 64)),
                     "', not '", kFormat, "'"));
  }
  return CatchUp(/*stop_at_gap=*/true);
}

EtcdMetadataStore::FollowStats EtcdMetadataStore::follow_stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

absl::Status EtcdMetadataStore::CatchUp(bool stop_at_gap) {
  const std::string& p = options_.prefix;
  TESSERA_ASSIGN_OR_RETURN(std::vector<mvccpb::KeyValue> manifest,
                           etcd_->Range(p + "snapshot"));
  if (!manifest.empty()) {
    const std::string& m = manifest.front().value();
    if (m.size() < 20 || !absl::StartsWith(m, kManifestMagic)) {
      return absl::DataLossError(absl::StrCat(
          "etcd prefix ", p, ": the snapshot manifest is damaged"));
    }
    const uint64_t generation = GetLE(m, 4, 8);
    const uint64_t through = GetLE(m, 12, 8);
    // A snapshot already followed is not read again: a standby that kept
    // up reads only the log written since.
    if (!followed_snapshot_ || generation != snapshot_generation_) {
      TESSERA_ASSIGN_OR_RETURN(const std::string bytes,
                               Unstage(kSnapshotMagic, "snapchunk", generation,
                                       m.substr(20), "the snapshot"));
      MetadataState state;
      TESSERA_RETURN_IF_ERROR(
          Annotate(DecodeSnapshot(bytes, &state),
                   absl::StrCat("the snapshot under etcd prefix ", p)));
      followed_ = std::move(state);
      followed_snapshot_ = true;
      snapshot_generation_ = generation;
      followed_next_ = through + 1;
      replays_records_ = false;
      ++stats_.snapshots_read;
    }
  }
  const std::string log = p + "log/";
  TESSERA_ASSIGN_OR_RETURN(
      std::vector<mvccpb::KeyValue> entries,
      etcd_->Range(LogKey(followed_next_), PrefixEnd(log)));
  for (const mvccpb::KeyValue& kv : entries) {
    uint64_t seq = 0;
    const absl::string_view digits =
        absl::string_view(kv.key()).substr(log.size());
    if (digits.size() != 20 || !absl::SimpleAtoi(digits, &seq)) {
      return absl::DataLossError(
          absl::StrCat("etcd key ", kv.key(), " is no log entry of tessera's"));
    }
    // A slot whose write is still being settled: a standby waits for it.
    if (seq != followed_next_ && stop_at_gap) break;
    if (kv.value() != kVoid) {
      TESSERA_ASSIGN_OR_RETURN(const std::string bytes,
                               Unstage(kLogMagic, "logchunk", seq, kv.value(),
                                       absl::StrCat("log entry ", seq)));
      absl::StatusOr<std::vector<MetadataChange>> changes = DecodeBatch(bytes);
      if (!changes.ok()) {
        return Annotate(
            changes.status(),
            absl::StrCat("log entry ", seq, " under etcd prefix ", p));
      }
      for (const MetadataChange& change : *changes) followed_.Apply(change);
      replays_records_ = true;
      ++stats_.entries_read;
    }
    followed_next_ = seq + 1;
  }
  next_seq_ = std::max(next_seq_, followed_next_);
  return absl::OkStatus();
}

absl::Status EtcdMetadataStore::DecidePending() {
  const Pending pending = *pending_;
  etcdserverpb::TxnRequest txn;
  *txn.add_compare() = Absent(LogKey(pending.seq));
  *txn.add_success() = Put(LogKey(pending.seq), std::string(kVoid));
  absl::StatusOr<bool> voided = Commit(std::move(txn));
  if (!voided.ok()) {
    return absl::UnavailableError(
        absl::StrCat("etcd cannot settle an earlier write yet: ",
                     voided.status().message()));
  }
  if (*voided) {
    pending_.reset();
    return absl::OkStatus();
  }
  TESSERA_ASSIGN_OR_RETURN(std::vector<mvccpb::KeyValue> slot,
                           etcd_->Range(LogKey(pending.seq)));
  if (slot.empty()) return Fenced();  // the fence failed, not the slot
  if (slot.front().value() == kVoid) {
    pending_.reset();
    return absl::OkStatus();
  }
  if (slot.front().value() == pending.value) {
    broken_ = absl::DataLossError(absl::StrCat(
        "a batch reported as not recorded reached etcd after all (log entry ",
        pending.seq, " under ", options_.prefix,
        "): restart the coordinator to load it"));
    return broken_;
  }
  return Fenced();
}

absl::Status EtcdMetadataStore::Append(
    absl::Span<const MetadataChange> changes) {
  absl::MutexLock lock(&mu_);
  TESSERA_RETURN_IF_ERROR(broken_);
  if (pending_.has_value()) TESSERA_RETURN_IF_ERROR(DecidePending());
  TESSERA_ASSIGN_OR_RETURN(const std::string bytes, EncodeBatch(changes));
  const uint64_t seq = next_seq_;
  TESSERA_ASSIGN_OR_RETURN(const std::string value,
                           Stage(kLogMagic, "logchunk", seq, bytes));
  etcdserverpb::TxnRequest txn;
  *txn.add_compare() = Absent(LogKey(seq));
  *txn.add_success() = Put(LogKey(seq), value);
  absl::StatusOr<bool> done = Commit(std::move(txn));
  if (!done.ok()) {
    if (!Ambiguous(done.status())) return done.status();
    // It may still land: the slot is settled before the next write.
    pending_ = Pending{seq, value};
    next_seq_ = seq + 1;
    return absl::UnavailableError(done.status().message());
  }
  if (!*done) {
    // A try that timed out on one member and was retried on another may
    // have landed first.
    absl::StatusOr<std::vector<mvccpb::KeyValue>> slot =
        etcd_->Range(LogKey(seq));
    if (!slot.ok() || slot->empty() || slot->front().value() != value) {
      return Fenced();
    }
  }
  next_seq_ = seq + 1;
  replays_records_ = true;
  return absl::OkStatus();
}

absl::Status EtcdMetadataStore::Snapshot(const MetadataState& state) {
  TESSERA_ASSIGN_OR_RETURN(const std::string bytes, EncodeSnapshot(state));
  absl::MutexLock lock(&mu_);
  TESSERA_RETURN_IF_ERROR(broken_);
  if (pending_.has_value()) TESSERA_RETURN_IF_ERROR(DecidePending());
  // A new generation at every try: a try whose answer was lost may have
  // made its generation the current one.
  const uint64_t generation = ++snapshot_generation_;
  const uint64_t through = next_seq_ - 1;
  TESSERA_ASSIGN_OR_RETURN(
      const std::string staged,
      Stage(kSnapshotMagic, "snapchunk", generation, bytes));
  std::string manifest(kManifestMagic);
  PutLE(&manifest, generation, 8);
  PutLE(&manifest, through, 8);
  manifest += staged;
  const std::string& p = options_.prefix;
  etcdserverpb::TxnRequest txn;
  *txn.add_success() = Put(p + "snapshot", manifest);
  // The log it holds, chunks of entries that never landed, and the
  // snapshots before it go in the same transaction.
  *txn.add_success() = DeleteRange(p + "log/", LogKey(through + 1));
  *txn.add_success() =
      DeleteRange(p + "logchunk/", ChunkKey("logchunk", through + 1, -1));
  *txn.add_success() =
      DeleteRange(p + "snapchunk/", ChunkKey("snapchunk", generation, -1));
  TESSERA_ASSIGN_OR_RETURN(const bool done, Commit(std::move(txn)));
  if (!done) return Fenced();
  replays_records_ = false;
  return absl::OkStatus();
}

absl::StatusOr<std::string> EtcdMetadataStore::LoadOrMakeSecret(size_t bytes) {
  absl::MutexLock lock(&mu_);
  const std::string key = options_.prefix + kSecretKey;
  for (int attempt = 0; attempt < 2; ++attempt) {
    TESSERA_ASSIGN_OR_RETURN(std::vector<mvccpb::KeyValue> got,
                             etcd_->Range(key));
    if (!got.empty()) {
      if (got.front().value().size() != bytes) {
        return absl::DataLossError(absl::StrCat("etcd key ", key, " is not a ",
                                                bytes, "-byte secret"));
      }
      return got.front().value();
    }
    std::string secret(bytes, '\0');
    if (getrandom(secret.data(), bytes, 0) != static_cast<ssize_t>(bytes)) {
      return absl::InternalError("cannot draw a cluster secret");
    }
    etcdserverpb::TxnRequest txn;
    *txn.add_compare() = Absent(key);
    *txn.add_success() = Put(key, secret);
    TESSERA_ASSIGN_OR_RETURN(const bool made, Commit(std::move(txn)));
    if (made) return secret;
  }
  return Fenced();
}

bool EtcdMetadataStore::ReplaysRecords() const {
  absl::MutexLock lock(&mu_);
  return replays_records_;
}

}  // namespace tessera
