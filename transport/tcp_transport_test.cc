// TcpTransport against a real worker's data port (worker/data_port.h) on
// 127.0.0.1: the transport contract, alone and in chains, then what a
// hostile or careless peer meets: junk, oversized lengths, a capability
// for another tensor, a write of the wrong size, and a worker with no data
// port; then the same over mutual TLS, with a plaintext client, a
// certificate from another CA, none at all, a host name the certificate
// does not carry, and renewed files.
#include "transport/tcp_transport.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>

#include "absl/base/internal/endian.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rpc/channel.h"
#include "rpc/tls_context.h"
#include "transport/tcp_wire.h"
#include "transport/transport_chain.h"
#include "transport/transport_contract_test.h"

namespace tessera {
namespace testing {
namespace {

using ::testing::HasSubstr;

constexpr absl::Duration kTimeout = absl::Seconds(30);

std::unique_ptr<ShardTransport> MakeTcp(ChannelCache* channels) {
  TcpTransportOptions options;
  options.timeout = kTimeout;
  return std::make_unique<TcpTransport>(channels, options);
}

std::unique_ptr<ShardTransport> MakeChain(ChannelCache* channels,
                                          const std::string& transport) {
  DataPlaneOptions options;
  options.timeout = kTimeout;
  options.transport = transport;
  options.shared_memory = false;  // so that the data port carries the bytes
  options.ucx = false;
  return TransportChain::Make(channels, options);
}

TransportFactory Tcp() {
  TransportFactory f{"tcp", &MakeTcp};
  f.data_port = true;
  return f;
}

INSTANTIATE_TEST_SUITE_P(Tcp, TransportContractTest, ::testing::Values(Tcp()),
                         FactoryName);

INSTANTIATE_TEST_SUITE_P(Chain, TransportContractTest,
                         ::testing::Values(
                             [] {
                               TransportFactory f{
                                   "tcp_then_grpc", [](ChannelCache* channels) {
                                     return MakeChain(channels, "auto");
                                   }};
                               f.data_port = true;
                               return f;
                             }(),
                             [] {
                               TransportFactory f{
                                   "forced_tcp", [](ChannelCache* channels) {
                                     return MakeChain(channels, "tcp");
                                   }};
                               f.data_port = true;
                               return f;
                             }()),
                         FactoryName);

// The same worker, for tests of the data port itself.
class DataPortTest : public TransportContractTest {
 protected:
  // A raw connection to the data port.
  int Connect() {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(data_port_->port()));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    return fd;
  }
  static void Send(int fd, const std::string& bytes) {
    ASSERT_EQ(send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(bytes.size()));
  }
  // What the worker sent before it closed the connection (within 10 s).
  static std::string UntilClosed(int fd) {
    std::string got;
    char buffer[4096];
    while (true) {
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, 10000) != 1) {
        ADD_FAILURE() << "the worker kept the connection open";
        break;
      }
      const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
      if (n <= 0) break;
      got.append(buffer, static_cast<size_t>(n));
    }
    close(fd);
    return got;
  }
  static std::string Header(DataOp op, uint32_t meta, uint64_t payload) {
    char out[kDataHeaderBytes];
    EncodeRequestHeader({op, meta, payload}, out);
    return std::string(out, sizeof(out));
  }
  static std::string ReadRequest(const std::string& capability, uint64_t id,
                                 const Box& box, int64_t item) {
    v1::DataRequest request;
    request.set_capability(capability);
    request.set_shard_id(id);
    for (int64_t o : box.offsets) request.add_offsets(o);
    for (int64_t s : box.sizes) request.add_sizes(s);
    request.set_item_bytes(item);
    const std::string meta = request.SerializeAsString();
    return Header(DataOp::kRead, static_cast<uint32_t>(meta.size()), 0) + meta;
  }
  std::string OtherTensorGrant() {
    Capability grant;
    grant.worker = "w0";
    grant.tensor = "other";
    grant.version = 1;
    grant.change = kTestChange;
    grant.rights = kRightRead | kRightWrite;
    grant.expires_ms = absl::ToUnixMillis(absl::Now() + absl::Hours(1));
    return MintCapability(grant, kWorkerKey);
  }
};

