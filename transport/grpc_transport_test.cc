#include "transport/grpc_transport.h"

#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/worker.grpc.pb.h"
#include "proto/worker.pb.h"
#include "rpc/channel.h"
#include "rpc/server.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::IsOkAndHolds;
using ::tessera::testing::StatusIs;
using ::testing::HasSubstr;

std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices)
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

TEST(RegionChunkTest, EncodedChunkParsesAsTheProtobufMessage) {
  grpc::ByteBuffer buffer;
  EncodeRegionChunk(
      1 << 20,
      {grpc::Slice(std::string("abc")), grpc::Slice(std::string("defg"))},
      &buffer);
  v1::ReadRegionResponse parsed;
  ASSERT_TRUE(parsed.ParseFromString(Flatten(buffer)));
  EXPECT_EQ(parsed.offset(), 1 << 20);
  EXPECT_EQ(parsed.data(), "abcdefg");
}

TEST(RegionChunkTest, DecodesProtobufSerializationSplitAcrossSlices) {
  v1::ReadRegionResponse message;
  message.set_offset(300);
  message.set_data(std::string(1000, 'x') + "yz");
  const std::string wire = message.SerializeAsString();
  // Cut the wire bytes into 7-byte slices, so fields straddle slice edges.
  std::vector<grpc::Slice> slices;
  for (size_t i = 0; i < wire.size(); i += 7)
    slices.emplace_back(wire.substr(i, 7));
  grpc::ByteBuffer buffer(slices.data(), slices.size());
  absl::StatusOr<RegionChunkView> view = DecodeRegionChunk(&buffer);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->offset, 300);
  EXPECT_EQ(view->size, 1002);
  std::string data;
  for (absl::string_view v : view->data) data.append(v.data(), v.size());
  EXPECT_EQ(data, message.data());
}

TEST(RegionChunkTest, ZeroOffsetAndEmptyDataRoundTrip) {
  grpc::ByteBuffer buffer;
  EncodeRegionChunk(0, {}, &buffer);
  absl::StatusOr<RegionChunkView> view = DecodeRegionChunk(&buffer);
  ASSERT_OK(view);
  EXPECT_EQ(view->offset, 0);
  EXPECT_EQ(view->size, 0);
}

TEST(RegionChunkTest, TruncatedMessageIsDataLoss) {
  const std::string wire = "\x12\x10short";  // says 16 bytes, has 5
  grpc::Slice slice(wire);
  grpc::ByteBuffer buffer(&slice, 1);
  EXPECT_EQ(DecodeRegionChunk(&buffer).status().code(),
            absl::StatusCode::kDataLoss);
}

// A data field whose length runs past the message, after a good one: refused,
// the length never added (it may be near 2^64).
TEST(RegionChunkTest, ALengthPastTheMessageIsDataLoss) {
  const std::string wire =
      std::string("\x12\x02ok\x12\xff\xff\xff\xff\xff\xff\xff\xff\x7f", 13) +
      "tail";
  grpc::Slice slice(wire);
  grpc::ByteBuffer buffer(&slice, 1);
  EXPECT_EQ(DecodeRegionChunk(&buffer).status().code(),
            absl::StatusCode::kDataLoss);
}

// One serialized ReadRegionResponse as a worker would send it.
grpc::ByteBuffer Chunk(int64_t offset, const std::string& data) {
  v1::ReadRegionResponse message;
  message.set_offset(offset);
  message.set_data(data);
  grpc::Slice slice(message.SerializeAsString());
  return grpc::ByteBuffer(&slice, 1);
}

// A RegionReceiver of a 12-byte read of 4-byte elements, and what its sink
// was given. Not movable: the receiver refers to the sink.
struct Receiving {
  Receiving() = default;
  Receiving(const Receiving&) = delete;
  Receiving& operator=(const Receiving&) = delete;

  std::vector<std::pair<int64_t, std::string>> calls;
  ChunkSink sink = [this](int64_t offset, absl::string_view data) {
    calls.emplace_back(offset, std::string(data));
    return absl::OkStatus();
  };
  RegionReceiver receiver{12, 4, sink};
};

TEST(RegionReceiverTest, ChunksThatContinueTheStreamAreDelivered) {
  Receiving r;
  grpc::ByteBuffer a = Chunk(0, "abcdefgh"), b = Chunk(8, "ijkl");
  ASSERT_THAT(r.receiver.Receive(&a), IsOk());
  EXPECT_THAT(r.receiver.Finish(), StatusIs(absl::StatusCode::kDataLoss,
                                            HasSubstr("after 8 of 12")));
  ASSERT_THAT(r.receiver.Receive(&b), IsOk());
  EXPECT_THAT(r.receiver.Finish(), IsOk());
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[1], std::make_pair(int64_t{8}, std::string("ijkl")));
}

