// SharedMemoryTransport against worker replies that lie. A real worker cannot
// be made to lie, so a FakeWorker (a real Worker service on a real gRPC
// server on 127.0.0.1:0) answers MapShard with a crafted reply naming a real
// shared-memory segment this test made, of whatever size the case needs.
// Every lie must be an error with the code of shared_memory.h's contract,
// never a fault in the reading process.
#include "transport/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/worker.grpc.pb.h"
#include "rpc/channel.h"
#include "rpc/server.h"
#include "transport/shared_memory_arena.h"
#include "transport/transport_chain.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;
using ::testing::HasSubstr;

// A Worker service whose MapShard answers whatever the test set. Every other
// call is UNIMPLEMENTED, so a fallback to gRPC shows as that code.
class FakeWorker : public v1::Worker::Service {
 public:
  void SetReply(v1::MapShardResponse reply) {
    absl::MutexLock lock(&mu_);
    reply_ = std::move(reply);
  }
  grpc::Status MapShard(grpc::ServerContext*, const v1::MapShardRequest*,
                        v1::MapShardResponse* response) override {
    absl::MutexLock lock(&mu_);
    *response = reply_;
    return grpc::Status::OK;
  }

 private:
  absl::Mutex mu_;
  v1::MapShardResponse reply_ ABSL_GUARDED_BY(mu_);
};

// A shared-memory object of `bytes` bytes holding 0, 1, 2, ... (mod 256);
// unlinked on destruction.
class Segment {
 public:
  explicit Segment(int64_t bytes) {
    static int counter = 0;
    name_ = absl::StrCat("/tessera-shm-test-", getpid(), "-", counter++);
    const int fd = shm_open(name_.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    EXPECT_GE(fd, 0) << std::strerror(errno);
    std::string data(static_cast<size_t>(bytes), '\0');
    for (int64_t i = 0; i < bytes; ++i) data[i] = static_cast<char>(i);
    EXPECT_EQ(write(fd, data.data(), data.size()),
              static_cast<ssize_t>(data.size()));
    close(fd);
  }
  ~Segment() { shm_unlink(name_.c_str()); }
  const std::string& name() const { return name_; }

 private:
  std::string name_;
};

// How the transport under test keeps mappings: one per read, whole shards
// per (worker, shard), or whole segments by identity (SegmentMappingPool).
enum class Keeping { kPerRead, kCached, kPooled };

class SharedMemoryTest : public ::testing::TestWithParam<Keeping> {
 protected:
  void SetUp() override {
    if (access("/dev/shm", W_OK) != 0 || LocalHostId().empty())
      GTEST_SKIP() << "no writable /dev/shm here";
    absl::StatusOr<RunningServer> server =
        StartServer("127.0.0.1:0", {&worker_});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    address_ = absl::StrCat("127.0.0.1:", server_.port);
    SharedMemoryTransportOptions options;
    options.cache_mappings = GetParam() == Keeping::kCached;
    options.keep_segment_bytes =
        GetParam() == Keeping::kPooled ? int64_t{1} << 30 : 0;
    transport_ = std::make_unique<SharedMemoryTransport>(&channels_, options);
  }
  void TearDown() override {
    transport_.reset();
    if (server_.server != nullptr) server_.server->Shutdown();
  }

  // A reply as a worker on this host would give for `segment`.
  static v1::MapShardResponse Reply(const Segment& segment, int64_t bytes,
                                    const Shape& shape, int64_t item_bytes) {
    v1::MapShardResponse reply;
    reply.set_host_id(LocalHostId());
    reply.set_segment(segment.name());
    reply.set_bytes(bytes);
    for (int64_t d : shape) reply.add_shape(d);
    reply.set_item_bytes(item_bytes);
    return reply;
  }

  RemoteShard Shard(const Shape& shape, int64_t item_bytes) const {
    RemoteShard shard;
    shard.location.worker = "fake";
    shard.location.address = address_;
    shard.location.shard_id = 7;
    shard.item_bytes = item_bytes;
    shard.shape = shape;
    return shard;
  }

  // Reads `box` of `shard` into a fresh array of the box's sizes.
  absl::Status ReadInto(std::vector<char>* out, const RemoteShard& shard,
                        const Box& box) {
    out->assign(static_cast<size_t>(box.NumElements() * shard.item_bytes), 0);
    const Shape sizes(box.sizes.begin(), box.sizes.end());
    return transport_->Read(
        shard, box,
        ReadTarget::HostArray(out->data(), sizes,
                              std::vector<int64_t>(sizes.size(), 0)));
  }

