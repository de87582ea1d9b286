#include "coordinator/file_metadata_store.h"

#include <dirent.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "coordinator/metadata_store_contract_test.h"
#include "core/testing/status_matchers.h"
#include "core/testing/temp_files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::MakeTempDir;
using ::tessera::testing::ReadFileToString;
using ::tessera::testing::StatusIs;
using ::tessera::testing::WriteStringToFile;
using ::testing::AllOf;
using ::testing::HasSubstr;

MetadataChange TensorChange(const std::string& name, uint64_t version,
                            int num_shards) {
  auto tensor = std::make_shared<TensorMetadata>();
  tensor->name = name;
  tensor->shape = {static_cast<int64_t>(num_shards) * 2, 3};
  tensor->dtype = DType::kInt16;
  tensor->version = version;
  for (int i = 0; i < num_shards; ++i) {
    ShardInfo shard;
    shard.box = Box{{2 * i, 0}, {2, 3}};
    Replica& replica = shard.replicas.emplace_back();
    replica.rank = i;
    replica.worker = "w" + std::to_string(i);
    replica.shard_id = 100 * version + i;
    tensor->shards.push_back(shard);
  }
  return MetadataChange::Tensor(std::move(tensor));
}

MetadataChange Deleted(const std::string& name) {
  return MetadataChange::DeletedTensor(name);
}

int64_t FileSize(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 ? st.st_size : -1;
}

// The file store against the MetadataStore contract: a restart is a new
// store on the same directory, after the old one is closed.
testing::MetadataStoreFactory FileStoreFactory() {
  testing::MetadataStoreFactory factory;
  factory.name = "File";
  factory.make = [] {
    return std::make_unique<FileMetadataStore>(MakeTempDir("store_") + "/data");
  };
  factory.make_faulty = [](testing::FaultPlan* faults) {
    FileOps ops;
    ops.write = [faults](int fd, const void* data, size_t size) {
      return faults->Write(fd, data, size);
    };
    ops.sync = [faults](int fd) { return faults->Sync(fd); };
    return std::make_unique<FileMetadataStore>(MakeTempDir("store_") + "/data",
                                               ops);
  };
  factory.reopen = [](std::unique_ptr<MetadataStore> store) {
    auto* file = static_cast<FileMetadataStore*>(store.get());
    const std::string dir = file->dir();
    const FileOps ops = file->ops();
    store.reset();  // releases the directory's lock
    return std::make_unique<FileMetadataStore>(dir, ops);
  };
  return factory;
}

using ::tessera::testing::MetadataStoreContractTest;
INSTANTIATE_TEST_SUITE_P(File, MetadataStoreContractTest,
                         ::testing::Values(FileStoreFactory()),
                         MetadataStoreContractTest::Name);

TEST(FileMetadataStoreTest, NewDirectoryStartsEmpty) {
  FileMetadataStore store(MakeTempDir("store_") + "/fresh");
  auto state = store.Load();
  ASSERT_THAT(state.status(), IsOk());
  EXPECT_TRUE(state->tensors.empty());
  EXPECT_TRUE(state->workers.empty());
}

TEST(FileMetadataStoreTest, ChangesSurviveAReopen) {
  const std::string dir = MakeTempDir("store_");
  {
    FileMetadataStore store(dir);
    ASSERT_THAT(store.Load().status(), IsOk());
    WorkerInfo worker;
    worker.name = "w0";
    worker.address = "127.0.0.1:1";
    ASSERT_THAT(store.Append(MetadataChange::Worker(worker)), IsOk());
    ASSERT_THAT(store.Append(TensorChange("a", 1, 2)), IsOk());
    ASSERT_THAT(store.Append(TensorChange("b", 1, 3)), IsOk());
    ASSERT_THAT(store.Append(TensorChange("a", 2, 4)), IsOk());
    ASSERT_THAT(store.Append(Deleted("b")), IsOk());
  }
  FileMetadataStore store(dir);
  auto state = store.Load();
  ASSERT_THAT(state.status(), IsOk());
  EXPECT_EQ(store.records_recovered(), 5);
  ASSERT_EQ(state->tensors.size(), 1u);
  const TensorMetadata& a = *state->tensors.at("a");
  EXPECT_EQ(a.version, 2u);
  ASSERT_EQ(a.shards.size(), 4u);
  EXPECT_EQ(a.shards[3].replicas[0].shard_id, 203u);
  EXPECT_EQ(a.shards[3].replicas[0].worker, "w3");
  EXPECT_EQ(a.dtype, DType::kInt16);
  EXPECT_EQ(state->workers.at("w0").address, "127.0.0.1:1");
}

