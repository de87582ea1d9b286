// Fuzzes a worker's data port (worker/data_port.h) as a stranger on the
// network reaches it: a real DataPort on 127.0.0.1 serving a real
// WorkerNode, sent arbitrary byte streams over a real TCP connection, some
// of them well-formed requests with valid capabilities (so that the
// handlers behind the parser run too).
//
// Input: records (fuzz_util.h), appended to the stream in order:
//   op 0  raw bytes
//   op 1  the preface
//   op 2  a request: [op: byte % 4] [grant: byte % 4: read, write, another
//         tensor's, none] [shard: byte % 4] [rank: byte % 4] then per dim
//         [offset: byte % 20] [size: byte % 20], [item: byte % 9], and
//         [payload: byte] bytes of payload announced, [send: byte & 1]
//         whether they follow
// Invariants beyond "no crash, no UB, no hang": a stream that does not
// open with the preface gets no byte back; every reply the worker sends
// parses (a known code, a bounded message); and the port ends up with no
// connection open once its peers are gone.
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "absl/base/internal/endian.h"
#include "absl/time/clock.h"
#include "core/capability.h"
#include "core/init_fill.h"
#include "fuzz/fuzz_util.h"
#include "transport/shared_memory_arena.h"
#include "transport/tcp_wire.h"
#include "worker/data_port.h"
#include "worker/host_shard_store.h"
#include "worker/worker_node.h"

