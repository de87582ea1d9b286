// TransportChain's choice, fallback and counting, with scripted transports
// standing in for shared memory and gRPC (the real ones pass the contract in
// transport_contract_test).
#include "transport/transport_chain.h"

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rpc/channel.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;

// Answers every call with `answer` (copying zeros on success) and counts
// the calls it got.
class ScriptedTransport : public ShardTransport {
 public:
  ScriptedTransport(std::string name, absl::Status answer, int* calls)
      : name_(std::move(name)), answer_(std::move(answer)), calls_(calls) {}
  const std::string& name() const override { return name_; }
  absl::Status Read(const RemoteShard& shard, const Box& box,
                    const ReadTarget& target) override {
    ++*calls_;
    if (!answer_.ok()) return answer_;
    std::string zeros(box.NumElements() * shard.item_bytes, '\0');
    return target.Deliver(box.sizes, 0, box.NumElements(), zeros.data(),
                          shard.item_bytes);
  }
  absl::Status Write(const RemoteShard&, const WriteSource&) override {
    ++*calls_;
    return answer_;
  }

 private:
  const std::string name_;
  const absl::Status answer_;
  int* const calls_;
};

class TransportChainTest : public ::testing::Test {
 protected:
  std::unique_ptr<TransportChain> Chain(absl::Status first, int64_t min_bytes,
                                        absl::Status second) {
    std::vector<TransportChain::Link> links;
    links.push_back(TransportChain::Link{
        std::make_unique<ScriptedTransport>("near", first, &near_calls_),
        min_bytes});
    links.push_back(TransportChain::Link{
        std::make_unique<ScriptedTransport>("far", second, &far_calls_), 0});
    return std::make_unique<TransportChain>(std::move(links));
  }

  // Reads `n` int32 elements.
  absl::Status ReadN(TransportChain& chain, int64_t n) {
    out_.assign(static_cast<size_t>(n) * 4, 'x');
    RemoteShard shard;
    shard.location.address = "w:1";
    shard.item_bytes = 4;
    return chain.Read(shard, WholeBox({n}),
                      ReadTarget::HostArray(out_.data(), {n}, {0}));
  }

  int near_calls_ = 0;
  int far_calls_ = 0;
  std::string out_;
};

TEST_F(TransportChainTest, FirstTransportThatCanMovesTheBytes) {
  auto chain = Chain(absl::OkStatus(), 0, absl::OkStatus());
  ASSERT_THAT(ReadN(*chain, 10), IsOk());
  EXPECT_EQ(near_calls_, 1);
  EXPECT_EQ(far_calls_, 0);
  EXPECT_EQ(out_, std::string(40, '\0'));
  const DataPlaneStats stats = chain->Stats();
  EXPECT_EQ(stats.bytes.at("near"), 40);
  EXPECT_EQ(stats.bytes.at("far"), 0);
  EXPECT_EQ(stats.fallbacks.at("near"), 0);
}

TEST_F(TransportChainTest, FailedPreconditionFallsBackAndIsCounted) {
  auto chain =
      Chain(absl::FailedPreconditionError("another host"), 0, absl::OkStatus());
  ASSERT_THAT(ReadN(*chain, 10), IsOk());
  ASSERT_THAT(ReadN(*chain, 5), IsOk());
  EXPECT_EQ(far_calls_, 2);
  const DataPlaneStats stats = chain->Stats();
  EXPECT_EQ(stats.bytes.at("near"), 0);
  EXPECT_EQ(stats.bytes.at("far"), 60);
  EXPECT_EQ(stats.fallbacks.at("near"), 2);
}

TEST_F(TransportChainTest, OtherErrorsAreFinal) {
  for (absl::Status error :
       {absl::NotFoundError("freed"), absl::UnavailableError("gone"),
        absl::OutOfRangeError("outside")}) {
    auto chain = Chain(error, 0, absl::OkStatus());
    EXPECT_THAT(ReadN(*chain, 10), StatusIs(error.code()));
    EXPECT_EQ(chain->Stats().fallbacks.at("near"), 0);
  }
  EXPECT_EQ(far_calls_, 0);
}

