// Workers' TCP data ports end to end, on real daemons: each worker
// registers its data address (`workers --json`), the CLI moves a put and a
// get over `--transport=tcp` and counts them in `get --json`, workers pull
// reshard pieces from each other over TCP (`--peer_transport=tcp`, counted
// in their metrics), and a worker started with `--data_listen=off` has none:
// forcing TCP to it names the transport and the worker, `auto` falls back
// to gRPC. A plaintext data port beyond loopback needs `--insecure`, as
// the gRPC port does.
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/npy_file.h"
#include "client/tessera_client.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/cluster.h"
#include "tests/processes.h"
#include "tests/test_arrays.h"

namespace tessera {
namespace {

class TcpDataTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    metrics_ = {PickFreePort(), PickFreePort(), PickFreePort()};
    TestClusterOptions options;
    options.num_workers = 3;
    // Shared memory and UCX off for the workers' pulls, so that the data
    // ports carry them; worker 2 has none.
    options.worker_flags = {"--peer_transport=tcp"};
    options.per_worker_flags = [](int i) {
      std::vector<std::string> flags = {
          absl::StrCat("--metrics_listen=127.0.0.1:", metrics_[i])};
      if (i == 2) flags = {"--data_listen=off", "--peer_transport=grpc"};
      return flags;
    };
    auto cluster = TestCluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = cluster->release();
  }
  static void TearDownTestSuite() { delete cluster_; }

  // Runs the CLI against the cluster.
  static int Cli(std::vector<std::string> args, std::string* out,
                 std::string* err) {
    args.insert(args.begin(),
                {TestCluster::BinaryPath("client/tessera"),
                 "--coordinator=" + cluster_->coordinator_address()});
    return TestCluster::Run(args, out, err);
  }

  static TestCluster* cluster_;
  static std::vector<int> metrics_;
};

TestCluster* TcpDataTest::cluster_ = nullptr;
std::vector<int> TcpDataTest::metrics_;

TEST_F(TcpDataTest, WorkersListTheirDataAddresses) {
  std::string out, err;
  ASSERT_EQ(Cli({"workers", "--json"}, &out, &err), 0) << err;
  const nlohmann::json workers = nlohmann::json::parse(out);
  ASSERT_EQ(workers.size(), 3u) << out;
  for (const nlohmann::json& w : workers) {
    const std::string name = w.at("name").get<std::string>();
    const std::string data = w.at("data_address").get<std::string>();
    if (name == "w2") {
      EXPECT_EQ(data, "") << "--data_listen=off";
      continue;
    }
    EXPECT_TRUE(absl::StartsWith(data, "127.0.0.1:")) << data;
    EXPECT_NE(data, w.at("address").get<std::string>());
  }
}

TEST_F(TcpDataTest, PutAndGetMoveOverTheDataPorts) {
  const std::string dir = ::testing::TempDir();
  const std::string in = dir + "/tcp_in.npy";
  const std::string out_file = dir + "/tcp_out.npy";
  const HostArray array = Iota(DType::kFloat32, {256, 64});
  ASSERT_TRUE(WriteNpyFile(in, array).ok());
  std::string out, err;
  ASSERT_EQ(Cli({"--transport=tcp", "put", "tcp_t", "--input=" + in,
                 "--chunk_dim=0", "--placements=rank:0,rank:1"},
                &out, &err),
            0)
      << err;
  ASSERT_EQ(
      Cli({"--transport=tcp", "get", "tcp_t", "--output=" + out_file, "--json"},
          &out, &err),
      0)
      << err;
  const nlohmann::json got = nlohmann::json::parse(out);
  EXPECT_EQ(got.at("transport").at("tcp").get<int64_t>(), 256 * 64 * 4) << out;
  EXPECT_EQ(got.at("transport").size(), 1u) << out;
  absl::StatusOr<HostArray> back = ReadNpyFile(out_file, std::nullopt);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(SameBytes(*back, array)) << "bytes differ";
  // A region that is not contiguous in its shard: columns 10..30.
  ASSERT_EQ(Cli({"--transport=tcp", "get", "tcp_t", "--region=5:250,10:30",
                 "--output=" + out_file},
                &out, &err),
            0)
      << err;
  back = ReadNpyFile(out_file, std::nullopt);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(SameBytes(*back, Slice(array, Box{{5, 10}, {245, 20}})))
      << "region bytes differ";
}

TEST_F(TcpDataTest, WorkersPullReshardPiecesOverTheirDataPorts) {
  auto client = Client::Connect(cluster_->coordinator_address());
  ASSERT_TRUE(client.ok()) << client.status();
  InitSpec arange;
  arange.kind = InitSpec::Kind::kArange;
  ASSERT_TRUE((*client)
                  ->Create("pull_t", {128, 64}, DType::kInt32,
                           LayoutSpec::Chunk(0, Ranks({0, 1})), arange)
                  .ok());
  ASSERT_TRUE(
      (*client)->Reshard("pull_t", LayoutSpec::Chunk(1, Ranks({0, 1}))).ok());
  absl::StatusOr<HostArray> got = (*client)->Get("pull_t", std::nullopt);
  ASSERT_TRUE(got.ok()) << got.status();
  for (int i = 0; i < 128 * 64; ++i) ASSERT_EQ(got->As<int32_t>()[i], i);
  double pulled = 0;
  for (int w = 0; w < 2; ++w) {
    pulled += MetricSum(FetchMetrics(metrics_[w]),
                        "tessera_transfer_bytes_total", "transport=\"tcp\"");
  }
  // Rows to columns: each new shard takes half its bytes from the other.
  EXPECT_EQ(pulled, 2 * 64 * 32 * 4) << "reshard pieces pulled over TCP";
}

TEST_F(TcpDataTest, AWorkerWithoutADataPortIsNamedOrPassedOver) {
  auto client = Client::Connect(cluster_->coordinator_address());
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)
                  ->Create("off_t", {16, 8}, DType::kFloat32,
                           LayoutSpec::Chunk(0, Ranks({2})),
                           InitSpec{InitSpec::Kind::kOnes})
                  .ok());
  std::string out, err;
  const std::string file = ::testing::TempDir() + "/off.npy";
  EXPECT_EQ(
      Cli({"--transport=tcp", "get", "off_t", "--output=" + file}, &out, &err),
      1);
  EXPECT_TRUE(absl::StrContains(err, "tcp")) << err;
  EXPECT_TRUE(absl::StrContains(err, "w2")) << err;
  ASSERT_EQ(Cli({"get", "off_t", "--output=" + file, "--json"}, &out, &err), 0)
      << err;
  EXPECT_FALSE(absl::StrContains(out, "\"tcp\"")) << out;
}

TEST(TcpDataPortTest, APlaintextDataPortBeyondLoopbackNeedsInsecure) {
  std::string out, err;
  const int status =
      TestCluster::Run({TestCluster::BinaryPath("worker/tessera-worker"),
                        "--coordinator=127.0.0.1:1", "--listen=127.0.0.1:0",
                        "--data_listen=0.0.0.0:0"},
                       &out, &err);
  EXPECT_NE(status, 0);
  const std::string said = out + err;  // the daemon logs to stdout
  EXPECT_TRUE(absl::StrContains(said, "--data_listen")) << said;
  EXPECT_TRUE(absl::StrContains(said, "0.0.0.0")) << said;
  EXPECT_TRUE(absl::StrContains(said, "insecure")) << said;
}

}  // namespace
}  // namespace tessera