  FakeWorker worker_;
  RunningServer server_;
  std::string address_;
  ChannelCache channels_;
  std::unique_ptr<SharedMemoryTransport> transport_;
};

TEST_P(SharedMemoryTest, TruthfulReplyIsReadByteExact) {
  Segment segment(6 * 8 * 4);
  worker_.SetReply(Reply(segment, 6 * 8 * 4, {6, 8}, 4));
  std::vector<char> out;
  ASSERT_THAT(ReadInto(&out, Shard({6, 8}, 4), Box{{2, 3}, {3, 4}}), IsOk());
  for (int r = 0; r < 3; ++r) {
    for (int c = 0; c < 4 * 4; ++c) {
      EXPECT_EQ(out[r * 16 + c], static_cast<char>(((2 + r) * 8 + 3) * 4 + c))
          << r << "," << c;
    }
  }
}

// A worker reuses a freed shard's pages for another shard after renaming
// them away (shared_memory_arena.h). A read whose copy overlaps that must
// not hand on the other shard's bytes as this one's: NOT_FOUND, as a gRPC
// read of the freed shard says. The sink renames the segment mid-read.
TEST_P(SharedMemoryTest, ShardFreedDuringTheCopyIsNotFound) {
  Segment segment(6 * 8 * 4);
  worker_.SetReply(Reply(segment, 6 * 8 * 4, {6, 8}, 4));
  const std::string moved = segment.name() + "-parked";
  bool renamed = false;
  ReadTarget target =
      ReadTarget::Sink([&](int64_t, int64_t, const char*) -> absl::Status {
        if (!renamed) {
          renamed = rename(("/dev/shm" + segment.name()).c_str(),
                           ("/dev/shm" + moved).c_str()) == 0;
        }
        return absl::OkStatus();
      });
  EXPECT_THAT(transport_->Read(Shard({6, 8}, 4), Box{{0, 0}, {6, 8}}, target),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("freed")));
  ASSERT_TRUE(renamed);
  // And a kept mapping is not used again once the name is gone.
  std::vector<char> out;
  EXPECT_FALSE(ReadInto(&out, Shard({6, 8}, 4), Box{{0, 0}, {1, 1}}).ok());
  shm_unlink(moved.c_str());
}

// The crash this guards against: a 4 KiB segment whose reply claims a
// 1000 x 1000 shape made the copy run 4 MB past the mapping (SIGSEGV).
TEST_P(SharedMemoryTest, ShapeNeedingMoreBytesThanTheReplySaysIsInternal) {
  Segment segment(4096);
  worker_.SetReply(Reply(segment, 4096, {1000, 1000}, 4));
  std::vector<char> out;
  EXPECT_THAT(ReadInto(&out, Shard({1000, 1000}, 4), WholeBox({1000, 1000})),
              StatusIs(absl::StatusCode::kInternal,
                       ::testing::AllOf(HasSubstr("inconsistent"),
                                        HasSubstr("4096 bytes"),
                                        HasSubstr("[1000, 1000]"))));
  // A worker pulling a reshard piece does not know the shard's shape.
  EXPECT_THAT(ReadInto(&out, Shard({}, 4), Box{{999, 0}, {1, 1000}}),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("inconsistent")));
}

TEST_P(SharedMemoryTest, ZeroByteReplyForANonEmptyShapeIsInternal) {
  Segment segment(64);
  worker_.SetReply(Reply(segment, 0, {16}, 4));
  std::vector<char> out;
  EXPECT_THAT(ReadInto(&out, Shard({16}, 4), WholeBox({16})),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("inconsistent")));
}

TEST_P(SharedMemoryTest, SegmentShorterThanAConsistentReplyFallsBack) {
  Segment segment(100);  // the reply says 4000
  worker_.SetReply(Reply(segment, 4000, {1000}, 4));
  std::vector<char> out;
  EXPECT_THAT(ReadInto(&out, Shard({1000}, 4), Box{{0}, {10}}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("smaller than the shard")));
}

TEST_P(SharedMemoryTest, NegativeAndOverflowingSizesAreInternal) {
  Segment segment(64);
  worker_.SetReply(Reply(segment, 64, {-4, -4}, 4));
  std::vector<char> out;
  EXPECT_THAT(ReadInto(&out, Shard({}, 4), Box{{0, 0}, {1, 1}}),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("negative")));
  worker_.SetReply(Reply(segment, 64, {int64_t{1} << 62, int64_t{1} << 62}, 4));
  EXPECT_THAT(ReadInto(&out, Shard({}, 4), Box{{0, 0}, {1, 1}}),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("overflows")));
  worker_.SetReply(Reply(segment, 64, {}, 4));
  EXPECT_THAT(ReadInto(&out, Shard({}, 4), Box{{0}, {1}}),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("no dims")));
}