INSTANTIATE_TEST_SUITE_P(Tcp, DataPortTest, ::testing::Values(Tcp()),
                         FactoryName);

TEST_P(DataPortTest, JunkIsClosedWithNothingWritten) {
  int fd = Connect();
  Send(fd, "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(UntilClosed(fd), "");
  // A preface of another version.
  fd = Connect();
  std::string preface = DataPreface();
  preface[4] = 9;
  Send(fd, preface);
  EXPECT_EQ(UntilClosed(fd), "");
  // The right preface, then an unknown op.
  fd = Connect();
  Send(fd, DataPreface() + Header(static_cast<DataOp>(77), 10, 0));
  EXPECT_EQ(UntilClosed(fd), "");
  // A meta that does not parse.
  fd = Connect();
  Send(fd, DataPreface() + Header(DataOp::kRead, 8, 0) + "\xff\xff\xff\xff" +
               "\xff\xff\xff\xff");
  EXPECT_EQ(UntilClosed(fd), "");
  EXPECT_GE(data_port_->Stats().dropped, 4);
}

TEST_P(DataPortTest, OversizedLengthsAreClosedBeforeAnythingIsRead) {
  // 4 GiB of meta announced: refused on the header, nothing allocated.
  int fd = Connect();
  Send(fd, DataPreface() + Header(DataOp::kRead, 0xffffffffu, 0));
  EXPECT_EQ(UntilClosed(fd), "");
  // A read announcing a payload.
  fd = Connect();
  Send(fd, DataPreface() + Header(DataOp::kRead, 4, uint64_t{1} << 62));
  EXPECT_EQ(UntilClosed(fd), "");
  // A box of more dims than any tensor has.
  Allocate(1, {64}, DType::kInt32);
  Box deep;
  deep.offsets.assign(40, 0);
  deep.sizes.assign(40, 1);
  fd = Connect();
  Send(fd, DataPreface() + ReadRequest(Grant(kRightRead), 1, deep, 4));
  EXPECT_EQ(UntilClosed(fd), "");
}

TEST_P(DataPortTest, WhatStrangersMakeThePortHoldIsBoundedForThePort) {
  Allocate(1, {64}, DType::kInt32);
  DataPortOptions small;
  small.max_meta_in_flight = 1500;
  absl::StatusOr<std::unique_ptr<DataPort>> port =
      DataPort::Start(node_.get(), small);
  ASSERT_THAT(port.status(), IsOk());
  data_port_ = *std::move(port);  // Connect() dials this one now
  // A announces 1000 bytes of meta and sends none: the worker holds them.
  const int a = Connect();
  Send(a, DataPreface() + Header(DataOp::kRead, 1000, 0));
  absl::SleepFor(absl::Milliseconds(200));
  // B announcing as much again is over the port's budget: closed at once.
  const int b = Connect();
  Send(b, DataPreface() + Header(DataOp::kRead, 1000, 0));
  EXPECT_EQ(UntilClosed(b), "");
  close(a);
  absl::SleepFor(absl::Milliseconds(200));
  // The budget is back once A is gone: a well-formed read is answered.
  const int c = Connect();
  Send(c, DataPreface() + ReadRequest(Grant(kRightRead), 1, WholeBox({64}), 4));
  shutdown(c, SHUT_WR);
  EXPECT_EQ(UntilClosed(c).size(), kDataHeaderBytes + 256);
}

TEST_P(DataPortTest, ACapabilityForAnotherTensorIsClosedWithNothingWritten) {
  Allocate(1, {64}, DType::kInt32);
  int fd = Connect();
  Send(fd,
       DataPreface() + ReadRequest(OtherTensorGrant(), 1, WholeBox({64}), 4));
  EXPECT_EQ(UntilClosed(fd), "");
  fd = Connect();
  Send(fd, DataPreface() + ReadRequest("", 1, WholeBox({64}), 4));
  EXPECT_EQ(UntilClosed(fd), "");
  // Through the transport: the read fails, nothing lands.
  std::string out(256, '\x5a');
  RemoteShard shard = At(1, {64}, DType::kInt32);
  shard.location.capability = OtherTensorGrant();
  EXPECT_THAT(transport_->Read(shard, WholeBox({64}),
                               ReadTarget::HostArray(out.data(), {64}, {0})),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("closed the connection")));
  EXPECT_EQ(out, std::string(256, '\x5a'));
}