TEST(FileMetadataStoreTest, TornTailIsTruncatedAndEarlierRecordsRecovered) {
  const std::string dir = MakeTempDir("store_");
  int64_t size_after_two = 0;
  {
    FileMetadataStore store(dir);
    ASSERT_THAT(store.Load().status(), IsOk());
    ASSERT_THAT(store.Append(TensorChange("a", 1, 2)), IsOk());
    ASSERT_THAT(store.Append(TensorChange("b", 1, 2)), IsOk());
    size_after_two = FileSize(dir + "/log");
    ASSERT_THAT(store.Append(TensorChange("c", 1, 2)), IsOk());
  }
  // A crash in the middle of writing the third record.
  ASSERT_EQ(truncate((dir + "/log").c_str(), FileSize(dir + "/log") - 5), 0);
  FileMetadataStore store(dir);
  auto state = store.Load();
  ASSERT_THAT(state.status(), IsOk());
  EXPECT_EQ(state->tensors.size(), 2u);
  EXPECT_EQ(state->tensors.count("c"), 0u);
  EXPECT_GT(store.torn_bytes_dropped(), 0);
  EXPECT_EQ(FileSize(dir + "/log"), size_after_two);
  // The log continues cleanly after the truncation.
  ASSERT_THAT(store.Append(TensorChange("d", 1, 1)), IsOk());
}

