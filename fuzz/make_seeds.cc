// Writes the seed corpus of every fuzz target into DIR/<target>/ (run by
// hand after changing a format: fuzz/out/make_seeds fuzz/corpus). Seeds are
// small valid (and a few nearly valid) inputs: CLI texts, .npy headers as
// NumPy writes them (EncodeNpyHeader) plus big-endian / Fortran / v2 / v3
// variants, layouts, serialized requests in fuzz_util.h's records, and
// tensor metadata in both encodings.
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/checkpoint_index.h"
#include "core/delta_codec.h"
#include "core/npy.h"
#include "core/safetensors.h"
#include "core/shard_record.h"
#include "core/tensor_metadata.h"
#include "fuzz/fuzz_util.h"
#include "proto/coordinator.pb.h"
#include "proto/worker.pb.h"
#include "rpc/convert.h"

namespace tessera {
namespace {

std::string dir;

void Write(const std::string& target, const std::string& name,
           const std::string& bytes) {
  const std::string path = absl::StrCat(dir, "/", target, "/", name);
  std::ofstream out(path, std::ios::binary);
  out << bytes;
  if (!out) {
    std::fprintf(stderr, "cannot write %s (does the directory exist?)\n",
                 path.c_str());
    std::exit(1);
  }
}

void TextSeeds() {
  const char* kSeeds[][2] = {
      {"chunk_rows",
       "10,20\n0:5,:\n0:5,0:20@rank:0;5:10,0:20@rank:1\nrank:0,rank:"
       "1\nzeros\nfloat32\n0\n"},
      {"chunk_last",
       "4,6,8\n:,-3:,1:2\n:,:,0:4@w1/cpu;:,:,4:8@w2/cuda:1;\nw1,w2/"
       "cuda:0,rank:3/cpu\nfull:-7\nint8\n-1\n"},
      {"negative",
       "100\n-10:\n0:50@rank:0;50:100@rank:1\nrank:0\narange\nint64\n0\n"},
      {"overlap",
       "8,8\n:,:\n0:5,:@rank:0;4:8,:@rank:1\nrank:0,rank:1,rank:2\nrand:"
       "42\nbfloat16\n1\n"},
      {"uncovered",
       "8,8\n2:3,4:5\n0:4,:@w0;\nrank:0\nfull:1.5e3\nfloat16\n1\n"},
      {"empty_dims",
       "0,5\n:,:\n0:0,0:5@rank:0\nrank:0,rank:1\nones\nbool\n0\n"},
      {"full_bool",
       "3,3,3\n1:2\n:,:,:@rank:0\nrank:0/cuda\nfull:true\nuint8\n2\n"},
      {"full_nan", "16\n::\n0:16@x.y-z_1\nw\nfull:nan\nfloat64\n0\n"},
      {"big",
       "9223372036854775807,2\n-1:,:\n0:9223372036854775807,:@rank:0\nrank:"
       "0\nfull:99999999999999999999\nint16\n-2\n"},
      {"bad", "10,,20\n0:5:6\n0:5@\nrank:-1\nfull:\nfloat128\nx\n"},
  };
  for (const auto& s : kSeeds) Write("parse_text_fuzzer", s[0], s[1]);
}

void NpySeeds() {
  struct Case {
    const char* name;
    DType dtype;
    Shape shape;
  };
  const Case kCases[] = {
      {"f4_2x3", DType::kFloat32, {2, 3}},
      {"f8_5", DType::kFloat64, {5}},
      {"f2_2x2x2", DType::kFloat16, {2, 2, 2}},
      {"bf16_4", DType::kBFloat16, {4}},
      {"i1_3x1", DType::kInt8, {3, 1}},
      {"u1_0x4", DType::kUInt8, {0, 4}},
      {"i2_2x3", DType::kInt16, {2, 3}},
      {"i4_1x2x3", DType::kInt32, {1, 2, 3}},
      {"i8_3", DType::kInt64, {3}},
      {"b1_2x2", DType::kBool, {2, 2}},
  };
  for (const Case& c : kCases) {
    std::string file = EncodeNpyHeader(c.dtype, c.shape);
    int64_t n = static_cast<int64_t>(ItemSize(c.dtype));
    for (int64_t d : c.shape) n *= d;
    for (int64_t i = 0; i < n; ++i)
      file.push_back(static_cast<char>(i * 7 + 1));
    Write("npy_fuzzer", c.name, file);
  }
  // Hand-written headers: big-endian, Fortran order, versions 2.0 / 3.0,
  // Python 2 longs, and a truncated one.
  auto v1 = [](const std::string& dict, int data_bytes) {
    std::string h = dict;
    while ((10 + h.size() + 1) % 64 != 0) h.push_back(' ');
    h.push_back('\n');
    std::string out("\x93NUMPY\x01\x00", 8);
    out.push_back(static_cast<char>(h.size() & 0xff));
    out.push_back(static_cast<char>(h.size() >> 8));
    out += h;
    for (int i = 0; i < data_bytes; ++i) out.push_back(static_cast<char>(i));
    return out;
  };
  Write("npy_fuzzer", "be_f4_fortran",
        v1("{'descr': '>f4', 'fortran_order': True, 'shape': (2, 3), }", 24));
  Write(
      "npy_fuzzer", "le_i2_fortran3",
      v1("{'descr': '<i2', 'fortran_order': True, 'shape': (2, 3, 2), }", 24));
  Write("npy_fuzzer", "be_u2",
        v1("{'descr': '>u2', 'fortran_order': False, 'shape': (3,), }", 6));
  Write("npy_fuzzer", "py2_long",
        v1("{'fortran_order': False, 'shape': (2L, 2L), 'descr': '|u1'}", 4));
  Write("npy_fuzzer", "unsupported",
        v1("{'descr': '<c8', 'fortran_order': False, 'shape': (1,), }", 8));
  Write("npy_fuzzer", "scalar",
        v1("{'descr': '<f4', 'fortran_order': False, 'shape': (), }", 4));
  std::string v2 = v1(
      "{\"descr\": \"=i8\", \"fortran_order\": False, \"shape\": (2,), }", 16);
  v2 = std::string("\x93NUMPY\x02\x00", 8) + std::string(1, v2[8]) +
       std::string(1, v2[9]) + std::string(2, '\0') + v2.substr(10);
  Write("npy_fuzzer", "v2_i8", v2);
  std::string v3 = v2;
  v3[6] = '\x03';
  Write("npy_fuzzer", "v3_i8", v3);
  Write("npy_fuzzer", "truncated",
        v1("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 0)
            .substr(0, 40));
}

void SafetensorsSeeds() {
  // Files as LayoutSafetensors writes them, data filled with a pattern.
  struct Case {
    const char* name;
    std::vector<SafetensorsTensor> tensors;
    SafetensorsMetadata metadata;
  };
  const Case kCases[] = {
      {"one_f32", {{"w", DType::kFloat32, {2, 3}}}, {}},
      {"every_dtype",
       {{"f32", DType::kFloat32, {2}},
        {"f64", DType::kFloat64, {1, 2}},
        {"f16", DType::kFloat16, {3}},
        {"bf16", DType::kBFloat16, {2, 2}},
        {"i8", DType::kInt8, {5}},
        {"u8", DType::kUInt8, {1, 1, 3}},
        {"i16", DType::kInt16, {2}},
        {"i32", DType::kInt32, {2, 1}},
        {"i64", DType::kInt64, {1}},
        {"mask", DType::kBool, {4}}},
       {{"format", "pt"}}},
      {"scalar_and_empty",
       {{"step", DType::kInt64, {}}, {"none", DType::kFloat32, {0, 4}}},
       {{"a", "b"}, {"c", ""}}},
      {"model_names",
       {{"model.layers.0.q_proj.weight", DType::kBFloat16, {4, 4}},
        {"model.layers.0.q_proj.bias", DType::kBFloat16, {4}},
        {"model.embed_tokens.weight", DType::kFloat16, {8, 4}}},
       {}},
  };
  for (const Case& c : kCases) {
    absl::StatusOr<SafetensorsLayout> layout =
        LayoutSafetensors(c.tensors, c.metadata);
    if (!layout.ok()) {
      std::fprintf(stderr, "%s\n", layout.status().ToString().c_str());
      std::exit(1);
    }
    std::string file = layout->header;
    for (int64_t i = static_cast<int64_t>(file.size()); i < layout->file_bytes;
         ++i) {
      file.push_back(static_cast<char>(i * 13 + 5));
    }
    Write("safetensors_fuzzer", c.name, file);
  }
  // Hand-written headers: unpadded, escapes, and nearly valid ones.
  auto raw = [](const std::string& json, const std::string& data) {
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i) {
      out[i] = static_cast<char>((json.size() >> (8 * i)) & 0xff);
    }
    return out + json + data;
  };
  Write(
      "safetensors_fuzzer", "unpadded",
      raw(R"({"a":{"dtype":"I16","shape":[2],"data_offsets":[0,4]}})", "abcd"));
  Write("safetensors_fuzzer", "escaped",
        raw(R"({"a\u00e9\n":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
            R"( "__metadata__" : {"k\"":"v\\"}})",
            "z"));
  Write("safetensors_fuzzer", "overlap",
        raw(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
            R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
            "12345678"));
  Write("safetensors_fuzzer", "hole",
        raw(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
            "12345678"));
  Write("safetensors_fuzzer", "bad_dtype",
        raw(R"({"a":{"dtype":"F8_E4M3","shape":[1],"data_offsets":[0,1]}})",
            "1"));
  Write("safetensors_fuzzer", "empty", raw("{}", ""));
}

