// Additive mask values classified on their bits, the way the fast scanners read them
// (the GPU kernel, and the host scanner's 16-bytes-at-a-time path). For IEEE formats
// the magnitude bits order the values, so "v <= threshold" for negative v is
// "magnitude >= thr_mag", where thr_mag is the smallest magnitude whose value reaches
// |threshold|, found once with the same decoders classify_element() uses.
//
// Two forms of one rule: classify_bits() for one value, and AdditiveLanes for the
// 16-byte vectors both scanners load, every lane at once (SWAR). The host scanner and
// the device kernel instantiate the same AdditiveLanes (64-bit words on the host,
// 32-bit words on the device), and tests hold both word sizes to classify_element()
// on every 16-bit pattern in every lane.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "config.hpp"
#include "element.hpp"
#include "row_span.hpp"

namespace masklens {

struct AdditiveBits {
  std::uint32_t sign = 0, mag_mask = 0, inf_mag = 0, thr_mag = 0;
};

// The bit-level form of the additive encoding of `dtype` at `threshold` (finite, < 0).
inline AdditiveBits additive_bits(ElementType dtype, float threshold) noexcept {
  AdditiveBits b;
  if (!is_additive(dtype)) return b;
  const bool wide = dtype == ElementType::float32;
  b.sign = wide ? 0x80000000u : 0x8000u;
  b.mag_mask = b.sign - 1;
  b.inf_mag = dtype == ElementType::float32 ? 0x7f800000u : dtype == ElementType::bfloat16 ? 0x7f80u : 0x7c00u;
  const auto value = [&](std::uint32_t mag) {
    return dtype == ElementType::float32 ? bits_to_float(mag)
           : dtype == ElementType::bfloat16 ? bfloat16_to_float(static_cast<std::uint16_t>(mag))
                                            : float16_to_float(static_cast<std::uint16_t>(mag));
  };
  // Smallest magnitude whose value reaches |threshold| (values rise with magnitude).
  const float target = -threshold;
  std::uint32_t lo = 1, hi = b.inf_mag;
  while (lo < hi) {
    const std::uint32_t mid = lo + (hi - lo) / 2;
    if (value(mid) >= target) hi = mid;
    else lo = mid + 1;
  }
  b.thr_mag = lo;
  return b;
}

// One value's class from its bits (the same answer as classify_element()).
MASKLENS_HOST_DEVICE inline ElementClass classify_bits(std::uint32_t v, const AdditiveBits& b) noexcept {
  const std::uint32_t mag = v & b.mag_mask;
  if (mag == 0) return ElementClass::allowed;
  if (mag > b.inf_mag) return ElementClass::invalid;  // NaN
  if (!(v & b.sign)) return mag == b.inf_mag ? ElementClass::invalid : ElementClass::bias;
  if (mag == b.inf_mag) return ElementClass::masked;  // -inf
  return mag >= b.thr_mag ? ElementClass::finite_masked : ElementClass::bias;
}

// The row flag an element of class c sets (0 for allowed and masked).
MASKLENS_HOST_DEVICE constexpr std::uint32_t row_flag(ElementClass c) noexcept {
  return c == ElementClass::bias            ? std::uint32_t{kRowBias}
         : c == ElementClass::finite_masked ? std::uint32_t{kRowFiniteMasked}
         : c == ElementClass::invalid       ? std::uint32_t{kRowInvalid}
                                            : 0u;
}

namespace lanes {

// `Word` with a 1 in the lowest bit of every `LaneBits`-bit lane.
template <class Word, int LaneBits>
MASKLENS_HOST_DEVICE constexpr Word ones() noexcept {
  Word w = 0;
  for (int bit = 0; bit < 8 * static_cast<int>(sizeof(Word)); bit += LaneBits) w |= Word{1} << bit;
  return w;
}

// The top bit of each lane of `tops` (nothing else may be set) gathered into the low
// bits of the result, lane 0 in bit 0. One multiplication: the multiplier moves lane j's
// top bit to bit W - L + j (W word bits, L lanes); every other product of a lane bit and
// a multiplier bit lands on a distinct position below W - L or past W, so no sum carries.
template <class Word, int LaneBits>
MASKLENS_HOST_DEVICE constexpr std::uint32_t gather_tops(Word tops) noexcept {
  constexpr int kWordBits = 8 * static_cast<int>(sizeof(Word)), kLanes = kWordBits / LaneBits;
  constexpr Word kMultiplier = [] {
    Word m = 0;
    for (int j = 0; j < kLanes; ++j) m |= Word{1} << (kWordBits - kLanes + j - j * LaneBits - (LaneBits - 1));
    return m;
  }();
  return static_cast<std::uint32_t>((tops * kMultiplier) >> (kWordBits - kLanes));
}

}  // namespace lanes

// What a 16-byte vector of additive values says: which lanes attend, and the row flags
// its lanes set.
struct VectorClass {
  std::uint32_t attend = 0;  // bit i: lane i attends (+-0, or a bias)
  std::uint32_t flags = 0;   // kRowBias | kRowFiniteMasked | kRowInvalid
};

// The lane classifier: every value of a 16-byte vector of 2-byte (fp16 / bf16) or
// 4-byte (fp32) additive values at once, read as 16 / sizeof(Word) words of several
// lanes (Word = std::uint64_t on the host, std::uint32_t on the device). Same answer,
// lane for lane, as classify_bits(). The usual vector (every lane +-0, -inf or a finite
// value at or below the threshold) costs a few integer operations per word; a vector
// with a bias or a NaN / +inf lane takes a second, longer look, still without a loop
// over values.
template <int Esize, class Word>
struct AdditiveLanes {
  static_assert(Esize == 2 || Esize == 4, "additive values are 2 or 4 bytes");
  static_assert(std::is_same_v<Word, std::uint32_t> || std::is_same_v<Word, std::uint64_t>, "32- or 64-bit words");
  static constexpr int kLaneBits = 8 * Esize;
  static constexpr unsigned kLanesPerWord = sizeof(Word) / Esize;
  static constexpr std::size_t kWords = 16 / sizeof(Word);
  static constexpr int kLanes = 16 / Esize;
  static constexpr Word kOnes = lanes::ones<Word, kLaneBits>();
  static constexpr Word kSign = kOnes << (kLaneBits - 1);  // each lane's sign bit

