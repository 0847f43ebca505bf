// Block-structured masks and the oracle of the tile counts, for the suites that check
// the device's tile scan (the CUDA suites, and its agent replayed on the CPU): each
// block empty, all attending or random, blocks of random size that need not line up
// with the tiles, so every tile state and ragged edges occur; and each tile's attending
// elements counted element by element.
#pragma once

#include <doctest/doctest.h>

#include <masklens/mask_view.hpp>
#include <masklens/tiles.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "mask_gen.hpp"

namespace masklens::testing {

// B x H x Q x K of `dtype` (true attends; broadcast: one stored slice, stride 0 over
// batch and heads), blocks of `grain` x 1..12 rows by `grain` x 1..12 keys, each empty,
// all attending, half at random or all but 0.5% attending.
inline DenseMask block_structured_mask(Rng& rng, std::int64_t B, std::int64_t H, std::int64_t Q, std::int64_t K,
                                       ElementType dtype, bool broadcast, std::int64_t grain) {
  DenseMask out;
  const std::int64_t pb = broadcast ? 1 : B, ph = broadcast ? 1 : H;
  const int esize = element_size(dtype);
  out.storage.assign(static_cast<std::size_t>((pb * ph * Q * K * esize + 7) / 8 + 1), 0);
  auto* base = reinterpret_cast<std::uint8_t*>(out.storage.data());
  for (std::int64_t s = 0; s < pb * ph; ++s) {
    const std::int64_t bq = grain * uniform(rng, 1, 12), bk = grain * uniform(rng, 1, 12);
    for (std::int64_t q0 = 0; q0 < Q; q0 += bq)
      for (std::int64_t k0 = 0; k0 < K; k0 += bk) {
        const std::int64_t mode = uniform(rng, 0, 3);
        for (std::int64_t q = q0; q < std::min(Q, q0 + bq); ++q)
          for (std::int64_t k = k0; k < std::min(K, k0 + bk); ++k) {
            const bool attend = mode == 1 || (mode == 2 && coin(rng, 0.5)) || (mode == 3 && coin(rng, 0.995));
            write_value(base + ((s * Q + q) * K + k) * esize, dtype, Polarity::true_attends,
                        attend ? Value::allowed : Value::masked, static_cast<int>(uniform(rng, 0, 5)));
          }
      }
  }
  const std::int64_t shape[] = {pb, ph, Q, K};
  auto view = MaskView::contiguous(base, dtype, shape);
  REQUIRE(view.ok());
  out.view = broadcast ? *view->broadcast_to(B, H) : *view;
  out.describe = std::string(to_string(dtype)) + (broadcast ? " broadcast" : "") + " B=" + std::to_string(B) +
                 " H=" + std::to_string(H) + " Q=" + std::to_string(Q) + " K=" + std::to_string(K);
  return out;
}

// Attending elements per tile of `g` (tile_grid_for(v, ...)), element by element.
inline std::vector<unsigned long long> reference_tile_counts(const MaskView& v, const TileGrid& g) {
  std::vector<unsigned long long> counts(static_cast<std::size_t>(g.tiles()), 0);
  for (std::int64_t b = 0; b < g.distinct_batch; ++b)
    for (std::int64_t h = 0; h < g.distinct_heads; ++h)
      for (std::int64_t q = 0; q < g.q_len; ++q)
        for (std::int64_t k = 0; k < g.k_len; ++k)
          if (attends(v.at(b, h, q, k)))
            ++counts[static_cast<std::size_t>(g.tile_index(b * g.distinct_heads + h, q / g.block_q, k / g.block_k))];
  return counts;
}

}  // namespace masklens::testing