TEST_F(TransportChainTest, SmallMovesSkipATransportWithAMinimum) {
  auto chain = Chain(absl::OkStatus(), /*min_bytes=*/1 << 20, absl::OkStatus());
  ASSERT_THAT(ReadN(*chain, 1024), IsOk());  // 4 KiB
  EXPECT_EQ(near_calls_, 0);
  EXPECT_EQ(far_calls_, 1);
  ASSERT_THAT(ReadN(*chain, 1 << 18), IsOk());  // 1 MiB
  EXPECT_EQ(near_calls_, 1);
  const DataPlaneStats stats = chain->Stats();
  EXPECT_EQ(stats.bytes.at("far"), 4096);
  EXPECT_EQ(stats.bytes.at("near"), 1 << 20);
  EXPECT_EQ(stats.fallbacks.at("near"), 0);  // skipping is no fallback
}

TEST_F(TransportChainTest, LastTransportsAnswerIsReturned) {
  auto chain = Chain(absl::FailedPreconditionError("another host"), 0,
                     absl::FailedPreconditionError("cannot either"));
  EXPECT_THAT(ReadN(*chain, 10),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       ::testing::HasSubstr("cannot either")));
}

TEST_F(TransportChainTest, WritesChooseByTheShardsSize) {
  auto chain =
      Chain(absl::FailedPreconditionError("no segment"), 0, absl::OkStatus());
  RemoteShard shard;
  shard.item_bytes = 2;
  shard.shape = {3, 7};
  std::string src(42, 'a');
  ASSERT_THAT(chain->Write(shard, WriteSource{src.data(), {3, 7}, {0, 0}}),
              IsOk());
  const DataPlaneStats stats = chain->Stats();
  EXPECT_EQ(stats.bytes.at("far"), 42);
  EXPECT_EQ(stats.fallbacks.at("near"), 1);
}

TEST_F(TransportChainTest, TransferReadsEachPieceThroughTheChain) {
  auto chain =
      Chain(absl::FailedPreconditionError("another host"), 0, absl::OkStatus());
  class Receiver : public TransferReceiver {
   public:
    absl::StatusOr<PieceTarget> TargetFor(const TransferPiece&) override {
      return PieceTarget{ReadTarget::HostArray(buffer, {16}, {0}), 4, nullptr};
    }
    char buffer[64];
  } receiver;
  TransferBatch batch;
  batch.src_address = "w:1";
  batch.pieces.push_back(TransferPiece{1, {0}, 2, {0}, {4}});
  batch.pieces.push_back(TransferPiece{1, {4}, 2, {4}, {12}});
  absl::StatusOr<int64_t> moved = chain->Transfer(batch, receiver);
  ASSERT_THAT(moved.status(), IsOk());
  EXPECT_EQ(*moved, 64);
  EXPECT_EQ(chain->Stats().bytes.at("far"), 64);
  EXPECT_EQ(chain->Stats().fallbacks.at("near"), 2);
}

// Holds every read until `expected` reads are in flight at once, then lets
// them all finish; a read that waits 10 s for the others fails.
class RendezvousTransport : public ShardTransport {
 public:
  explicit RendezvousTransport(int expected) : expected_(expected) {}
  const std::string& name() const override { return name_; }
  absl::Status Read(const RemoteShard& shard, const Box& box,
                    const ReadTarget& target) override {
    {
      absl::MutexLock lock(&mu_);
      ++arrived_;
      if (!mu_.AwaitWithTimeout(
              absl::Condition(this, &RendezvousTransport::AllArrived),
              absl::Seconds(10))) {
        return absl::DeadlineExceededError("reads did not overlap");
      }
    }
    std::string zeros(box.NumElements() * shard.item_bytes, '\0');
    return target.Deliver(box.sizes, 0, box.NumElements(), zeros.data(),
                          shard.item_bytes);
  }
  absl::Status Write(const RemoteShard&, const WriteSource&) override {
    return absl::OkStatus();
  }

