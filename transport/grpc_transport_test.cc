#include "transport/grpc_transport.h"

#include <string>
#include <vector>

#include "core/testing/status_matchers.h"
#include "gtest/gtest.h"
#include "proto/worker.pb.h"

namespace tessera {
namespace {

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

}  // namespace
}  // namespace tessera
