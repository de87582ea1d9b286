#include "client/safetensors_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/testing/status_matchers.h"
#include "core/testing/temp_files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::ReadFileToString;
using ::tessera::testing::StatusIs;
using ::tessera::testing::TempPath;
using ::tessera::testing::WriteStringToFile;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A file as the format defines it: 8-byte little-endian length, the JSON
// text, then `data`.
std::string File(const std::string& json, const std::string& data = "") {
  std::string out(8, '\0');
  uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + json + data;
}

TEST(SafetensorsDTypeTest, CodesMapBothWays) {
  for (DType d : AllDTypes()) {
    EXPECT_THAT(DTypeFromSafetensors(SafetensorsDTypeCode(d)),
                ::tessera::testing::IsOkAndHolds(d));
  }
  EXPECT_EQ(SafetensorsDTypeCode(DType::kBFloat16), "BF16");
  EXPECT_EQ(SafetensorsDTypeCode(DType::kBool), "BOOL");
  EXPECT_EQ(SafetensorsDTypeCode(DType::kUInt16), "U16");
  EXPECT_EQ(SafetensorsDTypeCode(DType::kFloat8E4M3FN), "F8_E4M3");
  EXPECT_EQ(SafetensorsDTypeCode(DType::kFloat8E5M2), "F8_E5M2");
  for (const char* code : {"F8_E8M0", "C64", "f32", ""}) {
    EXPECT_THAT(
        DTypeFromSafetensors(code),
        StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("safetensors")))
        << code;
  }
}

TEST(ParseSafetensorsTest, ReadsWhatTheReferenceWrites) {
  // Bytes as safetensors' Python save_file writes them (compact JSON, spaces
  // up to a multiple of 8).
  std::string json =
      R"({"__metadata__":{"format":"pt"},"b":{"dtype":"I64","shape":[1],)"
      R"("data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2,1],)"
      R"("data_offsets":[8,16]},"z":{"dtype":"BOOL","shape":[0],)"
      R"("data_offsets":[16,16]}})";
  json.append((8 - json.size() % 8) % 8, ' ');
  const std::string data(16, 'x');
  absl::StatusOr<SafetensorsHeader> h = ParseSafetensors(File(json, data));
  ASSERT_THAT(h.status(), IsOk());
  EXPECT_EQ(h->data_offset, static_cast<int64_t>(8 + json.size()));
  EXPECT_EQ(h->data_bytes, 16);
  ASSERT_EQ(h->entries.size(), 3u);
  EXPECT_EQ(h->entries[0].name, "b");
  EXPECT_EQ(h->entries[0].dtype, DType::kInt64);
  EXPECT_EQ(h->entries[1].name, "a");
  EXPECT_THAT(h->entries[1].shape, ElementsAre(2, 1));
  EXPECT_EQ(h->entries[1].begin, 8);
  EXPECT_EQ(h->entries[2].name, "z");
  EXPECT_EQ(h->entries[2].num_bytes(), 0);
  ASSERT_EQ(h->metadata.size(), 1u);
  EXPECT_EQ(h->metadata[0].first, "format");
  EXPECT_EQ(h->metadata[0].second, "pt");
}

TEST(ParseSafetensorsTest, EmptyHeaderAndScalars) {
  ASSERT_THAT(ParseSafetensors(File("{}")).status(), IsOk());
  absl::StatusOr<SafetensorsHeader> h = ParseSafetensors(
      File(R"({"s":{"dtype":"F64","shape":[],"data_offsets":[0,8]}})",
           std::string(8, '\0')));
  ASSERT_THAT(h.status(), IsOk());
  EXPECT_TRUE(h->entries[0].shape.empty());
}

// Each malformed input is INVALID_ARGUMENT and says "safetensors" and what.
struct BadCase {
  const char* what;
  std::string file;
  const char* words;
};

