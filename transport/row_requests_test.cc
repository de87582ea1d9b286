// ReadRowsInRequests: how a row read is cut into requests (rows, bytes and
// shards per request), rows too large for a request read alone, and a
// reply of the wrong size delivering nothing.
#include <cstring>
#include <string>
#include <vector>

#include "core/limits.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "transport/shard_transport.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;

// Row r of every shard holds bytes (shard_id + r) % 251; Read serves rows
// too large for a request the same way.
class RowServer : public ShardTransport {
 public:
  const std::string& name() const override { return name_; }
  absl::Status Read(const RemoteShard& shard, const Box& box,
                    const ReadTarget& target) override {
    ++reads;
    const int64_t row = RowBytes(shard.shape, shard.item_bytes);
    std::string bytes(
        static_cast<size_t>(row),
        static_cast<char>((shard.location.shard_id + box.offsets[0]) % 251));
    std::memcpy(target.data(), bytes.data(), bytes.size());
    return absl::OkStatus();
  }
  absl::Status Write(const RemoteShard&, const WriteSource&) override {
    return absl::UnimplementedError("no writes");
  }
  // A request's reply as a worker would give it, less `short_by` bytes.
  absl::Status Answer(const RowRequest& request, std::string* reply,
                      int64_t row_bytes, size_t short_by = 0) {
    requests.push_back(request);
    for (const RowRequest::Shard& shard : request.shards) {
      for (int64_t r : shard.rows) {
        reply->append(static_cast<size_t>(row_bytes),
                      static_cast<char>((shard.shard_id + r) % 251));
      }
    }
    reply->resize(reply->size() - short_by);
    return absl::OkStatus();
  }

  std::vector<RowRequest> requests;
  int reads = 0;

 private:
  const std::string name_ = "rows";
};

ShardRows Entry(uint64_t id, Shape shape, std::vector<int64_t> rows) {
  ShardRows entry;
  entry.shard.location.address = "w0:1";
  entry.shard.location.shard_id = id;
  entry.shard.item_bytes = 4;
  entry.shard.shape = std::move(shape);
  entry.rows = std::move(rows);
  return entry;
}

TEST(RowRequestsTest, RowsAreCutByCountBytesAndShards) {
  RowServer server;
  std::vector<ShardRows> entries;
  // 1 KiB rows: kMaxChunkBytes / 1 KiB of them per request.
  std::vector<int64_t> rows(5000);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<int64_t>(i);
  entries.push_back(Entry(1, {5000, 256}, rows));
  for (uint64_t id = 2; id <= 4; ++id)
    entries.push_back(Entry(id, {8, 2}, {7}));
  std::vector<std::vector<bool>> seen(entries.size());
  for (size_t e = 0; e < entries.size(); ++e)
    seen[e].assign(entries[e].rows.size(), false);
  ASSERT_THAT(
      ReadRowsInRequests(
          server, entries,
          [&](size_t e, size_t k, const char* row) {
            const ShardRows& entry = entries[e];
            EXPECT_EQ(row[0], static_cast<char>((entry.shard.location.shard_id +
                                                 entry.rows[k]) %
                                                251));
            seen[e][k] = true;
          },
          /*max_shards=*/2,
          [&](const RowRequest& request, std::string* reply) {
            server.requests.push_back(request);
            for (const RowRequest::Shard& shard : request.shards) {
              const int64_t bytes = shard.shard_id == 1 ? 1024 : 8;
              for (int64_t r : shard.rows) {
                reply->append(static_cast<size_t>(bytes),
                              static_cast<char>((shard.shard_id + r) % 251));
              }
            }
            return absl::OkStatus();
          }),
      IsOk());
  for (size_t e = 0; e < entries.size(); ++e) {
    for (size_t k = 0; k < seen[e].size(); ++k)
      EXPECT_TRUE(seen[e][k]) << e << " " << k;
  }
  for (const RowRequest& request : server.requests) {
    EXPECT_LE(request.bytes, kMaxChunkBytes);
    EXPECT_LE(request.shards.size(), 2u);
  }
  // 5000 rows of 1 KiB at 4096 per request (4 MiB); the other 904 with
  // shard 2's row (two shards at most); shards 3 and 4.
  ASSERT_EQ(server.requests.size(), 3u);
  EXPECT_EQ(server.requests[0].shards[0].rows.size(), 4096u);
  ASSERT_EQ(server.requests[1].shards.size(), 2u);
  EXPECT_EQ(server.requests[1].shards[0].rows.size(), 904u);
  EXPECT_EQ(server.requests[2].shards.size(), 2u);
  EXPECT_EQ(server.reads, 0);
}

TEST(RowRequestsTest, ARowLargerThanARequestIsReadAlone) {
  RowServer server;
  const int64_t wide = kMaxChunkBytes / 4 + 1;  // one row over the limit
  std::vector<ShardRows> entries = {Entry(9, {3, wide}, {2, 0})};
  int delivered = 0;
  ASSERT_THAT(ReadRowsInRequests(
                  server, entries,
                  [&](size_t, size_t k, const char* row) {
                    EXPECT_EQ(row[0],
                              static_cast<char>(9 + entries[0].rows[k]));
                    ++delivered;
                  },
                  0,
                  [&](const RowRequest&, std::string*) {
                    return absl::InternalError("no request expected");
                  }),
              IsOk());
  EXPECT_EQ(delivered, 2);
  EXPECT_EQ(server.reads, 2);
}

TEST(RowRequestsTest, AShortReplyDeliversNoRow) {
  RowServer server;
  std::vector<ShardRows> entries = {Entry(1, {10, 4}, {1, 2, 3})};
  int delivered = 0;
  EXPECT_THAT(
      ReadRowsInRequests(
          server, entries, [&](size_t, size_t, const char*) { ++delivered; }, 0,
          [&](const RowRequest& request, std::string* reply) {
            return server.Answer(request, reply, 16, /*short_by=*/1);
          }),
      StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_EQ(delivered, 0);
}

TEST(RowRequestsTest, ShardsOfTwoWorkersOrWithoutShapesAreRefused) {
  RowServer server;
  std::vector<ShardRows> entries = {Entry(1, {10, 4}, {1}),
                                    Entry(2, {10, 4}, {1})};
  entries[1].shard.location.address = "w1:1";
  auto send = [&](const RowRequest& request, std::string* reply) {
    return server.Answer(request, reply, 16);
  };
  EXPECT_THAT(ReadRowsInRequests(
                  server, entries, [](size_t, size_t, const char*) {}, 0, send),
              StatusIs(absl::StatusCode::kInvalidArgument));
  entries[1].shard.location.address = "w0:1";
  entries[1].shard.shape.clear();
  EXPECT_THAT(ReadRowsInRequests(
                  server, entries, [](size_t, size_t, const char*) {}, 0, send),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace tessera