TEST_P(DataPortTest, AnsweredErrorsKeepTheConnection) {
  Allocate(1, {64}, DType::kInt32);
  auto* tcp = static_cast<TcpTransport*>(transport_.get());
  std::string out(256, '\0');
  const RemoteShard shard = At(1, {64}, DType::kInt32);
  EXPECT_THAT(tcp->Read(shard, Box{{60}, {10}},
                        ReadTarget::HostArray(out.data(), {64}, {0})),
              StatusIs(absl::StatusCode::kOutOfRange));
  RemoteShard wide = shard;
  wide.item_bytes = 8;
  EXPECT_THAT(tcp->Read(wide, Box{{0}, {4}},
                        ReadTarget::HostArray(out.data(), {4}, {0})),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("4-byte elements")));
  ASSERT_THAT(tcp->Read(shard, WholeBox({64}),
                        ReadTarget::HostArray(out.data(), {64}, {0})),
              IsOk());
  EXPECT_EQ(out, Bytes(1));
  EXPECT_EQ(tcp->connections_opened(), 1);
}

TEST_P(DataPortTest, AWriteOfTheWrongSizeIsRefusedAndChangesNothing) {
  Allocate(1, {64}, DType::kInt32);
  const std::string before = Bytes(1);
  v1::DataRequest request;
  request.set_capability(Grant(kRightWrite));
  request.set_shard_id(1);
  request.set_item_bytes(4);
  const std::string meta = request.SerializeAsString();
  const int fd = Connect();
  Send(fd, DataPreface() +
               Header(DataOp::kWrite, static_cast<uint32_t>(meta.size()),
                      uint64_t{1} << 40) +
               meta);
  const std::string reply = UntilClosed(fd);
  ASSERT_GE(reply.size(), kDataHeaderBytes);
  absl::StatusOr<DataReplyHeader> header =
      DecodeReplyHeader(reply.substr(0, kDataHeaderBytes), 0);
  ASSERT_THAT(header.status(), IsOk());
  EXPECT_EQ(header->code, absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(reply.substr(kDataHeaderBytes), HasSubstr("takes 256"));
  EXPECT_EQ(Bytes(1), before);
}

TEST_P(DataPortTest, RowsAndPatchesMoveOverTheDataPort) {
  Allocate(1, {40, 6}, DType::kFloat32);
  std::vector<ShardRows> entries(1);
  entries[0].shard = At(1, {40, 6}, DType::kFloat32);
  entries[0].rows = {39, 0, 7, 7};
  std::string got(4 * 24, '\0');
  ASSERT_THAT(transport_->ReadRows(entries,
                                   [&](size_t, size_t k, const char* row) {
                                     std::memcpy(got.data() + k * 24, row, 24);
                                   }),
              IsOk());
  const std::string shard = Bytes(1);
  EXPECT_EQ(got, shard.substr(39 * 24, 24) + shard.substr(0, 24) +
                     shard.substr(7 * 24, 24) + shard.substr(7 * 24, 24));
  // A patch of rows 2..4, columns 1..3, from an array of its own shape.
  std::string patch(3 * 2 * 4, '\x11');
  WriteSource source;
  source.data = patch.data();
  source.shape = {3, 2};
  source.offsets = {0, 0};
  ASSERT_THAT(transport_->WriteBox(At(1, {40, 6}, DType::kFloat32),
                                   Box{{2, 1}, {3, 2}}, source),
              IsOk());
  const std::string after = Bytes(1);
  for (int r = 0; r < 40; ++r) {
    for (int c = 0; c < 6; ++c) {
      const size_t at = static_cast<size_t>((r * 6 + c) * 4);
      const bool patched = r >= 2 && r < 5 && c >= 1 && c < 3;
      EXPECT_EQ(after.substr(at, 4),
                patched ? std::string(4, '\x11') : shard.substr(at, 4))
          << r << "," << c;
    }
  }
  EXPECT_GE(data_port_->Stats().requests, 2);
}

// A patch whose rows are long lands straight in the shard, a few MiB at a
// time: its windows cross rows in the middle, and the rest of the shard
// stays as it was.
TEST_P(DataPortTest, ALongRowedPatchLandsExactlyInPlace) {
  Allocate(2, {700, 2100}, DType::kInt32);  // rows of 8400 bytes
  const std::string before = Bytes(2);
  const Box box{{5, 30}, {600, 2000}};  // 4.8 MB of 8000-byte rows
  const Shape src_shape{601, 2003};
  std::string src(static_cast<size_t>(src_shape[0] * src_shape[1] * 4), '\0');
  for (size_t i = 0; i < src.size(); ++i)
    src[i] = static_cast<char>(i * 37 + 1);
  WriteSource source{src.data(), src_shape, {1, 2}};
  ASSERT_THAT(
      transport_->WriteBox(At(2, {700, 2100}, DType::kInt32), box, source),
      IsOk());
  std::string want = before;
  CopyBox(src.data(), src_shape, {1, 2}, want.data(), Shape{700, 2100},
          box.offsets, box.sizes, 4);
  EXPECT_TRUE(Bytes(2) == want) << "the shard holds other bytes";
}

TEST_P(DataPortTest, AConnectionTheWorkerClosedWhileIdleIsReplaced) {
  Allocate(1, {64}, DType::kInt32);
  DataPortOptions quick;
  quick.idle_timeout = absl::Milliseconds(100);
  absl::StatusOr<std::unique_ptr<DataPort>> port =
      DataPort::Start(node_.get(), quick);
  ASSERT_THAT(port.status(), IsOk());
  TcpTransportOptions options;
  const std::string data_address = absl::StrCat("127.0.0.1:", (*port)->port());
  options.resolve = [&](const std::string&) -> absl::StatusOr<std::string> {
    return data_address;
  };
  TcpTransport tcp(nullptr, options);
  std::string out(256, '\0');
  const RemoteShard shard = At(1, {64}, DType::kInt32);
  ASSERT_THAT(tcp.Read(shard, WholeBox({64}),
                       ReadTarget::HostArray(out.data(), {64}, {0})),
              IsOk());
  absl::SleepFor(absl::Milliseconds(500));  // the worker drops it
  ASSERT_THAT(tcp.Read(shard, WholeBox({64}),
                       ReadTarget::HostArray(out.data(), {64}, {0})),
              IsOk());
  EXPECT_EQ(out, Bytes(1));
  EXPECT_EQ(tcp.connections_opened(), 2);
}

TEST_P(DataPortTest, AWorkerWhoseDataPortMovedIsAskedAgain) {
  Allocate(1, {64}, DType::kInt32);
  std::string out(256, '\0');
  const RemoteShard shard = At(1, {64}, DType::kInt32);
  ASSERT_THAT(transport_->Read(shard, WholeBox({64}),
                               ReadTarget::HostArray(out.data(), {64}, {0})),
              IsOk());
  // As a restarted worker: the old port gone, a new one on another port.
  data_port_.reset();
  absl::StatusOr<std::unique_ptr<DataPort>> moved =
      DataPort::Start(node_.get(), DataPortOptions());
  ASSERT_THAT(moved.status(), IsOk());
  data_port_ = *std::move(moved);
  served_.service->set_data_address(
      absl::StrCat("127.0.0.1:", data_port_->port()));
  std::fill(out.begin(), out.end(), '\0');
  ASSERT_THAT(transport_->Read(shard, WholeBox({64}),
                               ReadTarget::HostArray(out.data(), {64}, {0})),
              IsOk());
  EXPECT_EQ(out, Bytes(1));
  EXPECT_EQ(data_port_->Stats().requests, 1);
}

TEST_P(DataPortTest, AWorkerWithNoDataPortDeclinesAndTheChainUsesGrpc) {
  Allocate(1, {64}, DType::kInt32);
  served_.service->set_data_address("");  // as --data_listen=off leaves it
  ChannelCache channels;
  TcpTransport tcp(&channels, TcpTransportOptions());
  std::string out(256, '\0');
  const RemoteShard shard = At(1, {64}, DType::kInt32);
  EXPECT_THAT(tcp.Read(shard, WholeBox({64}),
                       ReadTarget::HostArray(out.data(), {64}, {0})),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("no data port")));
  std::unique_ptr<ShardTransport> chain = MakeChain(&channels, "auto");
  ASSERT_THAT(chain->Read(shard, WholeBox({64}),
                          ReadTarget::HostArray(out.data(), {64}, {0})),
              IsOk());
  EXPECT_EQ(out, Bytes(1));
  const DataPlaneStats stats =
      static_cast<TransportChain*>(chain.get())->Stats();
  EXPECT_EQ(stats.bytes.count("tcp") ? stats.bytes.at("tcp") : 0, 0);
  EXPECT_EQ(stats.bytes.at("grpc"), 256);
  // Forced, the user is told which worker cannot be reached this way.
  std::unique_ptr<ShardTransport> forced = MakeChain(&channels, "tcp");
  EXPECT_THAT(
      forced->Read(shard, WholeBox({64}),
                   ReadTarget::HostArray(out.data(), {64}, {0})),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("tcp")));
}