TEST(FileMetadataStoreTest, CorruptedLastRecordIsDroppedByItsChecksum) {
  const std::string dir = MakeTempDir("store_");
  {
    FileMetadataStore store(dir);
    ASSERT_THAT(store.Load().status(), IsOk());
    ASSERT_THAT(store.Append(TensorChange("a", 1, 2)), IsOk());
    ASSERT_THAT(store.Append(TensorChange("b", 1, 2)), IsOk());
  }
  {
    std::fstream f(dir + "/log",
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(FileSize(dir + "/log") - 3);
    f.put('\x7f');
  }
  FileMetadataStore store(dir);
  auto state = store.Load();
  ASSERT_THAT(state.status(), IsOk());
  EXPECT_EQ(state->tensors.size(), 1u);
  EXPECT_EQ(state->tensors.count("a"), 1u);
}

// One shard as a coordinator from before replicas described it.
struct OneOwner {
  std::string box;
  int32_t rank;
  std::string worker;
  uint64_t shard_id;
};

void ExpectOneReplicaEach(const TensorMetadata& meta,
                          const std::vector<OneOwner>& want) {
  ASSERT_EQ(meta.shards.size(), want.size()) << meta.name;
  for (size_t i = 0; i < want.size(); ++i) {
    const ShardInfo& shard = meta.shards[i];
    EXPECT_EQ(shard.box.ToString(), want[i].box) << meta.name << " " << i;
    ASSERT_EQ(shard.replicas.size(), 1u) << meta.name << " " << i;
    const Replica& replica = shard.replicas[0];
    EXPECT_EQ(replica.rank, want[i].rank) << meta.name << " " << i;
    EXPECT_EQ(replica.device.ToString(), "cpu");
    EXPECT_EQ(replica.worker, want[i].worker) << meta.name << " " << i;
    EXPECT_EQ(replica.address,
              want[i].rank == 1 ? "127.0.0.1:17871" : "127.0.0.1:17872");
    EXPECT_EQ(replica.shard_id, want[i].shard_id) << meta.name << " " << i;
  }
}

// A --data_dir written by a coordinator from before shards had replicas
// (testdata/one_owner_data_dir/README.md says how): every shard loads as one
// replica, the one its owner held.
TEST(FileMetadataStoreTest, DataDirOfOneOwnerPerShardLoadsAsOneReplicaEach) {
  const std::string source =
      absl::StrCat(std::getenv("TEST_SRCDIR"),
                   "/tessera/coordinator/testdata/one_owner_data_dir");
  const std::string dir = MakeTempDir("store_") + "/data";
  ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
  for (const char* name : {"snapshot", "log"}) {
    const std::string bytes = ReadFileToString(absl::StrCat(source, "/", name));
    ASSERT_FALSE(bytes.empty()) << name;
    WriteStringToFile(absl::StrCat(dir, "/", name), bytes);
  }
  auto store = std::make_unique<FileMetadataStore>(dir);
  absl::StatusOr<MetadataState> state = store->Load();
  ASSERT_THAT(state.status(), IsOk());
  EXPECT_GT(store->records_recovered(), 0);  // `late` is in the log
  EXPECT_THAT(state->workers.size(), 2u);
  EXPECT_EQ(state->workers.at("w0").address, "127.0.0.1:17871");
  EXPECT_EQ(state->workers.at("w1").rank, 0);
  std::vector<std::string> names;
  for (const auto& [name, meta] : state->tensors) names.push_back(name);
  EXPECT_THAT(names, ::testing::ElementsAre("emb", "grid", "late", "rows"));

  const TensorMetadata& emb = *state->tensors.at("emb");
  EXPECT_EQ(emb.version, 2u);
  EXPECT_EQ(emb.dtype, DType::kFloat32);
  EXPECT_EQ(emb.shape, (Shape{10, 4}));
  ExpectOneReplicaEach(emb, {{"0:10,0:2", 1, "w0", 12516703633074958785u},
                             {"0:10,2:4", 0, "w1", 10772376606352435384u}});
  ExpectOneReplicaEach(*state->tensors.at("grid"),
                       {{"0:2,0:2", 1, "w0", 10307021113094853430u},
                        {"0:2,2:4", 0, "w1", 14786798384446526431u},
                        {"2:4,0:4", 1, "w0", 13254903360102401983u}});
  ExpectOneReplicaEach(*state->tensors.at("rows"),
                       {{"0:2,0:2", 0, "w1", 9963105190592925392u},
                        {"2:4,0:2", 1, "w0", 4126231575443866782u},
                        {"4:6,0:2", 0, "w1", 4720517318500103526u}});
  const TensorMetadata& late = *state->tensors.at("late");
  EXPECT_EQ(late.dtype, DType::kFloat64);
  ExpectOneReplicaEach(late, {{"0:2,0:2", 0, "w1", 17399865348983128360u},
                              {"0:2,2:3", 1, "w0", 13129931622712651864u}});
  EXPECT_GT(state->shard_id_high_water, 0u);

  // What this version writes back (a snapshot, as at every start) loads
  // the same.
  ASSERT_THAT(store->Snapshot(*state), IsOk());
  store.reset();  // releases the directory's lock
  FileMetadataStore again(dir);
  absl::StatusOr<MetadataState> reloaded = again.Load();
  ASSERT_THAT(reloaded.status(), IsOk());
  ExpectOneReplicaEach(*reloaded->tensors.at("emb"),
                       {{"0:10,0:2", 1, "w0", 12516703633074958785u},
                        {"0:10,2:4", 0, "w1", 10772376606352435384u}});
}

// A log of tensors "a", "b", "c" (one record each); `*b_at` is the byte
// offset of b's record.
std::string ThreeRecordLog(int64_t* b_at) {
  const std::string dir = MakeTempDir("store_");
  FileMetadataStore store(dir);
  EXPECT_THAT(store.Load().status(), IsOk());
  EXPECT_THAT(store.Append(TensorChange("a", 1, 2)), IsOk());
  *b_at = FileSize(dir + "/log");
  EXPECT_THAT(store.Append(TensorChange("b", 1, 2)), IsOk());
  EXPECT_THAT(store.Append(TensorChange("c", 1, 2)), IsOk());
  return dir;
}

// A bad block in the middle of the log is not a torn tail: the records
// after it were acknowledged. It used to be truncated away with them (and
// their shards freed as unreferenced), logged as a torn tail.
TEST(FileMetadataStoreTest, DamageInTheMiddleOfTheLogRefusesToLoad) {
  int64_t b_at = 0;
  const std::string dir = ThreeRecordLog(&b_at);
  std::string log = ReadFileToString(dir + "/log");
  log[b_at + 12] ^= 0x40;  // a flipped bit in b's payload
  WriteStringToFile(dir + "/log", log);
  FileMetadataStore store(dir);
  EXPECT_THAT(
      store.Load().status(),
      StatusIs(
          absl::StatusCode::kDataLoss,
          AllOf(HasSubstr(absl::StrCat("damaged at byte offset ", b_at)),
                HasSubstr("1 valid record(s) follow"),
                HasSubstr(absl::StrCat("--recover_truncate_log_at=", b_at)))));
  // Nothing changed on the disk.
  EXPECT_EQ(ReadFileToString(dir + "/log"), log);
}

TEST(FileMetadataStoreTest, DamagedLengthInTheMiddleIsFoundByAScan) {
  int64_t b_at = 0;
  const std::string dir = ThreeRecordLog(&b_at);
  std::string log = ReadFileToString(dir + "/log");
  // A zeroed run over b's header: where c starts is no longer written down.
  for (int i = 0; i < 10; ++i) log[b_at + i] = '\0';
  WriteStringToFile(dir + "/log", log);
  FileMetadataStore store(dir);
  EXPECT_THAT(store.Load().status(),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr(absl::StrCat("offset ", b_at))));
  EXPECT_EQ(ReadFileToString(dir + "/log"), log);
}

