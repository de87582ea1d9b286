// CheckpointIo on a real HostShardStore and real files: a save read back by
// a load lands the same bytes, and what does not fit the shards is refused
// before a byte moves.
#include "worker/checkpoint_io.h"

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "core/checkpoint_index.h"
#include "core/safetensors.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/host_shard_store.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;
using ::testing::HasSubstr;

ShardDesc Desc(Shape shape, std::string tensor = "t", uint64_t version = 1) {
  ShardDesc desc;
  desc.tensor = std::move(tensor);
  desc.version = version;
  desc.dtype = DType::kInt32;
  desc.tensor_shape = shape;
  desc.box = WholeBox(shape);
  return desc;
}

std::string Bytes(ShardStore& store, uint64_t id) {
  absl::StatusOr<PinnedShard> pinned = store.Pin(id);
  EXPECT_THAT(pinned.status(), IsOk());
  return std::string(pinned->data, pinned->desc.ByteSize());
}

class CheckpointIoTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::filesystem::create_directories(root_);
    ASSERT_THAT(
        store_.Allocate(1, Desc({4}), InitSpec{InitSpec::Kind::kArange}),
        IsOk());
    ASSERT_THAT(store_.Allocate(2, Desc({2, 3}, "u"),
                                InitSpec{InitSpec::Kind::kArange}),
                IsOk());
    ASSERT_THAT(store_.Allocate(3, Desc({4}, "t", 2), InitSpec{}), IsOk());
  }

  const std::string root_ = std::string(std::getenv("TEST_TMPDIR")) + "/root";
  HostShardStore store_;
  std::vector<uint64_t> unsealed_;
  CheckpointIo io_{&store_, root_, [this](uint64_t id) {
                     for (uint64_t u : unsealed_)
                       if (u == id) return true;
                     return false;
                   }};
};

TEST_F(CheckpointIoTest, ASavedFileLoadsBackIntoAnotherShard) {
  CheckpointIo io(&store_, root_, [](uint64_t) { return false; });
  absl::StatusOr<CheckpointIo::SavedFile> saved = io.Save(
      "ck", "a.safetensors",
      {SaveItem{"t.w", 1, "t", 1, false}, SaveItem{"u.w", 2, "u", 1, false}},
      {{"format", "pt"}}, StopCondition{});
  ASSERT_THAT(saved.status(), IsOk());
  ASSERT_EQ(saved->items.size(), 2u);
  EXPECT_EQ(saved->items[0].bytes, 16);
  EXPECT_EQ(saved->items[1].bytes, 24);
  EXPECT_EQ(saved->file_bytes,
            std::filesystem::file_size(root_ + "/ck/a.safetensors"));
  absl::StatusOr<CheckpointListing> listing = io.List("ck");
  ASSERT_THAT(listing.status(), IsOk());
  ASSERT_EQ(listing->entries.size(), 2u);

  // Shard 3 (t at version 2) gets t.w's bytes back, CRC of the whole piece.
  const SavedItem& t = saved->items[0];
  absl::StatusOr<LoadedRuns> loaded =
      io.Load("ck", "a.safetensors", 3, {FileRun{t.data_offset, 16, 0}},
              t.data_offset, t.bytes);
  ASSERT_THAT(loaded.status(), IsOk());
  EXPECT_EQ(loaded->bytes_read, 16);
  EXPECT_EQ(loaded->part_crc32, t.crc32);
  EXPECT_EQ(Bytes(store_, 3), Bytes(store_, 1));
}

TEST_F(CheckpointIoTest, ASaveRefusesShardsNotSealedOrOfAnotherTensor) {
  unsealed_ = {1};
  EXPECT_THAT(io_.Save("ck", "b.safetensors",
                       {SaveItem{"t.w", 1, "t", 1, false}}, {}, {})
                  .status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("not a sealed shard of 't' version 1")));
  unsealed_.clear();
  EXPECT_THAT(io_.Save("ck", "b.safetensors",
                       {SaveItem{"u.w", 2, "t", 1, false}}, {}, {})
                  .status(),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  // A version before the shard was made is not its.
  EXPECT_THAT(io_.Save("ck", "b.safetensors",
                       {SaveItem{"t.w", 3, "t", 1, false}}, {}, {})
                  .status(),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(io_.Save("ck", "b.safetensors",
                       {SaveItem{"t.w", 1, "t", 1, /*scalar=*/true}}, {}, {})
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("one-element shard")));
  EXPECT_FALSE(std::filesystem::exists(root_ + "/ck/b.safetensors"));
}

TEST_F(CheckpointIoTest, ALoadRefusesRunsOutsideTheShardBeforeReading) {
  CheckpointIo io(&store_, root_, [](uint64_t) { return false; });
  ASSERT_THAT(io.Save("ck", "c.safetensors",
                      {SaveItem{"t.w", 1, "t", 1, false}}, {}, {})
                  .status(),
              IsOk());
  const std::string before = Bytes(store_, 3);
  EXPECT_THAT(
      io.Load("ck", "c.safetensors", 3, {FileRun{0, 8, 12}}, 0, 0).status(),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("not inside the shard of 16 bytes")));
  EXPECT_THAT(
      io.Load("ck", "c.safetensors", 3, {FileRun{8, 4, 0}, FileRun{0, 4, 4}}, 0,
              0)
          .status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("in file order")));
  EXPECT_THAT(
      io.Load("ck", "c.safetensors", 3, {FileRun{8, 8, 0}}, 8, 4).status(),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("not inside the piece")));
  EXPECT_THAT(
      io.Load("ck", "c.safetensors", 99, {FileRun{0, 4, 0}}, 0, 0).status(),
      StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(Bytes(store_, 3), before);
}

