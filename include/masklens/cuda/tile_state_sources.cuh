// Where torch's BlockMask writer (agent_block_mask.cuh) takes each tile's state from: the
// tile scan's 64-bit counts, states the caller has (a host tile summary copied over, say),
// or an exact structure's ranges. A source gives the states of one line at a time —
// kv_line(slice, q tile) over its k tiles, q_line(slice, k tile) over its q tiles — from
// what it works out once a line. Plain values a kernel takes as its parameter. nvcc only.
#pragma once

#include <cstdint>
#include <limits>

#include "../structure_tiles.hpp"
#include "../tile_grid.hpp"

namespace masklens::gpu::detail {

// The writer's lines: slices x q_tiles rows of k tiles (the kv side), then slices x
// k_tiles columns of q tiles (the q side). Counted once on the host: TileGrid's counts
// divide, and a source's lines index with them at every tile.
struct TileLines {
  std::int64_t slices = 1, q_tiles = 1, k_tiles = 1;
  static TileLines of(const TileGrid& g) { return {g.slices(), g.q_tiles(), g.k_tiles()}; }
};

// From the counts: TileGrid::state_of without its divisions. A tile is whole where it is
// in the first q_len / block_q q tiles and k_len / block_k k tiles, and full where whole
// and its count is block_q x block_k (`whole_count`; ~0, which no count reaches, where
// that product passes int64, as state_of never finds such a tile full).
struct StatesFromCounts {
  TileLines lines;
  const unsigned long long* counts = nullptr;
  unsigned long long whole_count = ~0ull;
  std::int64_t whole_q_tiles = 0, whole_k_tiles = 0;

  static StatesFromCounts of(const TileGrid& g, const unsigned long long* counts) {
    StatesFromCounts s;
    s.lines = TileLines::of(g);
    s.counts = counts;
    s.whole_q_tiles = g.q_len / g.block_q;
    s.whole_k_tiles = g.k_len / g.block_k;
    // Both positive (TileGrid's preconditions): the product fits where this holds.
    if (g.block_q <= std::numeric_limits<std::int64_t>::max() / g.block_k)
      s.whole_count = static_cast<unsigned long long>(g.block_q * g.block_k);
    return s;
  }
  // The lines capture values, not `this` (a kernel parameter's address would copy it).
  __device__ __forceinline__ static TileState state(unsigned long long count, bool whole,
                                                    unsigned long long whole_count) {
    if (count == 0) return TileState::empty;
    return whole && count == whole_count ? TileState::full : TileState::partial;
  }
  __device__ __forceinline__ auto kv_line(std::int64_t slice, std::int64_t qt) const {
    const unsigned long long* row = counts + (slice * lines.q_tiles + qt) * lines.k_tiles;
    const std::int64_t whole_to = qt < whole_q_tiles ? whole_k_tiles : 0;  // whole tiles: kt < whole_to
    const unsigned long long area = whole_count;
    return [row, whole_to, area](std::int64_t kt) { return state(row[kt], kt < whole_to, area); };
  }
  __device__ __forceinline__ auto q_line(std::int64_t slice, std::int64_t kt) const {
    const unsigned long long* column = counts + slice * lines.q_tiles * lines.k_tiles + kt;
    const std::int64_t nk = lines.k_tiles, whole_to = kt < whole_k_tiles ? whole_q_tiles : 0;
    const unsigned long long area = whole_count;
    return [column, nk, whole_to, area](std::int64_t qt) { return state(column[qt * nk], qt < whole_to, area); };
  }
};

struct StatesGiven {
  TileLines lines;
  const TileState* states = nullptr;

  static StatesGiven of(const TileGrid& g, const TileState* states) { return {TileLines::of(g), states}; }
  __device__ __forceinline__ auto kv_line(std::int64_t slice, std::int64_t qt) const {
    const TileState* row = states + (slice * lines.q_tiles + qt) * lines.k_tiles;
    return [row](std::int64_t kt) { return row[kt]; };
  }
  __device__ __forceinline__ auto q_line(std::int64_t slice, std::int64_t kt) const {
    const TileState* column = states + slice * lines.q_tiles * lines.k_tiles + kt;
    const std::int64_t nk = lines.k_tiles;
    return [column, nk](std::int64_t qt) { return column[qt * nk]; };
  }
};

// An exact structure's tile states from its ranges (structure_tile_ranges()): a q tile's
// full k tiles are one range inside the one range it touches.
struct StatesFromRanges {
  TileLines lines;
  const TileRowRanges* rows = nullptr;  // [slice][q tile]

  static StatesFromRanges of(const TileGrid& g, const TileRowRanges* rows) { return {TileLines::of(g), rows}; }
  __device__ __forceinline__ static TileState state(const TileRowRanges& r, std::int64_t kt) {
    if (kt >= r.full_begin && kt < r.full_end) return TileState::full;
    return kt >= r.touched_begin && kt < r.touched_end ? TileState::partial : TileState::empty;
  }
  __device__ __forceinline__ auto kv_line(std::int64_t slice, std::int64_t qt) const {
    const TileRowRanges r = rows[slice * lines.q_tiles + qt];
    return [r](std::int64_t kt) { return state(r, kt); };
  }
  __device__ __forceinline__ auto q_line(std::int64_t slice, std::int64_t kt) const {
    const TileRowRanges* column = rows + slice * lines.q_tiles;
    return [column, kt](std::int64_t qt) { return state(column[qt], kt); };
  }
};

}  // namespace masklens::gpu::detail
