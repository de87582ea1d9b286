// ImportSafetensors / ExportSafetensors against a real cluster: byte-exact
// round trips through the workers, and all-or-nothing on every failure.
#include "client/safetensors_io.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/safetensors_file.h"
#include "client/tessera_client.h"
#include "client/testing/local_cluster.h"
#include "core/init_fill.h"
#include "core/placement.h"
#include "core/testing/status_matchers.h"
#include "core/testing/temp_files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::PathExists;
using ::tessera::testing::ReadFileToString;
using ::tessera::testing::StatusIs;
using ::tessera::testing::WriteStringToFile;
using ::testing::HasSubstr;

// Byte i of an entry: a pattern that differs per entry (bools stay 0/1).
char PatternByte(const SafetensorsEntry& e, int64_t i, int seed) {
  if (e.dtype == DType::kBool) return static_cast<char>((i + seed) % 3 == 0);
  return static_cast<char>((i * 131 + seed * 17 + e.name.size()) & 0xff);
}

// Writes a safetensors file of `tensors` filled with PatternByte.
void MakeFile(const std::string& path, std::vector<SafetensorsTensor> tensors,
              int seed) {
  absl::StatusOr<SafetensorsLayout> layout =
      LayoutSafetensors(std::move(tensors), {{"source", "test"}});
  ASSERT_THAT(layout.status(), IsOk());
  absl::StatusOr<std::unique_ptr<SafetensorsWriter>> w =
      SafetensorsWriter::Create(path, *std::move(layout));
  ASSERT_THAT(w.status(), IsOk());
  for (size_t i = 0; i < (*w)->entries().size(); ++i) {
    const SafetensorsEntry& e = (*w)->entries()[i];
    for (int64_t b = 0; b < e.num_bytes(); ++b) {
      (*w)->data(i)[b] = PatternByte(e, b, seed);
    }
  }
  ASSERT_THAT((*w)->Commit(), IsOk());
}

std::vector<SafetensorsTensor> ModelTensors() {
  return {
      {"embed.weight", DType::kFloat32, {37, 8}},
      {"layers.0.q.weight", DType::kBFloat16, {16, 12}},
      {"layers.0.q.bias", DType::kFloat16, {16}},
      {"layers.0.scale", DType::kFloat64, {3, 2, 2}},
      {"ids", DType::kInt64, {11}},
      {"small", DType::kInt32, {2, 3}},
      {"codes", DType::kInt16, {9, 1}},
      {"bytes", DType::kUInt8, {33}},
      {"signed", DType::kInt8, {5, 5}},
      {"mask", DType::kBool, {7}},
      {"empty", DType::kFloat32, {0, 4}},
  };
}

std::vector<Placement> Ranks(int n) {
  std::vector<Placement> out;
  for (int i = 0; i < n; ++i) {
    out.push_back(*ParsePlacement(absl::StrCat("rank:", i)));
  }
  return out;
}

class SafetensorsIoTest : public LocalClusterSuite {
 protected:
  static std::vector<std::string> Names() {
    absl::StatusOr<std::vector<TensorInfo>> list = client_->List();
    EXPECT_THAT(list.status(), IsOk());
    std::vector<std::string> out;
    if (!list.ok()) return out;
    for (const TensorInfo& t : *list) out.push_back(t.name);
    std::sort(out.begin(), out.end());
    return out;
  }
};