TEST_P(SharedMemoryTest, SegmentNamesThatAreNotOneObjectAreInternal) {
  Segment segment(64);
  std::vector<char> out;
  for (const std::string& name :
       {std::string("/../../etc/passwd"), std::string("relative"),
        std::string("/"), std::string(""), std::string("/a\0b", 4),
        "/" + std::string(300, 'x')}) {
    v1::MapShardResponse reply = Reply(segment, 64, {16}, 4);
    reply.set_segment(name);
    worker_.SetReply(reply);
    EXPECT_THAT(ReadInto(&out, Shard({16}, 4), WholeBox({16})),
                StatusIs(absl::StatusCode::kInternal,
                         HasSubstr("not one shared-memory object")))
        << name;
  }
  v1::MapShardResponse reply = Reply(segment, 64, {16}, 4);
  reply.set_liveness("/x/y");
  worker_.SetReply(reply);
  EXPECT_THAT(ReadInto(&out, Shard({16}, 4), WholeBox({16})),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("liveness")));
}

TEST_P(SharedMemoryTest, TrueRepliesThatDoNotFitTheCallerFallBack) {
  Segment segment(64);
  std::vector<char> out;
  // Another element size than the metadata's.
  worker_.SetReply(Reply(segment, 64, {8}, 8));
  EXPECT_THAT(ReadInto(&out, Shard({16}, 4), WholeBox({16})),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  // Another shape than the metadata's.
  worker_.SetReply(Reply(segment, 64, {4, 4}, 4));
  EXPECT_THAT(ReadInto(&out, Shard({16}, 4), WholeBox({16})),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  // A box outside the shard the worker names.
  worker_.SetReply(Reply(segment, 64, {16}, 4));
  EXPECT_THAT(
      ReadInto(&out, Shard({}, 4), Box{{10}, {10}}),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("outside")));
  // Another host.
  v1::MapShardResponse reply = Reply(segment, 64, {16}, 4);
  reply.set_host_id("elsewhere");
  worker_.SetReply(reply);
  EXPECT_THAT(ReadInto(&out, Shard({16}, 4), WholeBox({16})),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("another host")));
}

TEST_P(SharedMemoryTest, WriteThroughALyingReplyIsInternal) {
  Segment segment(4096);
  worker_.SetReply(Reply(segment, 4096, {1000, 1000}, 4));
  std::vector<char> source(1000 * 1000 * 4, 'x');
  WriteSource write{source.data(), {1000, 1000}, {0, 0}};
  EXPECT_THAT(transport_->Write(Shard({1000, 1000}, 4), write),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("inconsistent")));
}

TEST_P(SharedMemoryTest, ChainDoesNotFallBackPastALyingReply) {
  Segment segment(4096);
  worker_.SetReply(Reply(segment, 4096, {1000, 1000}, 4));
  DataPlaneOptions options;
  options.shared_memory = true;
  options.shared_memory_min_bytes = 0;
  options.cache_mappings = GetParam() == Keeping::kCached;
  options.keep_segment_bytes =
      GetParam() == Keeping::kPooled ? int64_t{1} << 30 : 0;
  std::unique_ptr<TransportChain> chain =
      TransportChain::Make(&channels_, options);
  std::vector<char> out(1000 * 4);
  // gRPC would answer UNIMPLEMENTED here (FakeWorker): the error is the
  // shared-memory one, not a silent retry elsewhere.
  EXPECT_THAT(chain->Read(Shard({1000, 1000}, 4), Box{{0, 0}, {1, 1000}},
                          ReadTarget::HostArray(out.data(), {1, 1000}, {0, 0})),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("inconsistent")));
}

INSTANTIATE_TEST_SUITE_P(Mapping, SharedMemoryTest,
                         ::testing::Values(Keeping::kPerRead, Keeping::kCached,
                                           Keeping::kPooled),
                         [](const ::testing::TestParamInfo<Keeping>& info) {
                           switch (info.param) {
                             case Keeping::kPerRead:
                               return "PerRead";
                             case Keeping::kCached:
                               return "Cached";
                             case Keeping::kPooled:
                               return "Pooled";
                           }
                           return "Unknown";
                         });

