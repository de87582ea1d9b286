// `tessera load` against real daemons (CLI.md "Checkpoints (v3)"): a
// Hugging Face model directory (two files and their index) under the
// workers' --checkpoint_root loads into a row layout and a column layout
// bit-exact, each worker reading about only its shards' bytes; paths that
// leave the root, a worker without a root and a damaged file are refused
// with nothing created.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/npy_file.h"
#include "client/safetensors_file.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cluster.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

struct Result {
  int code = -1;
  std::string out;
  std::string err;
};

std::string Root() { return absl::StrCat(std::getenv("TEST_TMPDIR"), "/ckpt"); }

void WriteAll(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

// A safetensors file of `tensors` (laid out in the given order, with
// metadata), each entry's byte b being (b * 13 + seed); the bytes of each
// entry by name go to `bytes`.
std::string ModelFile(const std::vector<SafetensorsTensor>& tensors, int seed,
                      std::map<std::string, std::string>* bytes) {
  absl::StatusOr<SafetensorsLayout> layout =
      LayoutSafetensors(tensors, {{"format", "pt"}}, /*keep_order=*/true);
  EXPECT_TRUE(layout.ok()) << layout.status();
  std::string file = layout->header;
  for (const SafetensorsEntry& e : layout->entries) {
    std::string data;
    for (int64_t b = 0; b < e.num_bytes(); ++b)
      data.push_back(static_cast<char>((b * 13 + seed) & 0xff));
    (*bytes)[e.name] = data;
    file += data;
  }
  return file;
}

class CheckpointTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    mkdir(Root().c_str(), 0755);
    // A model directory: two files and the index naming them.
    const std::string dir = Root() + "/model";
    mkdir(dir.c_str(), 0755);
    bytes_ = new std::map<std::string, std::string>;
    WriteAll(dir + "/model-00001-of-00002.safetensors",
             ModelFile({{"embed", DType::kBFloat16, {64, 48}},
                        {"ids", DType::kInt64, {37}},
                        {"scale", DType::kFloat32, {}}},
                       1, bytes_));
    WriteAll(dir + "/model-00002-of-00002.safetensors",
             ModelFile({{"u", DType::kUInt16, {8, 6}},
                        {"w.fp8", DType::kFloat8E4M3FN, {16, 16}},
                        {"head", DType::kFloat32, {40, 24}}},
                       2, bytes_));
    WriteAll(dir + "/model.safetensors.index.json",
             R"({"metadata": {"total_size": 1}, "weight_map": {)"
             R"("embed": "model-00001-of-00002.safetensors",)"
             R"("ids": "model-00001-of-00002.safetensors",)"
             R"("scale": "model-00001-of-00002.safetensors",)"
             R"("u": "model-00002-of-00002.safetensors",)"
             R"("w.fp8": "model-00002-of-00002.safetensors",)"
             R"("head": "model-00002-of-00002.safetensors"}})");
    // A directory whose one file is cut short, and a symlink out of the root.
    const std::string cut = Root() + "/cut";
    mkdir(cut.c_str(), 0755);
    std::map<std::string, std::string> ignored;
    const std::string whole =
        ModelFile({{"x", DType::kFloat32, {1024}}}, 3, &ignored);
    WriteAll(cut + "/model.safetensors", whole.substr(0, whole.size() - 100));
    ASSERT_EQ(symlink(std::getenv("TEST_TMPDIR"), (Root() + "/escape").c_str()),
              0);
    // 32 MiB in one entry, for a load that takes seconds.
    const std::string big = Root() + "/big";
    mkdir(big.c_str(), 0755);
    WriteAll(big + "/model.safetensors",
             ModelFile({{"w", DType::kFloat32, {8192, 1024}}}, 4, &ignored));

    TestClusterOptions options;
    // w3 has no --checkpoint_root.
    options.per_worker_flags = [](int i) {
      return i < 3 ? std::vector<std::string>{"--checkpoint_root=" + Root()}
                   : std::vector<std::string>{};
    };
    absl::StatusOr<std::unique_ptr<TestCluster>> cluster =
        TestCluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = cluster->release();
  }
  static void TearDownTestSuite() {
    delete cluster_;
    delete bytes_;
  }

  static Result Tessera(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {
        TestCluster::BinaryPath("client/tessera"),
        "--coordinator=" + cluster_->coordinator_address()};
    argv.insert(argv.end(), args.begin(), args.end());
    Result r;
    r.code = TestCluster::Run(argv, &r.out, &r.err);
    return r;
  }
  static std::string Tensors() { return Tessera({"ls", "--json"}).out; }

  // Every entry of the model, loaded under `prefix`, holds its file bytes.
  static void ExpectModel(const std::string& prefix) {
    for (const auto& [name, data] : *bytes_) {
      const std::string npy = absl::StrCat(Root(), "/../", name, ".npy");
      Result r = Tessera({"get", prefix + name, "--output=" + npy});
      ASSERT_EQ(r.code, 0) << r.err;
      absl::StatusOr<HostArray> a = ReadNpyFile(npy, std::nullopt);
      ASSERT_TRUE(a.ok()) << a.status();
      EXPECT_EQ(std::string(a->data(), a->num_bytes), data) << name;
    }
  }

  // {"bytes": B, "bytes_read": R} of a load --json.
  static std::pair<int64_t, int64_t> BytesOf(const std::string& json) {
    auto field = [&](const std::string& key) {
      const size_t at = json.find("\"" + key + "\": ");
      EXPECT_NE(at, std::string::npos) << json;
      return std::atoll(json.c_str() + at + key.size() + 4);
    };
    return {field("bytes"), field("bytes_read")};
  }

  static inline TestCluster* cluster_ = nullptr;
  static inline std::map<std::string, std::string>* bytes_ = nullptr;
};