// --- Mutual TLS on the data port ---

std::string PkiDir(const std::string& name) {
  return absl::StrCat(std::getenv("TEST_TMPDIR"), "/pki-", name);
}

// Certificates from deploy/make-certs.sh, made once per binary: the
// cluster's CA (worker w0, the user) and another CA.
void MakePki() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (const char* name : {"cluster", "other"}) {
      const std::string command =
          absl::StrCat("/bin/bash ", std::getenv("TEST_SRCDIR"),
                       "/tessera/deploy/make-certs.sh ", PkiDir(name),
                       " --workers 1 >/dev/null");
      ASSERT_EQ(std::system(command.c_str()), 0) << command;
    }
  });
}

// The files of `who` (w0, user) of the `cert` CA, trusting the `ca` CA.
TlsFiles Files(const std::string& ca, const std::string& cert,
               const std::string& who) {
  MakePki();
  TlsFiles files{PkiDir(ca) + "/ca.crt", "", ""};
  if (!who.empty()) {
    files.cert = absl::StrCat(PkiDir(cert), "/", who, ".crt");
    files.key = absl::StrCat(PkiDir(cert), "/", who, ".key");
  }
  return files;
}

std::shared_ptr<TlsContextSource> Source(
    const TlsFiles& files, TlsContextSource::Side side,
    ClientCertPolicy policy = ClientCertPolicy::kRequire,
    absl::Duration refresh = absl::ZeroDuration()) {
  absl::StatusOr<std::shared_ptr<TlsContextSource>> source =
      TlsContextSource::Watch(files, side, policy, refresh);
  EXPECT_THAT(source.status(), IsOk());
  return source.ok() ? *source : nullptr;
}

