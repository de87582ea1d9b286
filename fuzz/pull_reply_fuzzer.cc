// Fuzzes what a peer's reply can do to a worker pulling a reshard piece (or
// a client reading a region) over gRPC: arbitrary ReadRegion messages, cut
// into arbitrary slices as gRPC may hand them over, go through the
// receiving side exactly as ReadRegion runs it, without a network:
// RegionBytes for the request, a RegionReceiver per stream, and
// SinkToTarget placing the bytes into the destination shard's host array at
// the piece's offsets (WorkerNode::Transfer's Receiver), or a sink (its
// WriteBox path).
//
// Input: records (fuzz_util.h).
//   op 0  the piece: [item bytes: byte % 17, 0 included] [rank: 1..4]
//         then per dim [size: % 9] [margin before: % 3] [margin after: % 3]
//         (the destination shard is the box plus its margins), and
//         [flags] bit 0: a sink target instead of a host array
//   op 1  one message as raw bytes
//   op 2  one well-formed message: [offset: 8 bytes LE] then the data, as
//         EncodeRegionChunk writes it
//   op 3  EncodeRegionChunk / DecodeRegionChunk round trip of
//         [offset: 8 bytes LE] data
// Bits 2..7 of op 1 and 2 give the slice length the message is cut into
// (0: one slice). Messages are fed in order until one is refused, as the
// stream would be cancelled then.
// Invariants beyond "no crash, no UB": the sink sees element-aligned,
// contiguous ranges from byte 0 that stay inside the box; the destination
// holds exactly the delivered bytes at their places and nothing else
// changes (margins included); Finish is OK exactly when every byte came.
// A lone message is also taken as a unary reply (ReceiveWhole): all of the
// box or no byte.
#include <grpcpp/grpcpp.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/box.h"
#include "fuzz/fuzz_util.h"
#include "transport/grpc_transport.h"
#include "transport/shard_transport.h"