// What a shard segment is to SegmentMappingPool: a name for an object.
SharedSegment SegmentOf(const Segment& segment, int64_t bytes) {
  SharedSegment s;
  s.name = segment.name();
  s.bytes = bytes;
  s.shape = {bytes};
  return s;
}

absl::StatusOr<std::unique_ptr<ShardMapping>> PoolMap(
    SegmentMappingPool& pool, const SharedSegment& segment, int64_t begin,
    int64_t end) {
  const int fd = shm_open(segment.name.c_str(), O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0) return absl::NotFoundError(segment.name);
  absl::StatusOr<std::unique_ptr<ShardMapping>> mapping =
      pool.Map(fd, segment, begin, end);
  close(fd);
  return mapping;
}

// A peer that reuses a freed shard's pages renames the same object
// (shared_memory_arena.h): the pool serves the new name from the mapping it
// kept, which reads the object's current bytes and watches the new name.
TEST(SegmentMappingPoolTest, SameObjectUnderANewNameIsNotMappedAgain) {
  if (access("/dev/shm", W_OK) != 0) GTEST_SKIP() << "no /dev/shm here";
  SegmentMappingPool pool(int64_t{1} << 30, absl::Minutes(1));
  Segment segment(1 << 20);
  absl::StatusOr<std::unique_ptr<ShardMapping>> first =
      PoolMap(pool, SegmentOf(segment, 1 << 20), 0, 1 << 20);
  ASSERT_THAT(first, IsOk());
  EXPECT_EQ((*first)->At(300)[0], static_cast<char>(300 % 256));
  const char* address = (*first)->At(0);
  first->reset();  // the pool keeps it

  // Reused: new bytes, new name.
  const std::string renamed = segment.name() + "-reused";
  ASSERT_EQ(rename(("/dev/shm" + segment.name()).c_str(),
                   ("/dev/shm" + renamed).c_str()),
            0);
  {
    const int fd = shm_open(renamed.c_str(), O_RDWR, 0);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(pwrite(fd, "x", 1, 300), 1);
    close(fd);
  }
  SharedSegment now = SegmentOf(segment, 1 << 20);
  now.name = renamed;
  absl::StatusOr<std::unique_ptr<ShardMapping>> second =
      PoolMap(pool, now, 4096, 8192);
  ASSERT_THAT(second, IsOk());
  EXPECT_EQ((*second)->At(0), address);
  EXPECT_EQ((*second)->At(300)[0], 'x');
  EXPECT_TRUE((*second)->Current());
  EXPECT_EQ(pool.size(), 1u);
  EXPECT_EQ(pool.bytes(), 1 << 20);

  // Renamed away again (freed by the peer): the mapping no longer vouches.
  ASSERT_EQ(rename(("/dev/shm" + renamed).c_str(),
                   ("/dev/shm" + segment.name()).c_str()),
            0);
  EXPECT_FALSE((*second)->Current());
}