std::shared_ptr<TlsContextSource> UserTls() {
  return Source(Files("cluster", "cluster", "user"),
                TlsContextSource::Side::kClient);
}

std::shared_ptr<TlsContextSource> WorkerTls() {
  return Source(Files("cluster", "cluster", "w0"),
                TlsContextSource::Side::kServer);
}

std::unique_ptr<ShardTransport> MakeTcpTls(ChannelCache* channels) {
  TcpTransportOptions options;
  options.timeout = kTimeout;
  options.tls = UserTls();
  return std::make_unique<TcpTransport>(channels, options);
}

TransportFactory TcpTls() {
  TransportFactory f{"tcp_tls", &MakeTcpTls};
  f.data_port = true;
  f.data_port_tls = &WorkerTls;
  return f;
}

INSTANTIATE_TEST_SUITE_P(TcpTls, TransportContractTest,
                         ::testing::Values(TcpTls(),
                                           [] {
                                             TransportFactory f = TcpTls();
                                             f.name = "tcp_tls_then_grpc";
                                             f.make = [](ChannelCache* c) {
                                               DataPlaneOptions options;
                                               options.timeout = kTimeout;
                                               options.shared_memory = false;
                                               options.ucx = false;
                                               options.tcp_tls = UserTls();
                                               return TransportChain::Make(
                                                   c, options);
                                             };
                                             return f;
                                           }()),
                         FactoryName);

