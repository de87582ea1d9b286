#include "core/crc32.h"

#include <zlib.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tessera {
namespace {

uint32_t Zlib(uint32_t crc, const std::string& bytes) {
  return static_cast<uint32_t>(
      crc32_z(crc, reinterpret_cast<const Bytef*>(bytes.data()), bytes.size()));
}

TEST(Crc32, IsZlibsCheckValue) {
  // The CRC-32/ISO-HDLC check value of "123456789", in two calls.
  EXPECT_EQ(ExtendCrc32(ExtendCrc32(0, "1234"), "56789"), 0xcbf43926u);
}

// The folded path (64 bytes and more) against zlib's table code: every
// length around the fold's steps, any start value, any alignment.
TEST(Crc32, FoldsAsZlibComputes) {
  std::mt19937 rng(3);
  std::string buffer(9000, '\0');
  for (char& c : buffer) c = static_cast<char>(rng());
  for (size_t n = 0; n < 600; ++n) {
    for (size_t shift : {0, 1, 7}) {
      const std::string bytes = buffer.substr(shift, n);
      const uint32_t start = n % 2 ? static_cast<uint32_t>(rng()) : 0;
      ASSERT_EQ(ExtendCrc32(start, bytes), Zlib(start, bytes))
          << n << " bytes at +" << shift;
    }
  }
  for (int trial = 0; trial < 2000; ++trial) {
    const size_t n = rng() % buffer.size();
    const std::string bytes = buffer.substr(rng() % (buffer.size() - n), n);
    const uint32_t start = static_cast<uint32_t>(rng());
    ASSERT_EQ(ExtendCrc32(start, bytes), Zlib(start, bytes)) << n;
  }
  const std::string big(3 << 20, '\x5a');
  EXPECT_EQ(ExtendCrc32(0, big), Zlib(0, big));
}

TEST(Crc32, OfZerosMatchesZerosFed) {
  for (int64_t n : {0, 1, 7, 65535, 65536, 65537, 3 * 65536 + 11, 1 << 20}) {
    EXPECT_EQ(ZerosCrc32(n),
              ExtendCrc32(0, std::string(static_cast<size_t>(n), '\0')))
        << n;
  }
}

// Pieces cut into parts by random readers (each byte in exactly one part,
// each part a set of runs in offset order): the parts' CRCs combine into
// the CRC of the piece, and any one changed byte changes the combination.
TEST(PartCrc32, PartsOfAPieceCombineIntoItsCrc) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t n = std::uniform_int_distribution<int64_t>(1, 200000)(rng);
    std::string piece(static_cast<size_t>(n), '\0');
    for (char& c : piece) c = static_cast<char>(rng());
    const int readers = std::uniform_int_distribution<int>(1, 5)(rng);
    // Cut the piece into runs, each given to a random reader.
    std::vector<PartCrc32> parts(static_cast<size_t>(readers), PartCrc32(n));
    for (int64_t at = 0; at < n;) {
      const int64_t len = std::min<int64_t>(
          n - at, std::uniform_int_distribution<int64_t>(1, 9000)(rng));
      parts[rng() % parts.size()].Add(
          at, absl::string_view(piece).substr(static_cast<size_t>(at),
                                              static_cast<size_t>(len)));
      at += len;
    }
    std::vector<uint32_t> crcs;
    for (const PartCrc32& part : parts) crcs.push_back(part.Finish());
    EXPECT_EQ(CombinePartCrc32s(crcs, n), ExtendCrc32(0, piece))
        << "trial " << trial << ": " << readers << " readers of " << n;
    // One flipped bit in one part shows.
    crcs[0] ^= 1;
    EXPECT_NE(CombinePartCrc32s(crcs, n), ExtendCrc32(0, piece));
  }
}

TEST(PartCrc32, AColumnLoadsRunsWithOneGap) {
  // 64 rows of 1 KiB read as 4 columns of 256 bytes, a reader per column.
  std::string piece(64 * 1024, '\0');
  for (size_t i = 0; i < piece.size(); ++i)
    piece[i] = static_cast<char>(i * 31);
  std::vector<uint32_t> crcs;
  for (int col = 0; col < 4; ++col) {
    PartCrc32 part(static_cast<int64_t>(piece.size()));
    for (int row = 0; row < 64; ++row) {
      const int64_t at = row * 1024 + col * 256;
      part.Add(at, absl::string_view(piece).substr(at, 256));
    }
    crcs.push_back(part.Finish());
  }
  EXPECT_EQ(CombinePartCrc32s(crcs, static_cast<int64_t>(piece.size())),
            ExtendCrc32(0, piece));
  // A reader that holds every byte gives the piece's CRC alone.
  PartCrc32 whole(static_cast<int64_t>(piece.size()));
  whole.Add(0, piece);
  EXPECT_EQ(whole.Finish(), ExtendCrc32(0, piece));
  EXPECT_EQ(CombinePartCrc32s({whole.Finish()}, piece.size()),
            ExtendCrc32(0, piece));
}

}  // namespace
}  // namespace tessera