// A kept mapping must not hold memory its peer let go: once the object has
// no name, the sweeper drops it within a second or two.
TEST(SegmentMappingPoolTest, ObjectsWithNoNameLeftAreDropped) {
  if (access("/dev/shm", W_OK) != 0) GTEST_SKIP() << "no /dev/shm here";
  SegmentMappingPool pool(int64_t{1} << 30, absl::Minutes(1));
  auto segment = std::make_unique<Segment>(65536);
  ASSERT_THAT(PoolMap(pool, SegmentOf(*segment, 65536), 0, 65536), IsOk());
  EXPECT_EQ(pool.size(), 1u);
  segment.reset();  // unlinked
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (pool.size() > 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(pool.size(), 0u);
  EXPECT_EQ(pool.bytes(), 0);
}

TEST(SegmentMappingPoolTest, BoundedByBytesAndIdleTime) {
  if (access("/dev/shm", W_OK) != 0) GTEST_SKIP() << "no /dev/shm here";
  SegmentMappingPool pool(2 * 65536, absl::Seconds(1));
  Segment a(65536), b(65536), c(65536), huge(4 * 65536);
  ASSERT_THAT(PoolMap(pool, SegmentOf(a, 65536), 0, 10), IsOk());
  absl::SleepFor(absl::Milliseconds(5));
  ASSERT_THAT(PoolMap(pool, SegmentOf(b, 65536), 0, 10), IsOk());
  absl::SleepFor(absl::Milliseconds(5));
  ASSERT_THAT(PoolMap(pool, SegmentOf(c, 65536), 0, 10), IsOk());
  EXPECT_EQ(pool.size(), 2u);  // a, the least recently used, went
  EXPECT_EQ(pool.bytes(), 2 * 65536);
  // Larger than the bound: mapped for the caller, not kept.
  absl::StatusOr<std::unique_ptr<ShardMapping>> big =
      PoolMap(pool, SegmentOf(huge, 4 * 65536), 0, 4 * 65536);
  ASSERT_THAT(big, IsOk());
  EXPECT_EQ((*big)->At(70000)[0], static_cast<char>(70000 % 256));
  EXPECT_EQ(pool.size(), 2u);
  // At most `max_entries` kept, whatever their bytes.
  SegmentMappingPool few(int64_t{1} << 30, absl::Minutes(1), /*max_entries=*/2);
  for (const Segment* segment : {&a, &b, &c}) {
    ASSERT_THAT(PoolMap(few, SegmentOf(*segment, 65536), 0, 10), IsOk());
  }
  EXPECT_EQ(few.size(), 2u);
  // Unused for `idle`: dropped.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (pool.size() > 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(pool.size(), 0u);
}

TEST(SegmentMappingPoolTest, SpansOutsideOrObjectsShorterThanSaidAreRefused) {
  if (access("/dev/shm", W_OK) != 0) GTEST_SKIP() << "no /dev/shm here";
  SegmentMappingPool pool(int64_t{1} << 30, absl::Minutes(1));
  Segment segment(4096);
  EXPECT_THAT(PoolMap(pool, SegmentOf(segment, 4096), 0, 4097),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(
      PoolMap(pool, SegmentOf(segment, 8192), 0, 8192),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("smaller")));
  EXPECT_EQ(pool.size(), 0u);
}

// The checks after the RPC, without a network: the segment is a memfd.
TEST(CopyBoxFromMappingTest, BoxOutsideTheMappedSpanIsInternal) {
  const int fd = memfd_create("segment", 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 64), 0);
  SharedSegment segment;
  segment.name = "/memfd";
  segment.bytes = 64;
  segment.shape = {16};
  // Map only the bytes of elements 0..3, then ask for 8..11.
  absl::StatusOr<std::unique_ptr<ShardMapping>> mapping =
      MapSegmentBox(fd, segment, Box{{0}, {4}}, 4);
  close(fd);
  ASSERT_THAT(mapping, IsOk());
  std::vector<char> out(16);
  EXPECT_THAT(
      CopyBoxFromMapping(**mapping, {16}, Box{{8}, {4}},
                         ReadTarget::HostArray(out.data(), {4}, {0}), 4),
      StatusIs(absl::StatusCode::kInternal,
               HasSubstr("not all in the mapped")));
  EXPECT_THAT(
      CopyBoxFromMapping(**mapping, {16}, Box{{0}, {4}},
                         ReadTarget::HostArray(out.data(), {4}, {0}), 4),
      IsOk());
}

