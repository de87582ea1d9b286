#include "core/hf_export_plan.h"

#include <cstring>
#include <string>
#include <vector>

#include "core/checkpoint_index.h"
#include "core/safetensors.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tessera {
namespace {

using ::tessera::testing::StatusIs;
using ::testing::HasSubstr;

// A [rows, cols] int32 tensor whose element (r, c) is its name's length
// * 10000 + r * cols + c, cut into `boxes`, box i on workers[i % size].
struct Made {
  TensorMetadata meta;
  std::vector<std::string> shard_bytes;  // by shard id - 100
};

int32_t Value(const TensorMetadata& meta, int64_t r, int64_t c) {
  return static_cast<int32_t>(meta.name.size() * 10000 + r * meta.shape[1] + c);
}

void Add(const std::string& name, int64_t rows, int64_t cols,
         const std::vector<Box>& boxes, const std::vector<std::string>& workers,
         std::vector<Made>* all, uint64_t* next_id) {
  Made made;
  made.meta.name = name;
  made.meta.version = 2;
  made.meta.dtype = DType::kInt32;
  made.meta.shape = {rows, cols};
  for (size_t i = 0; i < boxes.size(); ++i) {
    ShardInfo& shard = made.meta.shards.emplace_back();
    shard.box = boxes[i];
    Replica r;
    r.worker = workers[i % workers.size()];
    r.address = r.worker + ":1";
    r.shard_id = (*next_id)++;
    shard.replicas.push_back(r);
  }
  all->push_back(std::move(made));
}

// The shard's row-major bytes, as its worker holds them.
std::string ShardBytes(const TensorMetadata& meta, uint64_t id) {
  for (const ShardInfo& s : meta.shards) {
    if (s.replicas[0].shard_id != id) continue;
    std::string out;
    for (int64_t r = 0; r < s.box.sizes[0]; ++r) {
      for (int64_t c = 0; c < s.box.sizes[1]; ++c) {
        const int32_t v =
            Value(meta, s.box.offsets[0] + r, s.box.offsets[1] + c);
        out.append(reinterpret_cast<const char*>(&v), sizeof(v));
      }
    }
    return out;
  }
  return "";
}

// Carries the plan out as the workers would: each file its header, then
// each write's runs from its shard.
std::vector<std::string> Fill(const HfExportPlan& plan,
                              const std::vector<Made>& made) {
  std::vector<std::string> files;
  for (const HfExportFile& f : plan.files) {
    std::string bytes(static_cast<size_t>(f.bytes), '\xee');
    std::memcpy(bytes.data(), f.header.data(), f.header.size());
    files.push_back(std::move(bytes));
  }
  for (const HfExportWorker& w : plan.workers) {
    for (const HfExportWrite& write : w.writes) {
      std::string shard;
      for (const Made& m : made) {
        if (m.meta.name == write.tensor)
          shard = ShardBytes(m.meta, write.shard_id);
      }
      EXPECT_EQ(static_cast<int64_t>(shard.size()), write.bytes);
      std::string& file = files[write.file];
      for (const FileRun& run : write.runs) {
        EXPECT_LE(run.file_offset + run.length,
                  static_cast<int64_t>(file.size()));
        std::memcpy(file.data() + run.file_offset,
                    shard.data() + run.shard_offset,
                    static_cast<size_t>(run.length));
      }
    }
  }
  return files;
}

HfExportOptions Options(int64_t max_file_bytes = kHfDefaultFileBytes,
                        const std::string& strip = "") {
  HfExportOptions options;
  options.export_id = "feedf00d";
  options.strip_prefix = strip;
  options.max_file_bytes = max_file_bytes;
  return options;
}

// Every file the plan makes is a whole safetensors file whose entries are
// the tensors, element for element, however they were cut.
TEST(HfExportPlanTest, ShardsOfRowsAndColumnsLandAsWholeTensors) {
  std::vector<Made> made;
  uint64_t id = 100;
  Add("rows", 6, 4, {Box({0, 0}, {3, 4}), Box({3, 0}, {3, 4})}, {"a", "b"},
      &made, &id);
  Add("columns", 5, 6,
      {Box({0, 0}, {5, 2}), Box({0, 2}, {5, 2}), Box({0, 4}, {5, 2})},
      {"a", "b"}, &made, &id);
  Add("grid", 4, 4,
      {Box({0, 0}, {2, 2}), Box({0, 2}, {2, 2}), Box({2, 0}, {2, 2}),
       Box({2, 2}, {2, 2})},
      {"b"}, &made, &id);
  std::vector<TensorMetadata> metas;
  for (const Made& m : made) metas.push_back(m.meta);
  ASSERT_OK_AND_ASSIGN(HfExportPlan plan, PlanHfExport(metas, Options()));
  ASSERT_EQ(plan.files.size(), 1u);
  EXPECT_EQ(plan.files[0].name, "model-00001-of-00001.safetensors");
  EXPECT_EQ(plan.files[0].staging,
            ".model-00001-of-00001.safetensors.feedf00d.part");
  EXPECT_EQ(plan.bytes, (24 + 30 + 16) * 4);
  ASSERT_EQ(plan.workers.size(), 2u);
  EXPECT_EQ(plan.workers[0].worker, "a");
  EXPECT_EQ(plan.workers[0].writes.size(), 3u);  // rows 0, columns 0 and 2
  EXPECT_EQ(plan.workers[1].writes.size(), 6u);

  const std::vector<std::string> files = Fill(plan, made);
  ASSERT_OK_AND_ASSIGN(SafetensorsHeader header, ParseSafetensors(files[0]));
  EXPECT_EQ(header.metadata, (SafetensorsMetadata{{"format", "pt"},
                                                  {kSavePartKey, "feedf00d"}}));
  ASSERT_EQ(header.entries.size(), 3u);
  for (const SafetensorsEntry& e : header.entries) {
    const Made* m = nullptr;
    for (const Made& x : made) {
      if (x.meta.name == e.name) m = &x;
    }
    ASSERT_NE(m, nullptr) << e.name;
    EXPECT_EQ(e.shape, m->meta.shape);
    EXPECT_EQ(e.dtype, DType::kInt32);
    const char* data = files[0].data() + header.data_offset + e.begin;
    for (int64_t r = 0; r < e.shape[0]; ++r) {
      for (int64_t c = 0; c < e.shape[1]; ++c) {
        int32_t v = 0;
        std::memcpy(&v, data + (r * e.shape[1] + c) * 4, 4);
        ASSERT_EQ(v, Value(m->meta, r, c)) << e.name << " " << r << "," << c;
      }
    }
  }
  const nlohmann::json index = nlohmann::json::parse(plan.index);
  EXPECT_EQ(index["metadata"]["total_size"], plan.bytes);
  EXPECT_EQ(index["weight_map"]["columns"], "model-00001-of-00001.safetensors");
  EXPECT_EQ(index["weight_map"].size(), 3u);
}

// Files are cut as Hugging Face cuts them: the next tensor opens a file
// when it would pass the bound; one larger than the bound is alone.
TEST(HfExportPlanTest, FilesAreCutAtTheBound) {
  std::vector<Made> made;
  uint64_t id = 100;
  for (const char* name : {"t0", "t1", "t2"}) {
    Add(name, 4, 4, {Box({0, 0}, {4, 4})}, {"a"}, &made, &id);  // 64 bytes
  }
  Add("big", 16, 4, {Box({0, 0}, {8, 4}), Box({8, 0}, {8, 4})}, {"a", "b"},
      &made, &id);  // 256 bytes
  Add("t3", 4, 4, {Box({0, 0}, {4, 4})}, {"b"}, &made, &id);
  std::vector<TensorMetadata> metas;
  for (const Made& m : made) metas.push_back(m.meta);
  ASSERT_OK_AND_ASSIGN(HfExportPlan plan, PlanHfExport(metas, Options(128)));
  // {t0, t1}, {t2}, {big}, {t3}
  ASSERT_EQ(plan.files.size(), 4u);
  EXPECT_EQ(plan.files[3].name, "model-00004-of-00004.safetensors");
  const nlohmann::json index = nlohmann::json::parse(plan.index);
  EXPECT_EQ(index["weight_map"]["t1"], "model-00001-of-00004.safetensors");
  EXPECT_EQ(index["weight_map"]["t2"], "model-00002-of-00004.safetensors");
  EXPECT_EQ(index["weight_map"]["big"], "model-00003-of-00004.safetensors");
  EXPECT_EQ(index["weight_map"]["t3"], "model-00004-of-00004.safetensors");
  const std::vector<std::string> files = Fill(plan, made);
  for (const std::string& f : files) ASSERT_OK(ParseSafetensors(f).status());
  ASSERT_OK_AND_ASSIGN(HfExportPlan one, PlanHfExport(metas, Options()));
  EXPECT_EQ(one.files.size(), 1u);
  EXPECT_THAT(PlanHfExport(metas, Options(0)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--max_shard_size")));
}

TEST(HfExportPlanTest, ThePrefixIsStrippedFromEveryName) {
  std::vector<Made> made;
  uint64_t id = 100;
  Add("llama/wq", 2, 2, {Box({0, 0}, {2, 2})}, {"a"}, &made, &id);
  Add("llama/wk", 2, 2, {Box({0, 0}, {2, 2})}, {"a"}, &made, &id);
  std::vector<TensorMetadata> metas;
  for (const Made& m : made) metas.push_back(m.meta);
  ASSERT_OK_AND_ASSIGN(HfExportPlan plan,
                       PlanHfExport(metas, Options(1 << 20, "llama/")));
  const nlohmann::json index = nlohmann::json::parse(plan.index);
  EXPECT_TRUE(index["weight_map"].contains("wq"));
  EXPECT_TRUE(index["weight_map"].contains("wk"));
  ASSERT_OK_AND_ASSIGN(SafetensorsHeader header,
                       ParseSafetensors(Fill(plan, made)[0]));
  EXPECT_EQ(header.entries.size(), 2u);
  EXPECT_THAT(PlanHfExport(metas, Options(1 << 20, "gpt/")),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("'llama/wq' does not start with 'gpt/'")));
  EXPECT_THAT(PlanHfExport(metas, Options(1 << 20, "llama/wq")),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(HfExportPlanTest, AShardWithoutALiveReplicaIsRefused) {
  std::vector<Made> made;
  uint64_t id = 100;
  Add("w", 4, 2, {Box({0, 0}, {2, 2}), Box({2, 0}, {2, 2})}, {"a", "b"}, &made,
      &id);
  made[0].meta.shards[1].replicas[0].available = false;
  EXPECT_THAT(PlanHfExport({made[0].meta}, Options()),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("shard 1 of 'w' is unavailable")));
}

// A tensor that came from a 0-d entry goes back as one.
TEST(HfExportPlanTest, AScalarIsZeroDimensional) {
  TensorMetadata meta;
  meta.name = "step";
  meta.version = 1;
  meta.dtype = DType::kInt64;
  meta.shape = {1};
  meta.origin.scalar = true;
  ShardInfo& shard = meta.shards.emplace_back();
  shard.box = Box({0}, {1});
  Replica r;
  r.worker = "a";
  r.address = "a:1";
  r.shard_id = 7;
  shard.replicas.push_back(r);
  ASSERT_OK_AND_ASSIGN(HfExportPlan plan, PlanHfExport({meta}, Options()));
  std::string file(static_cast<size_t>(plan.files[0].bytes), '\0');
  std::memcpy(file.data(), plan.files[0].header.data(),
              plan.files[0].header.size());
  ASSERT_OK_AND_ASSIGN(SafetensorsHeader header, ParseSafetensors(file));
  ASSERT_EQ(header.entries.size(), 1u);
  EXPECT_TRUE(header.entries[0].shape.empty());
  ASSERT_EQ(plan.workers[0].writes[0].runs.size(), 1u);
  EXPECT_EQ(plan.workers[0].writes[0].runs[0].length, 8);
  EXPECT_EQ(plan.workers[0].writes[0].runs[0].file_offset, header.data_offset);
}

}  // namespace
}  // namespace tessera
