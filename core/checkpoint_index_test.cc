#include "core/checkpoint_index.h"

#include <string>

#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

StoredPiece Piece(Box box, std::string file, std::string entry, int64_t offset,
                  int64_t bytes, uint32_t crc) {
  StoredPiece p;
  p.box = std::move(box);
  p.file = std::move(file);
  p.entry = std::move(entry);
  p.data_offset = offset;
  p.bytes = bytes;
  p.crc32 = crc;
  return p;
}

// A [4, 6] float32 tensor saved as two row halves in two files, and a 0-d
// int64 one.
CheckpointListing Saved() {
  CheckpointListing listing;
  listing.metadata = {{"format", "pt"}, {"step", "100"}};
  CheckpointEntry& w = listing.entries.emplace_back();
  w.name = "layers.0/w";
  w.dtype = DType::kFloat32;
  w.shape = {4, 6};
  w.bytes = 96;
  w.pieces.push_back(Piece(Box({0, 0}, {2, 6}), "a.safetensors", "layers.0/w:0",
                           128, 48, 0xdeadbeef));
  w.pieces.push_back(
      Piece(Box({2, 0}, {2, 6}), "b.safetensors", "layers.0/w:1", 64, 48, 7));
  CheckpointEntry& s = listing.entries.emplace_back();
  s.name = "step";
  s.dtype = DType::kInt64;
  s.bytes = 8;
  s.pieces.push_back(Piece(Box(), "a.safetensors", "step", 176, 8, 1));
  return listing;
}

TEST(TesseraIndex, RoundTripsEveryField) {
  const CheckpointListing saved = Saved();
  absl::StatusOr<CheckpointListing> back =
      ParseTesseraIndex(TesseraIndexJson(saved));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->metadata, saved.metadata);
  ASSERT_EQ(back->entries.size(), 2u);
  const CheckpointEntry& w = back->entries[0];
  EXPECT_EQ(w.name, "layers.0/w");
  EXPECT_EQ(w.dtype, DType::kFloat32);
  EXPECT_THAT(w.shape, ElementsAre(4, 6));
  EXPECT_EQ(w.bytes, 96);
  EXPECT_EQ(w.file, "a.safetensors");
  EXPECT_EQ(w.data_offset, 128);
  ASSERT_EQ(w.pieces.size(), 2u);
  EXPECT_EQ(w.pieces[1].box, Box({2, 0}, {2, 6}));
  EXPECT_EQ(w.pieces[1].file, "b.safetensors");
  EXPECT_EQ(w.pieces[1].entry, "layers.0/w:1");
  EXPECT_EQ(w.pieces[1].data_offset, 64);
  EXPECT_EQ(w.pieces[0].crc32, 0xdeadbeefu);
  const CheckpointEntry& s = back->entries[1];
  EXPECT_TRUE(s.shape.empty());
  EXPECT_EQ(s.bytes, 8);
  // A 0-d tensor loads as [1]: its piece is that box.
  EXPECT_EQ(PiecesOf(s).front().box, Box({0}, {1}));
}

