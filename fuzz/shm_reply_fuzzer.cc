// Fuzzes what a worker's MapShard reply can do to a same-host reader: an
// arbitrary reply and an arbitrary segment (a real memfd object of
// arbitrary bytes and size) go through the client's steps after the RPC,
// exactly as SharedMemoryTransport runs them: ValidateMapShardReply, then
// MapSegmentRange of the whole segment (a cached mapping) or MapSegmentBox
// of the box's span (a per-read one, as a worker pulling a piece maps it),
// then CopyBoxFromMapping into a host array or a sink; or, for a put,
// MapSegmentRange read-write and CopyShardToMapping.
//
// Input: records (fuzz_util.h).
//   op 0  the reply: a serialized tessera.v1.MapShardResponse. Its host_id is
//         compared with kHost ("fuzz-host"); bit 7 of op replaces it with
//         kHost, so most inputs get past that check.
//   op 1  the segment's bytes (the object is then cut or zero-extended to
//         the size in the parameters)
//   op 2  the parameters, read byte by byte (missing bytes are 0):
//         [flags] bit 0 whole-segment mapping (else the box's span),
//                 bit 1 sink target (else a host array), bit 2 the caller
//                 knows the shard's shape, bit 3 a write instead of a read
//         [item bytes] 1..16 (byte % 16 + 1)
//         [file size: 3 bytes LE] the segment object's size (< 1 MiB)
//         [rank] 0..4 (byte % 5), then per dim: [offset: int8] [size: uint8]
//         [expected shape] per dim one uint8
// Invariants beyond "no crash, no UB": a read that succeeds delivers
// exactly the box's bytes of the segment as the reply's shape lays them
// out; INTERNAL only for a reply ValidateMapShardReply refused; a
// consistent reply, over a large enough object, for a box inside the shape
// the caller expects is read without error.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/box.h"
#include "fuzz/fuzz_util.h"
#include "google/protobuf/stubs/logging.h"
#include "proto/worker.pb.h"
#include "transport/shard_transport.h"
#include "transport/shared_memory.h"

