// The tiles of an exact structure, from its fields alone (no mask is read): for each q
// tile, the k tiles it touches and the ones it fills, in O(1) row evaluations per q tile
// (O(q_tiles) per batch). decide() counts them to charge FlexAttention (cost.hpp);
// tiles.hpp writes them out as a TileSummary. Light on purpose: policy.hpp includes it.
//
// Why a q tile needs only two rows. For every exact kind and modifier, over the rows
// that attend a key (docs/tiles.md works through each rule):
//   1. those rows are one interval [first, end) of each batch;
//   2. a row's first and last keys (lo, hi) never decrease from one row to the next;
//   3. a row's first key is at most one past the previous row's last (no gap).
// So the attending rows a..b of a q tile touch exactly the keys lo(a)..hi(b), and a k
// tile is filled by all of them iff it lies inside lo(b)..hi(a). tests/test_tiles.cpp
// holds this to scanned masks of random structures of every kind.
#pragma once

#include <algorithm>
#include <cstdint>

#include "structure.hpp"
#include "tile_grid.hpp"

namespace masklens {

// The k tiles of one q tile: [touched_begin, touched_end) hold an attending pair,
// [full_begin, full_end) (inside them) only attending pairs; the rest are empty.
struct TileRowRanges {
  std::int64_t touched_begin = 0, touched_end = 0;
  std::int64_t full_begin = 0, full_end = 0;
};

// Whether batch b of the structure has rows of its own (a modifier given per batch),
// or every batch is batch 0's.
inline bool batches_differ(const MaskStructure& s) noexcept {
  return s.segments.size() > 1 || s.kv_valid.size() > 1 || s.q_valid.size() > 1;
}

// The tiling of a structure: one slice per batch when they differ, else one for all;
// the heads are always alike. Preconditions: as TileGrid's (make_tile_grid checks them).
inline TileGrid structure_tile_grid(const MaskStructure& s, TileSize size) noexcept {
  TileGrid g;
  g.batch = s.batch;
  g.heads = s.heads;
  g.q_len = s.q_len;
  g.k_len = s.k_len;
  g.block_q = size.q;
  g.block_k = size.k;
  g.distinct_batch = batches_differ(s) ? s.batch : 1;
  g.distinct_heads = 1;
  return g;
}

namespace detail {

inline bool row_attends(const MaskStructure& s, std::int64_t b, std::int64_t q) noexcept {
  const MaskStructure::Bounds r = s.row_bounds(b, q);
  return r.lo <= r.hi;
}

// The attending rows of batch b, [start, end) (property 1 above). One attending row is
// found among the first and last rows of the q tiles; the interval's ends are then
// binary searches from it. Only when none of those rows attends (fewer than block_q
// attending rows, all inside one tile) is the batch walked row by row.
inline KeyRange attending_rows(const MaskStructure& s, std::int64_t b, const TileGrid& g) noexcept {
  const KeyRange rows = s.query_rows(b);
  if (rows.end <= rows.start) return {0, 0};
  std::int64_t found = -1;
  const auto probe = [&](std::int64_t q) {
    if (found < 0 && q >= rows.start && q < rows.end && row_attends(s, b, q)) found = q;
  };
  probe(rows.start);
  probe(rows.end - 1);
  for (std::int64_t qt = 0, n = g.q_tiles(); qt < n && found < 0; ++qt) {
    probe(g.q_begin(qt));
    probe(g.q_end(qt) - 1);
  }
  if (found < 0) {
    if (s.empty_rows_in_batch(b) == s.q_len) return {0, 0};
    for (std::int64_t q = rows.start; q < rows.end && found < 0; ++q) probe(q);
    if (found < 0) return {0, 0};
  }
  // The first attending row in [rows.start, found]: rows before it attend nothing.
  std::int64_t lo = rows.start, hi = found;
  while (lo < hi) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    if (row_attends(s, b, mid)) hi = mid;
    else lo = mid + 1;
  }
  const std::int64_t first = lo;
  // The last attending row in [found, rows.end).
  lo = found;
  hi = rows.end - 1;
  while (lo < hi) {
    const std::int64_t mid = lo + (hi - lo + 1) / 2;
    if (row_attends(s, b, mid)) lo = mid;
    else hi = mid - 1;
  }
  return {first, lo + 1};
}

}  // namespace detail

// The k tiles of q tile qt of batch b, given the batch's attending rows (from
// detail::attending_rows). Preconditions: s.validate() is ok, s.kind != arbitrary.
inline TileRowRanges structure_tile_row(const MaskStructure& s, std::int64_t b, const TileGrid& g, std::int64_t qt,
                                        const KeyRange& attending) noexcept {
  TileRowRanges r;
  const std::int64_t q0 = g.q_begin(qt), q1 = g.q_end(qt);
  const std::int64_t a = std::max(q0, attending.start), z = std::min(q1, attending.end) - 1;
  if (a > z) return r;
  const MaskStructure::Bounds first = s.row_bounds(b, a), last = s.row_bounds(b, z);
  r.touched_begin = first.lo / g.block_k;
  r.touched_end = last.hi / g.block_k + 1;
  // Full only when every row of a whole q tile attends: then the keys every row attends
  // are lo(z)..hi(a), and a ragged last k tile is left out by the division.
  if (a == q0 && z == q1 - 1 && q1 - q0 == g.block_q) {
    const std::int64_t begin = last.lo / g.block_k + (last.lo % g.block_k != 0 ? 1 : 0);
    const std::int64_t end = (first.hi + 1) / g.block_k;
    if (end > begin) r.full_begin = begin, r.full_end = end;
  }
  return r;
}

// The share of partial and full tiles of the structure at `size`: the same for every
// head and, given per batch, averaged over the batches.
inline TileFractions structure_tile_fractions(const MaskStructure& s, TileSize size) noexcept {
  const TileGrid g = structure_tile_grid(s, size);
  const std::int64_t nq = g.q_tiles(), nk = g.k_tiles();
  double partial = 0, full = 0;
  for (std::int64_t b = 0; b < g.distinct_batch; ++b) {
    const KeyRange attending = detail::attending_rows(s, b, g);
    for (std::int64_t qt = 0; qt < nq; ++qt) {
      const TileRowRanges r = structure_tile_row(s, b, g, qt, attending);
      full += static_cast<double>(r.full_end - r.full_begin);
      partial += static_cast<double>((r.touched_end - r.touched_begin) - (r.full_end - r.full_begin));
    }
  }
  const double tiles = static_cast<double>(g.distinct_batch) * static_cast<double>(nq) * static_cast<double>(nk);
  return {size.q, size.k, partial / tiles, full / tiles};
}

}  // namespace masklens
