// Grants that outlive what they were for, on a cluster with tokens: a put's
// or update's write grant dies at its commit (the commit seals the shards
// it wrote, also those a later update keeps); a commit, an abandon or a
// client's clean-up names its own put and never touches a tensor another
// client made under the same name; and a read grant reads only the tensor
// it was issued for, not a later one of the same name. Every refused attack
// leaves the data as it was.
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/tessera_client.h"
#include "core/auth.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/coordinator.grpc.pb.h"
#include "proto/worker.grpc.pb.h"
#include "rpc/channel.h"
#include "rpc/convert.h"
#include "rpc/security.h"
#include "rpc/testing/certificates.h"
#include "tests/cluster.h"
#include "tests/pending_put.h"
#include "tests/test_arrays.h"

namespace tessera {
namespace {

std::string Dir() {
  return absl::StrCat(std::getenv("TEST_TMPDIR"), "/grants");
}
std::string File(const std::string& name) {
  return absl::StrCat(Dir(), "/", name);
}
std::string Token(const std::string& principal) {
  return *ReadTokenFile(File(principal + ".token"));
}

class GrantTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ASSERT_OK(MakeTestCertificates(Dir(), 2));
    // A second writer: another principal of the same role.
    {
      std::ofstream tokens(File("tokens"), std::ios::app);
      tokens << "writer2 write " << std::string(64, 'b') << "\n";
      std::ofstream token(File("writer2.token"));
      token << std::string(64, 'b');
    }
    TestClusterOptions options;
    options.num_workers = 2;
    // --tokens is read again every second (RevokedPrincipals edits it).
    options.coordinator_flags = {absl::StrCat("--tokens=", File("tokens")),
                                 "--reload_interval=1s"};
    ASSERT_EQ(mkdir(File("ckpt").c_str(), 0755), 0);
    options.worker_flags = {
        absl::StrCat("--token_file=", Dir(), "/{name}.token"),
        absl::StrCat("--checkpoint_root=", File("ckpt"))};
    options.client.token = Token("admin");
    auto cluster = TestCluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = cluster->release();
  }
  static void TearDownTestSuite() { delete cluster_; }

