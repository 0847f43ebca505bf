// Additive mask values classified on their bits, the way the fast scanners read them
// (the GPU kernel, and the host scanner's 8-bytes-at-a-time path). For IEEE formats
// the magnitude bits order the values, so "v <= threshold" for negative v is
// "magnitude >= thr_mag", where thr_mag is the smallest magnitude whose value reaches
// |threshold|, found once with the same decoders classify_element() uses.
#pragma once

#include <cstdint>

#include "config.hpp"
#include "element.hpp"

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

}  // namespace masklens