TEST_F(SafetensorsIoTest, ImportIsByteExactAndExportWritesTheSameFile) {
  const std::string in = Path("model.safetensors");
  MakeFile(in, ModelTensors(), 1);
  absl::StatusOr<SafetensorsImportResult> imported =
      ImportSafetensors(*client_, in, LayoutSpec::Chunk(0, Ranks(3)), "m1/");
  ASSERT_THAT(imported.status(), IsOk());
  ASSERT_EQ(imported->tensors.size(), ModelTensors().size());

  absl::StatusOr<std::unique_ptr<SafetensorsReader>> file =
      SafetensorsReader::Open(in);
  ASSERT_THAT(file.status(), IsOk());
  int64_t total = 0;
  for (const SafetensorsEntry& e : (*file)->entries()) {
    absl::StatusOr<HostArray> got = client_->Get("m1/" + e.name);
    ASSERT_THAT(got.status(), IsOk()) << e.name;
    EXPECT_EQ(got->dtype, e.dtype) << e.name;
    EXPECT_EQ(got->shape, e.shape) << e.name;
    ASSERT_EQ(got->num_bytes, e.num_bytes()) << e.name;
    EXPECT_EQ(std::memcmp(got->data(), (*file)->data(e), e.num_bytes()), 0)
        << e.name;
    absl::StatusOr<TensorMetadata> meta = client_->Describe("m1/" + e.name);
    ASSERT_THAT(meta.status(), IsOk());
    EXPECT_EQ(meta->shards.size(), 3u);
    total += e.num_bytes();
  }
  EXPECT_EQ(imported->bytes, total);

  // Export by prefix gives the imported file back: its entries in its order
  // and its metadata.
  const std::string out = Path("out.safetensors");
  absl::StatusOr<SafetensorsExportResult> exported =
      ExportSafetensors(*client_, out, SafetensorsSelection::Prefix("m1/"));
  ASSERT_THAT(exported.status(), IsOk());
  EXPECT_EQ(exported->entries.size(), ModelTensors().size());
  EXPECT_EQ(exported->bytes, total);
  EXPECT_EQ(ReadFileToString(out), ReadFileToString(in));
  EXPECT_EQ(static_cast<int64_t>(ReadFileToString(out).size()),
            exported->file_bytes);

  // Export by names: entry names are the tensor names.
  const std::string named = Path("named.safetensors");
  ASSERT_THAT(ExportSafetensors(*client_, named,
                                SafetensorsSelection::Names(
                                    {"m1/ids", "m1/layers.0.q.weight"}))
                  .status(),
              IsOk());
  absl::StatusOr<std::unique_ptr<SafetensorsReader>> back =
      SafetensorsReader::Open(named);
  ASSERT_THAT(back.status(), IsOk());
  ASSERT_EQ((*back)->entries().size(), 2u);
  EXPECT_EQ((*back)->entries()[0].name, "m1/ids");
  EXPECT_EQ((*back)->entries()[1].name, "m1/layers.0.q.weight");
  for (const SafetensorsEntry& e : (*back)->entries()) {
    absl::StatusOr<HostArray> got = client_->Get(e.name);
    ASSERT_THAT(got.status(), IsOk());
    EXPECT_EQ(std::memcmp(got->data(), (*back)->data(e), e.num_bytes()), 0);
  }
}

TEST_F(SafetensorsIoTest, MalformedFilesCreateNothing) {
  const std::vector<std::string> before = Names();
  const std::string entry =
      R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  auto file = [](const std::string& json, const std::string& data) {
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i) {
      out[i] = static_cast<char>((json.size() >> (8 * i)) & 0xff);
    }
    return out + json + data;
  };
  std::string huge(8, '\xff');
  const std::vector<std::string> bad = {
      huge + "{}",
      file("{" + entry, "12345678"),
      file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})",
           "12345678"),
      file("{" + entry +
               R"(,"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
           "12345678"),
      file(R"({"a":{"dtype":"C64","shape":[1],"data_offsets":[0,8]}})",
           "12345678"),
      "",
  };
  for (size_t i = 0; i < bad.size(); ++i) {
    const std::string path = Path(absl::StrCat("bad", i, ".safetensors"));
    WriteStringToFile(path, bad[i]);
    EXPECT_THAT(
        ImportSafetensors(*client_, path, LayoutSpec::Chunk(0, Ranks(2)))
            .status(),
        StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("safetensors")))
        << i;
  }
  EXPECT_EQ(Names(), before);
}

