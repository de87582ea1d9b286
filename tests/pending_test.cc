// A client that dies mid-put or mid-update leaves its change pending: the
// CLI shows it (ls --all, describe, the error of a second update) with who
// began it and when, and the coordinator's --pending_timeout gives it up,
// freeing the name, the bytes and the tensor's change lock. A change is
// bound to its client: one its client stops keeping (--pending_lease)
// ends within seconds.
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/tessera_client.h"
#include "gtest/gtest.h"
#include "proto/coordinator.grpc.pb.h"
#include "rpc/channel.h"
#include "tests/cluster.h"
#include "tests/pending_put.h"
#include "tests/test_arrays.h"

namespace tessera {
namespace {

// Begins a put of an 8-byte tensor on rank 0 at `coordinator` as a client
// would, and does nothing after (a client that dies); the reply.
v1::CreateTensorResponse BeginPutAt(const std::string& coordinator,
                                    const std::string& name) {
  auto stub = v1::Coordinator::NewStub(MakeChannel(coordinator));
  grpc::ClientContext context;
  v1::CreateTensorResponse created;
  EXPECT_TRUE(
      stub->CreateTensor(&context, PendingPutRequest(name, 8), &created).ok())
      << name;
  return created;
}

class PendingTest : public ClusterSuite<PendingTest> {
 public:
  static TestClusterOptions ClusterOptions() {
    TestClusterOptions options;
    options.num_workers = 2;
    options.coordinator_flags = {"--pending_timeout=3s"};
    return options;
  }