TEST(ParseSafetensorsTest, RefusesMalformedFiles) {
  const std::string ok_entry =
      R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  std::string huge_length(8, '\0');
  huge_length[4] = 1;  // 2^32
  std::string limit = File("{}");
  limit[0] = 0x01;
  limit[1] = 0xe1;
  limit[2] = 0xf5;
  limit[3] = 0x05;  // 100000001
  const std::vector<BadCase> cases = {
      {"short", "abc", "too few"},
      {"huge length", huge_length + "{}", "exceeds the limit"},
      {"length past limit", limit, "exceeds the limit"},
      {"length past end", File("{}").substr(0, 9), "past the end"},
      {"not an object", File("[1,2]"), "does not start with '{'"},
      {"bad json", File("{\"a\":"), "not valid JSON"},
      {"trailing garbage", File("{} x"), "not valid JSON"},
      {"bad utf8", File("{\"\xff\":{}}"), "not valid JSON"},
      {"entry not object", File(R"({"a":3})"), "not an object"},
      {"metadata not object", File(R"({"__metadata__":[]})"), "not an object"},
      {"metadata value", File(R"({"__metadata__":{"k":1}})"), "not a string"},
      {"bad dtype",
       File(R"({"a":{"dtype":"F8_E8M0","shape":[1],"data_offsets":[0,2]}})",
            "xx"),
       "dtype \"F8_E8M0\""},
      {"dtype not string",
       File(R"({"a":{"dtype":7,"shape":[1],"data_offsets":[0,4]}})", "xxxx"),
       "not a string"},
      {"negative dim",
       File(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})",
            "xxxx"),
       "negative dim"},
      {"float dim",
       File(R"({"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})",
            "xxxx"),
       "not a non-negative integer"},
      {"overflow",
       File(
           R"({"a":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]}})",
           "xxxxxxxx"),
       "overflow"},
      {"missing field", File(R"({"a":{"dtype":"F32","shape":[1]}})"),
       "no data_offsets"},
      {"unknown field",
       File(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}})",
            "xxxx"),
       "unknown field"},
      {"duplicate field",
       File(
           R"({"a":{"dtype":"F32","dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
           "xxxx"),
       "twice"},
      {"duplicate name",
       File("{" + ok_entry + "," + ok_entry + "}", "12345678"), "twice"},
      {"empty name",
       File(R"({"":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", "xxxx"),
       "empty name"},
      {"three offsets",
       File(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}})",
            "xxxx"),
       "[begin, end]"},
      {"reversed offsets",
       File(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[4,0]}})",
            "xxxx"),
       "end before they begin"},
      {"offsets out of range",
       File(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
            "xxxx"),
       "outside the data section"},
      {"size mismatch",
       File(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})",
            "xxxxxxxx"),
       "needs 12"},
      {"overlap",
       File(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
            R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
            "xxxxxxxx"),
       "overlap"},
      {"hole",
       File(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
            "xxxxxxxx"),
       "belong to no entry"},
      {"trailing data", File("{" + ok_entry + "}", "xxxxxxxxx"),
       "at the end of the data section"},
      {"deep nesting", File("{\"a\":{\"shape\":[[[[[[1]]]]]]}}"),
       "not a non-negative"},
  };
  for (const BadCase& c : cases) {
    absl::StatusOr<SafetensorsHeader> h = ParseSafetensors(c.file);
    EXPECT_THAT(h.status(), StatusIs(absl::StatusCode::kInvalidArgument,
                                     HasSubstr("safetensors")))
        << c.what;
    EXPECT_THAT(std::string(h.status().message()), HasSubstr(c.words))
        << c.what;
  }
}

TEST(ParseSafetensorsTest, BoundsEntriesAndRank) {
  std::string shape = "[";
  for (int i = 0; i <= kSafetensorsMaxRank; ++i) {
    absl::StrAppend(&shape, i ? "," : "", 1);
  }
  shape += "]";
  EXPECT_THAT(
      ParseSafetensors(File(absl::StrCat(R"({"a":{"dtype":"F32","shape":)",
                                         shape, R"(,"data_offsets":[0,4]}})"),
                            "xxxx"))
          .status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dims")));
}

// The header from a file by pread: what a parse of the whole file says,
// and a clear error for a file cut short, a FIFO or too short a file.
// stdin is taken only as far as its header says.
TEST(SafetensorsStreamBytesTest, AStreamIsSizedByItsHeader) {
  const std::string json =
      R"({"a":{"dtype":"I32","shape":[2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"U8","shape":[3],"data_offsets":[8,11]}})";
  const std::string file = File(json, std::string(11, 'x'));
  for (size_t cut :
       {size_t{0}, size_t{7}, size_t{8}, size_t{9}, file.size() - 12}) {
    absl::StatusOr<std::optional<int64_t>> partial =
        SafetensorsStreamBytes(file.substr(0, cut));
    ASSERT_THAT(partial.status(), IsOk()) << cut;
    EXPECT_FALSE(partial->has_value()) << cut;
  }
  absl::StatusOr<std::optional<int64_t>> whole =
      SafetensorsStreamBytes(file.substr(0, 8 + json.size()));
  ASSERT_THAT(whole.status(), IsOk());
  EXPECT_EQ(whole->value(), static_cast<int64_t>(file.size()));
  // Zeros (cat /dev/zero): a header of 0 bytes that is no JSON object.
  EXPECT_THAT(SafetensorsStreamBytes(std::string(16, '\0')).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'{'")));
  // A length past the limit, and entries that do not tile their data.
  EXPECT_THAT(SafetensorsStreamBytes(std::string(8, '\xff')).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("exceeds the limit")));
  EXPECT_FALSE(
      SafetensorsStreamBytes(
          File(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[4,5]}})"))
          .ok());
}