TEST(FileMetadataStoreTest, ZeroedTailIsATornTailNotDamage) {
  int64_t b_at = 0;
  const std::string dir = ThreeRecordLog(&b_at);
  // A crash can leave the file longer than what reached it, as zeros.
  const int64_t size = FileSize(dir + "/log");
  WriteStringToFile(dir + "/log",
                    ReadFileToString(dir + "/log") + std::string(4096, '\0'));
  FileMetadataStore store(dir);
  auto state = store.Load();
  ASSERT_THAT(state.status(), IsOk());
  EXPECT_EQ(state->tensors.size(), 3u);
  EXPECT_EQ(FileSize(dir + "/log"), size);
}

TEST(FileMetadataStoreTest, TruncatingAtTheNamedOffsetKeepsACopyOfTheLog) {
  int64_t b_at = 0;
  const std::string dir = ThreeRecordLog(&b_at);
  std::string log = ReadFileToString(dir + "/log");
  log[b_at + 12] ^= 0x40;
  WriteStringToFile(dir + "/log", log);
  {
    // Another offset than the damaged one is refused, naming the right one.
    RecoveryOptions wrong;
    wrong.truncate_log_at = b_at + 1;
    FileMetadataStore store(dir, FileOps(), wrong);
    EXPECT_THAT(store.Load().status(),
                StatusIs(absl::StatusCode::kDataLoss,
                         HasSubstr(absl::StrCat("offset ", b_at))));
  }
  RecoveryOptions recovery;
  recovery.truncate_log_at = b_at;
  {
    FileMetadataStore store(dir, FileOps(), recovery);
    auto state = store.Load();
    ASSERT_THAT(state.status(), IsOk());
    EXPECT_EQ(state->tensors.size(), 1u);
    EXPECT_EQ(state->tensors.count("a"), 1u);
    EXPECT_EQ(store.damaged_records_dropped(), 1);
    EXPECT_EQ(FileSize(dir + "/log"), b_at);
    EXPECT_EQ(ReadFileToString(absl::StrCat(dir, "/log.damaged-", b_at)), log);
    // The log goes on from the cut.
    ASSERT_THAT(store.Append(TensorChange("d", 1, 1)), IsOk());
  }
  // A flag left in place does nothing to a whole log.
  FileMetadataStore store(dir, FileOps(), recovery);
  auto state = store.Load();
  ASSERT_THAT(state.status(), IsOk());
  EXPECT_EQ(state->tensors.size(), 2u);
}

TEST(FileMetadataStoreTest, SnapshotThenLogReplaysToTheSameState) {
  const std::string dir = MakeTempDir("store_");
  {
    FileMetadataStore store(dir);
    ASSERT_THAT(store.Load().status(), IsOk());
    MetadataState state;
    state.tensors["a"] = TensorChange("a", 1, 2).tensor;
    state.shard_id_high_water = 5000;
    ASSERT_THAT(store.Snapshot(state), IsOk());
    EXPECT_EQ(FileSize(dir + "/log"), 0);
    ASSERT_THAT(store.Append(TensorChange("b", 1, 2)), IsOk());
  }
  FileMetadataStore store(dir);
  auto state = store.Load();
  ASSERT_THAT(state.status(), IsOk());
  EXPECT_EQ(state->tensors.size(), 2u);
  EXPECT_EQ(state->shard_id_high_water, 5000u);
}