// A --store_dir shard's file named by path: read byte-exact from a
// read-only mapping; a path that is not an absolute, plain `.data` path is
// INTERNAL; a symlink or a directory falls back; writes go over gRPC.
TEST_P(SharedMemoryTest, ShardFilesAreMappedReadOnlyByPath) {
  const std::string top = absl::StrCat(std::getenv("TEST_TMPDIR"), "/files-",
                                       static_cast<int>(GetParam()));
  // A worker's --store_dir keeps shard 7 in DIR/shards/<7 in hex>.data.
  auto store_dir = [&](const std::string& name) {
    const std::string shards = absl::StrCat(top, "/", name, "/shards");
    EXPECT_TRUE(std::filesystem::create_directories(shards));
    return shards;
  };
  const std::string dir = store_dir("ok");
  const std::string path = dir + "/0000000000000007.data";
  {
    std::string data(64, '\0');
    for (int i = 0; i < 64; ++i) data[i] = static_cast<char>(i * 3);
    std::ofstream(path, std::ios::binary) << data;
  }
  Segment unused(1);
  v1::MapShardResponse reply = Reply(unused, 64, {16}, 4);
  reply.set_segment(path);
  reply.set_file(true);
  worker_.SetReply(reply);
  std::vector<char> out;
  ASSERT_THAT(ReadInto(&out, Shard({16}, 4), Box({4}, {8})), IsOk());
  for (int i = 0; i < 32; ++i)
    EXPECT_EQ(out[i], static_cast<char>((16 + i) * 3));
  // Writes are the worker's (its record and CRC): not through the file.
  std::vector<char> bytes(64, 1);
  WriteSource source;
  source.data = bytes.data();
  source.shape = {16};
  source.offsets = {0};
  EXPECT_THAT(transport_->Write(Shard({16}, 4), source),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("--store_dir")));

  for (const std::string& bad :
       {std::string("relative.data"), dir + "/../x.data", dir + "//x.data",
        dir + "/./x.data", std::string("/etc/passwd"), dir + "/x.data/",
        std::string("/a\0b.data", 10)}) {
    reply.set_segment(bad);
    worker_.SetReply(reply);
    EXPECT_THAT(ReadInto(&out, Shard({16}, 4), WholeBox({16})),
                StatusIs(absl::StatusCode::kInternal,
                         HasSubstr("not the path of a shard file")))
        << bad;
  }
  // A worker names only the shard's own file: any other path, even one of
  // a shard file's form, is a lying reply and opens nothing.
  const std::string secret = top + "/secret.data";
  std::ofstream(secret) << "private";
  for (const std::string& other : {secret, dir + "/0000000000000008.data",
                                   top + "/0000000000000007.data"}) {
    reply.set_segment(other);
    worker_.SetReply(reply);
    EXPECT_THAT(
        ReadInto(&out, Shard({16}, 4), WholeBox({16})),
        StatusIs(absl::StatusCode::kInternal, HasSubstr("is not named")))
        << other;
  }
  // A symlink is not followed, at the end or on the way (both fall back:
  // FAILED_PRECONDITION).
  const std::string linked = store_dir("link") + "/0000000000000007.data";
  ASSERT_EQ(symlink(path.c_str(), linked.c_str()), 0);
  const std::string via = top + "/via";
  ASSERT_EQ(symlink((top + "/ok").c_str(), via.c_str()), 0);
  for (const std::string& other :
       {linked, via + "/shards/0000000000000007.data"}) {
    reply.set_segment(other);
    worker_.SetReply(reply);
    EXPECT_THAT(ReadInto(&out, Shard({16}, 4), WholeBox({16})),
                StatusIs(absl::StatusCode::kFailedPrecondition))
        << other;
  }
  // A directory or a FIFO of the name is no shard file: refused at once (a
  // FIFO would block an open for good).
  const std::string as_dir = store_dir("dir") + "/0000000000000007.data";
  ASSERT_EQ(mkdir(as_dir.c_str(), 0755), 0);
  const std::string as_fifo = store_dir("fifo") + "/0000000000000007.data";
  ASSERT_EQ(mkfifo(as_fifo.c_str(), 0600), 0);
  for (const std::string& other : {as_dir, as_fifo}) {
    reply.set_segment(other);
    worker_.SetReply(reply);
    EXPECT_THAT(
        ReadInto(&out, Shard({16}, 4), WholeBox({16})),
        StatusIs(absl::StatusCode::kInternal, HasSubstr("not a regular file")))
        << other;
  }
  // The shard freed: NOT_FOUND.
  reply.set_segment(store_dir("gone") + "/0000000000000007.data");
  worker_.SetReply(reply);
  EXPECT_THAT(ReadInto(&out, Shard({16}, 4), WholeBox({16})),
              StatusIs(absl::StatusCode::kNotFound));
}

TEST(ValidateMapShardReplyTest, ChecksEveryField) {
  v1::MapShardResponse reply;
  reply.set_host_id("h");
  reply.set_segment("/s");
  reply.set_bytes(24);
  reply.add_shape(2);
  reply.add_shape(3);
  reply.set_item_bytes(4);
  absl::StatusOr<SharedSegment> ok = ValidateMapShardReply(reply, "h", 4);
  ASSERT_THAT(ok, IsOk());
  EXPECT_EQ(ok->bytes, 24);
  EXPECT_EQ(ok->shape, (Shape{2, 3}));
  EXPECT_THAT(ValidateMapShardReply(reply, "", 4).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(ValidateMapShardReply(reply, "h", 0).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  reply.set_bytes(25);
  EXPECT_THAT(ValidateMapShardReply(reply, "h", 4).status(),
              StatusIs(absl::StatusCode::kInternal));
  reply.set_bytes(-24);
  EXPECT_THAT(ValidateMapShardReply(reply, "h", 4).status(),
              StatusIs(absl::StatusCode::kInternal));
}

}  // namespace
}  // namespace tessera