void LayoutSeeds() {
  // FuzzedDataProvider input: byte 0 picks the mode; the rest is consumed
  // from the end for integers. Deterministic pseudo-random seeds cover both.
  uint64_t x = 0x9e3779b97f4a7c15;
  for (int i = 0; i < 24; ++i) {
    std::string s(1, static_cast<char>(i % 2));
    for (int j = 0; j < 48 + i * 4; ++j) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      s.push_back(static_cast<char>(x & 0xff));
    }
    Write("layout_fuzzer", absl::StrCat(i % 2 ? "wide_" : "small_", i), s);
  }
}

template <typename M>
std::string Bytes(const M& m) {
  return m.SerializeAsString();
}

v1::AllocateShardsRequest Allocate(v1::DType dtype, std::vector<int64_t> shape,
                                   v1::InitMode::Kind init, uint64_t id,
                                   std::vector<int64_t> offsets,
                                   std::vector<int64_t> sizes) {
  v1::AllocateShardsRequest r;
  r.set_tensor("t");
  r.set_dtype(dtype);
  r.mutable_tensor_shape()->Assign(shape.begin(), shape.end());
  r.mutable_init()->set_kind(init);
  if (init == v1::InitMode::FULL) r.mutable_init()->set_value("3");
  auto* item = r.add_shards();
  item->set_shard_id(id);
  item->mutable_offsets()->Assign(offsets.begin(), offsets.end());
  item->mutable_sizes()->Assign(sizes.begin(), sizes.end());
  return r;
}

