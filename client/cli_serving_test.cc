// The `tessera` binary's serving commands (CLI.md "Serving (v2)") against
// a real cluster: import/export of .safetensors files, with their --json
// output, exit codes and error words.
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
#include "absl/strings/str_split.h"
#include "client/npy_file.h"
#include "client/safetensors_file.h"
#include "client/testing/local_cluster.h"
#include "client/tessera_client.h"
#include "core/npy.h"
#include "core/placement.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using ::tessera::testing::IsOk;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteAll(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

bool Exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

// The bytes of a safetensors file of `tensors` as LayoutSafetensors lays
// it out, each entry's byte b being (b * 7 + seed) (bools 0/1).
std::string SafetensorsBytes(std::vector<SafetensorsTensor> tensors,
                             int seed) {
  absl::StatusOr<SafetensorsLayout> layout =
      LayoutSafetensors(std::move(tensors));
  EXPECT_THAT(layout.status(), IsOk());
  std::string out = layout->header;
  for (const SafetensorsEntry& e : layout->entries) {
    for (int64_t b = 0; b < e.num_bytes(); ++b) {
      out.push_back(e.dtype == DType::kBool
                        ? static_cast<char>(b % 2)
                        : static_cast<char>((b * 7 + seed) & 0xff));
    }
  }
  return out;
}

std::string RawFile(const std::string& json, const std::string& data) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) {
    out[i] = static_cast<char>((json.size() >> (8 * i)) & 0xff);
  }
  return out + json + data;
}

class CliServingTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto cluster = LocalCluster::Start(3);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = cluster->release();
    auto client = Client::Connect(cluster_->coordinator_address());
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = client->release();
  }
  static void TearDownTestSuite() {
    delete client_;
    delete cluster_;
  }

  static std::string Path(const std::string& name) {
    return absl::StrCat(cluster_->dir(), "/", name);
  }
  static LocalCluster::Result Tessera(const std::vector<std::string>& args) {
    return cluster_->Tessera(args);
  }
  static std::string Tensors() { return Tessera({"ls", "--json"}).out; }

  // An error run: the exit code, one "error: ..." line with `words`.
  static void ExpectError(const LocalCluster::Result& r, int code,
                          const std::vector<std::string>& words) {
    EXPECT_EQ(r.code, code) << r.err;
    EXPECT_THAT(r.err, StartsWith("error: "));
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    for (const std::string& w : words) EXPECT_THAT(r.err, HasSubstr(w));
  }

  static inline LocalCluster* cluster_ = nullptr;
  static inline Client* client_ = nullptr;
};

const std::vector<SafetensorsTensor>& Model() {
  static const auto* tensors = new std::vector<SafetensorsTensor>{
      {"wte", DType::kFloat32, {10, 4}},
      {"h.0.attn", DType::kBFloat16, {4, 6}},
      {"h.0.bias", DType::kFloat16, {6}},
      {"pos", DType::kInt64, {5, 1}},
      {"flags", DType::kBool, {3}},
      {"codes", DType::kUInt8, {7}},
  };
  return *tensors;
}

