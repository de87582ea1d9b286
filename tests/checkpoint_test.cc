// `tessera load` and `tessera save` against real daemons (CLI.md
// "Checkpoints (v3)"): a Hugging Face model directory (two files and their
// index) under the workers' --checkpoint_root loads into a row layout and a
// column layout bit-exact, each worker reading about only its shards'
// bytes; what is saved from four workers parses with a plain reader of the
// public format and loads back on three in another layout bit-exact; paths
// that leave the root, a worker without a root, a damaged file and a failed
// checksum are refused with nothing created; a save that fails (a worker
// killed, a full disk) leaves the checkpoint it would have replaced
// loadable.
#include <dirent.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <zlib.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/npy_file.h"
#include "client/safetensors_file.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/cluster.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
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

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::set<std::string> Listing(const std::string& dir) {
  std::set<std::string> names;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..") names.insert(name);
    }
    closedir(d);
  }
  return names;
}

// A safetensors entry as a reader that knows only the public format sees
// it: 8 bytes of little-endian header length, the JSON header, then data
// at the header's data_offsets.
struct PlainEntry {
  std::string dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};
std::map<std::string, PlainEntry> PlainRead(const std::string& path) {
  const std::string file = ReadAll(path);
  std::map<std::string, PlainEntry> out;
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i)
    n = (n << 8) | static_cast<unsigned char>(file[i]);
  const nlohmann::json header = nlohmann::json::parse(file.substr(8, n));
  for (const auto& [name, e] : header.items()) {
    if (name == "__metadata__") continue;
    const int64_t begin = e["data_offsets"][0], end = e["data_offsets"][1];
    out[name] = {e["dtype"], e["shape"].get<std::vector<int64_t>>(),
                 file.substr(8 + n + begin, end - begin)};
  }
  return out;
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
    // A mount namespace of this test's own, which the workers share: a
    // small tmpfs mounted in it below the root is a full disk for them and
    // is gone with the test's processes.
    ASSERT_EQ(unshare(CLONE_NEWNS), 0)
        << "a mount namespace for the full-disk test: " << std::strerror(errno);
    ASSERT_EQ(mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr), 0)
        << std::strerror(errno);
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
    // A 4 MiB file that shrinks and grows back while it is loaded.
    const std::string shrink = Root() + "/shrink";
    mkdir(shrink.c_str(), 0755);
    WriteAll(shrink + "/model.safetensors",
             ModelFile({{"x", DType::kFloat32, {4096, 256}}}, 5, &ignored));
    // FIFOs where a file should be: the model file, and a save's index.
    for (const std::string& fifo : {Root() + "/fifo/model.safetensors",
                                    Root() + "/fifo-saved/tessera.json"}) {
      mkdir(fifo.substr(0, fifo.rfind('/')).c_str(), 0755);
      ASSERT_EQ(mkfifo(fifo.c_str(), 0644), 0) << std::strerror(errno);
    }
    // 32 MiB in one entry, for a load that takes seconds.
    const std::string big = Root() + "/big";
    mkdir(big.c_str(), 0755);
    WriteAll(big + "/model.safetensors",
             ModelFile({{"w", DType::kFloat32, {8192, 1024}}}, 4, &ignored));

    TestClusterOptions options;
    // w4 has no --checkpoint_root.
    options.num_workers = 5;
    options.per_worker_flags = [](int i) {
      return i < 4 ? std::vector<std::string>{"--checkpoint_root=" + Root()}
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
  // Each shard on two workers (the second filled as a put's are: w4, which
  // has no checkpoint root, may hold copies too).
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
  Result r = Tessera({"load", "model", "--chunk_dim=0", "--placements=w0,w4",
                      "--prefix=bad/"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("checkpoint_root"));
  EXPECT_THAT(r.err, HasSubstr("w4"));
  EXPECT_EQ(Tensors(), before);
  // A save there says so too, and not that --overwrite would help.
  ASSERT_EQ(Tessera({"create", "bad_save", "--shape=4", "--dtype=int8",
                     "--chunk_dim=0", "--placements=w0"})
                .code,
            0);
  for (const Case& c : cases) {
    if (c.words[0] != "checkpoint_root") continue;
    SCOPED_TRACE(c.dir);
    Result saved = Tessera({"save", c.dir, "bad_save"});
    EXPECT_EQ(saved.code, 1) << saved.err;
    for (const std::string& w : c.words) EXPECT_THAT(saved.err, HasSubstr(w));
    EXPECT_THAT(saved.err, Not(HasSubstr("--overwrite")));
  }
  EXPECT_EQ(Tessera({"rm", "bad_save"}).code, 0);
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

// Saved from four workers (rows), the checkpoint is what the contract says
// (each worker's own file, the Hugging Face index naming them, tessera.json
// with every piece's box and CRC-32), a plain reader of the format finds
// the bytes in it, and it loads on three workers by columns bit-exact.
TEST_F(CheckpointTest, SavesFromFourWorkersAndLoadsOnThreeInAnotherLayout) {
  ASSERT_EQ(Tessera({"load", "model", "--chunk_dim=0",
                     "--placements=w0,w1,w2,w3", "--prefix=s/"})
                .code,
            0);
  int64_t total = 0;
  for (const auto& [name, data] : *bytes_) total += data.size();
  Result r = Tessera({"save", "saved/one", "--prefix=s/", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, StartsWith("{\"dir\": \"saved/one\", \"tensors\": [\"s/"));
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat("\"bytes\": ", total,
                                            ", \"files\": 4, \"seconds\": ")));

  // Four worker files and the two index files, nothing else.
  const std::string dir = Root() + "/saved/one";
  const std::set<std::string> files = Listing(dir);
  EXPECT_EQ(files.size(), 6u) << absl::StrJoin(files, " ");
  EXPECT_EQ(files.count("tessera.json"), 1u);
  EXPECT_EQ(files.count("model.safetensors.index.json"), 1u);
  for (const std::string worker : {"w0", "w1", "w2", "w3"}) {
    EXPECT_EQ(std::count_if(files.begin(), files.end(),
                            [&](const std::string& f) {
                              return absl::StartsWith(f, worker + "-") &&
                                     absl::EndsWith(f, ".safetensors");
                            }),
              1)
        << worker;
  }
  // The Hugging Face index maps every entry to a file that holds it.
  const nlohmann::json index =
      nlohmann::json::parse(ReadAll(dir + "/model.safetensors.index.json"));
  EXPECT_EQ(index["metadata"]["total_size"], total);
  std::map<std::string, PlainEntry> entries;
  for (const auto& [entry, file] : index["weight_map"].items()) {
    std::map<std::string, PlainEntry> in =
        PlainRead(dir + "/" + file.get<std::string>());
    ASSERT_EQ(in.count(entry), 1u) << entry;
    entries[entry] = in[entry];
  }
  // tessera.json's pieces, in row order, are the model's bytes; each
  // piece's CRC-32 is zlib's of its bytes.
  const nlohmann::json saved =
      nlohmann::json::parse(ReadAll(dir + "/tessera.json"));
  EXPECT_EQ(saved["format"], "tessera.checkpoint");
  ASSERT_EQ(saved["tensors"].size(), bytes_->size());
  for (const nlohmann::json& t : saved["tensors"]) {
    const std::string name = t["name"].get<std::string>().substr(2);
    std::string joined;
    for (const nlohmann::json& piece : t["pieces"]) {
      const PlainEntry& e = entries.at(piece["entry"].get<std::string>());
      EXPECT_EQ(e.shape, piece["sizes"].get<std::vector<int64_t>>());
      const uint32_t crc = static_cast<uint32_t>(
          crc32(0, reinterpret_cast<const Bytef*>(e.bytes.data()),
                static_cast<uInt>(e.bytes.size())));
      EXPECT_EQ(crc, piece["crc32"].get<uint32_t>()) << piece["entry"];
      joined += e.bytes;
    }
    EXPECT_EQ(joined, bytes_->at(name)) << name;
  }
  // The 0-d entry is saved 0-d, the uint16 one as U16.
  EXPECT_EQ(entries.at("s/scale").shape, std::vector<int64_t>{});
  EXPECT_EQ(entries.at("s/u:0").dtype, "U16");

  // Loaded on three workers by columns (and a tensor of 0-d kept [1]).
  r = Tessera({"load", "saved/one", "--chunk_dim=-1", "--placements=w2,w1,w0",
               "--prefix=c/", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(BytesOf(r.out).first, total);
  ExpectModel("c/s/");
  EXPECT_THAT(Tensors(), HasSubstr("{\"name\": \"c/s/head\", \"shape\": [40, "
                                   "24], \"dtype\": \"float32\", \"version\": "
                                   "1, \"num_shards\": 3"));

  // Human output.
  r = Tessera({"save", "saved/two", "s/head", "s/ids"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, StartsWith("saved 2 tensors into saved/two, "));
}

// export --hf: the workers holding the shards (cut by columns, so each
// writes a run per row) write a Hugging Face sharded directory of whole
// tensors that a plain reader of the public format opens, and that loads
// back into another layout bit-exact.
TEST_F(CheckpointTest, ExportsAHuggingFaceDirectoryThatLoadsBackBitExact) {
  ASSERT_EQ(Tessera({"load", "model", "--chunk_dim=-1",
                     "--placements=w0,w1,w2,w3", "--prefix=hf/"})
                .code,
            0);
  int64_t total = 0;
  for (const auto& [name, data] : *bytes_) total += data.size();
  // embed (6144 bytes) alone; head and the small ones in the second file.
  Result r = Tessera({"export", "--hf", "exported/one", "--prefix=hf/",
                      "--strip_prefix=hf/", "--max_shard_size=8KB", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, StartsWith("{\"dir\": \"exported/one\", \"tensors\": "
                                "[\"hf/"));
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat("\"bytes\": ", total,
                                            ", \"files\": 2, \"seconds\": ")));
  const std::string dir = Root() + "/exported/one";
  EXPECT_EQ(Listing(dir),
            (std::set<std::string>{"model-00001-of-00002.safetensors",
                                   "model-00002-of-00002.safetensors",
                                   "model.safetensors.index.json"}));
  // Read as any Hugging Face loader reads it: the index, then each file.
  auto expect_plain = [&](int64_t files) {
    const nlohmann::json index =
        nlohmann::json::parse(ReadAll(dir + "/model.safetensors.index.json"));
    EXPECT_EQ(index["metadata"]["total_size"], total);
    ASSERT_EQ(index["weight_map"].size(), bytes_->size());
    std::set<std::string> named;
    for (const auto& [entry, file] : index["weight_map"].items()) {
      named.insert(file.get<std::string>());
      std::map<std::string, PlainEntry> in =
          PlainRead(dir + "/" + file.get<std::string>());
      ASSERT_EQ(in.count(entry), 1u) << entry;
      EXPECT_EQ(in[entry].bytes, bytes_->at(entry)) << entry;
    }
    EXPECT_EQ(static_cast<int64_t>(named.size()), files);
  };
  expect_plain(2);
  std::map<std::string, PlainEntry> second =
      PlainRead(dir + "/model-00002-of-00002.safetensors");
  EXPECT_EQ(second.at("head").shape, (std::vector<int64_t>{40, 24}));
  EXPECT_EQ(second.at("scale").shape, std::vector<int64_t>{});
  EXPECT_EQ(second.at("u").dtype, "U16");
  EXPECT_EQ(PlainRead(dir + "/model-00001-of-00002.safetensors").size(), 1u);

  // Back by rows on two workers.
  r = Tessera({"load", "exported/one", "--chunk_dim=0", "--placements=w2,w1",
               "--prefix=back/"});
  ASSERT_EQ(r.code, 0) << r.err;
  ExpectModel("back/");

  // The directory holds a checkpoint now: replaced only when told.
  const std::string index_before =
      ReadAll(dir + "/model.safetensors.index.json");
  r = Tessera(
      {"export", "--hf", "exported/one", "--prefix=hf/", "--strip_prefix=hf/"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("already holds a checkpoint"));
  EXPECT_EQ(ReadAll(dir + "/model.safetensors.index.json"), index_before);
  r = Tessera({"export", "--hf", "exported/one", "--prefix=hf/",
               "--strip_prefix=hf/", "--overwrite"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, StartsWith("exported 6 tensors into exported/one, "));
  expect_plain(1);

  // Bad input: refused, nothing written.
  struct Bad {
    std::vector<std::string> args;
    int code;
    std::string says;
  };
  for (const Bad& bad : std::vector<Bad>{
           {{"export", "--hf", "exported/bad", "--prefix=hf/",
             "--strip_prefix=gpt/"},
            1,
            "does not start with 'gpt/'"},
           {{"export", "--hf", "exported/bad", "--prefix=hf/",
             "--max_shard_size=lots"},
            2,
            "--max_shard_size"},
           {{"export", "--hf", "exported/bad", "hf/head", "--metadata=a=b"},
            2,
            "--metadata"},
           {{"export", "x.safetensors", "hf/head", "--strip_prefix=hf/"},
            2,
            "--strip_prefix is for export --hf"},
           {{"export", "--hf", "../out", "hf/head"}, 1, "checkpoint_root"},
           {{"export", "--hf", "exported/bad", "hf/nothing"}, 1, "hf/nothing"},
       }) {
    Result got = Tessera(bad.args);
    EXPECT_EQ(got.code, bad.code) << absl::StrJoin(bad.args, " ") << got.err;
    EXPECT_THAT(got.err, HasSubstr(bad.says)) << absl::StrJoin(bad.args, " ");
  }
  EXPECT_TRUE(Listing(Root() + "/exported/bad").empty());
}

// A piece whose bytes changed on disk fails its CRC, whether a load reads
// it whole or in parts on several workers (each worker's part CRC combines
// into the piece's): exit 1 `checkpoint`, nothing created. Bad names and a
// worker without a root are refused before anything is written.
TEST_F(CheckpointTest, DamagedPiecesAndBadSavesAreRefused) {
  ASSERT_EQ(Tessera({"load", "model", "--chunk_dim=0", "--placements=w0,w1",
                     "--prefix=d/"})
                .code,
            0);
  ASSERT_EQ(Tessera({"save", "saved/damaged", "d/head"}).code, 0);
  const std::string dir = Root() + "/saved/damaged";
  for (const std::string& f : Listing(dir)) {
    if (!absl::StartsWith(f, "w1-")) continue;
    // The last byte of w1's file is the last of its piece of d/head.
    std::fstream file(dir + "/" + f,
                      std::ios::in | std::ios::out | std::ios::binary);
    file.seekg(-1, std::ios::end);
    const char last = static_cast<char>(file.get());
    file.seekp(-1, std::ios::end);
    file.put(static_cast<char>(last ^ 0x5a));
  }
  std::string before = Tensors();
  Result r = Tessera({"load", "saved/damaged", "--chunk_dim=0",
                      "--placements=w2,w3", "--prefix=bad/"});
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_THAT(r.err, HasSubstr("checkpoint"));
  EXPECT_THAT(r.err, HasSubstr("checksum"));
  EXPECT_EQ(Tensors(), before);
  // By columns on three workers, none of which reads the piece whole.
  r = Tessera({"load", "saved/damaged", "--chunk_dim=1",
               "--placements=w0,w2,w3", "--prefix=bad/"});
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_THAT(r.err, HasSubstr("checkpoint"));
  EXPECT_THAT(r.err, HasSubstr("fails its checksum"));
  EXPECT_THAT(r.err, HasSubstr("d/head"));
  EXPECT_EQ(Tensors(), before);
  // A lone file of a save that never wrote its index is no model.
  const std::string part = Root() + "/part";
  mkdir(part.c_str(), 0755);
  for (const std::string& f : Listing(dir)) {
    if (absl::StartsWith(f, "w0-"))
      WriteAll(part + "/" + f, ReadAll(dir + "/" + f));
  }
  r = Tessera(
      {"load", "part", "--chunk_dim=0", "--placements=w0", "--prefix=bad/"});
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_THAT(r.err, HasSubstr("did not finish"));
  EXPECT_EQ(Tensors(), before);
  // It is no one's checkpoint either: a save again writes over it, as the
  // message says, without --overwrite.
  r = Tessera({"save", "part", "d/head"});
  EXPECT_EQ(r.code, 0) << r.err;
  r = Tessera({"load", "part", "--chunk_dim=0", "--placements=w2",
               "--prefix=part-again/"});
  EXPECT_EQ(r.code, 0) << r.err;
  before = Tensors();

  const struct {
    std::vector<std::string> args;
    int code;
    std::string word;
  } kCases[] = {
      {{"save", "/abs", "d/head"}, 1, "checkpoint_root"},
      {{"save", "saved/../../x", "d/head"}, 1, "checkpoint_root"},
      {{"save", "escape/x", "d/head"}, 1, "checkpoint_root"},
      {{"save", "saved/x", "absent"}, 1, "not found"},
      {{"save", "saved/x", "--prefix=nothing/"}, 1, "no tensor"},
      {{"save", "saved/x"}, 2, "NAME"},
      {{"save", "saved/x", "d/head", "--prefix=d/"}, 2, "not both"},
  };
  for (const auto& c : kCases) {
    SCOPED_TRACE(absl::StrJoin(c.args, " "));
    r = Tessera(c.args);
    EXPECT_EQ(r.code, c.code) << r.err;
    EXPECT_THAT(r.err, HasSubstr(c.word));
  }
  EXPECT_EQ(Listing(Root() + "/saved/x").size(), 0u);
  // A shard on the worker without a root: that worker cannot write.
  ASSERT_EQ(Tessera({"load", "model", "--chunk_dim=0", "--placements=w0",
                     "--prefix=r/"})
                .code,
            0);
  ASSERT_EQ(
      Tessera({"reshard", "r/head", "--chunk_dim=0", "--placements=w4"}).code,
      0);
  r = Tessera({"save", "saved/x", "r/head"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("checkpoint_root"));
  EXPECT_EQ(Listing(Root() + "/saved/x").size(), 0u);
}

// A save on a terminal shows the bytes the workers wrote, as the
// coordinator counts them (w1 stopped for 2.5 s: strictly between 0 and
// 100 % for a while).
TEST_F(CheckpointTest, SaveProgressOnATerminalCountsTheWorkersBytes) {
  ASSERT_EQ(Tessera({"load", "big", "--chunk_dim=0", "--placements=w0,w1",
                     "--prefix=sp/"})
                .code,
            0);
  const std::string log = absl::StrCat(std::getenv("TEST_TMPDIR"), "/save.log");
  const std::string command =
      absl::StrCat(TestCluster::BinaryPath("client/tessera"),
                   " --coordinator=", cluster_->coordinator_address(),
                   " save saved/progress sp/w");
  const TerminalRun run =
      RunOnTerminalWithWorkerStopped(command, cluster_->worker_pid(1), log);
  ASSERT_EQ(run.code, 0) << run.text;
  const ProgressLines progress = ProgressOf(run.text, "save saved/progress: ");
  EXPECT_GE(progress.lines.size(), 3u) << run.text;
  bool between = false;
  for (const std::string& line : progress.lines) {
    EXPECT_THAT(line, HasSubstr(" of 32.0 MiB (")) << run.text;
    between |= absl::StrContains(line, "16.0 MiB of 32.0 MiB");
  }
  EXPECT_TRUE(between) << run.text;
  EXPECT_THAT(run.text, HasSubstr("saved 1 tensor into saved/progress"));
}

// A save that fails (a worker killed while it writes) leaves the
// checkpoint it would have replaced as it was: the same index, the same
// files, loadable bit-exact; the files the failed save wrote are gone.
// Last: it restarts w1, whose shards are then lost.
TEST_F(CheckpointTest, AFailedSaveLeavesTheEarlierCheckpointLoadable) {
  ASSERT_EQ(Tessera({"load", "model", "--chunk_dim=0", "--placements=w0,w2",
                     "--prefix=k/"})
                .code,
            0);
  ASSERT_EQ(Tessera({"load", "big", "--chunk_dim=0", "--placements=w0,w1",
                     "--prefix=kb/"})
                .code,
            0);
  ASSERT_EQ(Tessera({"save", "saved/keep", "--prefix=k/"}).code, 0);
  const std::string dir = Root() + "/saved/keep";
  const std::set<std::string> before = Listing(dir);
  const std::string index = ReadAll(dir + "/tessera.json");

  kill(cluster_->worker_pid(1), SIGSTOP);
  Result failed;
  std::thread save([&] { failed = Tessera({"save", "saved/keep", "kb/w"}); });
  absl::SleepFor(absl::Seconds(1.5));
  cluster_->StopWorker(1, SIGKILL);
  save.join();
  EXPECT_EQ(failed.code, 1) << failed.out;
  EXPECT_THAT(failed.err, HasSubstr("w1"));
  EXPECT_EQ(Listing(dir), before);
  EXPECT_EQ(ReadAll(dir + "/tessera.json"), index);
  Result r = Tessera({"load", "saved/keep", "--chunk_dim=-1", "--placements=w3",
                      "--prefix=back/"});
  ASSERT_EQ(r.code, 0) << r.err;
  ExpectModel("back/k/");
  ASSERT_TRUE(cluster_->RestartWorker(1).ok());
}

// A save onto a disk that fills up fails with `the disk is full`, removes
// every file it wrote, and leaves the checkpoint already in the directory
// as it was and loadable.
TEST_F(CheckpointTest, AFullDiskFailsTheSaveAndKeepsTheEarlierCheckpoint) {
  const std::string small = Root() + "/small";
  ASSERT_EQ(mkdir(small.c_str(), 0755), 0);
  ASSERT_EQ(mount("tessera-full", small.c_str(), "tmpfs", 0, "size=4m"), 0)
      << std::strerror(errno);
  auto unmount = absl::MakeCleanup([&] { umount2(small.c_str(), MNT_DETACH); });
  auto free_bytes = [&] {
    struct statvfs s {};
    EXPECT_EQ(statvfs(small.c_str(), &s), 0);
    return static_cast<int64_t>(s.f_bavail) * static_cast<int64_t>(s.f_frsize);
  };
  ASSERT_EQ(Tessera({"load", "model", "--chunk_dim=0", "--placements=w0,w1",
                     "--prefix=fk/"})
                .code,
            0);
  // 32 MiB on two workers: more than the 4 MiB disk holds.
  ASSERT_EQ(Tessera({"load", "big", "--chunk_dim=0", "--placements=w2,w3",
                     "--prefix=fb/"})
                .code,
            0);
  ASSERT_EQ(Tessera({"save", "small/keep", "--prefix=fk/"}).code, 0);
  const std::string dir = small + "/keep";
  const std::set<std::string> before = Listing(dir);
  const std::string index = ReadAll(dir + "/tessera.json");
  const int64_t free_before = free_bytes();

  const Result full = Tessera({"save", "small/keep", "fb/w"});
  EXPECT_EQ(full.code, 1) << full.out;
  EXPECT_THAT(full.err, HasSubstr("the disk is full"));
  EXPECT_EQ(Listing(dir), before);
  EXPECT_EQ(ReadAll(dir + "/tessera.json"), index);
  EXPECT_EQ(free_bytes(), free_before);

  const Result r = Tessera({"load", "small/keep", "--chunk_dim=-1",
                            "--placements=w1,w3", "--prefix=back-full/"});
  ASSERT_EQ(r.code, 0) << r.err;
  ExpectModel("back-full/fk/");
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// A checkpoint file cut short while workers read it (a training job saving
// over the same path, a copy still under way) fails the load, never the
// workers: they read by pread, and a read past the end is an error, not a
// SIGBUS that would take every shard they hold with them. A column layout
// makes thousands of small runs per worker, which is where a mapping used
// to be read.
TEST_F(CheckpointTest, AFileCutShortWhileLoadingFailsTheLoadNotTheWorkers) {
  const std::string path = Root() + "/shrink/model.safetensors";
  const std::string whole = ReadAll(path);
  const absl::StatusOr<SafetensorsHeader> header = ParseSafetensors(whole);
  ASSERT_TRUE(header.ok()) << header.status();
  std::vector<pid_t> pids;
  for (int i = 0; i < 4; ++i) pids.push_back(cluster_->worker_pid(i));

  std::atomic<bool> stop{false};
  std::thread shrinker([&] {
    // Its data cut to a page, then grown back (as zeros) to its size.
    while (!stop.load()) {
      EXPECT_EQ(truncate(path.c_str(), header->data_offset + 4096), 0);
      absl::SleepFor(absl::Microseconds(300));
      EXPECT_EQ(truncate(path.c_str(), static_cast<off_t>(whole.size())), 0);
      absl::SleepFor(absl::Milliseconds(3));
    }
  });
  int failed = 0;
  for (int round = 0; round < 12; ++round) {
    const Result r =
        Tessera({"load", "shrink", "--chunk_dim=-1", "--placements=w0,w1,w2,w3",
                 absl::StrCat("--prefix=shrink", round, "/")});
    EXPECT_TRUE(r.code == 0 || r.code == 1) << r.code << r.err;
    if (r.code == 1) {
      ++failed;
      // Cut before the listing ("outside the data section") or under a
      // read ("shorter than"): either way the file, named.
      EXPECT_THAT(r.err, HasSubstr("checkpoint: 'shrink/model.safetensors"))
          << r.err;
    }
  }
  stop = true;
  shrinker.join();
  WriteAll(path, whole);
  std::cerr << failed << " of 12 loads met a file cut short\n";

  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(cluster_->worker_pid(i), pids[i]);
    EXPECT_EQ(kill(pids[i], 0), 0) << cluster_->worker_log(i);
  }
  // The file whole again: it loads bit-exact on the same workers.
  const Result r = Tessera({"load", "shrink", "--chunk_dim=-1",
                            "--placements=w3,w2,w1,w0", "--prefix=whole/"});
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string npy = Root() + "/../shrink-x.npy";
  ASSERT_EQ(Tessera({"get", "whole/x", "--output=" + npy}).code, 0);
  absl::StatusOr<HostArray> a = ReadNpyFile(npy, std::nullopt);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(std::string(a->data(), a->num_bytes),
            whole.substr(static_cast<size_t>(header->data_offset)));
}

// A FIFO where a checkpoint file should be is refused at once, as no file:
// no worker thread waits in open() for a writer that never comes, and the
// workers serve the next load.
TEST_F(CheckpointTest, AFifoInACheckpointDirectoryIsRefusedAtOnce) {
  const std::string timeout = "/usr/bin/timeout";
  auto bounded = [&](std::vector<std::string> args) {
    std::vector<std::string> argv = {
        timeout, "20", TestCluster::BinaryPath("client/tessera"),
        "--coordinator=" + cluster_->coordinator_address()};
    argv.insert(argv.end(), args.begin(), args.end());
    Result r;
    r.code = TestCluster::Run(argv, &r.out, &r.err);
    return r;
  };
  Result r = bounded({"load", "fifo", "--chunk_dim=0", "--placements=w0,w1"});
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("not a regular file"));
  r = bounded({"load", "fifo-saved", "--chunk_dim=0", "--placements=w0,w1"});
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("is not a file"));
  // A save over that directory reads its index first: what it cannot read
  // is not taken for no checkpoint, and the FIFO is left as it was.
  ASSERT_EQ(bounded({"load", "model", "--chunk_dim=0", "--placements=w0,w1",
                     "--prefix=fifo-src/"})
                .code,
            0);
  r = bounded({"save", "fifo-saved", "--prefix=fifo-src/"});
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("cannot be read as a checkpoint"));
  struct stat st {};
  ASSERT_EQ(stat((Root() + "/fifo-saved/tessera.json").c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));

  r = bounded({"load", "model", "--chunk_dim=-1", "--placements=w1,w0",
               "--prefix=after-fifo/"});
  ASSERT_EQ(r.code, 0) << r.err;
  ExpectModel("after-fifo/");
}

}  // namespace
}  // namespace tessera