void WorkerSeeds() {
  const uint8_t A = 0, B = 8;  // bit 3 picks the worker
  auto alloc1 =
      Allocate(v1::FLOAT32, {8, 8}, v1::InitMode::ARANGE, 1, {0, 0}, {4, 8});
  auto alloc2 =
      Allocate(v1::FLOAT32, {8, 8}, v1::InitMode::ZEROS, 2, {4, 0}, {4, 8});
  v1::ReadRegionRequest read;
  read.set_shard_id(1);
  read.mutable_offsets()->Add(1);
  read.mutable_offsets()->Add(2);
  read.mutable_sizes()->Add(2);
  read.mutable_sizes()->Add(3);
  read.set_chunk_bytes(8);
  // Two pieces from shard 1 into shard 2 (the fuzzer fills src_address).
  v1::TransferRequest pull;
  pull.set_src_worker("a");
  pull.set_dst_worker("b");
  for (int p = 0; p < 2; ++p) {
    v1::TransferPiece* piece = pull.add_pieces();
    piece->set_dst_shard_id(2);
    piece->set_src_shard_id(1);
    for (int d = 0; d < 2; ++d) {
      piece->add_dst_offsets(p * 2);
      piece->add_src_offsets(d + p);
      piece->add_sizes(2);
    }
  }
  v1::FreeShardsRequest free_req;
  free_req.add_shard_ids(1);
  free_req.add_shard_ids(2);
  free_req.add_shard_ids(99);
  v1::WriteShardRequest w1, w2;
  w1.set_shard_id(1);
  w1.set_offset(0);
  w1.set_data(std::string(16, 'a'));
  w2.set_shard_id(1);
  w2.set_offset(120);
  w2.set_data(std::string(8, 'b'));

  std::string s;
  fuzz::AppendRecord(&s, A | 0, Bytes(alloc1));
  fuzz::AppendRecord(&s, A | 1, Bytes(read));
  Write("worker_request_fuzzer", "alloc_read", s);
  s.clear();
  fuzz::AppendRecord(&s, A | 0, Bytes(alloc1));
  fuzz::AppendRecord(&s, A | 0, Bytes(alloc2));
  fuzz::AppendRecord(&s, A | 2, Bytes(pull));  // local copy
  fuzz::AppendRecord(&s, A | 3, Bytes(free_req));
  Write("worker_request_fuzzer", "alloc_transfer_local_free", s);
  s.clear();
  fuzz::AppendRecord(&s, A | 0, Bytes(alloc1));
  fuzz::AppendRecord(&s, B | 0, Bytes(alloc2));
  fuzz::AppendRecord(&s, B | 2,
                     Bytes(pull));  // B pulls from A (bit 4 clear = A)
  Write("worker_request_fuzzer", "transfer_peer", s);
  s.clear();
  // A shard large enough for shared memory on A, pulled by B.
  fuzz::AppendRecord(
      &s, A | 0,
      Bytes(Allocate(v1::FLOAT32, {1024, 512}, v1::InitMode::ARANGE, 1, {0, 0},
                     {1024, 512})));
  fuzz::AppendRecord(&s, B | 0,
                     Bytes(Allocate(v1::FLOAT32, {8, 8}, v1::InitMode::ZEROS, 2,
                                    {4, 0}, {4, 8})));
  fuzz::AppendRecord(&s, B | 2, Bytes(pull));
  Write("worker_request_fuzzer", "transfer_peer_shared", s);
  s.clear();
  fuzz::AppendRecord(&s, A | 0, Bytes(alloc1));
  fuzz::AppendRecord(&s, A | 4, Bytes(w1));
  fuzz::AppendRecord(&s, A | 4, Bytes(w2));
  fuzz::AppendRecord(&s, A | 1, Bytes(read));
  Write("worker_request_fuzzer", "write_read", s);
  s.clear();
  for (v1::DType t :
       {v1::INT8, v1::FLOAT16, v1::BFLOAT16, v1::INT64, v1::BOOL}) {
    fuzz::AppendRecord(&s, A | 0,
                       Bytes(Allocate(t, {3, 5, 7}, v1::InitMode::FULL, 10 + t,
                                      {0, 1, 2}, {3, 4, 5})));
  }
  fuzz::AppendRecord(
      &s, A | 0,
      Bytes(Allocate(v1::INT32, {10}, v1::InitMode::RAND, 30, {8}, {0})));
  Write("worker_request_fuzzer", "dtypes_fill", s);
  s.clear();
  fuzz::AppendRecord(
      &s, A | 0,
      Bytes(Allocate(v1::FLOAT64, {1 << 20, 1 << 20}, v1::InitMode::EMPTY, 5,
                     {0, 0}, {1 << 20, 1 << 20})));
  fuzz::AppendRecord(
      &s, A | 0,
      Bytes(Allocate(v1::FLOAT32, {4}, v1::InitMode::ONES, 6, {2}, {4})));
  fuzz::AppendRecord(
      &s, A | 0,
      Bytes(Allocate(v1::FLOAT32, {4, 4}, v1::InitMode::ONES, 7, {0}, {4})));
  Write("worker_request_fuzzer", "bad_allocs", s);
  s.clear();
  // A patch of rows 1..2, columns 3..5 of shard 1, then rows of shards 1
  // and 2 in one call.
  v1::WriteShardRequest patch;
  patch.set_shard_id(1);
  patch.set_offset(0);
  patch.set_data(std::string(24, 'p'));
  for (int64_t v : {1, 3}) patch.add_box_offsets(v);
  for (int64_t v : {2, 3}) patch.add_box_sizes(v);
  v1::ReadRowsRequest rows;
  auto* rows1 = rows.add_shards();
  rows1->set_shard_id(1);
  for (int64_t r : {3, 0, 1, 0}) rows1->add_rows(r);
  auto* rows2 = rows.add_shards();
  rows2->set_shard_id(2);
  rows2->add_rows(2);
  fuzz::AppendRecord(&s, A | 0, Bytes(alloc1));
  fuzz::AppendRecord(&s, A | 0, Bytes(alloc2));
  fuzz::AppendRecord(&s, A | 4, Bytes(patch));
  fuzz::AppendRecord(&s, A | 5, Bytes(rows));
  Write("worker_request_fuzzer", "patch_rows", s);
  s.clear();
  // Small regions of shards 1 and 2 in one call, on A and on B (a GPU
  // store: UNIMPLEMENTED).
  v1::ReadSmallRegionsRequest regions;
  for (const auto& [id, offsets, sizes] : std::vector<
           std::tuple<uint64_t, std::vector<int64_t>, std::vector<int64_t>>>{
           {1, {1, 2}, {2, 3}}, {2, {0, 0}, {1, 4}}, {1, {3, 0}, {1, 8}}}) {
    v1::ReadRegionRequest* region = regions.add_regions();
    region->set_shard_id(id);
    for (int64_t v : offsets) region->add_offsets(v);
    for (int64_t v : sizes) region->add_sizes(v);
  }
  fuzz::AppendRecord(&s, A | 0, Bytes(alloc1));
  fuzz::AppendRecord(&s, A | 0, Bytes(alloc2));
  fuzz::AppendRecord(&s, A | 16 | 5, Bytes(regions));
  fuzz::AppendRecord(&s, B | 0, Bytes(alloc1));
  fuzz::AppendRecord(&s, B | 16 | 5, Bytes(regions));
  Write("worker_request_fuzzer", "small_regions", s);
  s.clear();
  // B reports a GPU: a staged read of its shard, and A pulling from it.
  v1::StageReadRequest stage;
  stage.set_shard_id(1);
  for (int64_t v : {0, 0}) stage.add_offsets(v);
  for (int64_t v : {1024, 512}) stage.add_sizes(v);
  stage.set_slot_bytes(1 << 20);
  stage.set_item_bytes(4);
  stage.set_first(1000);
  stage.set_count(1 << 18);
  stage.set_slot(1);
  fuzz::AppendRecord(
      &s, B | 0,
      Bytes(Allocate(v1::FLOAT32, {1024, 512}, v1::InitMode::ARANGE, 1, {0, 0},
                     {1024, 512})));
  fuzz::AppendRecord(&s, B | 6, Bytes(stage));
  fuzz::AppendRecord(&s, A | 0,
                     Bytes(Allocate(v1::FLOAT32, {8, 8}, v1::InitMode::ZEROS, 2,
                                    {4, 0}, {4, 8})));
  fuzz::AppendRecord(&s, A | 2 | 16, Bytes(pull));  // A pulls from B
  Write("worker_request_fuzzer", "stage_read", s);

  // An exchange share for B (which takes part) and for A (which does not):
  // one piece out of shard 1, one into shard 2, and one piece past shard 2.
  v1::NcclExchangeRequest share;
  share.set_unique_id(std::string(128, 'n'));
  share.set_ranks(2);
  share.set_rank(1);
  auto add_piece = [](v1::NcclPiece* piece, uint64_t shard, int64_t row) {
    piece->set_peer(0);
    piece->set_shard_id(shard);
    piece->add_offsets(row);
    piece->add_offsets(0);
    piece->add_sizes(2);
    piece->add_sizes(8);
  };
  add_piece(share.add_sends(), 1, 0);
  add_piece(share.add_recvs(), 2, 1);
  v1::NcclExchangeRequest past = share;
  past.mutable_recvs(0)->set_offsets(0, 3);
  s.clear();
  fuzz::AppendRecord(&s, B | 0, Bytes(alloc1));
  fuzz::AppendRecord(&s, B | 0, Bytes(alloc2));
  fuzz::AppendRecord(&s, B | 7, Bytes(share));
  fuzz::AppendRecord(&s, B | 7, Bytes(past));
  fuzz::AppendRecord(&s, A | 0, Bytes(alloc1));
  fuzz::AppendRecord(&s, A | 7, Bytes(share));
  Write("worker_request_fuzzer", "nccl_exchange", s);
}