TEST_F(CliServingTest, ImportThenExportRoundTripsBytes) {
  const std::string in = Path("gpt.safetensors");
  const std::string bytes = SafetensorsBytes(Model(), 3);
  WriteAll(in, bytes);
  LocalCluster::Result r =
      Tessera({"import", in, "--chunk_dim=0",
               "--placements=rank:0,rank:1,rank:2", "--prefix=gpt/", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, StartsWith(absl::StrCat("{\"file\": \"", in,
                                             "\", \"tensors\": [{\"name\": ")));
  EXPECT_THAT(r.out, HasSubstr("{\"name\": \"gpt/h.0.attn\", \"shape\": [4, "
                               "6], \"dtype\": \"bfloat16\", \"version\": 1, "
                               "\"num_shards\": 3}"));
  EXPECT_THAT(r.out, HasSubstr("\"bytes\": 270, \"seconds\": "));

  // Each tensor holds its entry's bytes.
  absl::StatusOr<std::unique_ptr<SafetensorsReader>> file =
      SafetensorsReader::Open(in);
  ASSERT_THAT(file.status(), IsOk());
  for (const SafetensorsEntry& e : (*file)->entries()) {
    const std::string npy = Path(e.name + ".npy");
    LocalCluster::Result got =
        Tessera({"get", "gpt/" + e.name, "--output=" + npy});
    ASSERT_EQ(got.code, 0) << got.err;
    absl::StatusOr<HostArray> array = ReadNpyFile(
        npy, e.dtype == DType::kBFloat16 ? std::optional<DType>(e.dtype)
                                         : std::nullopt);
    ASSERT_THAT(array.status(), IsOk());
    EXPECT_EQ(array->shape, e.shape);
    EXPECT_EQ(std::string(array->data(), array->num_bytes),
              std::string((*file)->data(e), e.num_bytes()))
        << e.name;
  }

  // Export by prefix gives back the very same file.
  const std::string out = Path("gpt_out.safetensors");
  r = Tessera({"export", out, "--prefix=gpt/"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, StartsWith("exported 6 tensors into " + out));
  EXPECT_EQ(ReadAll(out), bytes);

  // By names, with --json.
  const std::string two = Path("two.safetensors");
  r = Tessera({"export", two, "gpt/pos", "gpt/wte", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(
      r.out,
      StartsWith(absl::StrCat(
          "{\"file\": \"", two,
          "\", \"entries\": [{\"entry\": \"gpt/pos\", \"tensor\": "
          "\"gpt/pos\", \"shape\": [5, 1], \"dtype\": \"int64\"}, "
          "{\"entry\": \"gpt/wte\", \"tensor\": \"gpt/wte\", "
          "\"shape\": [10, 4], \"dtype\": \"float32\"}], "
          "\"bytes\": 200, \"file_bytes\": ",
          ReadAll(two).size(), ", \"seconds\": ")));
  absl::StatusOr<std::unique_ptr<SafetensorsReader>> back =
      SafetensorsReader::Open(two);
  ASSERT_THAT(back.status(), IsOk());
  EXPECT_EQ((*back)->entries().size(), 2u);
}

TEST_F(CliServingTest, ImportWithShardsSpecResolvesPerEntry) {
  const std::string in = Path("boxes.safetensors");
  WriteAll(in, SafetensorsBytes({{"a", DType::kInt32, {4, 2}},
                                 {"b", DType::kInt32, {6, 3}}},
                                5));
  LocalCluster::Result r = Tessera(
      {"import", in, "--shards=0:2,:@rank:0;2:,:@rank:1", "--prefix=boxes/"});
  ASSERT_EQ(r.code, 0) << r.err;
  absl::StatusOr<TensorMetadata> b = client_->Describe("boxes/b");
  ASSERT_THAT(b.status(), IsOk());
  ASSERT_EQ(b->shards.size(), 2u);
  EXPECT_EQ(b->shards[1].box.ToString(), "2:6,0:3");
}

TEST_F(CliServingTest, MalformedFilesExitOneAndCreateNothing) {
  const std::string before = Tensors();
  const std::string entry =
      R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  std::string huge_length(8, '\xff');
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"length", huge_length + "{}"},
      {"short", "abc"},
      {"json", RawFile("{" + entry + ",", "12345678")},
      {"range",
       RawFile(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})",
               "12345678")},
      {"overlap",
       RawFile("{" + entry +
                   R"(,"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
               "12345678")},
      {"dtype",
       RawFile(R"({"a":{"dtype":"F8_E5M2","shape":[8],"data_offsets":[0,8]}})",
               "12345678")},
  };
  for (const auto& [what, bytes] : bad) {
    const std::string path = Path("bad_" + what + ".safetensors");
    WriteAll(path, bytes);
    SCOPED_TRACE(what);
    ExpectError(Tessera({"import", path, "--chunk_dim=0",
                         "--placements=rank:0", "--prefix=bad/"}),
                1, {"safetensors"});
  }
  ExpectError(Tessera({"import", Path("missing.safetensors"), "--chunk_dim=0",
                       "--placements=rank:0"}),
              1, {"safetensors", "missing.safetensors"});
  EXPECT_EQ(Tensors(), before);
}

TEST_F(CliServingTest, InvalidShardingDimCreatesNothing) {
  const std::string in = Path("dim.safetensors");
  WriteAll(in, SafetensorsBytes({{"m", DType::kFloat32, {4, 4}},
                                 {"v", DType::kFloat32, {4}}},
                                1));
  const std::string before = Tensors();
  ExpectError(Tessera({"import", in, "--chunk_dim=1",
                       "--placements=rank:0,rank:1", "--prefix=dim/"}),
              1, {"invalid sharding dim", "\"v\""});
  EXPECT_EQ(Tensors(), before);
  // A placement that does not exist: nothing is left either.
  ExpectError(Tessera({"import", in, "--chunk_dim=0",
                       "--placements=rank:0,rank:7", "--prefix=dim/"}),
              1, {"does not exist"});
  EXPECT_EQ(Tensors(), before);
}

TEST_F(CliServingTest, UsageErrorsExitTwo) {
  const std::string f = Path("u.safetensors");
  ExpectError(Tessera({"import"}), 2, {"missing FILE.safetensors"});
  ExpectError(Tessera({"import", f}), 2, {"missing the sharding"});
  ExpectError(Tessera({"import", f, "--chunk_dim=x", "--placements=rank:0"}),
              2, {"--chunk_dim"});
  ExpectError(Tessera({"export", f}), 2, {"NAME", "--prefix"});
  ExpectError(Tessera({"export", f, "a", "--prefix=p/"}), 2, {"not both"});
  ExpectError(Tessera({"export", f, "bad name"}), 2, {"bad name"});
  ExpectError(Tessera({"export"}), 2, {"missing FILE.safetensors"});
}

TEST_F(CliServingTest, FailedExportLeavesNoFile) {
  ASSERT_THAT(client_->Create("exp/a", {3}, DType::kInt8,
                              LayoutSpec::Chunk(0, {*ParsePlacement("rank:0")}))
                  .status(),
              IsOk());
  const std::string out = Path("never.safetensors");
  ExpectError(Tessera({"export", out, "exp/a", "exp/missing"}), 1,
              {"not found"});
  EXPECT_FALSE(Exists(out));
  ExpectError(Tessera({"export", out, "--prefix=nothing-here/"}), 1,
              {"safetensors", "nothing-here/"});
  EXPECT_FALSE(Exists(out));
}

}  // namespace
}  // namespace tessera