namespace tessera {
namespace {

constexpr char kUntouched = static_cast<char>(0xA5);

struct Piece {
  int64_t item = 4;
  Box box;                           // in the source shard; offsets 0
  Shape dst_shape;                   // the destination shard
  std::vector<int64_t> dst_offsets;  // where the box lands in it
  bool sink = false;
};

Piece ParsePiece(absl::string_view bytes) {
  size_t pos = 0;
  auto next = [&]() -> uint8_t {
    return pos < bytes.size() ? static_cast<uint8_t>(bytes[pos++]) : 0;
  };
  Piece p;
  p.item = next() % 17;
  const int rank = next() % 4 + 1;
  for (int d = 0; d < rank; ++d) {
    const int64_t size = next() % 9, before = next() % 3, after = next() % 3;
    p.box.offsets.push_back(0);
    p.box.sizes.push_back(size);
    p.dst_shape.push_back(before + size + after);
    p.dst_offsets.push_back(before);
  }
  p.sink = next() & 1;
  return p;
}

int64_t Le64(absl::string_view bytes) {
  uint64_t v = 0;
  for (size_t i = 0; i < 8 && i < bytes.size(); ++i)
    v |= static_cast<uint64_t>(static_cast<uint8_t>(bytes[i])) << (8 * i);
  return static_cast<int64_t>(v);
}

std::vector<grpc::Slice> Cut(absl::string_view bytes, size_t slice) {
  std::vector<grpc::Slice> slices;
  if (slice == 0) slice = bytes.size() + 1;
  for (size_t i = 0; i < bytes.size(); i += slice) {
    const std::string part(bytes.substr(i, slice));
    slices.emplace_back(part);
  }
  return slices;
}

grpc::ByteBuffer Buffer(std::vector<grpc::Slice> slices) {
  if (slices.empty()) return grpc::ByteBuffer();
  return grpc::ByteBuffer(slices.data(), slices.size());
}

// Where flat element `e` of the row-major box lands in the destination.
int64_t DstByte(const Piece& p, int64_t e) {
  int64_t at = 0, stride = p.item;
  for (size_t d = p.box.rank(); d-- > 0;) {
    at += (p.dst_offsets[d] + e % p.box.sizes[d]) * stride;
    e /= p.box.sizes[d];
    stride *= p.dst_shape[d];
  }
  return at;
}

void RoundTrip(absl::string_view bytes, size_t slice) {
  const int64_t offset = Le64(bytes);
  const absl::string_view data = bytes.size() > 8 ? bytes.substr(8) : "";
  grpc::ByteBuffer buffer;
  EncodeRegionChunk(offset, Cut(data, slice), &buffer);
  absl::StatusOr<RegionChunkView> view = DecodeRegionChunk(&buffer);
  FUZZ_CHECK(view.ok(), view.status().ToString());
  FUZZ_CHECK(view->offset == offset, "offset changed");
  std::string back;
  for (absl::string_view v : view->data) back.append(v.data(), v.size());
  FUZZ_CHECK(back == data && view->size == static_cast<int64_t>(data.size()),
             "data changed");
}

// whole: the one message is a unary reply (RegionReceiver::ReceiveWhole),
// which delivers all of the box or nothing.
void Pull(const Piece& p, const std::vector<grpc::ByteBuffer*>& messages,
          bool whole) {
  absl::StatusOr<int64_t> total = RegionBytes(p.box, p.item);
  if (!total.ok()) {
    FUZZ_CHECK(p.item == 0, "RegionBytes refused a valid piece: " +
                                total.status().ToString());
    return;
  }
  int64_t dst_bytes = p.item;
  for (int64_t d : p.dst_shape) dst_bytes *= d;
  std::vector<char> dst(static_cast<size_t>(dst_bytes), kUntouched);
  std::vector<char> expected = dst;

  int64_t next = 0;  // the byte the sink must get next
  ReadTarget target =
      p.sink ? ReadTarget::Sink([&](int64_t first, int64_t count,
                                    const char* data) {
        FUZZ_CHECK(
            first * p.item == next - count * p.item && count > 0,
            absl::StrCat("sink got elements [", first, ", +", count, ")"));
        for (int64_t e = 0; e < count; ++e) {
          std::memcpy(dst.data() + DstByte(p, first + e), data + e * p.item,
                      p.item);
        }
        return absl::OkStatus();
      })
             : ReadTarget::HostArray(dst.data(), p.dst_shape, p.dst_offsets);
  const ChunkSink place = SinkToTarget(p.box, p.item, target);
  const ChunkSink sink = [&](int64_t byte_offset, absl::string_view data) {
    FUZZ_CHECK(byte_offset == next,
               absl::StrCat("bytes at ", byte_offset, ", expected ", next));
    FUZZ_CHECK(data.size() % p.item == 0 && !data.empty(),
               absl::StrCat(data.size(), " bytes of ", p.item, "-byte items"));
    FUZZ_CHECK(byte_offset + static_cast<int64_t>(data.size()) <= *total,
               absl::StrCat("bytes [", byte_offset, ", +", data.size(),
                            ") past the ", *total, "-byte box"));
    for (size_t e = 0; e < data.size() / p.item; ++e) {
      std::memcpy(expected.data() + DstByte(p, byte_offset / p.item + e),
                  data.data() + e * p.item, p.item);
    }
    next = byte_offset + static_cast<int64_t>(data.size());
    return place(byte_offset, data);
  };
  RegionReceiver receiver(*total, p.item, sink);
  bool refused = false;
  if (whole) {
    refused = !receiver.ReceiveWhole(messages[0]).ok();
    FUZZ_CHECK(next == (refused ? 0 : *total),
               absl::StrCat("a whole reply delivered ", next, " of ", *total,
                            " bytes"));
  } else {
    for (grpc::ByteBuffer* message : messages) {
      if (!receiver.Receive(message).ok()) {
        refused = true;
        break;
      }
      FUZZ_CHECK(receiver.received() == next, "received is not what came");
    }
  }
  FUZZ_CHECK(dst == expected, "the destination differs from what arrived");
  if (!refused) {
    FUZZ_CHECK(receiver.Finish().ok() == (next == *total),
               receiver.Finish().ToString());
  }
}

}  // namespace
}  // namespace tessera

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tessera::fuzz::Records records(data, size);
  tessera::Piece piece = tessera::ParsePiece("");
  std::vector<grpc::ByteBuffer> buffers;
  buffers.reserve(64);
  uint8_t op;
  absl::string_view bytes;
  while (records.Next(&op, &bytes) && buffers.size() < 64) {
    const size_t slice = op >> 2;
    switch (op & 3) {
      case 0:
        piece = tessera::ParsePiece(bytes);
        break;
      case 1:
        buffers.push_back(tessera::Buffer(tessera::Cut(bytes, slice)));
        break;
      case 2: {
        grpc::ByteBuffer buffer;
        tessera::EncodeRegionChunk(
            tessera::Le64(bytes),
            tessera::Cut(bytes.size() > 8 ? bytes.substr(8) : "", slice),
            &buffer);
        buffers.push_back(std::move(buffer));
        break;
      }
      default:
        tessera::RoundTrip(bytes, slice);
        break;
    }
  }
  std::vector<grpc::ByteBuffer*> messages;
  for (grpc::ByteBuffer& b : buffers) messages.push_back(&b);
  tessera::Pull(piece, messages, /*whole=*/false);
  if (messages.size() == 1) tessera::Pull(piece, messages, /*whole=*/true);
  return 0;
}
