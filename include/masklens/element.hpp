// Element types a mask may have and what one element means. Host and device code
// share these functions, so every scanner reads an element the same way.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

#include "config.hpp"

namespace masklens {

enum class ElementType : std::uint8_t {
  boolean,  // 1 byte, non-zero = true
  uint8,    // 1 byte, non-zero = true
  int8,     // 1 byte, non-zero = true
  float16,  // IEEE binary16, additive
  bfloat16, // bfloat16, additive
  float32,  // IEEE binary32, additive
};

constexpr std::string_view to_string(ElementType t) noexcept {
  switch (t) {
    case ElementType::boolean: return "bool";
    case ElementType::uint8: return "uint8";
    case ElementType::int8: return "int8";
    case ElementType::float16: return "float16";
    case ElementType::bfloat16: return "bfloat16";
    case ElementType::float32: return "float32";
  }
  return "unknown";
}

MASKLENS_HOST_DEVICE constexpr int element_size(ElementType t) noexcept {
  switch (t) {
    case ElementType::float16:
    case ElementType::bfloat16: return 2;
    case ElementType::float32: return 4;
    default: return 1;
  }
}

MASKLENS_HOST_DEVICE constexpr bool is_additive(ElementType t) noexcept {
  return t == ElementType::float16 || t == ElementType::bfloat16 || t == ElementType::float32;
}

// Which boolean value means "attend": torch and HF use true = attend;
// TransformerEngine uses true = masked out.
enum class Polarity : std::uint8_t { true_attends, true_masks };

// What one element says about its (query, key) pair.
enum class ElementClass : std::uint8_t {
  allowed,        // boolean attend, or additive exactly 0
  masked,         // boolean masked, or additive -inf
  finite_masked,  // additive finite value <= the threshold: weight 0 unless the whole row is masked
  bias,           // additive value that is neither 0 nor masked: the key attends with a bias
  invalid,        // NaN or +inf: no meaning as a mask
};

// Allowed and bias elements both let the key take part in the softmax.
MASKLENS_HOST_DEVICE constexpr bool attends(ElementClass c) noexcept {
  return c == ElementClass::allowed || c == ElementClass::bias;
}

MASKLENS_HOST_DEVICE inline float bits_to_float(std::uint32_t bits) noexcept {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
#endif
}

MASKLENS_HOST_DEVICE inline float bfloat16_to_float(std::uint16_t bits) noexcept {
  return bits_to_float(static_cast<std::uint32_t>(bits) << 16);
}

// Exact binary16 -> binary32 conversion (subnormals included), without <cuda_fp16.h>.
MASKLENS_HOST_DEVICE inline float float16_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = std::uint32_t{h & 0x8000u} << 16;  // braces, not a cast: already unsigned
  std::uint32_t exponent = (h >> 10) & 0x1fu;
  std::uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return bits_to_float(sign | 0x7f800000u | (mantissa << 13));  // inf / NaN
  if (exponent == 0) {
    if (mantissa == 0) return bits_to_float(sign);
    // Subnormal: normalise.
    exponent = 1;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --exponent;
    }
    mantissa &= 0x3ffu;
  }
  return bits_to_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

// Classifies one additive value. -0.0 counts as 0 (allowed).
MASKLENS_HOST_DEVICE inline ElementClass classify_additive(float v, float masked_threshold) noexcept {
  if (v == 0.0f) return ElementClass::allowed;
  if (v != v) return ElementClass::invalid;  // NaN
  if (v > 3.402823466e38f) return ElementClass::invalid;  // +inf
  if (v < -3.402823466e38f) return ElementClass::masked;  // -inf
  return v <= masked_threshold ? ElementClass::finite_masked : ElementClass::bias;
}

// Classifies the element at `p` (which must be aligned to its size).
MASKLENS_HOST_DEVICE inline ElementClass classify_element(const void* p, ElementType t, Polarity polarity,
                                                          float masked_threshold) noexcept {
  switch (t) {
    case ElementType::float16:
      return classify_additive(float16_to_float(*static_cast<const std::uint16_t*>(p)), masked_threshold);
    case ElementType::bfloat16:
      return classify_additive(bfloat16_to_float(*static_cast<const std::uint16_t*>(p)), masked_threshold);
    case ElementType::float32:
      return classify_additive(*static_cast<const float*>(p), masked_threshold);
    default: {
      const bool truth = *static_cast<const std::uint8_t*>(p) != 0;
      return (truth == (polarity == Polarity::true_attends)) ? ElementClass::allowed : ElementClass::masked;
    }
  }
}

}  // namespace masklens
