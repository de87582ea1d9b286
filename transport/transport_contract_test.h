// The contract every ShardTransport passes (shard_transport.h), run against
// a real worker: a WorkerNode on a HostShardStore whose shards all live in
// shared memory, behind a WorkerService on a real gRPC server on
// 127.0.0.1:0 in this process. transport_contract_test.cc instantiates it
// for each implementation:
//
//   INSTANTIATE_TEST_SUITE_P(Grpc, TransportContractTest,
//                            ::testing::Values(TransportFactory{"grpc", ...}));
//
// Covered: whole and strided sub-box reads byte-exact (rank 1..3, several
// element sizes) into host arrays and into sinks, empty boxes, reads of a
// freed shard (NOT_FOUND, also after an earlier read), an unreachable
// worker (UNAVAILABLE), writes read back, a transfer batch of several
// pieces, and the bytes a TransportChain of the transport counts.
#ifndef TESSERA_TRANSPORT_TRANSPORT_CONTRACT_TEST_H_
#define TESSERA_TRANSPORT_TRANSPORT_CONTRACT_TEST_H_

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/box.h"
#include "core/capability.h"
#include "core/dtype.h"
#include "core/init_fill.h"
#include "core/strided_copy.h"
#include "core/testing/grants.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rpc/channel.h"
#include "rpc/server.h"
#include "transport/shard_transport.h"
#include "transport/shared_memory_arena.h"
#include "transport/transport_chain.h"
#include "worker/data_port.h"
#include "worker/host_shard_store.h"
#include "worker/testing/served_worker.h"
#include "worker/worker_node.h"
#include "worker/worker_service.h"

namespace tessera {
namespace testing {

// How to make the transport under test; `channels` reaches the worker and
// outlives the transport.
struct TransportFactory {
  std::string name;
  std::function<std::unique_ptr<ShardTransport>(ChannelCache* channels)> make;
  // Skip where /dev/shm cannot be written (the transport cannot work).
  bool needs_shared_memory = false;
  // Services the worker serves beside its Worker service for this transport
  // (UCX's keys), made from the node before the server starts and dropped
  // after it stops. Empty: none.
  std::function<std::vector<std::shared_ptr<grpc::Service>>(WorkerNode* node)>
      services;
  // The worker opens a data port (worker/data_port.h) and names it.
  bool data_port = false;
  // The data port's mutual TLS (null or empty: plaintext).
  std::function<std::shared_ptr<TlsContextSource>()> data_port_tls;
};

inline std::string FactoryName(
    const ::testing::TestParamInfo<TransportFactory>& info) {
  return info.param.name;
}

// A transfer's receiving end over a local store: pieces land straight in
// the pinned destination shards.
class StoreReceiver : public TransferReceiver {
 public:
  explicit StoreReceiver(ShardStore* store) : store_(store) {}
  absl::StatusOr<PieceTarget> TargetFor(const TransferPiece& piece) override {
    absl::StatusOr<PinnedShard> pinned = store_->Pin(piece.dst_shard_id);
    if (!pinned.ok()) return pinned.status();
    absl::Status inside = CheckWithin(piece.DstBox(), pinned->desc.box.sizes,
                                      "destination region");
    if (!inside.ok()) return inside;
    return PieceTarget{
        ReadTarget::HostArray(pinned->data, pinned->desc.box.sizes,
                              piece.dst_offsets),
        static_cast<int64_t>(ItemSize(pinned->desc.dtype)), pinned->keep_alive};
  }