 private:
  bool AllArrived() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return arrived_ >= expected_;
  }

  const std::string name_ = "near";
  const int expected_;
  absl::Mutex mu_;
  int arrived_ ABSL_GUARDED_BY(mu_) = 0;
};

// A gather reads every worker's pieces from its own thread through one
// chain: the chain must let those reads run side by side (a lock held
// across a read would make the copies serial).
TEST(TransportChainConcurrencyTest, ReadsFromManyThreadsOverlap) {
  constexpr int kReaders = 4;
  std::vector<TransportChain::Link> links;
  links.push_back(
      TransportChain::Link{std::make_unique<RendezvousTransport>(kReaders), 0});
  TransportChain chain(std::move(links));
  std::vector<std::string> outs(kReaders, std::string(40, 'x'));
  std::vector<absl::Status> results(kReaders);
  std::vector<std::thread> threads;
  for (int i = 0; i < kReaders; ++i) {
    threads.emplace_back([&, i] {
      RemoteShard shard;
      shard.location.address = absl::StrCat("w:", i);
      shard.item_bytes = 4;
      results[i] = chain.Read(shard, WholeBox({10}),
                              ReadTarget::HostArray(outs[i].data(), {10}, {0}));
    });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kReaders; ++i) {
    EXPECT_THAT(results[i], IsOk()) << "reader " << i;
    EXPECT_EQ(outs[i], std::string(40, '\0'));
  }
  EXPECT_EQ(chain.Stats().bytes.at("near"), kReaders * 40);
}

TEST(TransportChainMakeTest, AutoTriesSharedMemoryThenUcxThenTcpThenGrpc) {
  DataPlaneOptions options;
  const DataPlaneStats all = TransportChain::Make(nullptr, options)->Stats();
  EXPECT_EQ(all.bytes.size(), 4u);
  EXPECT_EQ(all.bytes.count("shm"), 1u);
  EXPECT_EQ(all.bytes.count("ucx"), 1u);
  EXPECT_EQ(all.bytes.count("tcp"), 1u);
  EXPECT_EQ(all.bytes.count("grpc"), 1u);
  options.shared_memory = false;
  const DataPlaneStats no_shm = TransportChain::Make(nullptr, options)->Stats();
  EXPECT_EQ(no_shm.bytes.size(), 3u);
  EXPECT_EQ(no_shm.bytes.count("shm"), 0u);
  options.ucx = false;
  options.tcp = false;
  const DataPlaneStats grpc = TransportChain::Make(nullptr, options)->Stats();
  ASSERT_EQ(grpc.bytes.size(), 1u);
  EXPECT_EQ(grpc.bytes.begin()->first, "grpc");
}

TEST(TransportChainMakeTest, AutoLeavesUcxOutUnderTlsUnlessTheFabricIsTrusted) {
  ChannelOptions tls;
  tls.credentials = grpc::SslCredentials(grpc::SslCredentialsOptions());
  ChannelCache channels(tls);
  DataPlaneOptions options;
  EXPECT_EQ(
      TransportChain::Make(&channels, options)->Stats().bytes.count("ucx"), 0u);
  // The data ports speak plaintext: never under TLS channels.
  EXPECT_EQ(
      TransportChain::Make(&channels, options)->Stats().bytes.count("tcp"), 0u);
  options.ucx_trusted_fabric = true;
  EXPECT_EQ(
      TransportChain::Make(&channels, options)->Stats().bytes.count("ucx"), 1u);
  options.ucx = false;  // still the caller's to turn off
  EXPECT_EQ(
      TransportChain::Make(&channels, options)->Stats().bytes.count("ucx"), 0u);
}

