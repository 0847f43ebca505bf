// render: a structure back to a dense boolean mask [batch, q_len, k_len] (true =
// attend), for samples, pictures and tests. Precondition: kind != arbitrary.
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
      for (std::int64_t q = 0; q < s.q_len; ++q, p += s.k_len) {
        const RowSpan r = s.row(b, q);
        for (std::int64_t k = r.first; !r.empty() && k <= r.last; ++k) p[k] = 1;
      }
    return out;
  });
}

}  // namespace masklens