namespace tessera {
namespace {

constexpr char kHost[] = "fuzz-host";
constexpr int64_t kMaxFileBytes = (int64_t{1} << 20) - 1;
constexpr int64_t kMaxArrayBytes = int64_t{1} << 20;

struct Params {
  bool whole = false;
  bool sink = false;
  bool shape_known = false;
  bool write = false;
  int64_t item = 1;
  int64_t file_bytes = 0;
  Box box;
  Shape expected;
};

Params ParseParams(absl::string_view bytes) {
  size_t pos = 0;
  auto next = [&]() -> uint8_t {
    return pos < bytes.size() ? static_cast<uint8_t>(bytes[pos++]) : 0;
  };
  Params p;
  const uint8_t flags = next();
  p.whole = flags & 1;
  p.sink = flags & 2;
  p.shape_known = flags & 4;
  p.write = flags & 8;
  p.item = next() % 16 + 1;
  p.file_bytes = next();
  p.file_bytes |= int64_t{next()} << 8;
  p.file_bytes |= int64_t{next()} << 16;
  p.file_bytes &= kMaxFileBytes;
  const int rank = next() % 5;
  for (int d = 0; d < rank; ++d) {
    p.box.offsets.push_back(static_cast<int8_t>(next()));
    p.box.sizes.push_back(next());
  }
  if (p.shape_known) {
    for (int d = 0; d < rank; ++d) p.expected.push_back(next());
  }
  return p;
}

// The bytes the object holds: `content` cut or zero-extended to `size`.
std::string FileBytes(absl::string_view content, int64_t size) {
  std::string out(content.substr(0, static_cast<size_t>(size)));
  out.resize(static_cast<size_t>(size), '\0');
  return out;
}

// Byte offset in the segment of element `flat` (row-major over the box) of
// `box`, laid out row-major over `shape`.
int64_t SegmentOffset(const Shape& shape, const Box& box, int64_t flat,
                      int64_t item) {
  int64_t offset = 0, stride = item;
  for (size_t d = shape.size(); d-- > 0;) {
    const int64_t i = flat % box.sizes[d];
    flat /= box.sizes[d];
    offset += (box.offsets[d] + i) * stride;
    stride *= shape[d];
  }
  return offset;
}

// A read's bytes against the segment's.
void CheckElements(const std::string& file, const Shape& shape, const Box& box,
                   int64_t item, int64_t first, int64_t count,
                   const char* data) {
  for (int64_t e = 0; e < count; ++e) {
    const int64_t at = SegmentOffset(shape, box, first + e, item);
    FUZZ_CHECK(at >= 0 && at + item <= static_cast<int64_t>(file.size()),
               absl::StrCat("element ", first + e, " at byte ", at));
    FUZZ_CHECK(std::memcmp(file.data() + at, data + e * item, item) == 0,
               absl::StrCat("element ", first + e, " of box ", box.ToString()));
  }
}

bool Inside(const Shape& shape, const Box& box) {
  if (shape.size() != box.rank()) return false;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (box.offsets[d] < 0 || box.offsets[d] + box.sizes[d] > shape[d])
      return false;
  }
  return true;
}

void Run(const v1::MapShardResponse& reply, absl::string_view content,
         const Params& p) {
  const std::string file = FileBytes(content, p.file_bytes);
  const int fd = memfd_create("shm_reply_fuzzer", MFD_CLOEXEC);
  if (fd < 0) return;
  if (!file.empty() && write(fd, file.data(), file.size()) !=
                           static_cast<ssize_t>(file.size())) {
    close(fd);
    return;
  }
  absl::StatusOr<SharedSegment> segment =
      ValidateMapShardReply(reply, kHost, p.item);
  absl::Status status = segment.status();
  std::vector<char> array;
  if (segment.ok() && p.write) {
    if (p.expected.empty()) {
      close(fd);
      return;  // a put always knows the shard's shape
    }
    absl::StatusOr<std::unique_ptr<ShardMapping>> mapping =
        MapSegmentRange(fd, *segment, 0, segment->bytes, /*writable=*/true);
    status = mapping.status();
    if (mapping.ok()) {
      const int64_t bytes = WholeBox(p.expected).NumElements() * p.item;
      if (bytes > kMaxArrayBytes) {
        close(fd);
        return;
      }
      std::vector<char> source(static_cast<size_t>(bytes), 'w');
      WriteSource from{source.data(), p.expected,
                       std::vector<int64_t>(p.expected.size(), 0)};
      status = CopyShardToMapping(**mapping, p.expected, from, p.item);
      if (status.ok() && bytes > 0) {
        std::vector<char> back(static_cast<size_t>(bytes));
        FUZZ_CHECK(pread(fd, back.data(), back.size(), 0) ==
                       static_cast<ssize_t>(back.size()),
                   "reading back a write");
        FUZZ_CHECK(back == source, "a write landed elsewhere");
      }
    }
  } else if (segment.ok()) {
    absl::StatusOr<std::unique_ptr<ShardMapping>> mapping =
        p.whole ? MapSegmentRange(fd, *segment, 0, segment->bytes,
                                  /*writable=*/false)
                : MapSegmentBox(fd, *segment, p.box, p.item);
    status = mapping.status();
    if (mapping.ok()) {
      bool sized = true;
      int64_t elements = 1;
      for (int64_t s : p.box.sizes) {
        if (s < 0) sized = false;
        elements *= s;
      }
      const int64_t bytes = elements * p.item;
      if (p.sink || !sized || bytes > kMaxArrayBytes) {
        int64_t next_first = 0;
        status = CopyBoxFromMapping(
            **mapping, p.expected, p.box,
            ReadTarget::Sink([&](int64_t first, int64_t count,
                                 const char* data) {
              FUZZ_CHECK(
                  first == next_first && count > 0 && first + count <= elements,
                  absl::StrCat("sink got [", first, ", +", count, ")"));
              next_first = first + count;
              CheckElements(file, segment->shape, p.box, p.item, first, count,
                            data);
              return absl::OkStatus();
            }),
            p.item);
        if (status.ok()) {
          FUZZ_CHECK(next_first == elements, "the sink did not get the box");
        }
      } else {
        array.assign(static_cast<size_t>(bytes), '\0');
        const Shape sizes(p.box.sizes.begin(), p.box.sizes.end());
        status = CopyBoxFromMapping(
            **mapping, p.expected, p.box,
            ReadTarget::HostArray(array.data(), sizes,
                                  std::vector<int64_t>(sizes.size(), 0)),
            p.item);
        if (status.ok()) {
          CheckElements(file, segment->shape, p.box, p.item, 0, elements,
                        array.data());
        }
      }
    }
  }
  close(fd);
  if (absl::IsInternal(status)) {
    FUZZ_CHECK(!segment.ok(),
               "INTERNAL for a consistent reply: " + status.ToString());
  }
  // A consistent reply over an object large enough, for a box inside the
  // shape the caller expects, must be read.
  if (segment.ok() && !p.write && p.box.rank() > 0 &&
      static_cast<int64_t>(file.size()) >= segment->bytes &&
      (p.expected.empty() || p.expected == segment->shape) &&
      Inside(segment->shape, p.box)) {
    FUZZ_CHECK(status.ok(), "a true reply failed: " + status.ToString());
  }
}

}  // namespace
}  // namespace tessera

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Replies with strings that are not UTF-8 are refused; quietly.
  google::protobuf::SetLogHandler(
      [](google::protobuf::LogLevel, const char*, int, const std::string&) {});
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tessera::fuzz::Records records(data, size);
  tessera::v1::MapShardResponse reply;
  std::string content;
  std::string params;
  uint8_t op;
  absl::string_view bytes;
  while (records.Next(&op, &bytes)) {
    switch (op & 3) {
      case 0:
        if (!reply.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())))
          return 0;
        if (op & 0x80) reply.set_host_id(tessera::kHost);
        break;
      case 1:
        content = std::string(bytes);
        break;
      case 2:
        params = std::string(bytes);
        break;
      default:
        break;
    }
  }
  tessera::Run(reply, content, tessera::ParseParams(params));
  return 0;
}