TEST(FileMetadataStoreTest, BrokenSnapshotIsAnErrorNotAnEmptyState) {
  const std::string dir = MakeTempDir("store_");
  {
    FileMetadataStore store(dir);
    ASSERT_THAT(store.Load().status(), IsOk());
    MetadataState state;
    state.tensors["a"] = TensorChange("a", 1, 2).tensor;
    ASSERT_THAT(store.Snapshot(state), IsOk());
  }
  ASSERT_EQ(
      truncate((dir + "/snapshot").c_str(), FileSize(dir + "/snapshot") - 1),
      0);
  FileMetadataStore store(dir);
  EXPECT_THAT(store.Load().status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("snapshot")));
}

TEST(FileMetadataStoreTest, TwoCoordinatorsCannotShareADirectory) {
  const std::string dir = MakeTempDir("store_");
  FileMetadataStore first(dir);
  ASSERT_THAT(first.Load().status(), IsOk());
  FileMetadataStore second(dir);
  EXPECT_THAT(
      second.Load().status(),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("in use")));
}

TEST(FileMetadataStoreTest, ABatchIsOneWriteAndComesBackWhole) {
  const std::string dir = MakeTempDir("store_");
  {
    FileMetadataStore store(dir);
    ASSERT_THAT(store.Load().status(), IsOk());
    std::vector<MetadataChange> batch;
    for (int i = 0; i < 50; ++i)
      batch.push_back(TensorChange("t" + std::to_string(i), 1, 2));
    ASSERT_THAT(store.Append(batch), IsOk());
  }
  FileMetadataStore store(dir);
  auto state = store.Load();
  ASSERT_THAT(state.status(), IsOk());
  EXPECT_EQ(state->tensors.size(), 50u);
  EXPECT_EQ(store.records_recovered(), 50);
}

TEST(FileMetadataStoreTest, TornBatchKeepsTheRecordsBeforeTheTear) {
  // A crash in the middle of a batch: the records written whole before the
  // tear are recovered (they were never acknowledged, but replaying them is
  // what a log does), the torn one is dropped.
  const std::string dir = MakeTempDir("store_");
  {
    FileMetadataStore store(dir);
    ASSERT_THAT(store.Load().status(), IsOk());
    ASSERT_THAT(store.Append({TensorChange("a", 1, 2), TensorChange("b", 1, 2),
                              TensorChange("c", 1, 2)}),
                IsOk());
  }
  ASSERT_EQ(truncate((dir + "/log").c_str(), FileSize(dir + "/log") - 3), 0);
  FileMetadataStore store(dir);
  auto state = store.Load();
  ASSERT_THAT(state.status(), IsOk());
  EXPECT_EQ(state->tensors.size(), 2u);
  EXPECT_EQ(state->tensors.count("c"), 0u);
}

TEST(FileMetadataStoreTest, AppendBeforeLoadIsRefused) {
  FileMetadataStore store(MakeTempDir("store_"));
  EXPECT_THAT(
      store.Append(TensorChange("a", 1, 1)),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("not loaded")));
}

TEST(FileMetadataStoreTest,
     ABatchThatCannotBeCutBackIsDataLossAndStopsChanges) {
  testing::FaultPlan faults;
  FileOps ops;
  ops.write = [&](int fd, const void* data, size_t size) {
    return faults.Write(fd, data, size);
  };
  ops.sync = [&](int fd) { return faults.Sync(fd); };
  const std::string dir = MakeTempDir("store_");
  FileMetadataStore store(dir, ops);
  ASSERT_THAT(store.Load().status(), IsOk());
  ASSERT_THAT(store.Append(TensorChange("a", 1, 2)), IsOk());
  faults.FailSyncs(2, EIO);  // the sync, then the sync of the cut
  EXPECT_THAT(store.Append(TensorChange("b", 1, 2)),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("unknown")));
  EXPECT_THAT(store.Append(TensorChange("c", 1, 2)),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("refuses changes")));
}