 private:
  ShardStore* const store_;
};

class TransportContractTest
    : public ::testing::TestWithParam<TransportFactory> {
 protected:
  void SetUp() override {
    if (GetParam().needs_shared_memory && access("/dev/shm", W_OK) != 0)
      GTEST_SKIP() << "no writable /dev/shm here";
    HostShardStoreOptions store_options;
    store_options.arena = arena_;
    store_options.shared_memory_min_bytes = 0;  // every shard can be mapped
    store_ = std::make_unique<HostShardStore>(store_options);
    WorkerNodeOptions node_options;
    node_options.arena = arena_;
    node_ = std::make_unique<WorkerNode>(store_.get(), node_options);
    node_->SetIdentity("w0", kWorkerKey);
    if (GetParam().data_port) {
      DataPortOptions port_options;
      if (GetParam().data_port_tls)
        port_options.tls = GetParam().data_port_tls();
      absl::StatusOr<std::unique_ptr<DataPort>> port =
          DataPort::Start(node_.get(), port_options);
      ASSERT_TRUE(port.ok()) << port.status();
      data_port_ = *std::move(port);
    }
    std::vector<grpc::Service*> services;
    if (GetParam().services) extra_services_ = GetParam().services(node_.get());
    for (const auto& extra : extra_services_) services.push_back(extra.get());
    absl::StatusOr<ServedWorker> served = ServeWorker(node_.get(), services);
    ASSERT_TRUE(served.ok()) << served.status();
    served_ = std::move(*served);
    if (data_port_ != nullptr) {
      served_.service->set_data_address(
          absl::StrCat("127.0.0.1:", data_port_->port()));
    }
    address_ = served_.address;
    transport_ = GetParam().make(&channels_);
  }

  void TearDown() override {
    transport_.reset();
    served_.Shutdown();
    extra_services_.clear();
    data_port_.reset();
  }

  // Allocates shard `id`: a whole tensor of `shape`, values 0, 1, 2, ...
  void Allocate(uint64_t id, Shape shape, DType dtype) {
    ShardDesc desc;
    desc.tensor = "t";
    desc.version = 1;
    desc.writable = true;  // as a put's shards are
    desc.change = kTestChange;
    desc.dtype = dtype;
    desc.tensor_shape = shape;
    desc.box = WholeBox(shape);
    ASSERT_THAT(store_->Allocate(id, desc, InitSpec{InitSpec::Kind::kArange}),
                ::tessera::testing::IsOk());
  }

  // The shard's bytes as the worker's store holds them.
  std::string Bytes(uint64_t id) {
    absl::StatusOr<PinnedShard> pinned = store_->Pin(id);
    EXPECT_TRUE(pinned.ok()) << pinned.status();
    if (!pinned.ok()) return "";
    return std::string(pinned->data, static_cast<size_t>(pinned->bytes));
  }

  RemoteShard At(uint64_t id, const Shape& shape, DType dtype,
                 std::string address = "") {
    RemoteShard shard;
    shard.location.worker = "w0";
    shard.location.address = address.empty() ? address_ : address;
    shard.location.shard_id = id;
    shard.location.capability = Grant(kRightRead | kRightWrite);
    shard.item_bytes = static_cast<int64_t>(ItemSize(dtype));
    shard.shape = shape;
    return shard;
  }

  // What the coordinator would grant on tensor "t" version 1 at w0.
  static std::string Grant(uint32_t rights) {
    Capability grant;
    grant.worker = "w0";
    grant.tensor = "t";
    grant.version = 1;
    grant.change = kTestChange;  // the put's that writes the shards
    grant.rights = rights;
    grant.expires_ms = absl::ToUnixMillis(absl::Now() + absl::Hours(1));
    return MintCapability(grant, kWorkerKey);
  }
  static constexpr char kWorkerKey[] = "contract-test-key";

  // Reads `box` of shard `id` into an array of `dst_shape` at `dst_offsets`
  // (prefilled with 0x5a) and checks every byte against the store's.
  void ExpectReadExact(uint64_t id, const Shape& shape, DType dtype,
                       const Box& box, const Shape& dst_shape,
                       const std::vector<int64_t>& dst_offsets) {
    SCOPED_TRACE(
        absl::StrCat("shard ", ShapeToString(shape), " box ", box.ToString()));
    const size_t item = ItemSize(dtype);
    int64_t dst_elements = 1;
    for (int64_t d : dst_shape) dst_elements *= d;
    std::string got(static_cast<size_t>(dst_elements) * item, '\x5a');
    ASSERT_THAT(transport_->Read(
                    At(id, shape, dtype), box,
                    ReadTarget::HostArray(got.data(), dst_shape, dst_offsets)),
                ::tessera::testing::IsOk());
    std::string want(got.size(), '\x5a');
    const std::string shard = Bytes(id);
    if (box.NumElements() > 0) {
      CopyBox(shard.data(), shape, box.offsets, want.data(), dst_shape,
              dst_offsets, box.sizes, item);
    }
    EXPECT_TRUE(got == want) << "bytes differ";
  }

  const std::shared_ptr<SharedMemoryArena> arena_ =
      std::make_shared<SharedMemoryArena>();
  std::unique_ptr<HostShardStore> store_;
  std::unique_ptr<WorkerNode> node_;
  std::unique_ptr<DataPort> data_port_;
  ServedWorker served_;
  std::string address_;
  ChannelCache channels_;
  std::unique_ptr<ShardTransport> transport_;
  std::vector<std::shared_ptr<grpc::Service>> extra_services_;
};

TEST_P(TransportContractTest, WholeShardReadsAreByteExact) {
  Allocate(1, {1000}, DType::kInt32);
  Allocate(2, {64, 48}, DType::kInt16);
  Allocate(3, {8, 12, 10}, DType::kFloat64);
  ExpectReadExact(1, {1000}, DType::kInt32, WholeBox({1000}), {1000}, {0});
  ExpectReadExact(2, {64, 48}, DType::kInt16, WholeBox({64, 48}), {64, 48},
                  {0, 0});
  ExpectReadExact(3, {8, 12, 10}, DType::kFloat64, WholeBox({8, 12, 10}),
                  {8, 12, 10}, {0, 0, 0});
}

TEST_P(TransportContractTest, StridedSubBoxesLandInPlace) {
  Allocate(1, {1000}, DType::kInt32);
  Allocate(2, {64, 48}, DType::kInt16);
  Allocate(3, {8, 12, 10}, DType::kFloat64);
  // Rank 1: a middle run, into a larger array at an offset.
  ExpectReadExact(1, {1000}, DType::kInt32, Box{{3}, {500}}, {600}, {50});
  // Rank 2: strided columns; then full rows (contiguous in the shard).
  ExpectReadExact(2, {64, 48}, DType::kInt16, Box{{5, 7}, {20, 13}}, {30, 20},
                  {4, 2});
  ExpectReadExact(2, {64, 48}, DType::kInt16, Box{{10, 0}, {30, 48}}, {30, 48},
                  {0, 0});
  // Rank 3: strided in every dim.
  ExpectReadExact(3, {8, 12, 10}, DType::kFloat64, Box{{1, 2, 3}, {5, 4, 6}},
                  {6, 6, 8}, {1, 1, 2});
}

// Boxes of several MiB whose rows are long (a reshard's pieces): rows a
// few KiB long, and rows longer than a TLS record, each read from the
// middle of the shard into the middle of a larger array, and written from
// the middle of a larger array. A data port moves such rows straight
// between the arrays, a few MiB at a time, so a box of more than that
// crosses its windows in the middle of a row.
TEST_P(TransportContractTest, LongRowsOfLargeBoxesMoveExactly) {
  Allocate(4, {600, 2100}, DType::kInt32);  // rows of 8400 bytes
  Allocate(5, {300, 5000}, DType::kInt32);  // rows of 20000 bytes
  ExpectReadExact(4, {600, 2100}, DType::kInt32, Box{{3, 100}, {590, 1900}},
                  {600, 2000}, {5, 50});
  ExpectReadExact(5, {300, 5000}, DType::kInt32, Box{{1, 500}, {290, 4400}},
                  {291, 4500}, {1, 7});
  for (const auto& [id, shape] :
       {std::pair<uint64_t, Shape>{4, {600, 2100}}, {5, {300, 5000}}}) {
    const Shape src_shape{shape[0] + 3, shape[1] + 11};
    std::string src(static_cast<size_t>(src_shape[0] * src_shape[1] * 4), '\0');
    for (size_t i = 0; i < src.size(); ++i)
      src[i] = static_cast<char>(i * 131 + 7);
    WriteSource source{src.data(), src_shape, {2, 5}};
    ASSERT_THAT(transport_->Write(At(id, shape, DType::kInt32), source),
                ::tessera::testing::IsOk());
    std::string want(static_cast<size_t>(shape[0] * shape[1] * 4), '\0');
    CopyBox(src.data(), src_shape, {2, 5}, want.data(), shape, {0, 0}, shape,
            4);
    EXPECT_TRUE(Bytes(id) == want) << "shard " << id << " holds other bytes";
  }
}

TEST_P(TransportContractTest, SinkReceivesTheBoxInRowMajorOrder) {
  Allocate(2, {64, 48}, DType::kInt16);
  const Box box{{5, 7}, {20, 13}};
  std::string got(static_cast<size_t>(box.NumElements()) * 2, '\0');
  int64_t next = 0;
  ASSERT_THAT(
      transport_->Read(
          At(2, {64, 48}, DType::kInt16), box,
          ReadTarget::Sink([&](int64_t first, int64_t count, const char* data) {
            EXPECT_EQ(first, next);
            std::memcpy(got.data() + first * 2, data,
                        static_cast<size_t>(count) * 2);
            next = first + count;
            return absl::OkStatus();
          })),
      ::tessera::testing::IsOk());
  EXPECT_EQ(next, box.NumElements());
  std::string want(got.size(), '\0');
  const std::string shard = Bytes(2);
  CopyBoxToFlatRange(shard.data(), Shape{64, 48}, box.offsets, box.sizes, 0,
                     box.NumElements(), want.data(), 2);
  EXPECT_TRUE(got == want) << "bytes differ";
}

TEST_P(TransportContractTest, EmptyBoxReadsNothing) {
  Allocate(2, {64, 48}, DType::kInt16);
  std::string out(16, '\x5a');
  ASSERT_THAT(
      transport_->Read(At(2, {64, 48}, DType::kInt16), Box{{3, 0}, {0, 48}},
                       ReadTarget::HostArray(out.data(), {2, 4}, {0, 0})),
      ::tessera::testing::IsOk());
  EXPECT_EQ(out, std::string(16, '\x5a'));
}

TEST_P(TransportContractTest, ReadOfFreedShardIsNotFound) {
  Allocate(1, {1000}, DType::kInt32);
  Allocate(2, {64, 48}, DType::kInt16);
  std::vector<char> out(4000);
  // Shard 1 was read before it was freed (a transport may keep state).
  ASSERT_THAT(transport_->Read(At(1, {1000}, DType::kInt32), WholeBox({1000}),
                               ReadTarget::HostArray(out.data(), {1000}, {0})),
              ::tessera::testing::IsOk());
  ASSERT_THAT(store_->Free(1), ::tessera::testing::IsOk());
  ASSERT_THAT(store_->Free(2), ::tessera::testing::IsOk());
  EXPECT_THAT(transport_->Read(At(1, {1000}, DType::kInt32), WholeBox({1000}),
                               ReadTarget::HostArray(out.data(), {1000}, {0})),
              ::tessera::testing::StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(
      transport_->Read(At(2, {64, 48}, DType::kInt16), Box{{0, 0}, {1, 4}},
                       ReadTarget::HostArray(out.data(), {1, 4}, {0, 0})),
      ::tessera::testing::StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(
      transport_->Read(At(2, {64, 48}, DType::kInt16), Box{{0, 0}, {0, 4}},
                       ReadTarget::HostArray(out.data(), {1, 4}, {0, 0})),
      ::tessera::testing::StatusIs(absl::StatusCode::kNotFound));
}

TEST_P(TransportContractTest, UnreachableWorkerIsUnavailable) {
  Allocate(1, {1000}, DType::kInt32);
  std::vector<char> out(4000);
  // Nothing listens on port 1.
  EXPECT_THAT(transport_->Read(At(1, {1000}, DType::kInt32, "127.0.0.1:1"),
                               WholeBox({1000}),
                               ReadTarget::HostArray(out.data(), {1000}, {0})),
              ::tessera::testing::StatusIs(absl::StatusCode::kUnavailable));
  WriteSource source{out.data(), {1000}, {0}};
  EXPECT_THAT(
      transport_->Write(At(1, {1000}, DType::kInt32, "127.0.0.1:1"), source),
      ::tessera::testing::StatusIs(absl::StatusCode::kUnavailable));
}

TEST_P(TransportContractTest, WriteThenReadBack) {
  Allocate(1, {1000}, DType::kInt32);
  Allocate(3, {8, 12, 10}, DType::kFloat64);
  // The shard is the box at {2, 1, 3} of a larger host array.
  const Shape src_shape{10, 14, 16};
  std::string src(10 * 14 * 16 * 8, '\0');
  for (size_t i = 0; i < src.size(); ++i)
    src[i] = static_cast<char>(i * 131 + 7);
  WriteSource source{src.data(), src_shape, {2, 1, 3}};
  ASSERT_THAT(transport_->Write(At(3, {8, 12, 10}, DType::kFloat64), source),
              ::tessera::testing::IsOk());
  std::string want(8 * 12 * 10 * 8, '\0');
  CopyBox(src.data(), src_shape, {2, 1, 3}, want.data(), Shape{8, 12, 10},
          {0, 0, 0}, Shape{8, 12, 10}, 8);
  EXPECT_TRUE(Bytes(3) == want) << "the worker holds other bytes";
  ExpectReadExact(3, {8, 12, 10}, DType::kFloat64, WholeBox({8, 12, 10}),
                  {8, 12, 10}, {0, 0, 0});
  // Rank 1, from the start of its source.
  std::vector<int32_t> values(1000);
  for (int i = 0; i < 1000; ++i) values[i] = 7 * i - 3;
  WriteSource flat{reinterpret_cast<const char*>(values.data()), {1000}, {0}};
  ASSERT_THAT(transport_->Write(At(1, {1000}, DType::kInt32), flat),
              ::tessera::testing::IsOk());
  EXPECT_TRUE(Bytes(1) ==
              std::string(reinterpret_cast<char*>(values.data()), 4000));
}

// Progress: a read counts each byte as landed once (array or sink, whole or
// strided), a write counts each byte as sent once.
TEST_P(TransportContractTest, ProgressCountsEveryByteOnce) {
  Allocate(2, {64, 48}, DType::kInt16);
  Allocate(3, {8, 12, 10}, DType::kFloat64);
  std::atomic<int64_t> landed{0};
  std::vector<char> out(64 * 48 * 2);
  ASSERT_THAT(
      transport_->Read(At(2, {64, 48}, DType::kInt16), WholeBox({64, 48}),
                       ReadTarget::HostArray(out.data(), {64, 48}, {0, 0})
                           .CountingInto(&landed)),
      ::tessera::testing::IsOk());
  EXPECT_EQ(landed.load(), 64 * 48 * 2);
  landed = 0;
  const Box strided{{5, 7}, {20, 13}};
  ASSERT_THAT(
      transport_->Read(At(2, {64, 48}, DType::kInt16), strided,
                       ReadTarget::HostArray(out.data(), {20, 13}, {0, 0})
                           .CountingInto(&landed)),
      ::tessera::testing::IsOk());
  EXPECT_EQ(landed.load(), 20 * 13 * 2);
  landed = 0;
  ASSERT_THAT(transport_->Read(
                  At(3, {8, 12, 10}, DType::kFloat64), WholeBox({8, 12, 10}),
                  ReadTarget::Sink([](int64_t, int64_t, const char*) {
                    return absl::OkStatus();
                  }).CountingInto(&landed)),
              ::tessera::testing::IsOk());
  EXPECT_EQ(landed.load(), 8 * 12 * 10 * 8);
  std::atomic<int64_t> sent{0};
  std::string src(8 * 12 * 10 * 8, '\x11');
  WriteSource source{src.data(), {8, 12, 10}, {0, 0, 0}};
  source.sent = source.sent.With(&sent);
  ASSERT_THAT(transport_->Write(At(3, {8, 12, 10}, DType::kFloat64), source),
              ::tessera::testing::IsOk());
  EXPECT_EQ(sent.load(), 8 * 12 * 10 * 8);
}

TEST_P(TransportContractTest, TransferBatchOfSeveralPieces) {
  Allocate(1, {1000}, DType::kInt32);
  Allocate(2, {64, 48}, DType::kInt16);
  // The receiving worker: this process, with its own store.
  HostShardStore local;
  ShardDesc desc;
  desc.tensor = "t";
  desc.dtype = DType::kInt16;
  desc.tensor_shape = {40, 40};
  desc.box = WholeBox({40, 40});
  ASSERT_THAT(local.Allocate(20, desc, InitSpec{}), ::tessera::testing::IsOk());
  desc.dtype = DType::kInt32;
  desc.tensor_shape = {300};
  desc.box = WholeBox({300});
  ASSERT_THAT(local.Allocate(10, desc, InitSpec{}), ::tessera::testing::IsOk());

  TransferBatch batch;
  batch.src_worker = "w0";
  batch.src_address = address_;
  batch.dst_worker = "w1";
  batch.dst_address = "here";
  batch.src_capability = Grant(kRightRead);
  batch.pieces.push_back(TransferPiece{2, {0, 0}, 20, {0, 0}, {10, 40}});
  batch.pieces.push_back(TransferPiece{2, {30, 5}, 20, {20, 3}, {15, 30}});
  batch.pieces.push_back(TransferPiece{1, {100}, 10, {50}, {200}});
  StoreReceiver receiver(&local);
  absl::StatusOr<int64_t> moved = transport_->Transfer(batch, receiver);
  ASSERT_THAT(moved.status(), ::tessera::testing::IsOk());
  EXPECT_EQ(*moved, (10 * 40 + 15 * 30) * 2 + 200 * 4);

  std::string want2(40 * 40 * 2, '\0');
  const std::string src2 = Bytes(2);
  CopyBox(src2.data(), Shape{64, 48}, {0, 0}, want2.data(), Shape{40, 40},
          {0, 0}, Shape{10, 40}, 2);
  CopyBox(src2.data(), Shape{64, 48}, {30, 5}, want2.data(), Shape{40, 40},
          {20, 3}, Shape{15, 30}, 2);
  std::string got2(want2.size(), '\0');
  ASSERT_THAT(local.ReadBox(20, WholeBox({40, 40}), 0, 1600, got2.data()),
              ::tessera::testing::IsOk());
  EXPECT_TRUE(got2 == want2) << "2-d pieces differ";
  std::vector<int32_t> got1(300);
  ASSERT_THAT(local.ReadBox(10, WholeBox({300}), 0, 300,
                            reinterpret_cast<char*>(got1.data())),
              ::tessera::testing::IsOk());
  EXPECT_EQ(got1[49], 0);
  EXPECT_EQ(got1[50], 100);
  EXPECT_EQ(got1[249], 299);
  EXPECT_EQ(got1[250], 0);

  // A piece whose source is gone fails the batch as a read would.
  batch.pieces.push_back(TransferPiece{99, {0}, 10, {0}, {4}});
  EXPECT_THAT(transport_->Transfer(batch, receiver).status(),
              ::tessera::testing::StatusIs(absl::StatusCode::kNotFound));
}

TEST_P(TransportContractTest, ChainCountsTheBytesThisTransportMoved) {
  Allocate(1, {1000}, DType::kInt32);
  Allocate(2, {64, 48}, DType::kInt16);
  std::vector<TransportChain::Link> links;
  links.push_back(TransportChain::Link{GetParam().make(&channels_), 0});
  TransportChain chain(std::move(links));
  std::vector<char> out(4000);
  ASSERT_THAT(chain.Read(At(1, {1000}, DType::kInt32), Box{{10}, {90}},
                         ReadTarget::HostArray(out.data(), {1000}, {0})),
              ::tessera::testing::IsOk());
  ASSERT_THAT(chain.Read(At(2, {64, 48}, DType::kInt16), Box{{1, 1}, {3, 5}},
                         ReadTarget::HostArray(out.data(), {3, 5}, {0, 0})),
              ::tessera::testing::IsOk());
  WriteSource source{out.data(), {1000}, {0}};
  ASSERT_THAT(chain.Write(At(1, {1000}, DType::kInt32), source),
              ::tessera::testing::IsOk());
  // A failed read counts nothing.
  EXPECT_FALSE(chain
                   .Read(At(7, {10}, DType::kInt32), WholeBox({10}),
                         ReadTarget::HostArray(out.data(), {10}, {0}))
                   .ok());
  const DataPlaneStats stats = chain.Stats();
  ASSERT_EQ(stats.bytes.size(), 1u);
  EXPECT_EQ(stats.bytes.begin()->second, 90 * 4 + 15 * 2 + 4000);
  EXPECT_EQ(stats.fallbacks.begin()->second, 0);
}

}  // namespace testing
}  // namespace tessera

#endif  // TESSERA_TRANSPORT_TRANSPORT_CONTRACT_TEST_H_
