#include "core/crc32.h"

#include <zlib.h>

#include <string>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace tessera {
namespace {

#if defined(__x86_64__)
// One 16-byte fold: `a` times x^(128)/x^(192) mod P (the two halves of `k`),
// added to the next 16 bytes.
__attribute__((target("pclmul,sse4.1"))) inline __m128i Fold16(__m128i a,
                                                               __m128i next,
                                                               __m128i k) {
  return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(a, k, 0x11), next),
                       _mm_clmulepi64_si128(a, k, 0x00));
}

// The raw (not inverted) CRC-32 register after `len` bytes (>= 64, a
// multiple of 16) from `crc`: four lanes folded 64 bytes at a time, then
// into one, then a Barrett reduction (Gopal et al., "Fast CRC Computation
// for Generic Polynomials Using PCLMULQDQ", Intel 2009; the constants are
// the bit-reflected ones of the polynomial 0x04C11DB7).
__attribute__((target("pclmul,sse4.1"))) uint32_t FoldCrc32(
    const unsigned char* buf, size_t len, uint32_t crc) {
  const __m128i k1k2 = _mm_set_epi64x(0x01c6e41596, 0x0154442bd4);
  const __m128i k3k4 = _mm_set_epi64x(0x00ccaa009e, 0x01751997d0);
  const __m128i k5k0 = _mm_set_epi64x(0, 0x0163cd6124);
  const __m128i poly = _mm_set_epi64x(0x01f7011641, 0x01db710641);
  auto load = [](const unsigned char* p) {
    return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  };
  __m128i x1 =
      _mm_xor_si128(load(buf), _mm_cvtsi32_si128(static_cast<int>(crc)));
  __m128i x2 = load(buf + 16);
  __m128i x3 = load(buf + 32);
  __m128i x4 = load(buf + 48);
  buf += 64;
  len -= 64;
  for (; len >= 64; buf += 64, len -= 64) {
    x1 = Fold16(x1, load(buf), k1k2);
    x2 = Fold16(x2, load(buf + 16), k1k2);
    x3 = Fold16(x3, load(buf + 32), k1k2);
    x4 = Fold16(x4, load(buf + 48), k1k2);
  }
  x1 = Fold16(x1, x2, k3k4);
  x1 = Fold16(x1, x3, k3k4);
  x1 = Fold16(x1, x4, k3k4);
  for (; len >= 16; buf += 16, len -= 16) x1 = Fold16(x1, load(buf), k3k4);
  // 128 bits to 64, then Barrett-reduced to 32.
  const __m128i low32 = _mm_setr_epi32(~0, 0, ~0, 0);
  x1 = _mm_xor_si128(_mm_srli_si128(x1, 8),
                     _mm_clmulepi64_si128(x1, k3k4, 0x10));
  x2 = _mm_srli_si128(x1, 4);
  x1 = _mm_xor_si128(_mm_clmulepi64_si128(_mm_and_si128(x1, low32), k5k0, 0x00),
                     x2);
  x2 = _mm_clmulepi64_si128(_mm_and_si128(x1, low32), poly, 0x10);
  x2 = _mm_clmulepi64_si128(_mm_and_si128(x2, low32), poly, 0x00);
  return static_cast<uint32_t>(_mm_extract_epi32(_mm_xor_si128(x1, x2), 1));
}
#endif

}  // namespace

uint32_t ExtendCrc32(uint32_t crc, absl::string_view bytes) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  size_t n = bytes.size();
#if defined(__x86_64__)
  static const bool kFold =
      __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
  if (kFold && n >= 64) {
    const size_t folded = n & ~size_t{15};
    crc = ~FoldCrc32(p, folded, ~crc);
    p += folded;
    n -= folded;
  }
#endif
  return static_cast<uint32_t>(crc32_z(crc, p, n));
}

uint32_t ZerosCrc32(int64_t bytes) {
  constexpr int64_t kBlock = 64 << 10;
  static const std::string* const kZeros =
      new std::string(static_cast<size_t>(kBlock), '\0');
  // The remainder from a buffer of zeros, then whole blocks by doubling:
  // the CRC of zeros followed by zeros is the CRC of both (crc32_combine).
  uint32_t crc = ExtendCrc32(0, absl::string_view(*kZeros).substr(
                                    0, static_cast<size_t>(bytes % kBlock)));
  uint32_t power = ExtendCrc32(0, *kZeros);  // CRC of `power_bytes` zeros
  int64_t power_bytes = kBlock;
  for (int64_t blocks = bytes / kBlock; blocks > 0; blocks >>= 1) {
    if (blocks & 1) {
      crc = static_cast<uint32_t>(crc32_combine64(crc, power, power_bytes));
    }
    if (blocks > 1) {
      power = static_cast<uint32_t>(crc32_combine64(power, power, power_bytes));
      power_bytes *= 2;
    }
  }
  return crc;
}

void PartCrc32::Add(int64_t offset, absl::string_view bytes) {
  const int64_t gap = offset - at_;
  if (gap > 0) {
    // crc(P || 0^gap) = crc32_combine(crc(P), crc(0^gap), gap); a column
    // load's parts keep one gap, so its operator is made once.
    if (gap != last_gap_) {
      last_gap_ = gap;
      zeros_ = ZerosCrc32(gap);
      shift_ = static_cast<uint32_t>(crc32_combine_gen64(gap));
    }
    crc_ = static_cast<uint32_t>(crc32_combine_op(crc_, zeros_, shift_));
  }
  crc_ = ExtendCrc32(crc_, bytes);
  at_ = offset + static_cast<int64_t>(bytes.size());
}

uint32_t PartCrc32::Finish() const {
  const int64_t rest = piece_bytes_ - at_;
  if (rest <= 0) return crc_;
  return static_cast<uint32_t>(crc32_combine64(crc_, ZerosCrc32(rest), rest));
}

uint32_t CombinePartCrc32s(absl::Span<const uint32_t> parts,
                           int64_t piece_bytes) {
  // crc(m) = L(m) ^ c(n) with L linear and c(n) = crc(0^n) for messages of
  // n bytes, so the XOR of k parts' CRCs is crc(whole) ^ c(n) when k is even.
  uint32_t crc = 0;
  for (uint32_t part : parts) crc ^= part;
  if (parts.size() % 2 == 0) crc ^= ZerosCrc32(piece_bytes);
  return crc;
}

}  // namespace tessera
