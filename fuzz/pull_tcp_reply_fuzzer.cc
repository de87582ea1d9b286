// Fuzzes what a worker's data port can answer a reader over TCP (a client's
// get, a worker pulling a reshard piece): a stand-in worker on 127.0.0.1
// takes TcpTransport's request and answers it with arbitrary bytes, then
// closes; the read lands in a host array with margins around the box, or
// in a sink.
//
// Input: records (fuzz_util.h).
//   op 0  the read: [item: 1 + byte % 8] [rank: 1 + byte % 3] then per dim
//         [size: byte % 9] [margin before: byte % 3] [margin after:
//         byte % 3], and [flags] bit 0: a sink target
//   op 1  reply bytes, raw
//   op 2  a well-formed reply header: [code: byte % 18] [message bytes:
//         byte] [payload: 0 the read's size, else byte] then the bytes
// Invariants beyond "no crash, no UB, no hang": bytes outside the box never
// change; an OK read has exactly the reply's payload at the box's places;
// a sink sees element-aligned, in-order ranges inside the box.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/internal/endian.h"
#include "absl/strings/str_cat.h"
#include "core/box.h"
#include "core/strided_copy.h"
#include "fuzz/fuzz_util.h"
#include "transport/tcp_transport.h"
#include "transport/tcp_wire.h"

namespace tessera {
namespace {

constexpr char kUntouched = static_cast<char>(0xA5);

struct Read {
  int64_t item = 4;
  Box box;
  Shape dst_shape;
  std::vector<int64_t> dst_offsets;
  bool sink = false;
};

Read ParseRead(absl::string_view bytes) {
  size_t pos = 0;
  auto next = [&]() -> uint8_t {
    return pos < bytes.size() ? static_cast<uint8_t>(bytes[pos++]) : 0;
  };
  Read r;
  r.item = 1 + next() % 8;
  const int rank = 1 + next() % 3;
  for (int d = 0; d < rank; ++d) {
    const int64_t size = next() % 9;
    const int64_t before = next() % 3;
    const int64_t after = next() % 3;
    r.box.offsets.push_back(0);
    r.box.sizes.push_back(size);
    r.dst_offsets.push_back(before);
    r.dst_shape.push_back(before + size + after);
  }
  r.sink = next() & 1;
  return r;
}

// A listening socket on 127.0.0.1, made once.
std::pair<int, int> Listener() {
  static const std::pair<int, int> listener = [] {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        listen(fd, 16) != 0) {
      fuzz::Fail("listen");
    }
    socklen_t len = sizeof(addr);
    getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    return std::make_pair(fd, static_cast<int>(ntohs(addr.sin_port)));
  }();
  return listener;
}

// The stand-in worker: takes one connection, reads the preface and one
// request, sends `reply`, closes.
void Answer(int listen_fd, const std::string& reply) {
  const int fd = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd < 0) return;
  char head[kDataPrefaceBytes + kDataHeaderBytes];
  if (ReceiveFully(fd, head, sizeof(head), absl::Seconds(5), "reader").ok()) {
    std::string meta(absl::little_endian::Load32(head + kDataPrefaceBytes + 4),
                     '\0');
    if (ReceiveFully(fd, meta.data(), meta.size(), absl::Seconds(5), "reader")
            .ok()) {
      const iovec part{const_cast<char*>(reply.data()), reply.size()};
      (void)SendFully(fd, absl::MakeConstSpan(&part, 1), absl::Seconds(5),
                      "reader");
    }
  }
  close(fd);
}

}  // namespace
}  // namespace tessera

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  Read read = ParseRead("");
  std::string reply;
  fuzz::Records records(data, size);
  uint8_t op;
  absl::string_view bytes;
  while (records.Next(&op, &bytes)) {
    switch (op % 3) {
      case 0:
        read = ParseRead(bytes);
        break;
      case 1:
        reply.append(bytes.data(), bytes.size());
        break;
      case 2: {
        size_t pos = 0;
        auto next = [&]() -> uint8_t {
          return pos < bytes.size() ? static_cast<uint8_t>(bytes[pos++]) : 0;
        };
        const uint32_t code = next() % 18;
        const uint32_t message = next();
        const uint8_t payload = next();
        char header[kDataHeaderBytes];
        absl::little_endian::Store32(header, code);
        absl::little_endian::Store32(header + 4, message);
        absl::little_endian::Store64(
            header + 8, payload == 0 ? static_cast<uint64_t>(
                                           read.box.NumElements() * read.item)
                                     : payload);
        reply.append(header, sizeof(header));
        reply.append(bytes.substr(pos).data(), bytes.size() - pos);
        break;
      }
    }
  }
  const auto [listen_fd, port] = Listener();
  std::thread worker([&, fd = listen_fd] { Answer(fd, reply); });

  TcpTransportOptions options;
  options.timeout = absl::Seconds(5);
  options.resolve =
      [port = port](const std::string&) -> absl::StatusOr<std::string> {
    return absl::StrCat("127.0.0.1:", port);
  };
  TcpTransport transport(nullptr, options);
  RemoteShard shard;
  shard.location.address = "w0";
  shard.location.shard_id = 1;
  shard.item_bytes = read.item;
  int64_t dst_elements = 1;
  for (int64_t d : read.dst_shape) dst_elements *= d;
  const size_t item = static_cast<size_t>(read.item);
  std::string dst(static_cast<size_t>(dst_elements) * item, kUntouched);
  int64_t next_element = 0;
  const int64_t total = read.box.NumElements();
  const ReadTarget target =
      read.sink ? ReadTarget::Sink([&](int64_t first, int64_t count,
                                       const char* bytes_in) {
        FUZZ_CHECK(
            first == next_element && count >= 0 && first + count <= total,
            "a sink range out of order or outside the box");
        CopyFlatRangeToBox(bytes_in, first, count, read.box.sizes, dst.data(),
                           read.dst_shape, read.dst_offsets, item);
        next_element = first + count;
        return absl::OkStatus();
      })
                : ReadTarget::HostArray(dst.data(), read.dst_shape,
                                        read.dst_offsets);
  const absl::Status status = transport.Read(shard, read.box, target);
  worker.join();

  // Outside the box nothing changed; an OK read holds the payload.
  std::string want(dst.size(), kUntouched);
  if (status.ok() && total > 0) {
    const std::string payload =
        reply.substr(kDataHeaderBytes, static_cast<size_t>(total) * item);
    FUZZ_CHECK(payload.size() == static_cast<size_t>(total) * item,
               "an OK read of fewer bytes than the box");
    CopyFlatRangeToBox(payload.data(), 0, total, read.box.sizes, want.data(),
                       read.dst_shape, read.dst_offsets, item);
    FUZZ_CHECK(dst == want, "an OK read's bytes are not the reply's");
  } else {
    std::string inside(dst.size(), '\0');
    if (total > 0) {
      std::string ones(static_cast<size_t>(total) * item, '\x01');
      CopyFlatRangeToBox(ones.data(), 0, total, read.box.sizes, inside.data(),
                         read.dst_shape, read.dst_offsets, item);
    }
    for (size_t i = 0; i < dst.size(); ++i) {
      if (inside[i] == 0)
        FUZZ_CHECK(dst[i] == kUntouched, "a byte outside the box changed");
    }
  }
  return 0;
}
