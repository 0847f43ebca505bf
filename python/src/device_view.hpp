// How masklens._core and masklens._cuda describe a CUDA mask to each other: integers
// (data pointer, element type name, shape and strides in elements, threshold), the
// values a torch tensor hands out for free. DLPack would cost a capsule and, for a
// CUDA tensor, a stream handshake per call; these calls are the drop-in's hot path.
#pragma once

#include <masklens/mask_view.hpp>
#include <masklens/status.hpp>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace masklens::python {

inline Result<ElementType> element_named(const std::string& name) {
  for (ElementType t : {ElementType::boolean, ElementType::uint8, ElementType::int8, ElementType::float16,
                        ElementType::bfloat16, ElementType::float32})
    if (to_string(t) == name) return t;
  return error(ErrorCode::unsupported_dtype,
               "mask dtype '" + name + "' is not a mask type (bool, uint8, int8, float16, bfloat16, float32)");
}

// The view both modules build from the same integers, so the span table one sizes is
// the one the other fills.
inline Result<MaskView> view_of(std::uintptr_t data, const std::string& dtype, const std::vector<std::int64_t>& shape,
                                const std::vector<std::int64_t>& strides, float masked_threshold) {
  Result<ElementType> type = element_named(dtype);
  if (!type) return type.status();
  if (data == 0) return error(ErrorCode::invalid_argument, "mask data pointer is null");
  MaskEncoding enc;
  enc.masked_threshold = masked_threshold;
  return MaskView::make(reinterpret_cast<const void*>(data), *type, std::span<const std::int64_t>(shape),
                        std::span<const std::int64_t>(strides), enc);
}

}  // namespace masklens::python