namespace tessera {
namespace {

constexpr char kKey[] = "data-port-fuzz-key";

struct World {
  std::unique_ptr<HostShardStore> store;
  std::unique_ptr<WorkerNode> node;
  std::unique_ptr<DataPort> port;
};

World& TheWorld() {
  static World* world = [] {
    auto* w = new World;
    HostShardStoreOptions options;
    options.arena = std::make_shared<SharedMemoryArena>();
    w->store = std::make_unique<HostShardStore>(options);
    WorkerNodeOptions node_options;
    node_options.arena = options.arena;
    w->node = std::make_unique<WorkerNode>(w->store.get(), node_options);
    w->node->SetIdentity("w0", kKey);
    const Shape shapes[] = {{16, 8}, {64}, {4, 5, 6}};
    for (uint64_t id = 1; id <= 3; ++id) {
      ShardDesc desc;
      desc.tensor = "t";
      desc.version = 1;
      desc.writable = true;
      desc.change = 7;
      desc.dtype = id == 2 ? DType::kInt16 : DType::kFloat32;
      desc.tensor_shape = shapes[id - 1];
      desc.box = WholeBox(shapes[id - 1]);
      (void)w->store->Allocate(id, desc, InitSpec{InitSpec::Kind::kArange});
    }
    DataPortOptions port_options;
    port_options.idle_timeout = absl::Milliseconds(200);
    port_options.stall_timeout = absl::Milliseconds(200);
    absl::StatusOr<std::unique_ptr<DataPort>> port =
        DataPort::Start(w->node.get(), port_options);
    if (!port.ok())
      fuzz::Fail("data port", std::string(port.status().message()));
    w->port = *std::move(port);
    return w;
  }();
  return *world;
}

std::string Grant(int kind) {
  if (kind == 3) return "";
  Capability grant;
  grant.worker = "w0";
  grant.tensor = kind == 2 ? "other" : "t";
  grant.version = 1;
  grant.change = 7;
  grant.rights = kind == 1 ? kRightWrite : kRightRead;
  grant.expires_ms = absl::ToUnixMillis(absl::Now() + absl::Hours(1));
  return MintCapability(grant, kKey);
}

std::string Request(absl::string_view bytes) {
  size_t pos = 0;
  auto next = [&]() -> uint8_t {
    return pos < bytes.size() ? static_cast<uint8_t>(bytes[pos++]) : 0;
  };
  const uint32_t op = next() % 4;
  v1::DataRequest request;
  request.set_capability(Grant(next() % 4));
  const uint64_t shard = next() % 4;
  const int rank = next() % 4;
  if (op == static_cast<uint32_t>(DataOp::kReadRows)) {
    v1::DataRows* rows = request.add_rows();
    rows->set_shard_id(shard);
    for (int d = 0; d < rank + 1; ++d) rows->add_rows(next() % 20);
  } else {
    request.set_shard_id(shard);
    for (int d = 0; d < rank; ++d) {
      request.add_offsets(next() % 20);
      request.add_sizes(next() % 20);
    }
    request.set_item_bytes(next() % 9);
  }
  const uint32_t payload = next();
  const bool send = next() & 1;
  const std::string meta = request.SerializeAsString();
  char header[kDataHeaderBytes];
  absl::little_endian::Store32(header, op);
  absl::little_endian::Store32(header + 4, static_cast<uint32_t>(meta.size()));
  absl::little_endian::Store64(header + 8, payload);
  std::string out(header, sizeof(header));
  out += meta;
  if (send) out += std::string(payload, '\x42');
  return out;
}

// Every reply header in `got` parses, in order, as far as they can be
// told apart (a read's payload is skipped by its announced length).
void CheckReplies(const std::string& got) {
  size_t at = 0;
  while (got.size() - at >= kDataHeaderBytes) {
    const uint32_t code = absl::little_endian::Load32(got.data() + at);
    const uint32_t message = absl::little_endian::Load32(got.data() + at + 4);
    const uint64_t payload = absl::little_endian::Load64(got.data() + at + 8);
    FUZZ_CHECK(code <= 16, "a reply with an unknown code");
    FUZZ_CHECK(message <= kMaxDataMessageBytes, "an unbounded message");
    FUZZ_CHECK(code == 0 || payload == 0, "an error reply with bytes");
    FUZZ_CHECK(code != 0 || message == 0, "an OK reply with a message");
    at += kDataHeaderBytes + message;
    if (payload > got.size()) return;
    at += payload;
  }
}

}  // namespace
}  // namespace tessera

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  World& world = TheWorld();
  std::string stream;
  fuzz::Records records(data, size);
  uint8_t op;
  absl::string_view bytes;
  while (records.Next(&op, &bytes)) {
    switch (op % 3) {
      case 0:
        stream.append(bytes.data(), bytes.size());
        break;
      case 1:
        stream += DataPreface();
        break;
      case 2:
        stream += Request(bytes);
        break;
    }
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(world.port->port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  // Each input is a connection this side closes first: at hundreds a
  // second their TIME_WAITs can hold every local port for a moment
  // (EADDRNOTAVAIL), which says nothing of the worker.
  int fd = -1;
  for (const absl::Time until = absl::Now() + absl::Seconds(10);;) {
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) fuzz::Fail("socket", std::strerror(errno));
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0)
      break;
    const int error = errno;
    close(fd);
    if (error != EADDRNOTAVAIL || absl::Now() > until)
      fuzz::Fail("connect to the data port", std::strerror(error));
    absl::SleepFor(absl::Milliseconds(50));
  }
  // Sent while the worker answers (a reply must not block the stream).
  std::string got;
  size_t sent = 0;
  bool shut = false;
  char buffer[65536];
  const absl::Time give_up = absl::Now() + absl::Seconds(5);
  while (true) {
    pollfd p{fd, static_cast<short>(POLLIN | (shut ? 0 : POLLOUT)), 0};
    if (poll(&p, 1, 1000) < 0) break;
    if (p.revents & POLLOUT) {
      const ssize_t n = send(fd, stream.data() + sent, stream.size() - sent,
                             MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) sent += static_cast<size_t>(n);
      if (n < 0 && errno != EAGAIN) sent = stream.size();
      if (sent == stream.size()) {
        shutdown(fd, SHUT_WR);
        shut = true;
      }
    }
    if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
      const ssize_t n = recv(fd, buffer, sizeof(buffer), MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN)) break;
      if (n > 0) got.append(buffer, static_cast<size_t>(n));
    }
    FUZZ_CHECK(absl::Now() < give_up, "the worker neither answered nor closed");
  }
  close(fd);
  if (stream.compare(0, kDataPrefaceBytes, DataPreface()) != 0)
    FUZZ_CHECK(got.empty(), "bytes written to a stranger");
  CheckReplies(got);
  return 0;
}