TEST(ReadSafetensorsHeaderTest, ReadsTheHeaderAloneAndRefusesWhatIsNotOne) {
  const std::string json =
      R"({"__metadata__":{"tessera_save":"0badf00d"},)"
      R"("w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})";
  const std::string path = TempPath("header.safetensors");
  WriteStringToFile(path, File(json, std::string(16, 'x')));
  int fd = open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  absl::StatusOr<SafetensorsHeader> h = ReadSafetensorsHeader(fd);
  close(fd);
  ASSERT_THAT(h.status(), IsOk());
  ASSERT_EQ(h->entries.size(), 1u);
  EXPECT_EQ(h->entries[0].name, "w");
  ASSERT_EQ(h->metadata.size(), 1u);
  EXPECT_EQ(h->metadata[0].second, "0badf00d");

  // Cut inside its data, inside its header, inside its length.
  for (size_t keep : {8 + json.size() + 4, size_t{20}, size_t{5}}) {
    WriteStringToFile(path, File(json, std::string(16, 'x')).substr(0, keep));
    fd = open(path.c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    EXPECT_THAT(ReadSafetensorsHeader(fd).status(),
                StatusIs(absl::StatusCode::kInvalidArgument))
        << keep;
    close(fd);
  }
  const std::string fifo = TempPath("header.fifo");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  fd = open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(fd, 0);
  EXPECT_THAT(ReadSafetensorsHeader(fd).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("not a regular file")));
  close(fd);
}

TEST(LayoutSafetensorsTest, DeterministicAlignedAndParsesBack) {
  std::vector<SafetensorsTensor> tensors = {
      {"w.b", DType::kInt8, {3}},       {"w.a", DType::kFloat16, {2, 2}},
      {"emb", DType::kFloat64, {1, 3}}, {"mask", DType::kBool, {5}},
      {"big", DType::kInt64, {2}},      {"e", DType::kFloat32, {0, 7}},
  };
  absl::StatusOr<SafetensorsLayout> layout =
      LayoutSafetensors(tensors, {{"format", "pt"}});
  ASSERT_THAT(layout.status(), IsOk());
  absl::StatusOr<SafetensorsLayout> again =
      LayoutSafetensors({tensors.rbegin(), tensors.rend()}, {{"format", "pt"}});
  ASSERT_THAT(again.status(), IsOk());
  EXPECT_EQ(layout->header, again->header);
  EXPECT_EQ(layout->header.size() % 8, 0u);
  std::vector<std::string> order;
  for (const SafetensorsEntry& e : layout->entries) {
    order.push_back(e.name);
    EXPECT_EQ(e.begin % static_cast<int64_t>(ItemSize(e.dtype)), 0) << e.name;
  }
  EXPECT_THAT(order, ElementsAre("big", "emb", "e", "w.a", "mask", "w.b"));
  EXPECT_EQ(layout->header.substr(8, 2), "{\"");
  EXPECT_THAT(layout->header, HasSubstr(R"("__metadata__":{"format":"pt"})"));

  std::string file = layout->header;
  file.resize(layout->file_bytes, '\x5a');
  absl::StatusOr<SafetensorsHeader> parsed = ParseSafetensors(file);
  ASSERT_THAT(parsed.status(), IsOk());
  ASSERT_EQ(parsed->entries.size(), layout->entries.size());
  for (size_t i = 0; i < layout->entries.size(); ++i) {
    EXPECT_EQ(parsed->entries[i].name, layout->entries[i].name);
    EXPECT_EQ(parsed->entries[i].dtype, layout->entries[i].dtype);
    EXPECT_EQ(parsed->entries[i].shape, layout->entries[i].shape);
    EXPECT_EQ(parsed->entries[i].begin, layout->entries[i].begin);
    EXPECT_EQ(parsed->entries[i].end, layout->entries[i].end);
  }
}