TEST_F(TransportChainTest, SmallWritesSkipALinkWithAWriteMinimum) {
  std::vector<TransportChain::Link> links;
  links.push_back(
      TransportChain::Link{std::make_unique<ScriptedTransport>(
                               "near", absl::OkStatus(), &near_calls_),
                           0, /*min_write_bytes=*/1000});
  links.push_back(TransportChain::Link{
      std::make_unique<ScriptedTransport>("far", absl::OkStatus(), &far_calls_),
      0});
  TransportChain chain(std::move(links));
  RemoteShard shard;
  shard.item_bytes = 4;
  std::string src(4000, 'a');
  shard.shape = {10};  // 40 bytes: skips "near"
  ASSERT_THAT(chain.Write(shard, WriteSource{src.data(), {10}, {0}}), IsOk());
  shard.shape = {1000};  // 4000 bytes
  ASSERT_THAT(chain.Write(shard, WriteSource{src.data(), {1000}, {0}}), IsOk());
  // Reads of any size still take it.
  ASSERT_THAT(ReadN(chain, 10), IsOk());
  EXPECT_EQ(far_calls_, 1);
  EXPECT_EQ(near_calls_, 2);
  EXPECT_EQ(chain.Stats().fallbacks.at("near"), 0);
}

TEST(TransportChainMakeTest, NamingATransportForcesItAlone) {
  for (const std::string name : {"shm", "ucx", "tcp", "grpc"}) {
    DataPlaneOptions options;
    options.transport = name;
    options.shared_memory = false;  // ignored when one is named
    options.ucx = false;
    const DataPlaneStats stats =
        TransportChain::Make(nullptr, options)->Stats();
    ASSERT_EQ(stats.bytes.size(), 1u) << name;
    EXPECT_EQ(stats.bytes.begin()->first, name);
  }
}

TEST(TransportChainMakeTest, UnknownTransportNamesAreRefused) {
  EXPECT_THAT(CheckTransportName("auto"), IsOk());
  EXPECT_THAT(CheckTransportName("ucx"), IsOk());
  EXPECT_THAT(CheckTransportName("rdma"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::HasSubstr("auto, shm, ucx, tcp or grpc")));
}

TEST(TransportChainForcedTest, FailuresNameTheTransportAndTheWorker) {
  int calls = 0;
  for (absl::Status answer : {absl::FailedPreconditionError("another host"),
                              absl::UnavailableError("connection refused")}) {
    std::vector<TransportChain::Link> links;
    links.push_back(TransportChain::Link{
        std::make_unique<ScriptedTransport>("shm", answer, &calls), 0});
    TransportChain chain(std::move(links), /*forced=*/true);
    RemoteShard shard;
    shard.location.worker = "w7";
    shard.location.address = "h:1";
    shard.item_bytes = 4;
    std::string out(40, 'x');
    EXPECT_THAT(chain.Read(shard, WholeBox({10}),
                           ReadTarget::HostArray(out.data(), {10}, {0})),
                StatusIs(answer.code(),
                         ::testing::AllOf(::testing::HasSubstr("shm transport"),
                                          ::testing::HasSubstr("w7"),
                                          ::testing::HasSubstr(
                                              std::string(answer.message())))));
  }
  // Other answers are the worker's own, untouched.
  std::vector<TransportChain::Link> links;
  links.push_back(
      TransportChain::Link{std::make_unique<ScriptedTransport>(
                               "shm", absl::NotFoundError("freed"), &calls),
                           0});
  TransportChain chain(std::move(links), /*forced=*/true);
  RemoteShard shard;
  shard.item_bytes = 4;
  std::string out(40, 'x');
  EXPECT_THAT(chain.Read(shard, WholeBox({10}),
                         ReadTarget::HostArray(out.data(), {10}, {0})),
              StatusIs(absl::StatusCode::kNotFound, "freed"));
}

}  // namespace
}  // namespace tessera
