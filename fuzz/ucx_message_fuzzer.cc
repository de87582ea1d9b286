// Fuzzes a worker's UCX data plane (transport/ucx_server.h): the input is a
// sequence of records (fuzz_util.h), each an active message a peer sends
// to a real UcxServer over a real UCX endpoint (this host's shared memory):
//   op & 7       the message id: hello, check, check-and-release, send,
//                write, goodbye, the reply id (which the worker must
//                ignore), or one no handler knows
//   bytes[0]     how many of the rest are the header (the rest: the data)
//   op & 8       the header's first word is the magic
//   op & 16      its second word is this peer's id (the hello's answer);
//                for a hello, its data is junk instead of this peer's
//                UCX address
//   op & 32      the registration word names a live key: a read key for
//                op & 64 clear, the write key of a pending shard for it set
//   op & 128     the shard word names that key's shard
// The worker holds a committed (sealed) shard and a pending one. After each
// message the peer progresses, taking whatever the worker sends, and the
// fuzzer traps when the worker's progress thread died, or the sealed
// shard's bytes changed (no message may write a shard but through a write
// key of a pending one, in its range).
#include <ucp/api/ucp.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "core/capability.h"
#include "core/init_fill.h"
#include "fuzz/fuzz_util.h"
#include "transport/ucx_common.h"
#include "transport/ucx_server.h"
#include "worker/host_shard_store.h"
#include "worker/ucx_service.h"
#include "worker/worker_node.h"

