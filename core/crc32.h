// CRC-32 (ISO-HDLC, zlib's and safetensors tools'): the checksum of saved
// checkpoint pieces and --store_dir shard records. Every byte a save
// writes, a load reads and a restart re-attaches goes through it, so it
// folds 64 bytes at a time with carry-less multiplies where the CPU has
// them (about 4x zlib's table code here), and zlib's otherwise.
#ifndef TESSERA_CORE_CRC32_H_
#define TESSERA_CORE_CRC32_H_

#include <cstdint>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace tessera {

// The CRC-32 (zlib's, ISO-HDLC) of `bytes` continued from `crc` (0 to
// start).
uint32_t ExtendCrc32(uint32_t crc, absl::string_view bytes);

// The CRC-32 of a stored piece of which one reader holds only some bytes,
// every other byte taken as zero. CRC-32 is affine in its message, so the
// part CRCs of readers whose bytes tile the piece, each byte read by
// exactly one, combine into the piece's own (CombinePartCrc32s): a load that
// cuts a piece across shards and workers checks every byte against the CRC
// written at save time while reading only the bytes it needs.
class PartCrc32 {
 public:
  explicit PartCrc32(int64_t piece_bytes) : piece_bytes_(piece_bytes) {}
  // Bytes at `offset` from the piece's start; parts come in offset order,
  // none before the end of the last and none past the piece.
  void Add(int64_t offset, absl::string_view bytes);
  // The CRC-32 of the whole piece with zeros where nothing was added.
  uint32_t Finish() const;

 private:
  int64_t piece_bytes_;
  int64_t at_ = 0;  // bytes [0, at_) are in crc_
  uint32_t crc_ = 0;
  int64_t last_gap_ = -1;  // the gap that zeros_ and shift_ are of
  uint32_t zeros_ = 0;     // CRC-32 of last_gap_ zero bytes
  uint32_t shift_ = 0;     // crc32_combine_gen64(last_gap_)
};

// The CRC-32 of `piece_bytes` zero bytes, in O(log n).
uint32_t ZerosCrc32(int64_t piece_bytes);

// The CRC-32 of a piece of `piece_bytes` bytes from the part CRCs of
// readers whose bytes tile it (each byte in exactly one part).
uint32_t CombinePartCrc32s(absl::Span<const uint32_t> parts,
                           int64_t piece_bytes);

}  // namespace tessera

#endif  // TESSERA_CORE_CRC32_H_