v1::CreateTensorRequest Create(const std::string& name,
                               std::vector<int64_t> shape, v1::DType dtype,
                               int chunk_dim, std::vector<int> ranks,
                               bool pending) {
  v1::CreateTensorRequest r;
  r.set_name(name);
  r.mutable_shape()->Assign(shape.begin(), shape.end());
  r.mutable_properties()->set_dtype(dtype);
  auto* chunk = r.mutable_spec()->mutable_chunk();
  chunk->set_dim(chunk_dim);
  for (int rank : ranks) chunk->add_placements()->set_rank(rank);
  r.mutable_init()->set_kind(v1::InitMode::ARANGE);
  r.set_pending(pending);
  return r;
}

void CoordinatorSeeds() {
  auto create = Create("emb", {16, 8}, v1::FLOAT32, 0, {0, 1, 2}, false);
  v1::ReshardTensorRequest reshard;
  reshard.set_name("emb");
  auto* chunk = reshard.mutable_spec()->mutable_chunk();
  chunk->set_dim(1);
  chunk->add_placements()->set_worker("w2");
  chunk->add_placements()->set_rank(0);
  v1::ReshardTensorRequest reshard_enum;
  reshard_enum.set_name("emb");
  reshard_enum.set_expected_version(2);
  for (int i = 0; i < 2; ++i) {
    auto* shard =
        reshard_enum.mutable_spec()->mutable_enumerable()->add_shards();
    shard->add_offsets(i * 8);
    shard->add_offsets(0);
    shard->add_sizes(8);
    shard->add_sizes(8);
    shard->mutable_placement()->set_rank(i);
    shard->mutable_placement()->mutable_device()->set_kind(v1::Device::CPU);
  }
  v1::GetTensorRequest get;
  get.set_name("emb");
  v1::DeleteTensorRequest del;
  del.set_name("emb");
  v1::CommitTensorRequest commit;
  commit.set_name("p");
  commit.set_version(1);
  v1::RegisterWorkerRequest reg;
  reg.set_name("w9");
  reg.set_address("fake:9");
  reg.set_capacity_bytes(1 << 20);
  reg.add_held_shard_ids(1);
  v1::HeartbeatRequest hb;
  hb.set_name("w1");
  hb.set_bytes_used(10);

  // An import's create: float8 bytes, the file's metadata and place.
  auto imported = Create("m/w.fp8", {4, 4}, v1::FLOAT8_E4M3FN, 0, {0, 1}, true);
  imported.mutable_origin()->set_entry(3);
  auto* pair = imported.mutable_origin()->add_metadata();
  pair->set_key("format");
  pair->set_value("pt");
  v1::GetMoveProgressRequest progress;
  progress.set_name("emb");

  std::string s;
  fuzz::AppendRecord(&s, 2, Bytes(create));
  fuzz::AppendRecord(&s, 2, Bytes(imported));
  fuzz::AppendRecord(&s, 11, Bytes(progress));
  fuzz::AppendRecord(&s, 4, Bytes(get));
  fuzz::AppendRecord(&s, 7, Bytes(reshard));
  fuzz::AppendRecord(&s, 7, Bytes(reshard_enum));
  fuzz::AppendRecord(&s, 5, "");
  fuzz::AppendRecord(&s, 6, Bytes(del));
  Write("coordinator_request_fuzzer", "create_reshard_delete", s);
  s.clear();
  fuzz::AppendRecord(&s, 2, Bytes(Create("p", {5}, v1::INT8, -1, {2}, true)));
  fuzz::AppendRecord(&s, 3, Bytes(commit));
  fuzz::AppendRecord(&s, 8, "");
  Write("coordinator_request_fuzzer", "pending_commit", s);
  s.clear();
  fuzz::AppendRecord(&s, 0, Bytes(reg));
  fuzz::AppendRecord(&s, 1, Bytes(hb));
  fuzz::AppendRecord(
      &s, 2, Bytes(Create("on_w9", {4, 4}, v1::INT64, 1, {3, 0}, false)));
  Write("coordinator_request_fuzzer", "register_unreachable", s);
  s.clear();
  // A GPU worker with its UUID, one with a malformed UUID, then a create.
  v1::RegisterWorkerRequest gpu = reg;
  gpu.set_name("g9");
  gpu.mutable_device()->set_kind(v1::Device::CUDA);
  gpu.set_gpu_uuid("GPU-5e1f009a-b23c-4d0e-ff01-23456789abcd");
  v1::RegisterWorkerRequest bad_uuid = gpu;
  bad_uuid.set_name("g8");
  bad_uuid.set_gpu_uuid("GPU-zz\n");
  fuzz::AppendRecord(&s, 0, Bytes(gpu));
  fuzz::AppendRecord(&s, 0, Bytes(bad_uuid));
  fuzz::AppendRecord(
      &s, 2, Bytes(Create("on_g9", {4, 4}, v1::INT64, 1, {3, 0}, false)));
  Write("coordinator_request_fuzzer", "register_gpu", s);
  s.clear();
  fuzz::AppendRecord(
      &s, 2,
      Bytes(Create("big", {1 << 30, 1 << 30}, v1::FLOAT64, 0, {0, 1}, false)));
  fuzz::AppendRecord(&s, 2,
                     Bytes(Create("bad/dim", {4, 4}, v1::BOOL, 5, {0}, false)));
  fuzz::AppendRecord(
      &s, 2, Bytes(Create("", {4}, v1::DTYPE_UNSPECIFIED, 0, {0}, false)));
  fuzz::AppendRecord(
      &s, 2,
      Bytes(Create("nocap", {4096, 2048}, v1::FLOAT32, 0, {0, 1}, false)));
  Write("coordinator_request_fuzzer", "bad_creates", s);
  s.clear();
  auto c2 = Create("e", {6, 6}, v1::BFLOAT16, 0, {0, 0, 1}, false);
  auto* init = c2.mutable_init();
  init->set_kind(v1::InitMode::FULL);
  init->set_value("2.5");
  fuzz::AppendRecord(&s, 2, Bytes(c2));
  v1::ReshardTensorRequest r2;
  r2.set_name("e");
  r2.mutable_spec()->mutable_chunk()->set_dim(-1);
  r2.mutable_spec()->mutable_chunk()->add_placements()->set_rank(1);
  r2.mutable_spec()->mutable_chunk()->add_placements()->set_rank(0);
  r2.mutable_spec()->mutable_chunk()->add_placements()->set_rank(2);
  r2.mutable_spec()->mutable_chunk()->add_placements()->set_rank(0);
  fuzz::AppendRecord(&s, 7, Bytes(r2));
  fuzz::AppendRecord(&s, 7, Bytes(r2));
  Write("coordinator_request_fuzzer", "reshard_twice", s);
  s.clear();
  // A regional update staged, a second refused, committed; another staged
  // and abandoned; a leased read released.
  v1::UpdateTensorRequest update;
  update.set_name("e");
  update.set_has_region(true);
  for (int64_t v : {1, 2}) update.add_region_offsets(v);
  for (int64_t v : {3, 2}) update.add_region_sizes(v);
  v1::CommitTensorRequest commit_update;
  commit_update.set_name("e");
  commit_update.set_version(2);
  v1::CommitTensorRequest abandon = commit_update;
  abandon.set_version(3);
  abandon.set_abandon(true);
  v1::GetTensorRequest leased;
  leased.set_name("e");
  leased.set_lease(true);
  v1::ReleaseReadRequest release;
  release.set_name("e");
  release.set_version(2);
  fuzz::AppendRecord(&s, 2, Bytes(c2));
  fuzz::AppendRecord(&s, 9, Bytes(update));
  fuzz::AppendRecord(&s, 9, Bytes(update));
  fuzz::AppendRecord(&s, 3, Bytes(commit_update));
  fuzz::AppendRecord(&s, 4, Bytes(leased));
  fuzz::AppendRecord(&s, 9, Bytes(update));
  fuzz::AppendRecord(&s, 3, Bytes(abandon));
  fuzz::AppendRecord(&s, 10, Bytes(release));
  Write("coordinator_request_fuzzer", "update_commit_abandon", s);
}