 protected:
  // Runs the CLI; its exit status, stdout and stderr.
  static int Cli(const std::vector<std::string>& args, std::string* out,
                 std::string* err) {
    std::vector<std::string> argv = {
        TestCluster::BinaryPath("client/tessera"),
        absl::StrCat("--coordinator=", cluster_->coordinator_address())};
    argv.insert(argv.end(), args.begin(), args.end());
    return TestCluster::Run(argv, out, err);
  }
  // Begins a change as a client that then dies would: nothing follows.
  static void BeginPut(const std::string& name) {
    BeginPutAt(cluster_->coordinator_address(), name);
  }
  static void BeginUpdate(const std::string& name) {
    auto stub =
        v1::Coordinator::NewStub(MakeChannel(cluster_->coordinator_address()));
    grpc::ClientContext context;
    v1::UpdateTensorRequest update;
    update.set_name(name);
    v1::UpdateTensorResponse staged;
    ASSERT_TRUE(stub->UpdateTensor(&context, update, &staged).ok());
  }
};

TEST_F(PendingTest, ADeadClientsChangeIsShownThenGivenUp) {
  const int64_t used = BytesUsed();
  BeginPut("half");
  ASSERT_TRUE(client_
                  ->Create("u", {8}, DType::kInt8,
                           LayoutSpec::Chunk(0, Ranks({1})), InitSpec{})
                  .ok());
  BeginUpdate("u");
  std::string out, err;
  ASSERT_EQ(Cli({"ls"}, &out, &err), 0) << err;
  EXPECT_FALSE(absl::StrContains(out, "half")) << "a put is not visible";
  ASSERT_EQ(Cli({"ls", "--all"}, &out, &err), 0) << err;
  EXPECT_TRUE(absl::StrContains(out, "PENDING")) << out;
  EXPECT_TRUE(absl::StrContains(out, "put since")) << out;
  EXPECT_TRUE(absl::StrContains(out, "update to version 2 since")) << out;
  ASSERT_EQ(Cli({"ls", "--all", "--json"}, &out, &err), 0) << err;
  EXPECT_TRUE(absl::StrContains(
      out, "\"pending\": {\"change\": \"put\", \"version\": 1"))
      << out;
  ASSERT_EQ(Cli({"describe", "u"}, &out, &err), 0) << err;
  EXPECT_TRUE(absl::StrContains(out, "Pending:   an update to version 2"))
      << out;
  EXPECT_EQ(Cli({"describe", "half"}, &out, &err), 1);
  EXPECT_TRUE(absl::StrContains(err, "not found: a put of it is pending since"))
      << err;
  // A second update is told what blocks it, since when, and how it ends.
  const std::vector<int8_t> bytes(8, 1);
  absl::StatusOr<UpdateStats> second = client_->Update(
      "u", {8}, DType::kInt8, reinterpret_cast<const char*>(bytes.data()));
  EXPECT_EQ(second.status().code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(absl::StrContains(second.status().message(),
                                "has an update to version 2 pending since"))
      << second.status();
  EXPECT_TRUE(absl::StrContains(second.status().message(), "--pending_timeout"))
      << second.status();
  // Given up after --pending_timeout (3 s): the name and the bytes are free,
  // and the tensor takes updates again.
  const absl::Time until = absl::Now() + absl::Seconds(30);
  std::string listed;
  while (absl::Now() < until) {
    ASSERT_EQ(Cli({"ls", "--all"}, &listed, &err), 0) << err;
    if (!absl::StrContains(listed, "since")) break;
    absl::SleepFor(absl::Milliseconds(200));
  }
  EXPECT_FALSE(absl::StrContains(listed, "since")) << listed;
  EXPECT_TRUE(client_
                  ->Put("half", {8}, DType::kInt8,
                        reinterpret_cast<const char*>(bytes.data()),
                        LayoutSpec::Chunk(0, Ranks({0})))
                  .ok());
  EXPECT_TRUE(client_
                  ->Update("u", {8}, DType::kInt8,
                           reinterpret_cast<const char*>(bytes.data()))
                  .ok());
  // What the dead client's changes held is freed: 8 bytes of "half" and 8
  // of "u" remain.
  const absl::Time freed_by = absl::Now() + absl::Seconds(10);
  while (BytesUsed() != used + 16 && absl::Now() < freed_by) {
    absl::SleepFor(absl::Milliseconds(200));
  }
  EXPECT_EQ(BytesUsed(), used + 16);
}

// The same cluster with pending changes bound to their clients: a lease
// of 1 s, a --pending_timeout far away.
class PendingLeaseTest : public ClusterSuite<PendingLeaseTest> {
 public:
  static TestClusterOptions ClusterOptions() {
    TestClusterOptions options;
    options.num_workers = 2;
    options.coordinator_flags = {"--pending_timeout=10m", "--pending_lease=1s"};
    return options;
  }

 protected:
  // A put begun by hand, as a client would: its reply.
  static v1::CreateTensorResponse BeginPut(const std::string& name) {
    return BeginPutAt(cluster_->coordinator_address(), name);
  }
  static grpc::Status Keep(const std::string& name,
                           const v1::CreateTensorResponse& put) {
    auto stub =
        v1::Coordinator::NewStub(MakeChannel(cluster_->coordinator_address()));
    grpc::ClientContext context;
    v1::KeepPendingRequest keep;
    keep.set_name(name);
    keep.set_version(put.tensor().version());
    keep.set_change_id(put.change_id());
    v1::KeepPendingResponse kept;
    return stub->KeepPending(&context, keep, &kept);
  }
  // Whether `ls --all` lists `name` pending.
  static bool Pending(const std::string& name) {
    std::string out, err;
    EXPECT_EQ(TestCluster::Run({TestCluster::BinaryPath("client/tessera"),
                                absl::StrCat("--coordinator=",
                                             cluster_->coordinator_address()),
                                "ls", "--all"},
                               &out, &err),
              0)
        << err;
    return absl::StrContains(out, name + " ") &&
           absl::StrContains(out, "since");
  }
};

// A client that dies mid-put (here: one that never keeps its put) holds
// its name for the lease, not for --pending_timeout; a retry meanwhile is
// told what holds the name. A client that keeps its put holds it as long
// as it keeps it, and a keep of anything else is refused.
TEST_F(PendingLeaseTest, APutEndsWithinSecondsOfItsClientsDeath) {
  const std::vector<int8_t> bytes(8, 3);
  auto put = [&](const std::string& name) {
    return client_->Put(name, {8}, DType::kInt8,
                        reinterpret_cast<const char*>(bytes.data()),
                        LayoutSpec::Chunk(0, Ranks({1})));
  };
  const v1::CreateTensorResponse dead = BeginPut("dead");
  EXPECT_EQ(dead.pending_lease_ms(), 1000);
  absl::StatusOr<TensorMetadata> retry = put("dead");
  EXPECT_EQ(retry.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(absl::StrContains(retry.status().message(),
                                "already exists as a put pending since"))
      << retry.status();
  EXPECT_TRUE(absl::StrContains(retry.status().message(), "ls --all"))
      << retry.status();
  const absl::Time begun = absl::Now();
  while (Pending("dead") && absl::Now() - begun < absl::Seconds(30)) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_FALSE(Pending("dead"));
  std::cerr << "a dead client's put ended "
            << absl::FormatDuration(absl::Now() - begun)
            << " after it began (lease 1 s)\n";
  EXPECT_TRUE(put("dead").ok());

  // Kept for three leases: still pending, and it ends once no longer kept.
  const v1::CreateTensorResponse alive = BeginPut("alive");
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(Keep("alive", alive).ok());
    absl::SleepFor(absl::Milliseconds(300));
  }
  EXPECT_TRUE(Pending("alive"));
  v1::CreateTensorResponse other = alive;
  other.set_change_id(alive.change_id() + 1);
  EXPECT_EQ(Keep("alive", other).error_code(), grpc::StatusCode::NOT_FOUND);
  const absl::Time stopped = absl::Now();
  while (Pending("alive") && absl::Now() - stopped < absl::Seconds(30)) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_FALSE(Pending("alive"));
  EXPECT_EQ(Keep("alive", alive).error_code(), grpc::StatusCode::NOT_FOUND);
  // The SDK keeps its own changes: puts and updates commit.
  ASSERT_TRUE(put("sdk").ok());
  EXPECT_TRUE(client_
                  ->Update("sdk", {8}, DType::kInt8,
                           reinterpret_cast<const char*>(bytes.data()))
                  .ok());
}

}  // namespace
}  // namespace tessera