class DataPortTlsTest : public DataPortTest {
 protected:
  // Reads shard 1 ({64} int32) into `out` over a new TcpTransport with
  // `tls` (null: plaintext) from the data port at `data_address` (empty:
  // the test's).
  absl::Status ReadWith(std::shared_ptr<TlsContextSource> tls, std::string* out,
                        std::string data_address = "") {
    if (data_address.empty())
      data_address = absl::StrCat("127.0.0.1:", data_port_->port());
    TcpTransportOptions options;
    options.timeout = absl::Seconds(10);
    options.tls = std::move(tls);
    options.resolve = [=](const std::string&) -> absl::StatusOr<std::string> {
      return data_address;
    };
    TcpTransport tcp(nullptr, options);
    out->assign(256, '\x5a');
    return tcp.Read(At(1, {64}, DType::kInt32), WholeBox({64}),
                    ReadTarget::HostArray(out->data(), {64}, {0}));
  }
  const std::string kUntouched = std::string(256, '\x5a');
};

INSTANTIATE_TEST_SUITE_P(TcpTls, DataPortTlsTest, ::testing::Values(TcpTls()),
                         FactoryName);

TEST_P(DataPortTlsTest, APlaintextClientIsToldThePortSpeaksTls) {
  Allocate(1, {64}, DType::kInt32);
  std::string out;
  EXPECT_THAT(
      ReadWith(nullptr, &out),
      StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("speaks TLS")));
  EXPECT_EQ(out, kUntouched);
  // Raw: a plaintext request with a valid capability is answered with the
  // refusal alone, never a shard byte; junk gets nothing.
  int fd = Connect();
  Send(fd,
       DataPreface() + ReadRequest(Grant(kRightRead), 1, WholeBox({64}), 4));
  const std::string reply = UntilClosed(fd);
  ASSERT_GE(reply.size(), kDataHeaderBytes);
  absl::StatusOr<DataReplyHeader> header =
      DecodeReplyHeader(reply.substr(0, kDataHeaderBytes), 256);
  ASSERT_THAT(header.status(), IsOk());
  EXPECT_EQ(header->code, absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(reply.size(), kDataHeaderBytes + header->message_bytes);
  fd = Connect();
  Send(fd, "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(UntilClosed(fd), "");
  const DataPortStats stats = data_port_->Stats();
  EXPECT_EQ(stats.requests, 0);
  EXPECT_GE(stats.tls_refused, 3);
}

TEST_P(DataPortTlsTest, ACertificateFromAnotherCaIsRefused) {
  Allocate(1, {64}, DType::kInt32);
  std::string out;
  // The worker refuses the client's certificate.
  EXPECT_THAT(ReadWith(Source(Files("cluster", "other", "user"),
                              TlsContextSource::Side::kClient),
                       &out),
              StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("TLS")));
  EXPECT_EQ(out, kUntouched);
  // The client refuses the worker's.
  EXPECT_THAT(ReadWith(Source(Files("other", "other", "user"),
                              TlsContextSource::Side::kClient),
                       &out),
              StatusIs(absl::StatusCode::kUnauthenticated,
                       HasSubstr("certificate verify failed")));
  EXPECT_EQ(out, kUntouched);
  EXPECT_EQ(data_port_->Stats().requests, 0);
  // The cluster's own user reads.
  ASSERT_THAT(ReadWith(UserTls(), &out), IsOk());
  EXPECT_EQ(out, Bytes(1));
}

TEST_P(DataPortTlsTest, AClientWithoutACertificateNeedsTheOptionalPolicy) {
  Allocate(1, {64}, DType::kInt32);
  const std::shared_ptr<TlsContextSource> anonymous =
      Source(Files("cluster", "", ""), TlsContextSource::Side::kClient);
  std::string out;
  EXPECT_THAT(ReadWith(anonymous, &out),
              StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("TLS")));
  EXPECT_EQ(out, kUntouched);
  // --tls_client_cert=optional: let in, its capability still checked.
  DataPortOptions optional;
  optional.tls =
      Source(Files("cluster", "cluster", "w0"), TlsContextSource::Side::kServer,
             ClientCertPolicy::kOptional);
  absl::StatusOr<std::unique_ptr<DataPort>> port =
      DataPort::Start(node_.get(), optional);
  ASSERT_THAT(port.status(), IsOk());
  data_port_ = *std::move(port);
  ASSERT_THAT(ReadWith(anonymous, &out), IsOk());
  EXPECT_EQ(out, Bytes(1));
}