  // Magnitudes broadcast to every lane: the threshold's, +-inf's, and the first NaN's.
  Word thr = 0, inf = 0, nan = 0;

  AdditiveLanes() = default;
  MASKLENS_HOST_DEVICE explicit AdditiveLanes(const AdditiveBits& b) noexcept
      : thr(kOnes * b.thr_mag), inf(kOnes * b.inf_mag), nan(kOnes * (b.inf_mag + 1)) {}

  // Per lane, with the sign bit set first so that no borrow crosses a lane (magnitudes
  // and the constants are below it): the sign bit of (|v| | sign) - x survives iff
  // |v| >= x. The results below keep only each lane's sign bit meaningful.
  MASKLENS_HOST_DEVICE VectorClass classify(const Word (&w)[kWords]) const noexcept {
    Word zero[kWords];
    Word other = 0;   // lanes neither +-0 nor masked: a bias, NaN or +inf
    Word finite = 0;  // masked lanes that are finite (at or below the threshold, not -inf)
    MASKLENS_UNROLL
    for (unsigned i = 0; i < kWords; ++i) {
      const Word with_sign = w[i] | kSign;
      const Word at_thr = with_sign - thr;  // |v| >= thr
      const Word past_inf = with_sign - nan;  // |v| > inf: NaN
      const Word at_inf = with_sign - inf;  // |v| >= inf
      const Word nonzero = (w[i] & ~kSign) + ~kSign;  // |v| != 0 (no carry out of a lane: |v| <= ~sign)
      const Word masked = w[i] & at_thr & ~past_inf;  // negative, thr <= |v| <= inf
      other |= nonzero & ~masked;
      finite |= masked & ~at_inf;
      zero[i] = ~nonzero & kSign;
    }
    VectorClass c;
    if ((other & kSign) == 0) {
      MASKLENS_UNROLL
      for (unsigned i = 0; i < kWords; ++i)
        c.attend |= lanes::gather_tops<Word, kLaneBits>(zero[i]) << (i * kLanesPerWord);
      c.flags = (finite & kSign) ? std::uint32_t{kRowFiniteMasked} : 0u;
      return c;
    }
    return classify_rare(w);
  }

  // The same classification with bias and invalid lanes told apart: a vector holding a
  // bias, a NaN or +inf (rare in a mask; bias masks are the exception, and cost this).
  MASKLENS_HOST_DEVICE VectorClass classify_rare(const Word (&w)[kWords]) const noexcept {
    VectorClass c;
    Word bias = 0, finite = 0, invalid = 0;
    MASKLENS_UNROLL
    for (unsigned i = 0; i < kWords; ++i) {
      const Word with_sign = w[i] | kSign;
      const Word at_thr = with_sign - thr, past_inf = with_sign - nan, at_inf = with_sign - inf;
      const Word nonzero = (w[i] & ~kSign) + ~kSign;
      const Word negative_at_thr = w[i] & at_thr;
      const Word lane_bias = nonzero & ~at_inf & ~negative_at_thr;  // finite, non-zero, not masked
      c.attend |= lanes::gather_tops<Word, kLaneBits>((~nonzero | lane_bias) & kSign) << (i * kLanesPerWord);
      bias |= lane_bias;
      finite |= negative_at_thr & ~at_inf;
      invalid |= past_inf | (~w[i] & at_inf);  // NaN of either sign, or +inf
    }
    c.flags = ((bias & kSign) ? std::uint32_t{kRowBias} : 0u) |
              ((finite & kSign) ? std::uint32_t{kRowFiniteMasked} : 0u) |
              ((invalid & kSign) ? std::uint32_t{kRowInvalid} : 0u);
    return c;
  }
};

}  // namespace masklens