TEST(RegionReceiverTest, ChunksThatDoNotFitTheBoxAreDataLossAndNotDelivered) {
  const std::vector<std::pair<int64_t, std::string>> lies = {
      {4, "abcd"},                 // skips bytes
      {-4, "abcd"},                // before the box
      {0, std::string(16, 'x')},   // more than the box holds
      {int64_t{1} << 62, "abcd"},  // far past it
      {0, "abc"},                  // not whole elements
  };
  for (const auto& [offset, data] : lies) {
    Receiving r;
    grpc::ByteBuffer message = Chunk(offset, data);
    EXPECT_THAT(r.receiver.Receive(&message),
                StatusIs(absl::StatusCode::kDataLoss))
        << offset << " " << data.size();
    for (const auto& [at, bytes] : r.calls) {
      EXPECT_GE(at, 0);
      EXPECT_LE(at + static_cast<int64_t>(bytes.size()), 12);
    }
  }
}

TEST(RegionReceiverTest, GarbageIsDataLoss) {
  Receiving r;
  grpc::Slice slice(
      std::string("\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"));
  grpc::ByteBuffer message(&slice, 1);
  EXPECT_THAT(r.receiver.Receive(&message),
              StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_TRUE(r.calls.empty());
}

TEST(RegionReceiverTest, AWholeReplyIsExactlyTheReadOrNothingIsDelivered) {
  const std::vector<std::pair<int64_t, std::string>> lies = {
      {0, "abcdefgh"},            // short
      {0, std::string(16, 'x')},  // long
      {4, "abcdefgh"},            // not from the start
      {0, std::string(10, 'x')},  // not whole elements, short
  };
  for (const auto& [offset, data] : lies) {
    Receiving r;
    grpc::ByteBuffer message = Chunk(offset, data);
    EXPECT_THAT(r.receiver.ReceiveWhole(&message),
                StatusIs(absl::StatusCode::kDataLoss,
                         HasSubstr("for a read of 12 bytes")))
        << offset << " " << data.size();
    EXPECT_TRUE(r.calls.empty()) << offset << " " << data.size();
  }
  Receiving r;
  grpc::ByteBuffer message = Chunk(0, "abcdefghijkl");
  ASSERT_THAT(r.receiver.ReceiveWhole(&message), IsOk());
  EXPECT_THAT(r.receiver.Finish(), IsOk());
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0],
            std::make_pair(int64_t{0}, std::string("abcdefghijkl")));
}

TEST(RegionBytesTest, RefusesWhatAReadCannotAskFor) {
  EXPECT_THAT(RegionBytes(Box{{0, 0}, {3, 4}}, 8), IsOkAndHolds(96));
  EXPECT_THAT(RegionBytes(Box{{0}, {3}}, 0),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(RegionBytes(Box{{0}, {3}}, kMaxItemBytes + 1),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(
      RegionBytes(Box{{0}, {-3}}, 4),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("negative")));
  EXPECT_THAT(RegionBytes(Box{{0, 0}, {int64_t{1} << 40, int64_t{1} << 40}}, 4),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

// A Worker service that answers reads with the chunks the test set, true or
// not: a real worker cannot be made to send chunks outside the box.
class LyingWorker : public v1::Worker::Service {
 public:
  void Set(std::vector<std::pair<int64_t, std::string>> chunks,
           bool small_too) {
    absl::MutexLock lock(&mu_);
    chunks_ = std::move(chunks);
    small_too_ = small_too;
  }
  // From now on: ReadSmallRegion answers NOT_FOUND, its first call only
  // once Release() is called; ReadSmallRegions answers `reply`.
  void HoldSmallReadsThenAnswer(std::pair<int64_t, std::string> reply) {
    absl::MutexLock lock(&mu_);
    small_not_found_ = true;
    hold_ = true;
    regions_reply_ = std::move(reply);
  }
  void AwaitHeldRead() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&held_));
  }
  void Release() {
    absl::MutexLock lock(&mu_);
    hold_ = false;
  }
  int regions_calls() {
    absl::MutexLock lock(&mu_);
    return regions_calls_;
  }
  grpc::Status ReadSmallRegions(grpc::ServerContext*,
                                const v1::ReadSmallRegionsRequest*,
                                v1::ReadRegionResponse* response) override {
    absl::MutexLock lock(&mu_);
    ++regions_calls_;
    response->set_offset(regions_reply_.first);
    response->set_data(regions_reply_.second);
    return grpc::Status::OK;
  }
  grpc::Status ReadRegion(
      grpc::ServerContext*, const v1::ReadRegionRequest*,
      grpc::ServerWriter<v1::ReadRegionResponse>* writer) override {
    for (const auto& [offset, data] : Chunks()) {
      v1::ReadRegionResponse message;
      message.set_offset(offset);
      message.set_data(data);
      if (!writer->Write(message)) break;
    }
    return grpc::Status::OK;
  }
  grpc::Status ReadSmallRegion(grpc::ServerContext*,
                               const v1::ReadRegionRequest*,
                               v1::ReadRegionResponse* response) override {
    absl::MutexLock lock(&mu_);
    if (small_not_found_) {
      held_ = true;
      auto released = [this]()
                          ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !hold_; };
      mu_.Await(absl::Condition(&released));
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "no such shard");
    }
    if (!small_too_ || chunks_.empty()) {
      return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "stream it");
    }
    response->set_offset(chunks_[0].first);
    response->set_data(chunks_[0].second);
    return grpc::Status::OK;
  }

 private:
  std::vector<std::pair<int64_t, std::string>> Chunks() {
    absl::MutexLock lock(&mu_);
    return chunks_;
  }
  absl::Mutex mu_;
  std::vector<std::pair<int64_t, std::string>> chunks_ ABSL_GUARDED_BY(mu_);
  bool small_too_ ABSL_GUARDED_BY(mu_) = false;
  bool small_not_found_ ABSL_GUARDED_BY(mu_) = false;
  bool hold_ ABSL_GUARDED_BY(mu_) = false;
  bool held_ ABSL_GUARDED_BY(mu_) = false;
  std::pair<int64_t, std::string> regions_reply_ ABSL_GUARDED_BY(mu_);
  int regions_calls_ ABSL_GUARDED_BY(mu_) = 0;
};

class GrpcTransportLyingWorkerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<RunningServer> server =
        StartServer("127.0.0.1:0", {&worker_});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    transport_ =
        std::make_unique<GrpcTransport>(&channels_, GrpcTransportOptions{});
    shard_.location.address = absl::StrCat("127.0.0.1:", server_.port);
    shard_.location.shard_id = 1;
    shard_.item_bytes = 4;
  }
  void TearDown() override {
    transport_.reset();
    if (server_.server != nullptr) server_.server->Shutdown();
  }

  // Reads a 2x3 box into the middle of a guarded array: the 24 bytes of
  // the box lie between 64 guard bytes on each side, which must stay 'G'.
  absl::Status Read() { return ReadInto(buffer_); }
  absl::Status ReadInto(std::string& buffer) {
    buffer.assign(64 + 24 + 64, 'G');
    return transport_->Read(
        shard_, Box{{0, 0}, {2, 3}},
        ReadTarget::HostArray(buffer.data() + 64, {2, 3}, {0, 0}));
  }
  bool GuardsIntact() const {
    for (int i = 0; i < 64; ++i) {
      if (buffer_[i] != 'G' || buffer_[64 + 24 + i] != 'G') return false;
    }
    return true;
  }

  LyingWorker worker_;
  RunningServer server_;
  ChannelCache channels_;
  std::unique_ptr<GrpcTransport> transport_;
  RemoteShard shard_;
  std::string buffer_;
};

TEST_F(GrpcTransportLyingWorkerTest, TruthfulChunksAreRead) {
  worker_.Set({{0, std::string(16, 'a')}, {16, std::string(8, 'b')}},
              /*small_too=*/false);
  ASSERT_THAT(Read(), IsOk());
  EXPECT_EQ(buffer_.substr(64, 24), std::string(16, 'a') + std::string(8, 'b'));
  EXPECT_TRUE(GuardsIntact());
}

TEST_F(GrpcTransportLyingWorkerTest, ChunksOutsideTheBoxAreDataLoss) {
  const std::vector<std::vector<std::pair<int64_t, std::string>>> lies = {
      {{0, std::string(4096, 'x')}},  // too much
      {{0, std::string(16, 'a')}, {16, std::string(64, 'x')}},
      {{8, std::string(8, 'x')}},                             // skips
      {{-64, std::string(64, 'x')}},                          // before the box
      {{0, std::string(16, 'a')}, {0, std::string(8, 'x')}},  // repeats
      {{0, std::string(10, 'x')}},                            // half an element
      {{0, std::string(16, 'a')}},                            // ends early
  };
  for (bool small : {false, true}) {
    for (const auto& chunks : lies) {
      worker_.Set(chunks, small);
      absl::Status status = Read();
      EXPECT_THAT(status, StatusIs(absl::StatusCode::kDataLoss))
          << chunks.size() << " chunks, first " << chunks[0].second.size();
      EXPECT_TRUE(GuardsIntact());
    }
  }
}

// Two reads wait behind a held one and go out together; the worker's reply
// to both is short. Nothing of it may land: each read is asked again alone
// (answered NOT_FOUND here), and its array holds no byte of the bad reply.
TEST_F(GrpcTransportLyingWorkerTest, AShortCoalescedReplyLandsNoByte) {
  worker_.HoldSmallReadsThenAnswer({0, std::string(8, 'x')});
  absl::Status first_status;
  std::string first;
  std::thread held([&] { first_status = ReadInto(first); });
  worker_.AwaitHeldRead();
  std::string a, b;
  absl::Status a_status, b_status;
  std::thread ta([&] { a_status = ReadInto(a); });
  std::thread tb([&] { b_status = ReadInto(b); });
  while (transport_->waiting_small_reads() < 2)
    absl::SleepFor(absl::Milliseconds(1));
  worker_.Release();
  held.join();
  ta.join();
  tb.join();
  EXPECT_EQ(worker_.regions_calls(), 1);
  EXPECT_EQ(transport_->coalesced_calls(), 1);
  EXPECT_THAT(first_status, StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(a_status, StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(b_status, StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(a, std::string(64 + 24 + 64, 'G'));
  EXPECT_EQ(b, std::string(64 + 24 + 64, 'G'));
}

}  // namespace
}  // namespace tessera