TEST(LayoutSafetensorsTest, KeepOrderLaysEntriesOutAsGiven) {
  const std::vector<SafetensorsTensor> tensors = {
      {"z.small", DType::kInt8, {3}},
      {"a.big", DType::kFloat64, {2}},
      {"m", DType::kUInt16, {1, 2}},
  };
  absl::StatusOr<SafetensorsLayout> layout =
      LayoutSafetensors(tensors, {{"b", "2"}, {"a", "1"}}, /*keep_order=*/true);
  ASSERT_THAT(layout.status(), IsOk());
  std::vector<std::string> order;
  for (const SafetensorsEntry& e : layout->entries) order.push_back(e.name);
  EXPECT_THAT(order, ElementsAre("z.small", "a.big", "m"));
  EXPECT_EQ(layout->entries[1].begin, 3);  // unaligned: no holes allowed
  // Metadata in its order, first.
  EXPECT_EQ(layout->header.substr(8, 34),
            R"({"__metadata__":{"b":"2","a":"1"},)");
  std::string file = layout->header;
  file.resize(layout->file_bytes, '\x01');
  absl::StatusOr<SafetensorsHeader> parsed = ParseSafetensors(file);
  ASSERT_THAT(parsed.status(), IsOk());
  ASSERT_EQ(parsed->entries.size(), 3u);
  EXPECT_EQ(parsed->entries[0].name, "z.small");
  EXPECT_EQ(parsed->entries[2].dtype, DType::kUInt16);
  EXPECT_THAT(parsed->metadata,
              ElementsAre(std::pair<std::string, std::string>("b", "2"),
                          std::pair<std::string, std::string>("a", "1")));
}

TEST(LayoutSafetensorsTest, RefusesBadNames) {
  EXPECT_THAT(
      LayoutSafetensors({{"a", DType::kInt8, {1}}, {"a", DType::kInt8, {1}}})
          .status(),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("safetensors: two entries")));
  EXPECT_THAT(
      LayoutSafetensors({{"", DType::kInt8, {1}}}).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("empty name")));
  EXPECT_THAT(
      LayoutSafetensors({{"__metadata__", DType::kInt8, {1}}}).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("safetensors")));
  EXPECT_THAT(
      LayoutSafetensors({{"a", DType::kInt64, {int64_t{1} << 62}}}).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("safetensors")));
}

TEST(SafetensorsFileTest, WriterThenReaderRoundTrip) {
  const std::string path = TempPath("round.safetensors");
  absl::StatusOr<SafetensorsLayout> layout = LayoutSafetensors(
      {{"x", DType::kFloat32, {2, 3}}, {"y", DType::kUInt8, {5}}});
  ASSERT_THAT(layout.status(), IsOk());
  {
    absl::StatusOr<std::unique_ptr<SafetensorsWriter>> w =
        SafetensorsWriter::Create(path, *layout);
    ASSERT_THAT(w.status(), IsOk());
    for (size_t i = 0; i < (*w)->entries().size(); ++i) {
      std::memset((*w)->data(i), static_cast<int>('a' + i),
                  (*w)->entries()[i].num_bytes());
    }
    EXPECT_FALSE(access(path.c_str(), F_OK) == 0);  // not before Commit
    ASSERT_THAT((*w)->Commit(), IsOk());
  }
  const std::string bytes = ReadFileToString(path);
  EXPECT_EQ(static_cast<int64_t>(bytes.size()), layout->file_bytes);
  absl::StatusOr<std::unique_ptr<SafetensorsReader>> r =
      SafetensorsReader::Open(path);
  ASSERT_THAT(r.status(), IsOk());
  ASSERT_EQ((*r)->entries().size(), 2u);
  const SafetensorsEntry& x = (*r)->entries()[0];
  EXPECT_EQ(x.name, "x");
  EXPECT_EQ(std::string((*r)->data(x), x.num_bytes()), std::string(24, 'a'));
  const SafetensorsEntry& y = (*r)->entries()[1];
  EXPECT_EQ(std::string((*r)->data(y), y.num_bytes()), std::string(5, 'b'));
}

TEST(SafetensorsFileTest, UncommittedWriterLeavesNoFile) {
  const std::string dir = TempPath("uncommitted");
  mkdir(dir.c_str(), 0700);
  const std::string path = dir + "/out.safetensors";
  {
    absl::StatusOr<std::unique_ptr<SafetensorsWriter>> w =
        SafetensorsWriter::Create(
            path, *LayoutSafetensors({{"x", DType::kInt32, {4}}}));
    ASSERT_THAT(w.status(), IsOk());
  }
  EXPECT_EQ(rmdir(dir.c_str()), 0) << "the temporary file was left behind";
}

TEST(SafetensorsFileTest, ReaderErrorsNameTheFile) {
  EXPECT_THAT(
      SafetensorsReader::Open(TempPath("missing.safetensors")).status(),
      StatusIs(absl::StatusCode::kNotFound, HasSubstr("safetensors file")));
  const std::string empty = TempPath("empty.safetensors");
  WriteStringToFile(empty, "");
  EXPECT_THAT(SafetensorsReader::Open(empty).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("safetensors: the file has 0 bytes")));
  EXPECT_THAT(SafetensorsReader::Open(TempPath("")).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("not a regular file")));
}

}  // namespace
}  // namespace tessera