// shm_reply_fuzzer: [0x80: reply, host id replaced][1: segment][2: params]
// (see the fuzzer for the parameter bytes).
void ShmReplySeeds() {
  auto reply = [](const Shape& shape, int64_t item, int64_t bytes,
                  const std::string& name) {
    v1::MapShardResponse r;
    r.set_segment(name);
    r.set_bytes(bytes);
    for (int64_t d : shape) r.add_shape(d);
    r.set_item_bytes(item);
    return r.SerializeAsString();
  };
  auto params = [](uint8_t flags, int64_t item, int64_t file_bytes,
                   const std::vector<std::pair<int8_t, uint8_t>>& box,
                   const std::vector<uint8_t>& expected) {
    std::string p;
    p.push_back(static_cast<char>(flags));
    p.push_back(static_cast<char>(item - 1));
    for (int i = 0; i < 3; ++i)
      p.push_back(static_cast<char>((file_bytes >> (8 * i)) & 0xff));
    p.push_back(static_cast<char>(box.size()));
    for (const auto& [offset, size] : box) {
      p.push_back(static_cast<char>(offset));
      p.push_back(static_cast<char>(size));
    }
    for (uint8_t d : expected) p.push_back(static_cast<char>(d));
    return p;
  };
  std::string segment(6 * 8 * 4, '\0');
  for (size_t i = 0; i < segment.size(); ++i) segment[i] = static_cast<char>(i);
  struct Case {
    const char* name;
    std::string reply;
    std::string params;
  };
  const Case kCases[] = {
      {"box_host_array", reply({6, 8}, 4, 192, "/tessera-1-7-ab"),
       params(4, 4, 192, {{2, 3}, {3, 4}}, {6, 8})},
      {"whole_sink", reply({6, 8}, 4, 192, "/tessera-1-7-ab"),
       params(1 | 2 | 4, 4, 192, {{0, 6}, {0, 8}}, {6, 8})},
      {"pull_unknown_shape", reply({48}, 4, 192, "/s"),
       params(0, 4, 192, {{40, 8}}, {})},
      {"write", reply({6, 8}, 4, 192, "/s"),
       params(1 | 4 | 8, 4, 192, {{0, 6}, {0, 8}}, {6, 8})},
      {"bytes_lie", reply({1000, 1000}, 4, 4096, "/s"),
       params(1 | 4, 4, 4096, {{0, 200}, {0, 200}}, {200, 200})},
      {"short_file", reply({6, 8}, 4, 192, "/s"),
       params(1, 4, 100, {{5, 1}, {0, 8}}, {})},
      {"negative_dims", reply({-6, -8}, 4, 192, "/s"),
       params(1, 4, 192, {{0, 1}, {0, 1}}, {})},
      {"empty_dim", reply({0, 8}, 2, 0, "/s"),
       params(1 | 4, 2, 0, {{0, 0}, {0, 8}}, {0, 8})},
      {"bad_name", reply({48}, 4, 192, "/../x"),
       params(1, 4, 192, {{0, 48}}, {})},
      {"rank_4", reply({2, 3, 2, 4}, 1, 48, "/s"),
       params(0, 1, 48, {{1, 1}, {1, 2}, {0, 2}, {1, 3}}, {2, 3, 2, 4})},
  };
  for (const Case& c : kCases) {
    std::string s;
    fuzz::AppendRecord(&s, 0x80, c.reply);
    fuzz::AppendRecord(&s, 1, segment);
    fuzz::AppendRecord(&s, 2, c.params);
    Write("shm_reply_fuzzer", c.name, s);
  }
}

