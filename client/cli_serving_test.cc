// The `tessera` binary's serving commands (CLI.md "Serving (v2)") against
// a real cluster: import/export of .safetensors files, with their --json
// output, exit codes and error words.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/npy_file.h"
#include "client/safetensors_file.h"
#include "client/tessera_client.h"
#include "client/testing/local_cluster.h"
#include "core/init_fill.h"
#include "core/npy.h"
#include "core/placement.h"
#include "core/testing/status_matchers.h"
#include "core/testing/temp_files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/processes.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::PathExists;
using ::tessera::testing::ReadFileToString;
using ::tessera::testing::TempPath;
using ::tessera::testing::WriteStringToFile;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

// The bytes of a safetensors file of `tensors` as LayoutSafetensors lays
// it out, each entry's byte b being (b * 7 + seed) (bools 0/1).
std::string SafetensorsBytes(std::vector<SafetensorsTensor> tensors, int seed) {
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

class CliServingTest : public LocalClusterSuite {
 protected:
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
};

const std::vector<SafetensorsTensor>& Model() {
  static const auto* tensors = new std::vector<SafetensorsTensor>{
      {"wte", DType::kFloat32, {10, 4}},
      {"h.0.attn", DType::kBFloat16, {4, 6}},
      {"h.0.bias", DType::kFloat16, {6}},
      {"pos", DType::kInt64, {5, 1}},
      {"flags", DType::kBool, {3}},
      {"codes", DType::kUInt8, {7}},
      {"ids16", DType::kUInt16, {3, 2}},
      {"ids32", DType::kUInt32, {5}},
      {"ids64", DType::kUInt64, {2, 2}},
      {"w.fp8", DType::kFloat8E4M3FN, {2, 4}},
      {"g.fp8", DType::kFloat8E5M2, {4, 2}},
  };
  return *tensors;
}

TEST_F(CliServingTest, ImportThenExportRoundTripsBytes) {
  const std::string in = Path("gpt.safetensors");
  const std::string bytes = SafetensorsBytes(Model(), 3);
  WriteStringToFile(in, bytes);
  LocalCluster::Result r =
      Tessera({"import", in, "--chunk_dim=0",
               "--placements=rank:0,rank:1,rank:2", "--prefix=gpt/", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, StartsWith(absl::StrCat("{\"file\": \"", in,
                                             "\", \"tensors\": [{\"name\": ")));
  EXPECT_THAT(r.out, HasSubstr("{\"name\": \"gpt/h.0.attn\", \"shape\": [4, "
                               "6], \"dtype\": \"bfloat16\", \"version\": 1, "
                               "\"num_shards\": 3}"));
  EXPECT_THAT(r.out, HasSubstr("\"bytes\": 350, \"seconds\": "));

  // Each tensor holds its entry's bytes.
  absl::StatusOr<std::unique_ptr<SafetensorsReader>> file =
      SafetensorsReader::Open(in);
  ASSERT_THAT(file.status(), IsOk());
  for (const SafetensorsEntry& e : (*file)->entries()) {
    const std::string npy = Path(e.name + ".npy");
    LocalCluster::Result got =
        Tessera({"get", "gpt/" + e.name, "--output=" + npy});
    ASSERT_EQ(got.code, 0) << got.err;
    // bfloat16 and float8 come back as their raw words.
    absl::StatusOr<HostArray> array = ReadNpyFile(npy, std::nullopt);
    ASSERT_THAT(array.status(), IsOk());
    EXPECT_EQ(array->dtype, NpyFileDType(e.dtype)) << e.name;
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
  EXPECT_THAT(r.out, StartsWith("exported 11 tensors into " + out));
  EXPECT_EQ(ReadFileToString(out), bytes);

  // By names, with --json.
  const std::string two = Path("two.safetensors");
  r = Tessera({"export", two, "gpt/pos", "gpt/wte", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out,
              StartsWith(absl::StrCat(
                  "{\"file\": \"", two,
                  "\", \"entries\": [{\"entry\": \"gpt/pos\", \"tensor\": "
                  "\"gpt/pos\", \"shape\": [5, 1], \"dtype\": \"int64\"}, "
                  "{\"entry\": \"gpt/wte\", \"tensor\": \"gpt/wte\", "
                  "\"shape\": [10, 4], \"dtype\": \"float32\"}], "
                  "\"bytes\": 200, \"file_bytes\": ",
                  ReadFileToString(two).size(), ", \"seconds\": ")));
  absl::StatusOr<std::unique_ptr<SafetensorsReader>> back =
      SafetensorsReader::Open(two);
  ASSERT_THAT(back.status(), IsOk());
  EXPECT_EQ((*back)->entries().size(), 2u);
}

// A file as the reference writer or a trainer lays it out (not tessera's
// aligned order, with __metadata__) comes back from import + export byte
// for byte; --metadata adds keys or replaces values; a tensor made
// otherwise joins after the imported ones.
TEST_F(CliServingTest, ExportKeepsTheImportedFilesOrderAndMetadata) {
  const std::string json =
      R"({"__metadata__":{"format":"pt","step":"100"},)"
      R"("z.bias":{"dtype":"I8","shape":[3],"data_offsets":[0,3]},)"
      R"("a.w":{"dtype":"F32","shape":[2,1],"data_offsets":[3,11]},)"
      R"("m.ids":{"dtype":"U64","shape":[1],"data_offsets":[11,19]},)"
      R"("f.fp8":{"dtype":"F8_E4M3","shape":[2,2],"data_offsets":[19,23]}})";
  std::string padded = json;
  padded.append((8 - padded.size() % 8) % 8, ' ');
  std::string data;
  for (int b = 0; b < 23; ++b) data.push_back(static_cast<char>(b * 11 + 1));
  const std::string bytes = RawFile(padded, data);
  const std::string in = Path("ordered.safetensors");
  WriteStringToFile(in, bytes);
  LocalCluster::Result r =
      Tessera({"import", in, "--chunk_dim=0", "--placements=rank:0,rank:1",
               "--prefix=ord/"});
  ASSERT_EQ(r.code, 0) << r.err;

  const std::string out = Path("ordered_out.safetensors");
  r = Tessera({"export", out, "--prefix=ord/"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(ReadFileToString(out), bytes);

  // --metadata: a new key after the file's, a file key's value replaced.
  const std::string tagged = Path("tagged.safetensors");
  r = Tessera({"export", tagged, "--prefix=ord/",
               "--metadata=step=200,origin=tessera"});
  ASSERT_EQ(r.code, 0) << r.err;
  absl::StatusOr<std::unique_ptr<SafetensorsReader>> back =
      SafetensorsReader::Open(tagged);
  ASSERT_THAT(back.status(), IsOk());
  const SafetensorsMetadata want = {
      {"format", "pt"}, {"step", "200"}, {"origin", "tessera"}};
  EXPECT_EQ((*back)->header().metadata, want);
  ASSERT_EQ((*back)->entries().size(), 4u);
  EXPECT_EQ((*back)->entries()[0].name, "z.bias");
  EXPECT_EQ((*back)->entries()[3].name, "f.fp8");

  // A tensor not imported goes after the file's entries.
  ASSERT_EQ(Tessera({"create", "ord/new", "--shape=2", "--dtype=float32",
                     "--chunk_dim=0", "--placements=rank:2"})
                .code,
            0);
  const std::string mixed = Path("mixed.safetensors");
  r = Tessera({"export", mixed, "--prefix=ord/"});
  ASSERT_EQ(r.code, 0) << r.err;
  back = SafetensorsReader::Open(mixed);
  ASSERT_THAT(back.status(), IsOk());
  ASSERT_EQ((*back)->entries().size(), 5u);
  EXPECT_EQ((*back)->entries()[0].name, "z.bias");
  EXPECT_EQ((*back)->entries()[4].name, "new");

  // Bad --metadata: usage errors, no file.
  const std::string none = Path("none.safetensors");
  for (const char* bad : {"--metadata=novalue", "--metadata==x",
                          "--metadata=a=1,a=2", "--metadata=__metadata__=1"}) {
    SCOPED_TRACE(bad);
    ExpectError(Tessera({"export", none, "--prefix=ord/", bad}), 2,
                {"--metadata"});
    EXPECT_FALSE(PathExists(none));
  }
  ASSERT_EQ(Tessera({"rm", "ord/z.bias", "ord/a.w", "ord/m.ids", "ord/f.fp8",
                     "ord/new"})
                .code,
            0);
}

TEST_F(CliServingTest, ImportWithShardsSpecResolvesPerEntry) {
  const std::string in = Path("boxes.safetensors");
  WriteStringToFile(
      in, SafetensorsBytes(
              {{"a", DType::kInt32, {4, 2}}, {"b", DType::kInt32, {6, 3}}}, 5));
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
       RawFile(R"({"a":{"dtype":"F8_E8M0","shape":[8],"data_offsets":[0,8]}})",
               "12345678")},
  };
  for (const auto& [what, bytes] : bad) {
    const std::string path = Path("bad_" + what + ".safetensors");
    WriteStringToFile(path, bytes);
    SCOPED_TRACE(what);
    ExpectError(Tessera({"import", path, "--chunk_dim=0", "--placements=rank:0",
                         "--prefix=bad/"}),
                1, {"safetensors"});
  }
  ExpectError(Tessera({"import", Path("missing.safetensors"), "--chunk_dim=0",
                       "--placements=rank:0"}),
              1, {"safetensors", "missing.safetensors"});
  EXPECT_EQ(Tensors(), before);
}

TEST_F(CliServingTest, InvalidShardingDimCreatesNothing) {
  const std::string in = Path("dim.safetensors");
  WriteStringToFile(in, SafetensorsBytes({{"m", DType::kFloat32, {4, 4}},
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
  ExpectError(Tessera({"import", f, "--chunk_dim=x", "--placements=rank:0"}), 2,
              {"--chunk_dim"});
  ExpectError(Tessera({"export", f}), 2, {"NAME", "--prefix"});
  ExpectError(Tessera({"export", f, "a", "--prefix=p/"}), 2, {"not both"});
  ExpectError(Tessera({"export", f, "bad name"}), 2, {"bad name"});
  ExpectError(Tessera({"export"}), 2, {"missing FILE.safetensors"});
}

TEST_F(CliServingTest, FailedExportLeavesNoFile) {
  ASSERT_THAT(client_
                  ->Create("exp/a", {3}, DType::kInt8,
                           LayoutSpec::Chunk(0, {*ParsePlacement("rank:0")}))
                  .status(),
              IsOk());
  const std::string out = Path("never.safetensors");
  ExpectError(Tessera({"export", out, "exp/a", "exp/missing"}), 1,
              {"not found"});
  EXPECT_FALSE(PathExists(out));
  ExpectError(Tessera({"export", out, "--prefix=nothing-here/"}), 1,
              {"safetensors", "nothing-here/"});
  EXPECT_FALSE(PathExists(out));
}

// ---- get --rows, put --update, --json, --transport --------------------------

HostArray Int64Array(std::vector<int64_t> values) {
  HostArray a =
      HostArray::Allocate(DType::kInt64, {static_cast<int64_t>(values.size())});
  if (!values.empty()) std::memcpy(a.data(), values.data(), a.num_bytes);
  return a;
}

HostArray Int32Array(std::vector<int32_t> values) {
  HostArray a =
      HostArray::Allocate(DType::kInt32, {static_cast<int64_t>(values.size())});
  if (!values.empty()) std::memcpy(a.data(), values.data(), a.num_bytes);
  return a;
}

// A 10x3 int32 tensor holding arange(30), in three shards.
void MakeTable(Client& client, const std::string& name) {
  ASSERT_THAT(client
                  .Create(name, {10, 3}, DType::kInt32,
                          LayoutSpec::Chunk(0, {*ParsePlacement("rank:0"),
                                                *ParsePlacement("rank:1"),
                                                *ParsePlacement("rank:2")}),
                          *ParseInit("arange"))
                  .status(),
              IsOk());
}

std::vector<int32_t> Values(const std::string& npy) {
  absl::StatusOr<HostArray> a = ReadNpyFile(npy, std::nullopt);
  EXPECT_THAT(a.status(), IsOk());
  if (!a.ok()) return {};
  const int32_t* v = a->As<int32_t>();
  return std::vector<int32_t>(v, v + a->NumElements());
}

TEST_F(CliServingTest, GetRowsInAnyOrderWithRepeatsAndNegatives) {
  MakeTable(*client_, "rows/t");
  const std::string idx = Path("idx.npy");
  ASSERT_THAT(WriteNpyFile(idx, Int64Array({9, 0, 0, -1, 3})), IsOk());
  const std::string out = Path("rows_out.npy");
  LocalCluster::Result r =
      Tessera({"get", "rows/t", "--rows=" + idx, "--output=" + out});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(Values(out), (std::vector<int32_t>{27, 28, 29, 0, 1, 2, 0, 1, 2, 27,
                                               28, 29, 9, 10, 11}));
  absl::StatusOr<HostArray> shaped = ReadNpyFile(out, std::nullopt);
  ASSERT_THAT(shaped.status(), IsOk());
  EXPECT_EQ(shaped->shape, (Shape{5, 3}));

  // int32 indices, and --json.
  const std::string idx32 = Path("idx32.npy");
  ASSERT_THAT(WriteNpyFile(idx32, Int32Array({2, -10})), IsOk());
  r = Tessera({"get", "rows/t", "--rows", idx32, "--output", out, "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, StartsWith("{\"name\": \"rows/t\", \"shape\": [2, 3], "
                                "\"dtype\": \"int32\", \"version\": 1, "
                                "\"bytes\": 24, \"seconds\": "));
  EXPECT_THAT(r.out, HasSubstr("\"transport\": {"));
  EXPECT_EQ(Values(out), (std::vector<int32_t>{6, 7, 8, 0, 1, 2}));

  // No indices: zero rows.
  const std::string none = Path("none.npy");
  ASSERT_THAT(WriteNpyFile(none, Int64Array({})), IsOk());
  r = Tessera({"get", "rows/t", "--rows=" + none, "--output=" + out});
  ASSERT_EQ(r.code, 0) << r.err;
  shaped = ReadNpyFile(out, std::nullopt);
  ASSERT_THAT(shaped.status(), IsOk());
  EXPECT_EQ(shaped->shape, (Shape{0, 3}));
}

// The sum of the byte counts in `get --json`'s "transport" object.
int64_t TransportBytes(const std::string& json) {
  const size_t at = json.find("\"transport\": {");
  if (at == std::string::npos) return -1;
  const size_t end = json.find('}', at);
  int64_t total = 0;
  for (size_t colon = json.find(": ", at + 14); colon < end;
       colon = json.find(": ", colon + 2)) {
    total += std::strtoll(json.c_str() + colon + 2, nullptr, 10);
  }
  return total;
}

// `bytes` is the output (every index's row); `transport` what moved, each
// distinct row once (CLI.md leaves the difference unsaid; README and the
// SDK's TransferStats say it).
TEST_F(CliServingTest, GetRowsJsonCountsOutputBytesAndDistinctRowsMoved) {
  MakeTable(*client_, "rows/json");  // 10 x 3 int32: 12 bytes a row
  const std::string idx = Path("repeats.npy");
  ASSERT_THAT(WriteNpyFile(idx, Int64Array({4, 4, 4, 4, 4, -6, 7, 7})), IsOk());
  LocalCluster::Result r =
      Tessera({"get", "rows/json", "--rows=" + idx,
               "--output=" + Path("repeats_out.npy"), "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("\"bytes\": 96, "));  // 8 rows out
  EXPECT_EQ(TransportBytes(r.out), 24) << r.out;     // rows 4 and 7 moved
}

TEST_F(CliServingTest, GetRowsErrors) {
  MakeTable(*client_, "rows/e");
  const std::string out = Path("rows_err.npy");
  const std::string far = Path("far.npy");
  ASSERT_THAT(WriteNpyFile(far, Int64Array({1, 10})), IsOk());
  ExpectError(Tessera({"get", "rows/e", "--rows=" + far, "--output=" + out}), 1,
              {"out of bounds"});
  const std::string neg = Path("neg.npy");
  ASSERT_THAT(WriteNpyFile(neg, Int64Array({-11})), IsOk());
  ExpectError(Tessera({"get", "rows/e", "--rows=" + neg, "--output=" + out}), 1,
              {"out of bounds"});
  EXPECT_FALSE(PathExists(out));

  HostArray floats = HostArray::Allocate(DType::kFloat32, {2});
  std::memset(floats.data(), 0, floats.num_bytes);
  const std::string f = Path("float_rows.npy");
  ASSERT_THAT(WriteNpyFile(f, floats), IsOk());
  ExpectError(Tessera({"get", "rows/e", "--rows=" + f, "--output=" + out}), 1,
              {"rows", "int32 or int64"});
  HostArray matrix = HostArray::Allocate(DType::kInt64, {2, 2});
  std::memset(matrix.data(), 0, matrix.num_bytes);
  const std::string m = Path("matrix_rows.npy");
  ASSERT_THAT(WriteNpyFile(m, matrix), IsOk());
  ExpectError(Tessera({"get", "rows/e", "--rows=" + m, "--output=" + out}), 1,
              {"rows", "1-D"});
  const std::string junk = Path("junk_rows.npy");
  WriteStringToFile(junk, "not a npy file");
  ExpectError(Tessera({"get", "rows/e", "--rows=" + junk, "--output=" + out}),
              1, {"rows"});
  ExpectError(Tessera({"get", "rows/e", "--rows=" + Path("absent.npy"),
                       "--output=" + out}),
              1, {"rows"});
  EXPECT_FALSE(PathExists(out));

  ExpectError(Tessera({"get", "rows/e", "--rows=" + far, "--region=0:1",
                       "--output=" + out}),
              2, {"--rows"});
  ExpectError(Tessera({"get", "rows/e", "--rows=" + far, "--shard=0",
                       "--output=" + out}),
              2, {"--rows"});
}

// Runs `tessera ARGS` with `file` truncated to `size` bytes once the CLI
// has mapped it (client/testing/truncate_after_map.cc, LD_PRELOAD'ed): an
// input that shrinks while it is read, deterministically. `when` is ""
// (right after the mapping is made) or ":connect" (when the CLI then
// dials the cluster: after the file's header was read, before its data).
LocalCluster::Result TesseraTruncating(const LocalCluster& cluster,
                                       const std::string& file, int64_t size,
                                       const std::string& when,
                                       const std::vector<std::string>& args) {
  std::vector<std::string> argv = {
      "/usr/bin/env",
      "LD_PRELOAD=" +
          LocalCluster::BinaryPath("client/libtruncate_after_map.so"),
      "UCX_MEM_MMAP_HOOK_MODE=none",
      absl::StrCat("TESSERA_TEST_TRUNCATE_AFTER_MAP=", file, ":", size, when),
      LocalCluster::BinaryPath("client/tessera"),
      "--coordinator=" + cluster.coordinator_address()};
  argv.insert(argv.end(), args.begin(), args.end());
  return LocalCluster::Run(argv);
}

HostArray Iota32(const Shape& shape) {
  HostArray a = HostArray::Allocate(DType::kInt32, shape);
  for (int64_t i = 0; i < a.NumElements(); ++i)
    a.As<int32_t>()[i] = static_cast<int32_t>(i);
  return a;
}

// An input file that shrank while the CLI read it used to kill the CLI
// with SIGBUS (exit 135) midway through the put; bytes past the new end
// could also have gone in as zeros. Now: exit 1 naming the file, and
// nothing created or changed.
TEST_F(CliServingTest, InputsThatShrinkWhileReadFailCleanlyAndChangeNothing) {
  const HostArray big = Iota32({256, 1024});  // 1 MiB
  const std::string npy = Path("shrinks.npy");
  ASSERT_THAT(WriteNpyFile(npy, big), IsOk());
  ExpectError(
      TesseraTruncating(*cluster_, npy, 8192, ":connect",
                        {"put", "shrink/put", "--input=" + npy, "--chunk_dim=0",
                         "--placements=rank:0,rank:1,rank:2"}),
      1,
      {".npy file '" + npy + "'", "changed while it was read", "shrank from"});
  EXPECT_THAT(Tensors(), Not(HasSubstr("shrink/put")));

  // put --update: version 1 stays, with its bytes.
  ASSERT_THAT(client_
                  ->Create("shrink/upd", {256, 1024}, DType::kInt32,
                           LayoutSpec::Chunk(0, {*ParsePlacement("rank:0"),
                                                 *ParsePlacement("rank:1")}),
                           *ParseInit("arange"))
                  .status(),
              IsOk());
  ASSERT_THAT(WriteNpyFile(npy, big), IsOk());
  ExpectError(
      TesseraTruncating(*cluster_, npy, 8192, ":connect",
                        {"put", "shrink/upd", "--input=" + npy, "--update"}),
      1, {"changed while it was read"});
  absl::StatusOr<TensorMetadata> meta = client_->Describe("shrink/upd");
  ASSERT_THAT(meta.status(), IsOk());
  EXPECT_EQ(meta->version, 1u);
  absl::StatusOr<HostArray> kept = client_->Get("shrink/upd");
  ASSERT_THAT(kept.status(), IsOk());
  EXPECT_EQ(std::string(kept->data(), kept->num_bytes),
            std::string(big.data(), big.num_bytes));

  // import: all or nothing.
  const std::string st = Path("shrinks.safetensors");
  WriteStringToFile(st, SafetensorsBytes({{"a", DType::kFloat32, {64, 1024}},
                                          {"b", DType::kFloat32, {64, 1024}}},
                                         5));
  ExpectError(
      TesseraTruncating(*cluster_, st, 8192, ":connect",
                        {"import", st, "--chunk_dim=0",
                         "--placements=rank:0,rank:1", "--prefix=shrink/st/"}),
      1, {"safetensors file '" + st + "'", "changed while it was read"});
  EXPECT_THAT(Tensors(), Not(HasSubstr("shrink/st/")));

  // get --rows: indices past the new end would read as row 0.
  MakeTable(*client_, "shrink/rows");
  std::vector<int64_t> rows(4096);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = 1 + i % 9;
  const std::string idx = Path("shrinks_idx.npy");
  ASSERT_THAT(WriteNpyFile(idx, Int64Array(rows)), IsOk());
  const std::string out = Path("shrinks_rows.npy");
  ExpectError(TesseraTruncating(
                  *cluster_, idx, 4096, "",
                  {"get", "shrink/rows", "--rows=" + idx, "--output=" + out}),
              1, {"rows", "changed while it was read"});
  EXPECT_FALSE(PathExists(out));
}

TEST_F(CliServingTest, PutUpdateWholeAndRegion) {
  MakeTable(*client_, "upd/t");
  HostArray whole = HostArray::Allocate(DType::kInt32, {10, 3});
  for (int i = 0; i < 30; ++i) whole.As<int32_t>()[i] = 100 + i;
  const std::string in = Path("upd_whole.npy");
  ASSERT_THAT(WriteNpyFile(in, whole), IsOk());
  LocalCluster::Result r =
      Tessera({"put", "upd/t", "--input=" + in, "--update", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, StartsWith("{\"version\": 2, \"bytes_written\": 120, "
                                "\"shards_kept\": 0, \"seconds\": "));
  const std::string out = Path("upd_out.npy");
  ASSERT_EQ(Tessera({"get", "upd/t", "--output=" + out}).code, 0);
  EXPECT_EQ(Values(out)[29], 129);

  // Rows 4:6 lie in the second of three shards: the other two are kept.
  HostArray patch = HostArray::Allocate(DType::kInt32, {2, 3});
  for (int i = 0; i < 6; ++i) patch.As<int32_t>()[i] = -1;
  const std::string p = Path("upd_patch.npy");
  ASSERT_THAT(WriteNpyFile(p, patch), IsOk());
  r = Tessera(
      {"put", "upd/t", "--input=" + p, "--update", "--region=4:6,:", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, StartsWith("{\"version\": 3, \"bytes_written\": 24, "
                                "\"shards_kept\": 2, \"seconds\": "));
  ASSERT_EQ(Tessera({"get", "upd/t", "--output=" + out}).code, 0);
  std::vector<int32_t> want(30);
  for (int i = 0; i < 30; ++i) want[i] = (i >= 12 && i < 18) ? -1 : 100 + i;
  EXPECT_EQ(Values(out), want);
  r = Tessera({"put", "upd/t", "--input=" + p, "--update", "--region=-2:"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, StartsWith("updated upd/t region 8:10,0:3 from "));
}

TEST_F(CliServingTest, PutUpdateErrorsChangeNothing) {
  MakeTable(*client_, "upd/e");
  HostArray small = HostArray::Allocate(DType::kInt32, {9, 3});
  std::memset(small.data(), 0, small.num_bytes);
  const std::string s9 = Path("upd_small.npy");
  ASSERT_THAT(WriteNpyFile(s9, small), IsOk());
  ExpectError(Tessera({"put", "upd/e", "--input=" + s9, "--update"}), 1,
              {"shape"});
  ExpectError(
      Tessera({"put", "upd/e", "--input=" + s9, "--update", "--region=0:2,:"}),
      1, {"shape"});
  ExpectError(
      Tessera({"put", "upd/e", "--input=" + s9, "--update", "--region=5:15,:"}),
      1, {"out of bounds"});
  HostArray wide = HostArray::Allocate(DType::kInt64, {10, 3});
  std::memset(wide.data(), 0, wide.num_bytes);
  const std::string w = Path("upd_wide.npy");
  ASSERT_THAT(WriteNpyFile(w, wide), IsOk());
  ExpectError(Tessera({"put", "upd/e", "--input=" + w, "--update"}), 1,
              {"dtype"});
  ExpectError(Tessera({"put", "upd/missing", "--input=" + w, "--update"}), 1,
              {"not found"});
  absl::StatusOr<TensorMetadata> meta = client_->Describe("upd/e");
  ASSERT_THAT(meta.status(), IsOk());
  EXPECT_EQ(meta->version, 1u);

  ExpectError(Tessera({"put", "upd/e", "--input=" + w, "--update",
                       "--chunk_dim=0", "--placements=rank:0"}),
              2, {"--update"});
  ExpectError(Tessera({"put", "upd/e", "--input=" + w, "--region=0:1",
                       "--chunk_dim=0", "--placements=rank:0"}),
              2, {"--region needs --update"});
  ExpectError(
      Tessera({"put", "upd/e", "--input=" + w, "--update", "--region=0:x"}), 2,
      {"--region"});
}

TEST_F(CliServingTest, UpdateBFloat16FromWordsWithoutDType) {
  ASSERT_THAT(client_
                  ->Create("upd/bf", {4}, DType::kBFloat16,
                           LayoutSpec::Chunk(0, {*ParsePlacement("rank:0")}),
                           *ParseInit("zeros"))
                  .status(),
              IsOk());
  HostArray words = HostArray::Allocate(DType::kBFloat16, {4});
  for (int i = 0; i < 4; ++i) words.As<uint16_t>()[i] = 0x3f80;  // 1.0
  const std::string in = Path("bf_words.npy");
  ASSERT_THAT(WriteNpyFile(in, words), IsOk());
  LocalCluster::Result r =
      Tessera({"put", "upd/bf", "--input=" + in, "--update"});
  ASSERT_EQ(r.code, 0) << r.err;
  absl::StatusOr<HostArray> back = client_->Get("upd/bf");
  ASSERT_THAT(back.status(), IsOk());
  EXPECT_EQ(back->As<uint16_t>()[3], 0x3f80);
  HostArray f32 = HostArray::Allocate(DType::kFloat32, {4});
  std::memset(f32.data(), 0, f32.num_bytes);
  const std::string f = Path("bf_f32.npy");
  ASSERT_THAT(WriteNpyFile(f, f32), IsOk());
  ExpectError(Tessera({"put", "upd/bf", "--input=" + f, "--update"}), 1,
              {"dtype"});
}

TEST_F(CliServingTest, JsonOnEveryWritingCommand) {
  LocalCluster::Result r =
      Tessera({"create", "js/a", "--shape=4,2", "--dtype=float64",
               "--chunk_dim=0", "--placements=rank:0,rank:1", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, StartsWith("{\"name\": \"js/a\", \"shape\": [4, 2], "
                                "\"dtype\": \"float64\", \"version\": 1, "
                                "\"num_shards\": 2, \"bytes\": 64, "
                                "\"seconds\": "));
  const std::string npy = Path("js.npy");
  ASSERT_THAT(WriteNpyFile(npy, Int64Array({5, 6, 7})), IsOk());
  r = Tessera({"put", "js/b", "--input=" + npy, "--chunk_dim=0",
               "--placements=rank:2", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, StartsWith("{\"name\": \"js/b\", \"shape\": [3], "
                                "\"dtype\": \"int64\", \"version\": 1, "
                                "\"num_shards\": 1, \"bytes\": 24, "));
  const std::string out = Path("js_out.npy");
  r = Tessera({"get", "js/b", "--output=" + out, "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, StartsWith("{\"name\": \"js/b\", \"shape\": [3], "
                                "\"dtype\": \"int64\", \"version\": 1, "
                                "\"bytes\": 24, \"seconds\": "));
  EXPECT_THAT(r.out, HasSubstr(", \"transport\": {\""));
  EXPECT_EQ(r.out.back(), '\n');
  EXPECT_EQ(r.err, "");  // no progress lines with --json
  r = Tessera({"rm", "js/a", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "{\"name\": \"js/a\", \"deleted\": true}\n");
}

TEST_F(CliServingTest, TransportFlag) {
  MakeTable(*client_, "tr/t");
  const std::string out = Path("tr.npy");
  LocalCluster::Result r =
      Tessera({"--transport=grpc", "get", "tr/t", "--output=" + out, "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("\"transport\": {\"grpc\": 120}"));
  r = LocalCluster::Run({"/usr/bin/env", "TESSERA_TRANSPORT=grpc",
                         LocalCluster::BinaryPath("client/tessera"),
                         "--coordinator=" + cluster_->coordinator_address(),
                         "get", "tr/t", "--region=0:1", "--output=" + out,
                         "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("\"transport\": {\"grpc\": 12}"));
  ExpectError(Tessera({"--transport=carrier-pigeon", "ls"}), 2,
              {"transport", "carrier-pigeon"});
  ExpectError(Tessera({"ls", "--transport"}), 2, {"--transport"});
}

TEST_F(CliServingTest, FailedGetLeavesNoFileAndKeepsAnOldOne) {
  MakeTable(*client_, "fail/t");
  const std::string out = Path("fail.npy");
  ExpectError(Tessera({"get", "fail/none", "--output=" + out}), 1,
              {"not found"});
  ExpectError(Tessera({"get", "fail/t", "--region=0:11", "--output=" + out}), 1,
              {"out of bounds"});
  ExpectError(Tessera({"get", "fail/t", "--shard=3", "--output=" + out}), 1,
              {"out of bounds"});
  EXPECT_FALSE(PathExists(out));
  WriteStringToFile(out, "old contents");
  ExpectError(Tessera({"get", "fail/t", "--region=-11:", "--output=" + out}), 1,
              {"out of bounds"});
  EXPECT_EQ(ReadFileToString(out), "old contents");
  // Nothing else was left in the directory either.
  LocalCluster::Result ls = LocalCluster::Run(
      {"/bin/sh", "-c",
       "ls -a " + cluster_->dir() + " | grep -c '^\\.fail' || true"});
  EXPECT_EQ(ls.out, "0\n");
}

TEST_F(CliServingTest, EmptyTrailingShardAndEmptyRegionWriteEmptyFiles) {
  // torch.chunk of 5 rows over 4: the last shard is empty, at offset 6.
  ASSERT_THAT(client_
                  ->Create("empty/t", {5}, DType::kInt64,
                           LayoutSpec::Chunk(0, {*ParsePlacement("rank:0"),
                                                 *ParsePlacement("rank:1"),
                                                 *ParsePlacement("rank:2"),
                                                 *ParsePlacement("rank:0")}))
                  .status(),
              IsOk());
  const std::string out = Path("empty_shard.npy");
  LocalCluster::Result r =
      Tessera({"get", "empty/t", "--shard=3", "--output=" + out, "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("\"shape\": [0], "));
  absl::StatusOr<HostArray> a = ReadNpyFile(out, std::nullopt);
  ASSERT_THAT(a.status(), IsOk());
  EXPECT_EQ(a->shape, (Shape{0}));
  r = Tessera({"get", "empty/t", "--region=2:2", "--output=" + out});
  ASSERT_EQ(r.code, 0) << r.err;
  a = ReadNpyFile(out, std::nullopt);
  ASSERT_THAT(a.status(), IsOk());
  EXPECT_EQ(a->shape, (Shape{0}));
}

// Peak anonymous memory of a CLI run, sampled from /proc every millisecond.
struct Sampled {
  int code = -1;
  int64_t peak_anon_bytes = 0;
  std::string err;  // and what it wrote on stdout
};

Sampled RunSampled(const std::vector<std::string>& argv) {
  // What the run prints, shown when it fails.
  const std::string log_path = TempPath("sampled.log");
  unlink(log_path.c_str());
  const pid_t pid = SpawnDaemon(argv, log_path);
  Sampled s;
  const std::string status_path = absl::StrCat("/proc/", pid, "/status");
  while (true) {
    std::ifstream in(status_path);
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("RssAnon:", 0) == 0) {
        s.peak_anon_bytes = std::max<int64_t>(
            s.peak_anon_bytes,
            std::strtoll(line.c_str() + 8, nullptr, 10) * 1024);
      }
    }
    int status = 0;
    const pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) {
      s.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      break;
    }
    usleep(1000);
  }
  s.err = ReadFileToString(log_path);
  return s;
}

TEST_F(CliServingTest, LargeGetAndPutGoThroughTheFileNotMemory) {
  constexpr int64_t kElements = int64_t{64} << 20;  // 256 MiB of float32
  constexpr int64_t kBytes = kElements * 4;
  ASSERT_THAT(client_
                  ->Create("big/t", {kElements}, DType::kFloat32,
                           LayoutSpec::Chunk(0, {*ParsePlacement("rank:0"),
                                                 *ParsePlacement("rank:1"),
                                                 *ParsePlacement("rank:2")}),
                           *ParseInit("arange"))
                  .status(),
              IsOk());
  const std::string out = Path("big.npy");
  for (const char* transport : {"auto", "grpc"}) {
    SCOPED_TRACE(transport);
    Sampled s = RunSampled({LocalCluster::BinaryPath("client/tessera"),
                            "--coordinator=" + cluster_->coordinator_address(),
                            absl::StrCat("--transport=", transport), "get",
                            "big/t", "--output=" + out});
    ASSERT_EQ(s.code, 0) << s.err;
    std::cout << "get --transport=" << transport << " of " << (kBytes >> 20)
              << " MiB: peak RssAnon " << (s.peak_anon_bytes >> 20) << " MiB\n";
    EXPECT_GT(s.peak_anon_bytes, 0) << "no sample was taken";
    EXPECT_LT(s.peak_anon_bytes, kBytes / 4)
        << "peak RssAnon " << s.peak_anon_bytes << " for a " << kBytes
        << "-byte get";
    absl::StatusOr<NpyInput> got = OpenNpyFile(out, std::nullopt);
    ASSERT_THAT(got.status(), IsOk());
    ASSERT_EQ(got->num_bytes, kBytes);
    const float* v = reinterpret_cast<const float*>(got->data());
    EXPECT_EQ(v[0], 0.0f);
    EXPECT_EQ(v[12345678], 12345678.0f);
    EXPECT_EQ(v[kElements - 1], static_cast<float>(kElements - 1));
  }
  // And back in: put reads the file through its mapping.
  Sampled s = RunSampled({LocalCluster::BinaryPath("client/tessera"),
                          "--coordinator=" + cluster_->coordinator_address(),
                          "put", "big/copy", "--input=" + out, "--chunk_dim=0",
                          "--placements=rank:0,rank:1"});
  ASSERT_EQ(s.code, 0) << s.err;
  std::cout << "put of " << (kBytes >> 20) << " MiB: peak RssAnon "
            << (s.peak_anon_bytes >> 20) << " MiB\n";
  EXPECT_GT(s.peak_anon_bytes, 0) << "no sample was taken";
  EXPECT_LT(s.peak_anon_bytes, kBytes / 4)
      << "peak RssAnon " << s.peak_anon_bytes << " for a " << kBytes
      << "-byte put";
  absl::StatusOr<HostArray> tail =
      client_->Get("big/copy", Box({kElements - 2}, {2}));
  ASSERT_THAT(tail.status(), IsOk());
  EXPECT_EQ(tail->As<float>()[1], static_cast<float>(kElements - 1));
  unlink(out.c_str());

  // safetensors both ways: gathered into, and put from, the file's mapping.
  const std::string st = Path("big.safetensors");
  s = RunSampled({LocalCluster::BinaryPath("client/tessera"),
                  "--coordinator=" + cluster_->coordinator_address(), "export",
                  st, "big/t"});
  ASSERT_EQ(s.code, 0) << s.err;
  std::cout << "export of " << (kBytes >> 20) << " MiB: peak RssAnon "
            << (s.peak_anon_bytes >> 20) << " MiB\n";
  EXPECT_LT(s.peak_anon_bytes, kBytes / 4);
  s = RunSampled({LocalCluster::BinaryPath("client/tessera"),
                  "--coordinator=" + cluster_->coordinator_address(), "import",
                  st, "--chunk_dim=0", "--placements=rank:1,rank:2",
                  "--prefix=imported/"});
  ASSERT_EQ(s.code, 0) << s.err;
  std::cout << "import of " << (kBytes >> 20) << " MiB: peak RssAnon "
            << (s.peak_anon_bytes >> 20) << " MiB\n";
  EXPECT_LT(s.peak_anon_bytes, kBytes / 4);
  tail = client_->Get("imported/big/t", Box({kElements - 2}, {2}));
  ASSERT_THAT(tail.status(), IsOk());
  EXPECT_EQ(tail->As<float>()[1], static_cast<float>(kElements - 1));
  unlink(st.c_str());
  ASSERT_THAT(client_->Delete("imported/big/t"), IsOk());
  ASSERT_THAT(client_->Delete("big/t"), IsOk());
  ASSERT_THAT(client_->Delete("big/copy"), IsOk());
}

}  // namespace
}  // namespace tessera