TEST_F(CheckpointIoTest, AnIndexPastItsBoundIsRefused) {
  EXPECT_THAT(io_.WriteIndex("ck", "tessera.json",
                             std::string(kMaxCheckpointIndexBytes + 1, ' ')),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_FALSE(std::filesystem::exists(root_ + "/ck/tessera.json"));
  EXPECT_THAT(io_.WriteIndex("ck", "tessera.json", "{}"), IsOk());
  EXPECT_TRUE(std::filesystem::exists(root_ + "/ck/tessera.json"));
}

// An export's file: made with its header and zeros, filled by runs of a
// sealed shard, renamed into place; nothing else is written into or renamed.
TEST_F(CheckpointIoTest, AnExportWritesRunsOnlyIntoItsOwnFiles) {
  // Shard 2 (u, [2, 3] int32, 0..5) as the second column of a [2, 4] entry
  // would hold it: its rows at bytes 4 and 20 of the data.
  absl::StatusOr<SafetensorsLayout> layout = LayoutSafetensors(
      {{"u", DType::kInt32, {2, 4}}}, {{"format", "pt"}, {kSavePartKey, "e1"}});
  ASSERT_THAT(layout.status(), IsOk());
  const int64_t data = static_cast<int64_t>(layout->header.size());
  ASSERT_THAT(
      io_.WriteIndex("ex", ".a.part", layout->header, layout->file_bytes),
      IsOk());
  const std::vector<FileRun> runs = {{data + 4, 12, 0}, {data + 20, 12, 12}};
  EXPECT_THAT(io_.WriteRuns("ex", ".a.part", "e1", 2, "u", 1, runs), IsOk());
  // Another save's mark, runs past the data or out of order, another
  // tensor's shard, an unsealed one: refused.
  EXPECT_THAT(io_.WriteRuns("ex", ".a.part", "e2", 2, "u", 1, runs),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("not a file of save e2")));
  EXPECT_THAT(
      io_.WriteRuns("ex", ".a.part", "e1", 2, "u", 1, {{data + 28, 12, 0}}),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("not inside the data")));
  EXPECT_THAT(io_.WriteRuns("ex", ".a.part", "e1", 2, "u", 1,
                            {{data + 20, 4, 0}, {data + 4, 4, 4}}),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(io_.WriteRuns("ex", ".a.part", "e1", 2, "t", 1, runs),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  unsealed_ = {2};
  EXPECT_THAT(io_.WriteRuns("ex", ".a.part", "e1", 2, "u", 1, runs),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  unsealed_.clear();
  // A file of no export is never written into, nor renamed.
  ASSERT_THAT(io_.WriteIndex("ex", "other.bin", "{}"), IsOk());
  EXPECT_FALSE(io_.WriteRuns("ex", "other.bin", "e1", 2, "u", 1, runs).ok());
  EXPECT_FALSE(io_.Publish("ex", "e1", {{"other.bin", "b.safetensors"}}).ok());
  EXPECT_THAT(io_.Publish("ex", "e1", {{".a.part", "tessera.json"}}),
              StatusIs(absl::StatusCode::kInvalidArgument));
  // Into place, an earlier index gone first.
  ASSERT_THAT(io_.WriteIndex("ex", kHfIndexName, "{}"), IsOk());
  ASSERT_THAT(io_.Publish("ex", "e1", {{".a.part", "a.safetensors"}}), IsOk());
  EXPECT_FALSE(std::filesystem::exists(root_ + "/ex/" + kHfIndexName));
  EXPECT_FALSE(std::filesystem::exists(root_ + "/ex/.a.part"));
  absl::StatusOr<CheckpointListing> listing = io_.List("ex");
  // No index and only an export's files: an unfinished save, not a model.
  EXPECT_THAT(listing.status(), StatusIs(absl::StatusCode::kNotFound));
  ASSERT_THAT(io_.WriteIndex("ex", kHfIndexName,
                             R"({"weight_map": {"u": "a.safetensors"}})"),
              IsOk());
  listing = io_.List("ex");
  ASSERT_THAT(listing.status(), IsOk());
  ASSERT_EQ(listing->entries.size(), 1u);
  // The export's mark is the files' own, not the tensors' metadata.
  EXPECT_EQ(
      listing->metadata,
      (std::vector<std::pair<std::string, std::string>>{{"format", "pt"}}));
  std::string file(static_cast<size_t>(layout->file_bytes), '\0');
  {
    FILE* f = fopen((root_ + "/ex/a.safetensors").c_str(), "rb");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(fread(file.data(), 1, file.size(), f), file.size());
    fclose(f);
  }
  std::vector<int32_t> got(8);
  std::memcpy(got.data(), file.data() + data, 32);
  EXPECT_EQ(got, (std::vector<int32_t>{0, 0, 1, 2, 0, 3, 4, 5}));
}

}  // namespace
}  // namespace tessera