// pull_reply_fuzzer: [0: piece][2: well-formed message]... or raw [1: ...].
void PullReplySeeds() {
  auto le64 = [](int64_t v) {
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i)
      out[i] = static_cast<char>((static_cast<uint64_t>(v) >> (8 * i)) & 0xff);
    return out;
  };
  // A 3x4 box of 4-byte items (48 bytes) inside a 5x6 destination.
  const std::string piece = {4, 1, 3, 1, 1, 4, 2, 0, 0};
  {
    std::string s;
    fuzz::AppendRecord(&s, 0, piece);
    fuzz::AppendRecord(&s, 2, le64(0) + std::string(32, 'a'));
    fuzz::AppendRecord(&s, 2 | (5 << 2), le64(32) + std::string(16, 'b'));
    Write("pull_reply_fuzzer", "two_chunks", s);
  }
  {
    std::string s;
    const std::string sink_piece = {4, 1, 3, 1, 1, 4, 2, 0, 1};
    fuzz::AppendRecord(&s, 0, sink_piece);
    v1::ReadRegionResponse m;
    m.set_data(std::string(48, 'c'));
    fuzz::AppendRecord(&s, 1 | (3 << 2), m.SerializeAsString());
    Write("pull_reply_fuzzer", "one_raw_sink", s);
  }
  {
    std::string s;
    fuzz::AppendRecord(&s, 0, piece);
    fuzz::AppendRecord(&s, 2, le64(0) + std::string(16, 'a'));
    fuzz::AppendRecord(&s, 2, le64(8) + std::string(64, 'x'));
    Write("pull_reply_fuzzer", "overlap_overrun", s);
  }
  {
    std::string s;
    // A 2x2x3 box of 8-byte items (96 bytes).
    const std::string rank3 = {8, 2, 2, 0, 1, 2, 1, 0, 3, 0, 0, 0};
    fuzz::AppendRecord(&s, 0, rank3);
    fuzz::AppendRecord(&s, 2, le64(0) + std::string(40, 'd'));
    fuzz::AppendRecord(&s, 2, le64(40) + std::string(7, 'e'));
    fuzz::AppendRecord(&s, 3, le64(123456) + "round trip");
    Write("pull_reply_fuzzer", "misaligned_rank3", s);
  }
}