namespace tessera {
namespace {

constexpr uint64_t kSealed = 101;
constexpr uint64_t kPending = 102;
constexpr uint64_t kChange = 7;
// Hellos use request ids no fuzzed request does (those are 64-bit junk or
// zero mostly): a random constant.
constexpr uint64_t kHelloRequest = 0x6a09e667f3bcc908;

struct Peer {
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  ucp_ep_h ep = nullptr;
  uint64_t id = 0;  // the worker's name for this peer
  bool answered = false;
  std::vector<char> scratch = std::vector<char>(1 << 20);
};

struct World {
  HostShardStore store{HostShardStoreOptions{}};
  std::unique_ptr<WorkerNode> node;
  std::unique_ptr<UcxServer> server;
  UcxKey read_key, write_key;
  std::string sealed_bytes;
  Peer peer;
};

ShardDesc Desc(bool writable) {
  ShardDesc desc;
  desc.tensor = "t";
  desc.version = 1;
  desc.writable = writable;
  desc.change = writable ? kChange : 0;
  desc.dtype = DType::kInt32;
  desc.tensor_shape = {64, 64};
  desc.box = WholeBox({64, 64});
  return desc;
}

ucs_status_t OnReply(void* arg, const void* header, size_t length, void*,
                     size_t, const ucp_am_recv_param_t*) {
  auto* peer = static_cast<Peer*>(arg);
  if (length == sizeof(UcxCheckReply)) {
    UcxCheckReply reply;
    std::memcpy(&reply, header, sizeof(reply));
    // Only the hello's answer names this peer (a notice that the worker
    // forgot an earlier one names that one).
    if (reply.request_id == kHelloRequest &&
        reply.answer == static_cast<uint32_t>(UcxCheckAnswer::kHeld) &&
        reply.peer != 0) {
      peer->id = reply.peer;
    }
    peer->answered = true;
  }
  return UCS_OK;
}

void Drained(void* request, ucs_status_t, const ucp_tag_recv_info_t*, void*) {
  ucp_request_free(request);
}

// Progresses the peer for a little while, receiving what the worker sends.
void Progress(Peer& peer, absl::Duration how_long) {
  const absl::Time until = absl::Now() + how_long;
  while (absl::Now() < until) {
    while (ucp_worker_progress(peer.worker) != 0) {
    }
    ucp_tag_message_h message;
    ucp_tag_recv_info_t info;
    while ((message = ucp_tag_probe_nb(peer.worker, 0, 0, 1, &info)) !=
           nullptr) {
      ucp_request_param_t param{};
      param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK;
      param.cb.recv = &Drained;
      ucs_status_ptr_t r =
          ucp_tag_msg_recv_nbx(peer.worker, peer.scratch.data(),
                               peer.scratch.size(), message, &param);
      (void)r;  // freed by Drained, or done at once
    }
  }
}

// (Re)connects the peer to the worker and says hello, so that requests
// can name a known peer.
void Connect(World& world) {
  Peer& peer = world.peer;
  if (peer.ep != nullptr) {
    ucp_request_param_t close{};
    close.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    close.flags = UCP_EP_CLOSE_FLAG_FORCE;
    ucs_status_ptr_t r = ucp_ep_close_nbx(peer.ep, &close);
    if (UCS_PTR_IS_PTR(r)) {
      while (ucp_request_check_status(r) == UCS_INPROGRESS) {
        ucp_worker_progress(peer.worker);
      }
      ucp_request_free(r);
    }
  }
  peer.id = 0;
  ucp_ep_params_t ep{};
  ep.field_mask =
      UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  ep.address =
      reinterpret_cast<const ucp_address_t*>(world.server->address().data());
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  if (ucp_ep_create(peer.worker, &ep, &peer.ep) != UCS_OK) {
    fuzz::Fail("connecting to the worker failed");
  }
  const std::string address = *UcpWorkerAddress(peer.worker);
  UcxHello hello;
  hello.request_id = kHelloRequest;
  ucp_request_param_t send{};
  ucs_status_ptr_t r =
      ucp_am_send_nbx(peer.ep, kUcxHelloAm, &hello, sizeof(hello),
                      address.data(), address.size(), &send);
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while ((peer.id == 0 || (UCS_PTR_IS_PTR(r) &&
                           ucp_request_check_status(r) == UCS_INPROGRESS)) &&
         absl::Now() < until) {
    Progress(peer, absl::Milliseconds(1));
  }
  if (peer.id == 0 ||
      (UCS_PTR_IS_PTR(r) && ucp_request_check_status(r) == UCS_INPROGRESS)) {
    fuzz::Fail("the worker did not answer a hello");
  }
  if (UCS_PTR_IS_PTR(r)) ucp_request_free(r);
}

World* Setup() {
  auto* world = new World();
  world->node =
      std::make_unique<WorkerNode>(&world->store, WorkerNodeOptions{});
  world->node->SetIdentity("w0", "fuzz-key");
  InitSpec arange;
  arange.kind = InitSpec::Kind::kArange;
  if (!world->node
           ->Allocate({{kSealed, Desc(false)}, {kPending, Desc(true)}}, arange)
           .ok()) {
    fuzz::Fail("allocating the shards failed");
  }
  world->node->Seal(kSealed);
  absl::StatusOr<std::unique_ptr<UcxServer>> server =
      StartUcxServer(world->node.get());
  if (!server.ok())
    fuzz::Fail("cannot start UCX", std::string(server.status().message()));
  world->server = *std::move(server);
  world->read_key = *world->server->Register(kSealed, false);
  world->write_key = *world->server->Register(kPending, true);
  world->sealed_bytes.assign(world->store.Pin(kSealed)->data, 64 * 64 * 4);

  Peer& peer = world->peer;
  peer.context = *MakeUcpContext("fuzz-peer", UcxReach{});
  ucp_worker_params_t params{};
  params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  params.thread_mode = UCS_THREAD_MODE_SINGLE;
  if (ucp_worker_create(peer.context, &params, &peer.worker) != UCS_OK) {
    fuzz::Fail("creating the peer's UCX worker failed");
  }
  ucp_am_handler_param_t handler{};
  handler.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID |
                       UCP_AM_HANDLER_PARAM_FIELD_CB |
                       UCP_AM_HANDLER_PARAM_FIELD_ARG;
  handler.id = kUcxCheckReplyAm;
  handler.cb = &OnReply;
  handler.arg = &peer;
  ucp_worker_set_am_recv_handler(peer.worker, &handler);
  Connect(*world);
  return world;
}

}  // namespace
}  // namespace tessera

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  static World* world = Setup();
  Peer& peer = world->peer;
  static constexpr unsigned kIds[8] = {
      kUcxHelloAm, kUcxCheckAm,   kUcxCheckReleaseAm, kUcxSendAm,
      kUcxWriteAm, kUcxGoodbyeAm, kUcxCheckReplyAm,   31};
  fuzz::Records records(data, size);
  uint8_t op = 0;
  absl::string_view bytes;
  int sent = 0;
  while (records.Next(&op, &bytes) && sent < 16) {
    const size_t header_bytes =
        bytes.empty() ? 0 : std::min<size_t>(bytes[0] & 0x7f, bytes.size() - 1);
    std::string header(bytes.substr(bytes.empty() ? 0 : 1, header_bytes));
    std::string body(bytes.substr(std::min(bytes.size(), 1 + header_bytes)));
    // Make the fields deeper checks look at valid where asked, so the
    // fuzzer gets past the first ones.
    auto put_word = [&](size_t index, uint64_t value) {
      if (header.size() >= (index + 1) * 8) {
        std::memcpy(header.data() + index * 8, &value, 8);
      }
    };
    const unsigned id = kIds[op & 7];
    if (op & 8) put_word(0, kUcxCheckMagic);
    if (id == kUcxHelloAm) {
      // A hello's data is a UCX address, which UCX parses unbounded (as it
      // does the addresses in its own wire-up messages): a peer's own
      // address, or (op & 16) bytes whose version no UCX packs.
      if (op & 16) {
        if (!body.empty()) body[0] = static_cast<char>(body[0] | 0x0e);
      } else {
        body = *UcpWorkerAddress(peer.worker);
      }
    } else {
      if (op & 16) put_word(1, peer.id);
      const bool write = (op & 64) != 0;
      const UcxKey& key = write ? world->write_key : world->read_key;
      // request_id, shard_id, registration follow the peer.
      if (op & 128) put_word(3, key.shard_id);
      if (op & 32) put_word(4, key.registration);
    }
    // Never with UCP_AM_SEND_FLAG_REPLY: UCX resolves the endpoint id that
    // flag carries without checking it (a peer's ids are trusted by UCX
    // itself, below what this worker can check), and readers do not set it.
    ucp_request_param_t param{};
    ucs_status_ptr_t r = ucp_am_send_nbx(
        peer.ep, id, header.empty() ? nullptr : header.data(), header.size(),
        body.empty() ? nullptr : body.data(), body.size(), &param);
    // The buffers must outlive the send: wait for it here.
    if (UCS_PTR_IS_PTR(r)) {
      const absl::Time until = absl::Now() + absl::Seconds(5);
      while (ucp_request_check_status(r) == UCS_INPROGRESS &&
             absl::Now() < until) {
        ucp_worker_progress(peer.worker);
      }
      // Still out (this side's endpoint stuck in UCX's wire-up after the
      // worker closed its own): a fresh endpoint, whose hello must be
      // answered, and the old one's close cancels the send.
      if (ucp_request_check_status(r) == UCS_INPROGRESS) Connect(*world);
      ucp_request_free(r);
    }
    ++sent;
    Progress(peer, absl::Microseconds(300));
  }
  Progress(peer, absl::Milliseconds(1));
  // A goodbye (or hellos past the worker's bound) closed this peer: a
  // fresh endpoint and hello for the next input.
  if (world->server->Peers() != 1) Connect(*world);
  const std::string now(world->store.Pin(kSealed)->data, 64 * 64 * 4);
  if (now != world->sealed_bytes) {
    fuzz::Fail("a message changed a sealed shard's bytes");
  }
  return 0;
}