TEST_F(CheckpointTest, LoadsAHuggingFaceDirectoryIntoAnyLayoutBitExact) {
  int64_t total = 0;
  for (const auto& [name, data] : *bytes_) total += data.size();

  // Rows: each worker reads its rows, nothing more.
  Result r = Tessera({"load", "model", "--chunk_dim=0", "--placements=w0,w1,w2",
                      "--prefix=rows/", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, StartsWith("{\"dir\": \"model\", \"tensors\": ["));
  EXPECT_THAT(r.out, HasSubstr("{\"name\": \"rows/scale\", \"shape\": [1], "
                               "\"dtype\": \"float32\""));
  const auto [bytes, read] = BytesOf(r.out);
  EXPECT_EQ(bytes, total);
  EXPECT_GE(read, total);
  EXPECT_LE(read, total * 105 / 100) << r.out;
  ExpectModel("rows/");

  // Columns (the last dim): runs per row, the over-read still bounded.
  r = Tessera({"load", "model", "--chunk_dim=-1", "--placements=w2,w1,w0",
               "--prefix=cols/", "--replicas=2", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const auto [cbytes, cread] = BytesOf(r.out);
  EXPECT_EQ(cbytes, total);
  EXPECT_LE(cread, total * 125 / 100) << r.out;
  ExpectModel("cols/");
  // Each shard on two workers (the second filled as a put's are: w3, which
  // has no checkpoint root, holds copies too).
  EXPECT_THAT(Tensors(),
              HasSubstr("{\"name\": \"cols/head\", \"shape\": [40, 24], "
                        "\"dtype\": \"float32\", \"version\": 1, "
                        "\"num_shards\": 3, \"replicas\": 2}"));

  // An export of what was loaded gives the file back as tessera writes it:
  // its metadata, its entries in their order, the 0-d entry as 0-d.
  const std::string out = Root() + "/../second.safetensors";
  ASSERT_EQ(Tessera({"export", out, "rows/u", "rows/w.fp8", "rows/head"}).code,
            0);
  absl::StatusOr<std::unique_ptr<SafetensorsReader>> back =
      SafetensorsReader::Open(out);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ((*back)->header().metadata,
            (SafetensorsMetadata{{"format", "pt"}}));
  ASSERT_EQ((*back)->entries().size(), 3u);
  EXPECT_EQ((*back)->entries()[0].name, "rows/u");
  EXPECT_EQ((*back)->entries()[2].name, "rows/head");
  const std::string scalar = Root() + "/../scalar.safetensors";
  ASSERT_EQ(Tessera({"export", scalar, "rows/scale"}).code, 0);
  back = SafetensorsReader::Open(scalar);
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE((*back)->entries()[0].shape.empty());

  // Human output.
  r = Tessera(
      {"load", "model", "--chunk_dim=0", "--placements=w1", "--prefix=one/"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, StartsWith("loaded 6 tensors from model, "));
}

TEST_F(CheckpointTest, PathsOutOfTheRootAndBadFilesCreateNothing) {
  const std::string before = Tensors();
  struct Case {
    std::string dir;
    std::vector<std::string> words;
  };
  const std::vector<Case> cases = {
      {"/etc", {"checkpoint_root", "absolute"}},
      {"../ckpt/model", {"checkpoint_root", ".."}},
      {"model/../../x", {"checkpoint_root", ".."}},
      {"escape", {"checkpoint_root", "leaves"}},
      {"escape/ckpt/model", {"checkpoint_root", "leaves"}},
      {"absent", {"checkpoint", "does not exist"}},
      {"cut", {"checkpoint", "safetensors"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.dir);
    Result r = Tessera(
        {"load", c.dir, "--chunk_dim=0", "--placements=w0", "--prefix=bad/"});
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_THAT(r.err, StartsWith("error: "));
    for (const std::string& w : c.words) EXPECT_THAT(r.err, HasSubstr(w));
  }
  // A worker without --checkpoint_root cannot read: the load fails whole.
  Result r = Tessera({"load", "model", "--chunk_dim=0", "--placements=w0,w3",
                      "--prefix=bad/"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("checkpoint_root"));
  EXPECT_THAT(r.err, HasSubstr("w3"));
  EXPECT_EQ(Tensors(), before);
}

// A load on a terminal shows the bytes the workers landed, as the
// coordinator counts them: with w1 stopped for 2.5 s (its shard cannot even
// be made), the line says so (0 of 32 MiB) and is redrawn while it waits,
// then the result follows.
TEST_F(CheckpointTest, LoadProgressOnATerminalCountsTheWorkersBytes) {
  const std::string log = absl::StrCat(std::getenv("TEST_TMPDIR"), "/load.log");
  const std::string command =
      absl::StrCat(TestCluster::BinaryPath("client/tessera"),
                   " --coordinator=", cluster_->coordinator_address(),
                   " load big --chunk_dim=0 --placements=w0,w1 --prefix=prog/");
  const TerminalRun run =
      RunOnTerminalWithWorkerStopped(command, cluster_->worker_pid(1), log);
  ASSERT_EQ(run.code, 0);
  const ProgressLines progress = ProgressOf(run.text, "load big: ");
  for (const std::string& line : progress.lines) {
    EXPECT_THAT(line, HasSubstr(" of 32.0 MiB (")) << run.text;
  }
  EXPECT_GE(progress.lines.size(), 3u) << run.text;
  EXPECT_THAT(run.text, HasSubstr("loaded 1 tensor from big")) << run.text;
}

}  // namespace
}  // namespace tessera