// worker_data_port_fuzzer: [1: preface][2: request]...;
// pull_tcp_reply_fuzzer: [0: read][2: reply header and bytes].
void DataPortSeeds() {
  {
    std::string s;
    fuzz::AppendRecord(&s, 1, "");
    // A read of rows 1..3, columns 2..6 of shard 1 (16x8 float32) with a
    // valid read grant, then a row read, then a write of shard 2.
    fuzz::AppendRecord(&s, 2, std::string({1, 0, 1, 2, 1, 3, 2, 5, 4, 0, 0}));
    fuzz::AppendRecord(&s, 2, std::string({2, 0, 1, 1, 3, 7, 0, 0}));
    fuzz::AppendRecord(&s, 2, std::string({3, 1, 2, 0, 2, '\x80', 1}));
    Write("worker_data_port_fuzzer", "read_rows_write", s);
  }
  {
    std::string s;
    fuzz::AppendRecord(&s, 1, "");
    // Another tensor's grant, then junk.
    fuzz::AppendRecord(&s, 2, std::string({1, 2, 1, 1, 0, 4, 4, 0, 0}));
    fuzz::AppendRecord(&s, 0, "GET / HTTP/1.1\r\n\r\n");
    Write("worker_data_port_fuzzer", "other_grant_junk", s);
  }
  // A 3x4 box of 4-byte items inside a 5x6 destination.
  const std::string read = {3, 1, 3, 1, 1, 4, 0, 2, 0};
  {
    std::string s;
    fuzz::AppendRecord(&s, 0, read);
    fuzz::AppendRecord(&s, 2, std::string({0, 0, 0}) + std::string(48, 'a'));
    Write("pull_tcp_reply_fuzzer", "whole", s);
  }
  {
    std::string s;
    fuzz::AppendRecord(&s, 0, std::string({3, 1, 3, 1, 1, 4, 0, 2, 1}));
    fuzz::AppendRecord(&s, 2, std::string({5, 9, 0}) + "not found");
    Write("pull_tcp_reply_fuzzer", "error_sink", s);
  }
  {
    std::string s;
    fuzz::AppendRecord(&s, 0, read);
    fuzz::AppendRecord(&s, 2, std::string({0, 0, 0}) + std::string(20, 'b'));
    Write("pull_tcp_reply_fuzzer", "short", s);
  }
}

