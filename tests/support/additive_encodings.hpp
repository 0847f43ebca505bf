// Test support: the additive encodings frameworks write (masked = -inf, finfo.min or
// -1e4, or all three mixed with biases on attending keys), as bit patterns, and a
// rewrite of a rendered mask into one of them.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "mask_gen.hpp"

namespace masklens::testing {

// Additive encodings a framework writes: the masked value; or masked keys mixing all
// three masked values (a row holding -inf, finfo.min and -1e4 side by side) between
// attending keys of which some carry a bias; or every attending key carrying one bias
// (an ALiBi-like additive mask, masked by -inf).
enum class Encoding { neg_inf, lowest, minus_1e4, mixed_bias, all_bias };
inline constexpr Encoding kEncodings[] = {Encoding::neg_inf, Encoding::lowest, Encoding::minus_1e4,
                                          Encoding::mixed_bias, Encoding::all_bias};

inline const char* to_string(Encoding e) {
  switch (e) {
    case Encoding::neg_inf: return "-inf";
    case Encoding::lowest: return "finfo.min";
    case Encoding::minus_1e4: return "-1e4";
    case Encoding::mixed_bias: return "mixed with bias";
    case Encoding::all_bias: return "bias on every attending key";
  }
  return "?";
}

// The bit pattern of `value` in an additive type (bf16 rounds to nearest even).
inline std::uint32_t encode(ElementType dtype, float value) {
  const auto f32 = std::bit_cast<std::uint32_t>(value);
  if (dtype == ElementType::float32) return f32;
  if (dtype == ElementType::bfloat16) return (f32 + 0x7fffu + ((f32 >> 16) & 1u)) >> 16;
  // fp16 of the values used here (normal, or +-inf): exact for -1e4, 65504 and the biases.
  if (std::isinf(value)) return value < 0 ? 0xfc00u : 0x7c00u;
  const std::uint32_t sign = (f32 >> 16) & 0x8000u;
  const int exponent = static_cast<int>((f32 >> 23) & 0xffu) - 127 + 15;
  return sign | static_cast<std::uint32_t>(exponent) << 10 | ((f32 >> 13) & 0x3ffu);
}

// A masked value of the encoding (mixed: any of the three; all_bias: -inf).
inline std::uint32_t masked_bits(ElementType dtype, Encoding e, Rng& rng) {
  const float lowest = dtype == ElementType::float16    ? -65504.0f
                       : dtype == ElementType::bfloat16 ? bfloat16_to_float(0xff7f)
                                                        : std::numeric_limits<float>::lowest();
  const float values[] = {-std::numeric_limits<float>::infinity(), lowest, -1e4f};
  const std::size_t pick = e == Encoding::mixed_bias ? static_cast<std::size_t>(uniform(rng, 0, 2))
                           : e == Encoding::all_bias ? 0
                                                     : static_cast<std::size_t>(e);
  return encode(dtype, values[pick]);
}

inline void store_bits(std::uint8_t* p, ElementType dtype, std::uint32_t bits) {
  if (dtype == ElementType::float32) {
    std::memcpy(p, &bits, 4);
  } else {
    const auto h = static_cast<std::uint16_t>(bits);
    std::memcpy(p, &h, 2);
  }
}

// Rewrites every logical element of an additive mask in `e`: masked elements take its
// masked value, attending ones stay +-0 (mixed: carry a bias 20% of the time, -1.5, 0.25
// or 3; all_bias: 0.25 each; all above the default threshold of -1000).
inline void reencode(const MaskView& view, Encoding e, Rng& rng) {
  auto* data = static_cast<std::uint8_t*>(const_cast<void*>(view.data()));
  const int esize = element_size(view.dtype());
  for (std::int64_t b = 0; b < view.batch(); ++b)
    for (std::int64_t h = 0; h < view.heads(); ++h)
      for (std::int64_t q = 0; q < view.q_len(); ++q)
        for (std::int64_t k = 0; k < view.k_len(); ++k) {
          std::uint8_t* p = data + view.offset(b, h, q, k) * esize;
          if (!attends(view.at(b, h, q, k))) {
            store_bits(p, view.dtype(), masked_bits(view.dtype(), e, rng));
          } else if (e == Encoding::all_bias) {
            store_bits(p, view.dtype(), encode(view.dtype(), 0.25f));
          } else if (e == Encoding::mixed_bias && coin(rng, 0.2)) {
            const float biases[] = {-1.5f, 0.25f, 3.0f};
            store_bits(p, view.dtype(), encode(view.dtype(), biases[uniform(rng, 0, 2)]));
          }
        }
}

}  // namespace masklens::testing
