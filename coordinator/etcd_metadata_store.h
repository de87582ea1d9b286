// EtcdMetadataStore: the coordinator's metadata in etcd under one prefix P,
// as the file store keeps it in a directory: a snapshot plus a log of
// batches since it (--metadata=etcd://.../P).
//
//   P/format                "tessera-metadata 1": a prefix without it that
//                           holds any key is someone else's, and refused
//   P/cluster_id            drawn once, when the prefix is new
//   P/log/SEQ               one appended batch (SEQ: 20 digits, in order), or
//                           "void" for a slot whose write was lost
//   P/logchunk/SEQ/K        the parts of a batch over one chunk
//   P/snapshot              which snapshot generation holds the state, and
//                           through which SEQ
//   P/snapchunk/GEN/K       that snapshot's bytes
//   P/election/...          the coordinators' election (etcd_leadership.h)
//   P/cluster_secret        what capabilities are signed with, shared by
//                           every coordinator of the prefix
//
// etcd takes at most ~1.5 MiB per request and 128 operations per
// transaction, so a batch or snapshot larger than a chunk (1 MiB) is
// written as chunks first, each in its own transaction, and made visible
// by one small transaction naming them; chunks nobody names are removed
// with the log at the next snapshot. Every value carries a magic and the
// CRC-32 of its bytes, and decodes through metadata_codec's checks.
//
// Fencing: every write is one transaction that also compares the fence key
// (the leader's election key, coordinator/etcd_leadership.h) with the
// revision at which this coordinator created it, so a deposed leader can
// never commit: its transaction fails and the store refuses every later
// change (FAILED_PRECONDITION, "no longer the leader").
//
// A write whose answer never came (etcd without quorum, a timeout) may or
// may not have been applied. Append then returns UNAVAILABLE and keeps the
// slot; the next Append first decides it, writing "void" into it only if it
// is still empty. If the lost write had landed after all, a change the
// caller undid is recorded: the store then refuses every later change
// (DATA_LOSS), as the file store does after a failed sync, and a restarted
// coordinator loads it.
#ifndef TESSERA_COORDINATOR_ETCD_METADATA_STORE_H_
#define TESSERA_COORDINATOR_ETCD_METADATA_STORE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/etcd_client.h"
#include "coordinator/metadata_store.h"

namespace tessera {

// Where the coordinators' election keys live under the prefix.
inline constexpr char kElectionDir[] = "election/";
// The key that holds the secret every coordinator of the prefix signs
// capabilities with (etcd's access control guards it).
inline constexpr char kSecretKey[] = "cluster_secret";

// A stored value's header: "MAGIC" 'I' crc32 BYTES (inline), or "MAGIC"
// 'C' crc32 u64:total u32:chunks (the bytes in chunk keys).
struct StoredValue {
  uint32_t crc32 = 0;
  bool chunked = false;
  absl::string_view inline_bytes;  // into the value parsed
  uint64_t total_bytes = 0;
  uint64_t chunks = 0;
};
// DATA_LOSS (its words finish "VALUE ...") for a value that is not one of
// tessera's with `magic`, or names more than `max_bytes` or more chunks
// than bytes.
absl::StatusOr<StoredValue> ParseStoredValue(absl::string_view value,
                                             absl::string_view magic,
                                             int64_t max_bytes);

struct EtcdStoreOptions {
  std::string prefix;  // ends with '/'
  // Values are cut into chunks of at most this many bytes.
  int64_t chunk_bytes = int64_t{1} << 20;
  // The largest batch or snapshot the store reads back (bounds Load).
  int64_t max_value_bytes = int64_t{4} << 30;
};

class EtcdMetadataStore : public MetadataStore {
 public:
  EtcdMetadataStore(std::shared_ptr<const EtcdClient> etcd,
                    EtcdStoreOptions options);
  using MetadataStore::Append;

  // Writes succeed only while `key` has create revision `revision` (the
  // election key this coordinator holds). Call before Load.
  void SetFence(std::string key, int64_t revision) ABSL_LOCKS_EXCLUDED(mu_);
  const std::string& prefix() const { return options_.prefix; }