TEST_F(SafetensorsIoTest, InvalidShardingDimCreatesNothing) {
  const std::string in = Path("dims.safetensors");
  MakeFile(in, {{"a2", DType::kFloat32, {4, 4}}, {"b1", DType::kInt32, {8}}},
           2);
  const std::vector<std::string> before = Names();
  EXPECT_THAT(
      ImportSafetensors(*client_, in, LayoutSpec::Chunk(1, Ranks(2)), "dims/")
          .status(),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("invalid sharding dim")));
  EXPECT_EQ(Names(), before);
}

// A 0-d entry is kept as a tensor of shape [1] holding its element, and an
// export writes it back as 0-d: the file comes back byte for byte.
TEST_F(SafetensorsIoTest, ScalarsComeBackAsScalars) {
  const std::string in = Path("scalar.safetensors");
  MakeFile(in,
           {{"a", DType::kFloat32, {4}},
            {"logit_scale", DType::kFloat32, {}},
            {"step", DType::kInt64, {}}},
           3);
  absl::StatusOr<SafetensorsImportResult> imported =
      ImportSafetensors(*client_, in, LayoutSpec::Chunk(0, Ranks(2)), "sc/");
  ASSERT_THAT(imported.status(), IsOk());
  absl::StatusOr<TensorMetadata> step = client_->Describe("sc/step");
  ASSERT_THAT(step.status(), IsOk());
  EXPECT_EQ(step->shape, (Shape{1}));
  EXPECT_TRUE(step->origin.scalar);
  absl::StatusOr<std::unique_ptr<SafetensorsReader>> file =
      SafetensorsReader::Open(in);
  ASSERT_THAT(file.status(), IsOk());
  for (const SafetensorsEntry& e : (*file)->entries()) {
    if (e.name != "step") continue;
    absl::StatusOr<HostArray> got = client_->Get("sc/step");
    ASSERT_THAT(got.status(), IsOk());
    EXPECT_EQ(std::string(got->data(), 8), std::string((*file)->data(e), 8));
  }
  const std::string out = Path("scalar_out.safetensors");
  ASSERT_THAT(
      ExportSafetensors(*client_, out, SafetensorsSelection::Prefix("sc/"))
          .status(),
      IsOk());
  EXPECT_EQ(ReadFileToString(out), ReadFileToString(in));
  for (const char* name : {"sc/a", "sc/logit_scale", "sc/step"}) {
    ASSERT_THAT(client_->Delete(name), IsOk());
  }
}

TEST_F(SafetensorsIoTest, BadNamesAreRefusedBeforeAnything) {
  const std::vector<std::string> before = Names();
  const std::string spaced = Path("spaced.safetensors");
  MakeFile(spaced, {{"a b", DType::kFloat32, {4}}}, 3);
  EXPECT_THAT(
      ImportSafetensors(*client_, spaced, LayoutSpec::Chunk(0, Ranks(1)))
          .status(),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("safetensors file")));
  EXPECT_EQ(Names(), before);
}

TEST_F(SafetensorsIoTest, TakenNameOrFailedPutLeavesNothingNew) {
  const std::string in = Path("taken.safetensors");
  MakeFile(in, {{"x", DType::kFloat32, {4}}, {"y", DType::kFloat32, {6}}}, 4);
  ASSERT_THAT(
      client_
          ->Create("taken/y", {2}, DType::kInt8, LayoutSpec::Chunk(0, Ranks(1)))
          .status(),
      IsOk());
  const std::vector<std::string> before = Names();
  EXPECT_THAT(
      ImportSafetensors(*client_, in, LayoutSpec::Chunk(0, Ranks(2)), "taken/")
          .status(),
      StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("already exists")));
  EXPECT_EQ(Names(), before);

  // The second entry's placement names no worker: its put fails after the
  // first tensor was made, which is then deleted.
  EXPECT_THAT(ImportSafetensors(
                  *client_, in,
                  [](const SafetensorsEntry& e) -> absl::StatusOr<LayoutSpec> {
                    return LayoutSpec::Chunk(
                        0,
                        {*ParsePlacement(e.name == "x" ? "rank:0" : "rank:9")});
                  },
                  "partial/")
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("does not exist")));
  EXPECT_EQ(Names(), before);
}