TEST_P(DataPortTlsTest, TheWorkersCertificateMustNameTheHostDialled) {
  Allocate(1, {64}, DType::kInt32);
  DataPortOptions any;
  any.listen = "0.0.0.0:0";
  any.tls = WorkerTls();
  absl::StatusOr<std::unique_ptr<DataPort>> port =
      DataPort::Start(node_.get(), any);
  ASSERT_THAT(port.status(), IsOk());
  // 127.0.0.2 reaches this host, but w0's certificate names 127.0.0.1.
  std::string out;
  EXPECT_THAT(
      ReadWith(UserTls(), &out, absl::StrCat("127.0.0.2:", (*port)->port())),
      StatusIs(absl::StatusCode::kUnauthenticated,
               HasSubstr("IP address mismatch")));
  EXPECT_EQ(out, kUntouched);
  EXPECT_EQ((*port)->Stats().requests, 0);
}

TEST_P(DataPortTlsTest, ATlsClientAtAPlaintextPortFailsSayingSo) {
  Allocate(1, {64}, DType::kInt32);
  absl::StatusOr<std::unique_ptr<DataPort>> port =
      DataPort::Start(node_.get(), DataPortOptions());
  ASSERT_THAT(port.status(), IsOk());
  data_port_ = *std::move(port);
  std::string out;
  EXPECT_THAT(ReadWith(UserTls(), &out),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("TLS")));
  EXPECT_EQ(out, kUntouched);
  EXPECT_EQ(data_port_->Stats().requests, 0);
}

TEST_P(DataPortTlsTest, NewConnectionsUseTheCertificateFilesAsRenewed) {
  Allocate(1, {64}, DType::kInt32);
  // The worker's files in a directory of its own, followed every 1 ms.
  const std::string dir = PkiDir("renewed");
  ASSERT_EQ(
      std::system(absl::StrCat("mkdir -p ", dir, " && cp ", PkiDir("cluster"),
                               "/ca.crt ", PkiDir("cluster"), "/w0.crt ",
                               PkiDir("cluster"), "/w0.key ", dir)
                      .c_str()),
      0);
  DataPortOptions followed;
  followed.tls = Source({dir + "/ca.crt", dir + "/w0.crt", dir + "/w0.key"},
                        TlsContextSource::Side::kServer,
                        ClientCertPolicy::kRequire, absl::Milliseconds(1));
  absl::StatusOr<std::unique_ptr<DataPort>> port =
      DataPort::Start(node_.get(), followed);
  ASSERT_THAT(port.status(), IsOk());
  data_port_ = *std::move(port);
  std::string out;
  ASSERT_THAT(ReadWith(UserTls(), &out), IsOk());
  // A half-written key (a mismatched pair) keeps the last good pair.
  ASSERT_EQ(std::system(
                absl::StrCat("cp ", PkiDir("other"), "/w0.key ", dir, "/w0.key")
                    .c_str()),
            0);
  absl::SleepFor(absl::Milliseconds(5));
  ASSERT_THAT(ReadWith(UserTls(), &out), IsOk());
  // The whole set renewed from the other CA: the cluster's clients no
  // longer trust the worker; the other CA's do.
  ASSERT_EQ(std::system(absl::StrCat("cp ", PkiDir("other"), "/ca.crt ",
                                     PkiDir("other"), "/w0.crt ", dir)
                            .c_str()),
            0);
  absl::SleepFor(absl::Milliseconds(5));
  EXPECT_THAT(ReadWith(UserTls(), &out),
              StatusIs(absl::StatusCode::kUnauthenticated));
  ASSERT_THAT(ReadWith(Source(Files("other", "other", "user"),
                              TlsContextSource::Side::kClient),
                       &out),
              IsOk());
  EXPECT_EQ(out, Bytes(1));
}

}  // namespace
}  // namespace testing
}  // namespace tessera