void MetadataSeeds() {
  // Shard i of rows [2i, 2i+2) on w(i % 2); shard 1 unavailable.
  TensorMetadata meta;
  meta.name = "t";
  meta.shape = {6, 2};
  meta.dtype = DType::kInt32;
  meta.version = 3;
  for (int64_t i = 0; i < 3; ++i) {
    ShardInfo& shard = meta.shards.emplace_back();
    shard.box = Box{{2 * i, 0}, {2, 2}};
    Replica& replica = shard.replicas.emplace_back();
    replica.rank = static_cast<int32_t>(i % 2);
    replica.worker = absl::StrCat("w", i % 2);
    replica.address = absl::StrCat("10.0.0.", i % 2 + 1, ":7001");
    replica.shard_id = 100 + static_cast<uint64_t>(i);
    replica.available = i != 1;
  }
  auto write = [](const std::string& name, const TensorMetadata& m,
                  ShardEncoding encoding) {
    v1::ShardedTensorMetadata proto;
    TensorMetadataToProto(m, &proto, encoding);
    Write("metadata_fuzzer", name, proto.SerializeAsString());
  };
  write("one_owner_per_shard", meta, ShardEncoding::kPerShard);
  write("one_owner_packed", meta, ShardEncoding::kPacked);
  // Shard 0 also on w1 and w2 (cuda:1), its first replica unavailable.
  Replica second = meta.shards[1].replicas[0];
  second.shard_id = 200;
  second.available = true;
  Replica third;
  third.rank = 2;
  third.worker = "w2";
  third.address = "10.0.0.3:7001";
  third.device = Device{Device::Kind::kCuda, 1};
  third.shard_id = 300;
  meta.shards[0].replicas[0].available = false;
  meta.shards[0].replicas.push_back(second);
  meta.shards[0].replicas.push_back(third);
  write("replicas_per_shard", meta, ShardEncoding::kPerShard);
  write("replicas_packed", meta, ShardEncoding::kPacked);
}

// tessera.json (first byte even) and the HF index (odd) of a saved
// checkpoint: a row-split tensor in two files and a 0-d one.
void CheckpointIndexSeeds() {
  CheckpointListing listing;
  listing.metadata = {{"format", "pt"}};
  CheckpointEntry& w = listing.entries.emplace_back();
  w.name = "layers.0/w";
  w.dtype = DType::kBFloat16;
  w.shape = {4, 6};
  w.bytes = 48;
  for (int k = 0; k < 2; ++k) {
    StoredPiece& p = w.pieces.emplace_back();
    p.box = Box({2 * k, 0}, {2, 6});
    p.file = absl::StrCat("w", k, "-0a1b2c3d-0.safetensors");
    p.entry = absl::StrCat("layers.0/w:", k);
    p.data_offset = 128;
    p.bytes = 24;
    p.crc32 = 12345u * (k + 1);
  }
  CheckpointEntry& s = listing.entries.emplace_back();
  s.name = "step";
  s.dtype = DType::kInt64;
  s.bytes = 8;
  StoredPiece& p = s.pieces.emplace_back();
  p.file = "w0-0a1b2c3d-0.safetensors";
  p.entry = "step";
  p.data_offset = 152;
  p.bytes = 8;
  Write("checkpoint_index_fuzzer", "tessera_json",
        std::string(1, '\0') + TesseraIndexJson(listing));
  Write("checkpoint_index_fuzzer", "hf_index",
        std::string(1, '\1') + HfIndexJson(listing));
  Write("checkpoint_index_fuzzer", "hf_plain",
        std::string(1, '\1') +
            R"({"metadata": {"total_size": 8}, "weight_map": {"a": )"
            R"("model-00001-of-00002.safetensors", "b": )"
            R"("model-00002-of-00002.safetensors"}})");
}

// A worker's --store_dir record of a shard.
void ShardRecordSeeds() {
  ShardRecord r;
  r.shard_id = 0x1234abcd5678ef90ull;
  r.cluster_id = "9f2c";
  r.tensor = "layers.0/w";
  r.version = 2;
  r.incarnation = 41;
  r.dtype = DType::kBFloat16;
  r.tensor_shape = {8, 6};
  r.box = Box({4, 0}, {4, 6});
  r.bytes = 48;
  r.crc32 = 305419896;
  Write("shard_record_fuzzer", "record", ShardRecordJson(r));
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// delta_codec_fuzzer: [item index][count, 2 bytes][changes].
void DeltaSeeds() {
  const std::string ints(4096 * 4, '\0');
  std::string next = ints;
  for (size_t i = 0; i < next.size(); i += 200) next[i] = 1;
  Write("delta_codec_fuzzer", "scattered_i32",
        std::string("\x02\x00\x10", 3) + *EncodeDelta(ints, next, 4, 1 << 20));
  const std::string bytes(100, 'a');
  Write("delta_codec_fuzzer", "whole_u8",
        std::string("\x00\x64\x00", 3) +
            *EncodeDelta(bytes, std::string(100, 'b'), 1, 1 << 20));
  Write("delta_codec_fuzzer", "past_end",
        std::string("\x01\x04\x00\x03\x02yyyy", 9));
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  tessera::dir = argv[1];
  tessera::TextSeeds();
  tessera::NpySeeds();
  tessera::SafetensorsSeeds();
  tessera::LayoutSeeds();
  tessera::WorkerSeeds();
  tessera::CoordinatorSeeds();
  tessera::ShmReplySeeds();
  tessera::PullReplySeeds();
  tessera::DataPortSeeds();
  tessera::MetadataSeeds();
  tessera::CheckpointIndexSeeds();
  tessera::ShardRecordSeeds();
  tessera::DeltaSeeds();
  return 0;
}