  // Reads, and writes nothing: OK when the prefix is tessera's metadata
  // of this format, or new (nothing there but what a coordinator of it
  // writes before its metadata: the election and the cluster secret), and
  // lies inside no other tessera prefix. FAILED_PRECONDITION otherwise,
  // saying what is there. A coordinator checks it before it stands for
  // leader, so that a wrong --metadata leaves no key behind.
  absl::Status CheckPrefix() const ABSL_LOCKS_EXCLUDED(mu_);

  // The cluster secret of the prefix, drawn (`bytes` random bytes) by the
  // first coordinator that asks. Fenced like every write.
  absl::StatusOr<std::string> LoadOrMakeSecret(size_t bytes)
      ABSL_LOCKS_EXCLUDED(mu_);

  // A standby follows the prefix until it leads: Follow reads what was
  // written since its last call (a snapshot only when a newer one was
  // made, then the log after it), so that Load, at promotion, reads only
  // the tail. Does nothing once Load was called.
  absl::Status Follow() ABSL_LOCKS_EXCLUDED(mu_);
  struct FollowStats {
    uint64_t snapshots_read = 0;
    uint64_t entries_read = 0;  // log entries applied
  };
  // What Follow and Load have read, in all.
  FollowStats follow_stats() const ABSL_LOCKS_EXCLUDED(mu_);

  absl::StatusOr<MetadataState> Load() override ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Append(absl::Span<const MetadataChange> changes) override
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Snapshot(const MetadataState& state) override
      ABSL_LOCKS_EXCLUDED(mu_);
  bool ReplaysRecords() const override ABSL_LOCKS_EXCLUDED(mu_);
  std::string Describe() const override;

 private:
  struct Pending {
    uint64_t seq = 0;
    std::string value;  // what was sent for P/log/seq
  };
  // A prefix with no format key holds nothing else than what its
  // coordinators write before the metadata (FAILED_PRECONDITION if it does).
  absl::Status CheckNewPrefix() const;
  std::string LogKey(uint64_t seq) const;
  std::string ChunkKey(absl::string_view kind, uint64_t id, int64_t k) const;
  // A transaction of `ops` (and `compares`) guarded by the fence.
  absl::StatusOr<bool> Commit(etcdserverpb::TxnRequest request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes `bytes` as chunks under `kind`/`id`/ (when more than a chunk)
  // and returns the value that names them (or holds them inline).
  absl::StatusOr<std::string> Stage(absl::string_view magic,
                                    absl::string_view kind, uint64_t id,
                                    const std::string& bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The bytes a staged value names, checked against its CRC.
  absl::StatusOr<std::string> Unstage(absl::string_view magic,
                                      absl::string_view kind, uint64_t id,
                                      const std::string& value,
                                      absl::string_view what) const;
  // Brings followed_ up to etcd: the snapshot when its generation is not
  // the one followed, then the log entries from followed_next_ on (up to
  // the first missing one when `stop_at_gap`).
  absl::Status CatchUp(bool stop_at_gap) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status DecidePending() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Fenced() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::shared_ptr<const EtcdClient> etcd_;
  const EtcdStoreOptions options_;
  mutable absl::Mutex mu_;
  std::string fence_key_ ABSL_GUARDED_BY(mu_);
  int64_t fence_revision_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t snapshot_generation_ ABSL_GUARDED_BY(mu_) = 0;
  bool replays_records_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<Pending> pending_ ABSL_GUARDED_BY(mu_);
  // The state read so far (until Load hands it over), and where the log
  // goes on after it.
  MetadataState followed_ ABSL_GUARDED_BY(mu_);
  bool followed_snapshot_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t followed_next_ ABSL_GUARDED_BY(mu_) = 1;
  bool loaded_ ABSL_GUARDED_BY(mu_) = false;
  FollowStats stats_ ABSL_GUARDED_BY(mu_);
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera

#endif  // TESSERA_COORDINATOR_ETCD_METADATA_STORE_H_