TEST_F(SafetensorsIoTest, OneFailureAmongManyEntriesInFlightUndoesAll) {
  std::vector<SafetensorsTensor> tensors;
  for (int i = 0; i < 40; ++i) {
    tensors.push_back({absl::StrCat("e", i), DType::kFloat32, {16, 4}});
  }
  const std::string in = Path("many.safetensors");
  MakeFile(in, tensors, 6);
  const std::vector<std::string> before = Names();
  EXPECT_THAT(
      ImportSafetensors(
          *client_, in,
          [](const SafetensorsEntry& e) -> absl::StatusOr<LayoutSpec> {
            return LayoutSpec::Chunk(
                0, {*ParsePlacement(e.name == "e23" ? "rank:9" : "rank:1"),
                    *ParsePlacement("rank:2")});
          },
          "many/")
          .status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"e23\"")));
  EXPECT_EQ(Names(), before);
  // And all of them when nothing fails.
  absl::StatusOr<SafetensorsImportResult> ok =
      ImportSafetensors(*client_, in, LayoutSpec::Chunk(0, Ranks(3)), "many/");
  ASSERT_THAT(ok.status(), IsOk());
  ASSERT_EQ(ok->tensors.size(), 40u);
  EXPECT_EQ(ok->tensors[0].name, "many/e0");  // in the file's order
  EXPECT_EQ(Names().size(), before.size() + 40);
}

TEST_F(SafetensorsIoTest, FailedExportLeavesNoFile) {
  ASSERT_THAT(client_
                  ->Create("ex/a", {4}, DType::kFloat32,
                           LayoutSpec::Chunk(0, Ranks(2)), *ParseInit("arange"))
                  .status(),
              IsOk());
  const std::string out = Path("failed.safetensors");
  EXPECT_THAT(
      ExportSafetensors(*client_, out,
                        SafetensorsSelection::Names({"ex/a", "ex/nope"}))
          .status(),
      StatusIs(absl::StatusCode::kNotFound, HasSubstr("not found")));
  EXPECT_FALSE(PathExists(out));
  EXPECT_THAT(
      ExportSafetensors(*client_, out, SafetensorsSelection::Prefix("nothing/"))
          .status(),
      StatusIs(absl::StatusCode::kNotFound, HasSubstr("safetensors")));
  EXPECT_FALSE(PathExists(out));
  EXPECT_THAT(ExportSafetensors(*client_, Path("no/such/dir/x.safetensors"),
                                SafetensorsSelection::Prefix("ex/"))
                  .status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("safetensors")));

  EXPECT_THAT(
      ExportSafetensors(*client_, out,
                        SafetensorsSelection::Names({"ex/a", "ex/a"}))
          .status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("named twice")));
  EXPECT_FALSE(PathExists(out));
}

// A gather that fails half way (a worker killed) leaves no file, not even
// a partial one under another name.
TEST(SafetensorsExportFaultTest, DeadWorkerLeavesNoFile) {
  auto cluster = LocalCluster::Start(2);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  Client& client = (*cluster)->client();
  ASSERT_THAT(client
                  .Create("f/a", {64}, DType::kFloat32,
                          LayoutSpec::Chunk(0, Ranks(1)), *ParseInit("arange"))
                  .status(),
              IsOk());
  ASSERT_THAT(client
                  .Create("f/b", {64}, DType::kFloat32,
                          LayoutSpec::Chunk(0, {*ParsePlacement("rank:1")}),
                          *ParseInit("arange"))
                  .status(),
              IsOk());
  (*cluster)->KillWorker(1);
  const std::string dir = absl::StrCat((*cluster)->dir(), "/out");
  ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
  EXPECT_THAT(ExportSafetensors(client, dir + "/f.safetensors",
                                SafetensorsSelection::Prefix("f/"))
                  .status(),
              StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_EQ(rmdir(dir.c_str()), 0) << "the export left a file behind";
}

}  // namespace
}  // namespace tessera