  static std::unique_ptr<Client> As(const std::string& principal) {
    ClientOptions options;
    options.token = Token(principal);
    options.transport = "grpc";
    auto client = Client::Connect(cluster_->coordinator_address(), options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }
  static std::unique_ptr<v1::Coordinator::Stub> Coordinator(
      const std::string& principal) {
    ChannelOptions options;
    options.interceptors = BearerTokenInterceptors(Token(principal));
    return v1::Coordinator::NewStub(
        MakeChannel(cluster_->coordinator_address(), options));
  }
  static std::unique_ptr<v1::Worker::Stub> Worker(const std::string& address) {
    return v1::Worker::NewStub(MakeChannel(address));
  }

  // Writes `bytes` at byte 0 of shard `id` with `grant`; the call's code.
  static grpc::StatusCode Write(const std::string& address, uint64_t id,
                                const std::string& grant,
                                const std::string& bytes) {
    grpc::ClientContext context;
    context.AddMetadata(kCapabilityHeader, grant);
    v1::WriteShardResponse response;
    auto writer = Worker(address)->WriteShard(&context, &response);
    v1::WriteShardRequest chunk;
    chunk.set_shard_id(id);
    chunk.set_data(bytes);
    writer->Write(chunk);
    writer->WritesDone();
    return writer->Finish().error_code();
  }
  // Reads 4 bytes at the start of shard `id` with `grant`.
  static grpc::Status ReadFirst(const std::string& address, uint64_t id,
                                const std::string& grant, std::string* out) {
    grpc::ClientContext context;
    context.AddMetadata(kCapabilityHeader, grant);
    v1::ReadRegionRequest request;
    request.set_shard_id(id);
    request.add_offsets(0);
    request.add_sizes(4);
    v1::ReadRegionResponse response;
    grpc::Status status =
        Worker(address)->ReadSmallRegion(&context, request, &response);
    *out = response.data();
    return status;
  }

  // A put begun by hand (CreateTensor pending) of an int8 tensor of 8
  // elements in one shard on w0: its metadata, write grant and change id.
  struct Begun {
    TensorMetadata meta;
    std::string grant;
    uint64_t change = 0;
  };
  static Begun BeginPut(v1::Coordinator::Stub& coordinator,
                        const std::string& name) {
    grpc::ClientContext context;
    v1::CreateTensorResponse created;
    grpc::Status status = coordinator.CreateTensor(
        &context, PendingPutRequest(name, 8), &created);
    EXPECT_TRUE(status.ok()) << status.error_message();
    Begun out;
    out.meta = *TensorMetadataFromProto(created.tensor());
    out.grant = created.capabilities(0).token();
    out.change = created.change_id();
    return out;
  }
  static grpc::Status Commit(v1::Coordinator::Stub& coordinator,
                             const std::string& name, uint64_t version,
                             uint64_t change, bool abandon = false) {
    grpc::ClientContext context;
    v1::CommitTensorRequest commit;
    commit.set_name(name);
    commit.set_version(version);
    commit.set_change_id(change);
    commit.set_abandon(abandon);
    v1::CommitTensorResponse response;
    return coordinator.CommitTensor(&context, commit, &response);
  }

  static std::vector<int8_t> Contents(const std::string& name) {
    absl::StatusOr<HostArray> got = As("admin")->Get(name, std::nullopt);
    EXPECT_TRUE(got.ok()) << got.status();
    if (!got.ok()) return {};
    return std::vector<int8_t>(got->As<int8_t>(),
                               got->As<int8_t>() + got->NumElements());
  }

  static TestCluster* cluster_;
};
TestCluster* GrantTest::cluster_ = nullptr;

TEST_F(GrantTest, APutsWriteGrantDiesAtItsCommit) {
  auto writer = Coordinator("writer");
  const Begun put = BeginPut(*writer, "sealed");
  const Replica& shard = put.meta.shards[0].replicas[0];
  // Part of the shard, as a patch does (which left it writable before).
  ASSERT_EQ(Write(shard.address, shard.shard_id, put.grant, std::string(4, 1)),
            grpc::StatusCode::OK);
  ASSERT_TRUE(Commit(*writer, "sealed", 1, put.change).ok());
  const std::vector<int8_t> committed = Contents("sealed");
  // The same grant, after the commit: refused, nothing changes.
  EXPECT_EQ(Write(shard.address, shard.shard_id, put.grant, std::string(8, 9)),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Contents("sealed"), committed);
  EXPECT_EQ((*As("admin")->Describe("sealed")).version, 1u);

  // An update keeps the put's shard when its region misses it... (two
  // shards here: the update rewrites the second only)
  const std::vector<int8_t> rows(16, 3);
  auto client = As("writer");
  ASSERT_TRUE(client
                  ->Put("kept", {16}, DType::kInt8,
                        reinterpret_cast<const char*>(rows.data()),
                        LayoutSpec::Chunk(0, Ranks({0, 1})))
                  .ok());
  absl::StatusOr<TensorMetadata> v1 = client->Describe("kept");
  ASSERT_TRUE(v1.ok());
  const std::vector<int8_t> patch(8, 5);
  ASSERT_TRUE(client
                  ->Update("kept", {8}, DType::kInt8,
                           reinterpret_cast<const char*>(patch.data()),
                           Box{{8}, {8}})
                  .ok());
  // ... and a grant of version 2's update, or one minted for version 1's
  // put, rewrites neither shard now.
  const std::vector<int8_t> after = Contents("kept");
  for (const ShardInfo& shard : v1->shards) {
    const Replica& s = shard.replicas[0];
    EXPECT_EQ(Write(s.address, s.shard_id, v1->capabilities.at(s.worker),
                    std::string(8, 9)),
              grpc::StatusCode::PERMISSION_DENIED);
  }
  EXPECT_EQ(Contents("kept"), after);
}

TEST_F(GrantTest, AnUpdatesWriteGrantDiesAtItsCommit) {
  auto client = As("writer");
  const std::vector<int8_t> zeros(8, 0);
  ASSERT_TRUE(client
                  ->Put("upd", {8}, DType::kInt8,
                        reinterpret_cast<const char*>(zeros.data()),
                        LayoutSpec::Chunk(0, Ranks({1})))
                  .ok());
  auto writer = Coordinator("writer");
  grpc::ClientContext context;
  v1::UpdateTensorRequest update;
  update.set_name("upd");
  v1::UpdateTensorResponse staged;
  ASSERT_TRUE(writer->UpdateTensor(&context, update, &staged).ok());
  const TensorMetadata next = *TensorMetadataFromProto(staged.tensor());
  const Replica& shard = next.shards[0].replicas[0];
  std::string grant;
  for (const v1::WorkerCapability& c : staged.capabilities()) {
    if (c.worker() == shard.worker) grant = c.token();
  }
  // Half the shard (a whole-shard write sealed it even before).
  ASSERT_EQ(Write(shard.address, shard.shard_id, grant, std::string(4, 2)),
            grpc::StatusCode::OK);
  ASSERT_TRUE(Commit(*writer, "upd", 2, staged.change_id()).ok());
  const std::vector<int8_t> committed = {2, 2, 2, 2, 0, 0, 0, 0};
  EXPECT_EQ(Contents("upd"), committed);
  EXPECT_EQ(Write(shard.address, shard.shard_id, grant, std::string(8, 7)),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Contents("upd"), committed);
}

// Writer A begins a put of x; the name is taken from it (an admin removes
// the stuck put; writer B puts x). A's commit, A's abandon and A's
// clean-up must all leave B's tensor alone.
TEST_F(GrantTest, CommitsAndCleanUpsNameTheirOwnPut) {
  auto a = Coordinator("writer");
  const Begun put = BeginPut(*a, "x");
  // B may not remove A's put in progress; an admin may.
  EXPECT_EQ(As("writer2")->Delete("x").code(),
            absl::StatusCode::kPermissionDenied);
  ASSERT_TRUE(As("admin")->Delete("x").ok());
  const std::vector<int8_t> ours(8, 42);
  ASSERT_TRUE(As("writer2")
                  ->Put("x", {8}, DType::kInt8,
                        reinterpret_cast<const char*>(ours.data()),
                        LayoutSpec::Chunk(0, Ranks({0})))
                  .ok());
  const grpc::Status commit = Commit(*a, "x", 1, put.change);
  EXPECT_EQ(commit.error_code(), grpc::StatusCode::ABORTED)
      << commit.error_message();
  EXPECT_FALSE(Commit(*a, "x", 1, put.change, /*abandon=*/true).ok());
  // A's grant for its own (freed) shard writes nothing anywhere.
  EXPECT_NE(Write(put.meta.shards[0].replicas[0].address,
                  put.meta.shards[0].replicas[0].shard_id, put.grant,
                  std::string(8, 1)),
            grpc::StatusCode::OK);
  EXPECT_EQ(Contents("x"), ours);
  // A put of the taken name fails and removes nothing.
  auto client = As("writer");
  absl::StatusOr<TensorMetadata> failed = client->Put(
      "x", {8}, DType::kInt8, reinterpret_cast<const char*>(ours.data()),
      LayoutSpec::Chunk(0, Ranks({0})));
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(Contents("x"), ours);
  // A delete naming an earlier incarnation spares the tensor there now.
  EXPECT_EQ(client->Delete("x", put.meta.incarnation).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(Contents("x"), ours);
}

TEST_F(GrantTest, AReadGrantReadsOnlyTheTensorItWasIssuedFor) {
  auto admin = As("admin");
  const std::vector<int8_t> old_bytes(8, 11), new_bytes(8, 22);
  ASSERT_TRUE(admin
                  ->Put("y", {8}, DType::kInt8,
                        reinterpret_cast<const char*>(old_bytes.data()),
                        LayoutSpec::Chunk(0, Ranks({0})))
                  .ok());
  absl::StatusOr<TensorMetadata> old = As("reader")->Describe("y");
  ASSERT_TRUE(old.ok());
  const std::string grant =
      old->capabilities.at(old->shards[0].replicas[0].worker);
  std::string got;
  ASSERT_TRUE(ReadFirst(old->shards[0].replicas[0].address,
                        old->shards[0].replicas[0].shard_id, grant, &got)
                  .ok());
  ASSERT_TRUE(admin->Delete("y").ok());
  ASSERT_TRUE(admin
                  ->Put("y", {8}, DType::kInt8,
                        reinterpret_cast<const char*>(new_bytes.data()),
                        LayoutSpec::Chunk(0, Ranks({0})))
                  .ok());
  absl::StatusOr<TensorMetadata> now = admin->Describe("y");
  ASSERT_TRUE(now.ok());
  EXPECT_NE(now->incarnation, old->incarnation);
  // Same name, same version 1, same worker: the old grant is refused.
  const grpc::Status read =
      ReadFirst(now->shards[0].replicas[0].address,
                now->shards[0].replicas[0].shard_id, grant, &got);
  EXPECT_EQ(read.error_code(), grpc::StatusCode::PERMISSION_DENIED)
      << read.error_message();
}

// A principal removed from --tokens loses what it was granted before: its
// read grants (valid for an hour) are refused by the workers within a few
// heartbeats of the coordinator's reload, and a principal added back gets
// grants that work again.
TEST_F(GrantTest, ARemovedPrincipalsGrantsDieWithinTheReloadInterval) {
  auto admin = As("admin");
  const std::vector<int8_t> bytes(8, 7);
  ASSERT_TRUE(admin
                  ->Put("revoked", {8}, DType::kInt8,
                        reinterpret_cast<const char*>(bytes.data()),
                        LayoutSpec::Chunk(0, Ranks({0})))
                  .ok());
  absl::StatusOr<TensorMetadata> meta = As("reader")->Describe("revoked");
  ASSERT_TRUE(meta.ok()) << meta.status();
  const Replica& shard = meta->shards[0].replicas[0];
  const std::string grant = meta->capabilities.at(shard.worker);
  std::string got;
  ASSERT_TRUE(ReadFirst(shard.address, shard.shard_id, grant, &got).ok());

  // The operator removes "reader" (the file keeps its mode: rewritten).
  std::string all;
  {
    std::ifstream in(File("tokens"));
    all.assign(std::istreambuf_iterator<char>(in), {});
  }
  std::string without;
  for (absl::string_view line : absl::StrSplit(all, '\n')) {
    if (!line.empty() && !absl::StartsWith(line, "reader ")) {
      absl::StrAppend(&without, line, "\n");
    }
  }
  ASSERT_NE(without.size(), all.size());
  { std::ofstream(File("tokens"), std::ios::trunc) << without; }
  grpc::Status read = grpc::Status::OK;
  const absl::Time removed = absl::Now();
  while (read.ok() && absl::Now() - removed < absl::Seconds(15)) {
    absl::SleepFor(absl::Milliseconds(200));
    read = ReadFirst(shard.address, shard.shard_id, grant, &got);
  }
  EXPECT_EQ(read.error_code(), grpc::StatusCode::PERMISSION_DENIED)
      << read.error_message();
  EXPECT_THAT(read.error_message(), ::testing::HasSubstr("'reader'"));
  // Every worker refuses it for good, not just one heartbeat's worth.
  absl::SleepFor(absl::Seconds(2));
  EXPECT_EQ(ReadFirst(shard.address, shard.shard_id, grant, &got).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  // Others are untouched.
  EXPECT_TRUE(As("writer")->Get("revoked", std::nullopt).ok());

  // Added back: new grants work, the old one stays dead.
  { std::ofstream(File("tokens"), std::ios::trunc) << all; }
  absl::StatusOr<TensorMetadata> again = absl::UnavailableError("not yet");
  for (const absl::Time start = absl::Now();
       !again.ok() && absl::Now() - start < absl::Seconds(15);) {
    absl::SleepFor(absl::Milliseconds(200));
    ClientOptions options;
    options.token = Token("reader");
    options.transport = "grpc";
    auto reader = Client::Connect(cluster_->coordinator_address(), options);
    if (reader.ok()) again = (*reader)->Describe("revoked");
  }
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(ReadFirst(shard.address, shard.shard_id,
                        again->capabilities.at(shard.worker), &got)
                  .ok());
  EXPECT_EQ(ReadFirst(shard.address, shard.shard_id, grant, &got).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
}

// A safetensors file of one float32 entry `name` of 4 elements.
void WriteModelFile(const std::string& path, const std::string& name) {
  const std::string header = absl::StrCat("{\"", name,
                                          "\":{\"dtype\":\"F32\",\"shape\":[4],"
                                          "\"data_offsets\":[0,16]}}");
  std::string file(8, '\0');
  for (int i = 0; i < 8; ++i) {
    file[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  }
  file += header;
  file += std::string(16, '\x01');
  std::ofstream(path, std::ios::binary) << file;
}

// Saving needs the write role; a save never replaces a checkpoint another
// principal wrote (or one tessera did not write) unless told to, and then
// removes only files its earlier save wrote.
TEST_F(GrantTest, SavesNeedWriteAndReplaceOnlyWhatTheirPrincipalSaved) {
  auto admin = As("admin");
  const std::vector<int8_t> bytes(8, 5);
  ASSERT_TRUE(admin
                  ->Put("saved", {8}, DType::kInt8,
                        reinterpret_cast<const char*>(bytes.data()),
                        LayoutSpec::Chunk(0, Ranks({0, 1})))
                  .ok());
  // A reader may not save at all: nothing is written.
  EXPECT_EQ(As("reader")->SaveCheckpoint("r", {"saved"}).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_NE(access(File("ckpt/r").c_str(), F_OK), 0);

  // writer's checkpoint: writer may save over it again, writer2 may not.
  auto writer = As("writer");
  ASSERT_TRUE(writer->SaveCheckpoint("d", {"saved"}).ok());
  ASSERT_TRUE(writer->SaveCheckpoint("d", {"saved"}).ok());
  absl::StatusOr<Client::SaveStats> other =
      As("writer2")->SaveCheckpoint("d", {"saved"});
  EXPECT_EQ(other.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(other.status().message()),
              ::testing::AllOf(::testing::HasSubstr("'writer'"),
                               ::testing::HasSubstr("--overwrite")));
  // ... and writer's checkpoint is whole: it loads.
  Client::LoadEntry entry;
  entry.entry = "saved";
  entry.tensor = "loaded";
  entry.spec = LayoutSpec::Chunk(0, Ranks({1}));
  ASSERT_TRUE(admin->LoadCheckpoint("d", {entry}).ok());
  EXPECT_EQ(Contents("loaded"), bytes);
  // Told to, writer2 replaces it.
  EXPECT_TRUE(As("writer2")->SaveCheckpoint("d", {"saved"}, "", true).ok());

  // A Hugging Face model directory: replaced only when told to, and even
  // then its model file stays (tessera did not write it).
  ASSERT_EQ(mkdir(File("ckpt/hf").c_str(), 0755), 0);
  WriteModelFile(File("ckpt/hf/model.safetensors"), "w");
  EXPECT_EQ(writer->SaveCheckpoint("hf", {"saved"}).status().code(),
            absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(writer->SaveCheckpoint("hf", {"saved"}, "", true).ok());
  EXPECT_EQ(access(File("ckpt/hf/model.safetensors").c_str(), F_OK), 0);
  // Saved files are readable by every user (a loader in another container).
  struct stat st {};
  ASSERT_EQ(stat(File("ckpt/hf/tessera.json").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0044, 0044u);

  // export --hf is a save to the roles and to what a directory holds: a
  // reader writes nothing; writer replaces writer2's checkpoint only when
  // told to, and then the earlier save's files go, the index files first.
  Client::HfExport hf;
  EXPECT_EQ(As("reader")->ExportHf("rh", {"saved"}, "", hf).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_NE(access(File("ckpt/rh").c_str(), F_OK), 0);
  absl::StatusOr<Client::SaveStats> refused =
      writer->ExportHf("d", {"saved"}, "", hf);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(refused.status().message()),
              ::testing::HasSubstr("'writer2'"));
  hf.overwrite = true;
  ASSERT_TRUE(writer->ExportHf("d", {"saved"}, "", hf).ok());
  std::set<std::string> left;
  if (DIR* d = opendir(File("ckpt/d").c_str())) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] != '.') left.insert(e->d_name);
    }
    closedir(d);
  }
  EXPECT_EQ(left, (std::set<std::string>{"model-00001-of-00001.safetensors",
                                         "model.safetensors.index.json"}));
  ASSERT_EQ(stat(File("ckpt/d/model-00001-of-00001.safetensors").c_str(), &st),
            0);
  EXPECT_EQ(st.st_mode & 0044, 0044u);
  entry.tensor = "exported";
  ASSERT_TRUE(admin->LoadCheckpoint("d", {entry}).ok());
  EXPECT_EQ(Contents("exported"), bytes);
}

}  // namespace
}  // namespace tessera