// Who saved a checkpoint, and which files its save wrote.
TEST(TesseraIndex, KeepsWhoSavedItAndNamesOnlyThatSavesFiles) {
  CheckpointListing saved = Saved();
  saved.save_id = "0badf00d";
  saved.saved_by = "writer";
  absl::StatusOr<CheckpointListing> back =
      ParseTesseraIndex(TesseraIndexJson(saved));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->save_id, "0badf00d");
  EXPECT_EQ(back->saved_by, "writer");
  // An index from before these were kept: no one known.
  std::string old = TesseraIndexJson(Saved());
  old = absl::StrReplaceAll(
      old, {{"\"save_id\": \"\", ", ""}, {"\"saved_by\": \"\", ", ""}});
  ASSERT_EQ(old.find("saved_by"), std::string::npos);
  back = ParseTesseraIndex(old);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->saved_by, "");
  // Not a string, or too long: refused.
  EXPECT_FALSE(ParseTesseraIndex(absl::StrReplaceAll(TesseraIndexJson(saved),
                                                     {{"\"writer\"", "7"}}))
                   .ok());
  saved.saved_by = std::string(300, 'x');
  EXPECT_FALSE(ParseTesseraIndex(TesseraIndexJson(saved)).ok());

  EXPECT_EQ(SavedFileName("w0", "0badf00d", 2), "w0-0badf00d-2.safetensors");
  EXPECT_TRUE(IsSavedFileOf("w0-0badf00d-2.safetensors", "0badf00d"));
  EXPECT_TRUE(IsSavedFileOf("pod-a-b-0badf00d-10.safetensors", "0badf00d"));
  for (const char* other :
       {"model.safetensors", "w0-0badf00e-2.safetensors",
        "w0-0badf00d-.safetensors", "w0-0badf00d-2x.safetensors",
        "-0badf00d-2.safetensors", "0badf00d-2.safetensors",
        "w0-0badf00d-2.safetensors.tmp"}) {
    EXPECT_FALSE(IsSavedFileOf(other, "0badf00d")) << other;
  }
  EXPECT_FALSE(IsSavedFileOf("w0--2.safetensors", ""));
}

TEST(TesseraIndex, RefusesWhatDoesNotTileOrLies) {
  const std::string good = TesseraIndexJson(Saved());
  const struct {
    std::string from, to, error;
  } kCases[] = {
      // The second piece moved onto the first: overlap and a hole.
      {"\"offsets\":[2,0]", "\"offsets\":[1,0]", "overlap"},
      {"\"bytes\":48,\"crc32\":7", "\"bytes\":40,\"crc32\":7", "do not match"},
      {"\"b.safetensors\"", "\"../b.safetensors\"", "not a plain file name"},
      {"\"crc32\":7", "\"crc32\":4294967296", "crc32"},
      {"\"crc32\":7", "\"crc32\":-7", "not a count"},
      {"\"version\": 1", "\"version\": 2", "version"},
      {"\"format\": \"tessera.checkpoint\"", "\"format\": \"x\"", "not a"},
      {"\"name\": \"step\"", "\"name\": \"layers.0/w\"", "twice"},
      {"\"dtype\": \"int64\"", "\"dtype\": \"int65\"", "dtype"},
      {"\"data_offset\":64", "\"data_offset\":9223372036854775800",
       "do not match"},
      {"\"sizes\":[2,6],\"file\":\"b", "\"sizes\":[3,6],\"file\":\"b",
       "outside"},
  };
  for (const auto& c : kCases) {
    const std::string text = absl::StrReplaceAll(good, {{c.from, c.to}});
    ASSERT_NE(text, good) << c.from;
    absl::StatusOr<CheckpointListing> parsed = ParseTesseraIndex(text);
    ASSERT_FALSE(parsed.ok()) << c.to;
    EXPECT_THAT(parsed.status().message(), HasSubstr("checkpoint: "));
    EXPECT_THAT(parsed.status().message(), HasSubstr(c.error)) << c.to;
  }
  EXPECT_FALSE(ParseTesseraIndex("[1]").ok());
  EXPECT_FALSE(ParseTesseraIndex("{").ok());
  EXPECT_FALSE(
      ParseTesseraIndex(std::string(kMaxCheckpointIndexBytes + 1, ' ')).ok());
}

TEST(HfIndex, MapsEveryPieceToItsFileAndReadsBack) {
  const std::string text = HfIndexJson(Saved());
  EXPECT_THAT(text, HasSubstr("\"total_size\": 104"));
  EXPECT_THAT(text, HasSubstr("\"layers.0/w:1\": \"b.safetensors\""));
  absl::StatusOr<std::vector<std::string>> files = ParseHfIndex(text);
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_THAT(*files, ElementsAre("a.safetensors", "b.safetensors"));
  EXPECT_FALSE(ParseHfIndex("{\"weight_map\": {\"w\": \"/etc/passwd\"}}").ok());
  EXPECT_FALSE(ParseHfIndex("{\"weight_map\": {\"w\": 3}}").ok());
  EXPECT_FALSE(ParseHfIndex("{}").ok());
}

}  // namespace
}  // namespace tessera
