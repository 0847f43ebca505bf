// render: a structure back to a dense boolean mask [batch, q_len, k_len] (true =
// attend), for samples, pictures and tests: its rule (mask_rule.hpp) at every element,
// apart from the interval form row() that classification compares rows with.
#pragma once

#include <cstdint>
#include <vector>

#include "status.hpp"
#include "structure.hpp"

namespace masklens {

inline Result<std::vector<std::uint8_t>> render_dense(const MaskStructure& s) {
  if (s.kind == StructureKind::arbitrary)
    return error(ErrorCode::invalid_argument, "an arbitrary structure has no rendering");
  if (Status invalid = s.validate(); !invalid.ok()) return invalid;
  if (s.q_len > INT64_MAX / s.k_len || s.q_len * s.k_len > INT64_MAX / s.batch)
    return error(ErrorCode::invalid_shape, "structure shape is empty or overflows");
  return catch_alloc([&]() -> Result<std::vector<std::uint8_t>> {
    std::vector<std::uint8_t> out(static_cast<std::size_t>(s.batch * s.q_len * s.k_len), 0);
    std::uint8_t* p = out.data();
    for (std::int64_t b = 0; b < s.batch; ++b)
      for (std::int64_t q = 0; q < s.q_len; ++q, p += s.k_len)
        for (std::int64_t k = 0; k < s.k_len; ++k) p[k] = s.allows(b, q, k) ? 1 : 0;
    return out;
  });
}

}  // namespace masklens