int Mode(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 ? static_cast<int>(st.st_mode & 07777)
                                      : -1;
}

// Every regular file in `dir` and its mode.
std::map<std::string, int> FileModes(const std::string& dir) {
  std::map<std::string, int> out;
  DIR* listing = opendir(dir.c_str());
  if (listing == nullptr) return out;
  while (const dirent* entry = readdir(listing)) {
    const std::string path = dir + "/" + entry->d_name;
    struct stat st;
    if (lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode))
      out[entry->d_name] = static_cast<int>(st.st_mode & 07777);
  }
  closedir(listing);
  return out;
}

// Sets the umask for a scope, so that modes asked of open/mkdir show as they
// are (the metadata used to be created 0755/0644 and relied on the umask).
class ScopedUmask {
 public:
  explicit ScopedUmask(mode_t mask) : old_(umask(mask)) {}
  ~ScopedUmask() { umask(old_); }

 private:
  mode_t old_;
};

TEST(FileMetadataStoreTest, NewDataDirAndEveryFileInItArePrivate) {
  ScopedUmask open_umask(0);
  const std::string dir = MakeTempDir("store_") + "/data";
  {
    FileMetadataStore store(dir);
    ASSERT_THAT(store.Load().status(), IsOk());
    ASSERT_THAT(store.Append(TensorChange("a", 1, 2)), IsOk());
    MetadataState state;
    state.tensors["a"] = TensorChange("a", 1, 2).tensor;
    ASSERT_THAT(store.Snapshot(state), IsOk());
    ASSERT_THAT(store.Append(TensorChange("b", 1, 2)), IsOk());
  }
  EXPECT_EQ(Mode(dir), 0700);
  const std::map<std::string, int> files = FileModes(dir);
  for (const char* name : {"LOCK", "log", "snapshot", "cluster_id"}) {
    EXPECT_EQ(files.count(name), 1u) << name;
  }
  for (const auto& [name, mode] : files) {
    EXPECT_EQ(mode, 0600) << name;
  }
}

TEST(FileMetadataStoreTest, LooserExistingDataDirIsTightened) {
  ScopedUmask open_umask(0);
  const std::string dir = MakeTempDir("store_") + "/data";
  ASSERT_EQ(mkdir(dir.c_str(), 0755), 0);
  {
    std::ofstream log(dir + "/log");
    std::ofstream other(dir + "/notes");
  }
  ASSERT_EQ(chmod((dir + "/log").c_str(), 0644), 0);
  ASSERT_EQ(chmod((dir + "/notes").c_str(), 0666), 0);
  FileMetadataStore store(dir);
  ASSERT_THAT(store.Load().status(), IsOk());
  EXPECT_EQ(Mode(dir), 0700);
  EXPECT_EQ(Mode(dir + "/log"), 0600);
  EXPECT_EQ(Mode(dir + "/notes"), 0600);
}

TEST(FileMetadataStoreTest, DataDirThatIsAFileIsRefused) {
  const std::string path = MakeTempDir("store_") + "/file";
  { std::ofstream file(path); }
  FileMetadataStore store(path);
  EXPECT_THAT(store.Load().status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("not a directory")));
}

TEST(FileMetadataStoreTest, ClusterIdIsMadeOnceAndKeptInTheDirectory) {
  const std::string dir = MakeTempDir("store_");
  std::string id;
  {
    FileMetadataStore store(dir);
    auto state = store.Load();
    ASSERT_THAT(state.status(), IsOk());
    EXPECT_TRUE(store.cluster_id_created());
    id = state->cluster_id;
  }
  {
    FileMetadataStore store(dir);
    auto state = store.Load();
    ASSERT_THAT(state.status(), IsOk());
    EXPECT_FALSE(store.cluster_id_created());
    EXPECT_EQ(state->cluster_id, id);
  }
  std::ifstream in(dir + "/cluster_id");
  std::string text;
  std::getline(in, text);
  EXPECT_EQ(text, id);
  {
    std::ofstream garbled(dir + "/cluster_id");
    garbled << "not an id";
  }
  FileMetadataStore store(dir);
  EXPECT_THAT(store.Load().status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("cluster id")));
}

}  // namespace
}  // namespace tessera
