// Tiles of a mask: how a [batch, heads, Q, K] mask is cut into block_q x block_k tiles,
// what one tile is (empty, partial, full), and the writers of torch's BlockMask layout
// (BlockMask.from_kv_blocks; flash-attn's CuTe block-sparse tensors) for one row or one
// column of tiles. Plain values, raw pointers and 64-bit indexing, no allocation and no
// standard containers: a device kernel includes this header and fills the same arrays
// the host does (every function is MASKLENS_HOST_DEVICE). The host types and scanners
// are in tiles.hpp; docs/tiles.md describes the layout.
#pragma once

#include <cstdint>

#include "config.hpp"

namespace masklens {

// Tile size in query rows and keys. torch's BLOCK_SIZE=(q, k); 128 x 128 is its default.
struct TileSize {
  std::int64_t q = 128;
  std::int64_t k = 128;
};

// A tile holds no attending pair (empty), only attending pairs (full), or some of each
// (partial). As torch's create_block_mask, which pads the mask with masked elements to
// whole tiles, a ragged last tile (cut short by Q or K) is never full.
enum class TileState : std::uint8_t { empty = 0, partial = 1, full = 2 };

// What share of a mask's tiles are partial and full (the rest are empty), with the tile
// size they were counted at: what decide() charges FlexAttention on (cost.hpp).
struct TileFractions {
  std::int64_t block_q = 128, block_k = 128;
  double partial = 0;  // of all batch x heads x q_tiles x k_tiles tiles
  double full = 0;
};

// Tile counts over a summary's tiles.
struct TileTally {
  std::int64_t empty = 0, partial = 0, full = 0;
  MASKLENS_HOST_DEVICE constexpr std::int64_t total() const noexcept { return empty + partial + full; }
};

// The tiling of a mask. Slices read through a stride-0 batch or head dimension are
// stored once, as in SpanTable: distinct_batch is 1 (broadcast) or batch, likewise
// distinct_heads. Tiles are indexed [distinct slice][q tile][k tile]. Preconditions of
// every member (make_tile_grid in tiles.hpp checks them): every extent in [1, 2^62], so
// tile bounds never overflow, and q_tiles(), k_tiles() fit int32 (torch's indices).
struct TileGrid {
  std::int64_t batch = 1, heads = 1, q_len = 1, k_len = 1;
  std::int64_t block_q = 128, block_k = 128;
  std::int64_t distinct_batch = 1, distinct_heads = 1;

  MASKLENS_HOST_DEVICE constexpr std::int64_t q_tiles() const noexcept {
    return q_len / block_q + (q_len % block_q != 0 ? 1 : 0);
  }
  MASKLENS_HOST_DEVICE constexpr std::int64_t k_tiles() const noexcept {
    return k_len / block_k + (k_len % block_k != 0 ? 1 : 0);
  }
  MASKLENS_HOST_DEVICE constexpr std::int64_t slices() const noexcept { return distinct_batch * distinct_heads; }
  MASKLENS_HOST_DEVICE constexpr std::int64_t tiles() const noexcept { return slices() * q_tiles() * k_tiles(); }
  // The stored slice that logical (b, h) reads.
  MASKLENS_HOST_DEVICE constexpr std::int64_t slice_index(std::int64_t b, std::int64_t h) const noexcept {
    return (distinct_batch == 1 ? 0 : b) * distinct_heads + (distinct_heads == 1 ? 0 : h);
  }
  MASKLENS_HOST_DEVICE constexpr std::int64_t tile_index(std::int64_t slice, std::int64_t qt,
                                                         std::int64_t kt) const noexcept {
    return (slice * q_tiles() + qt) * k_tiles() + kt;
  }
  // Rows [q_begin, q_end) of q tile qt and keys [k_begin, k_end) of k tile kt.
  MASKLENS_HOST_DEVICE constexpr std::int64_t q_begin(std::int64_t qt) const noexcept { return qt * block_q; }
  MASKLENS_HOST_DEVICE constexpr std::int64_t q_end(std::int64_t qt) const noexcept {
    return q_len - qt * block_q < block_q ? q_len : (qt + 1) * block_q;
  }
  MASKLENS_HOST_DEVICE constexpr std::int64_t k_begin(std::int64_t kt) const noexcept { return kt * block_k; }
  MASKLENS_HOST_DEVICE constexpr std::int64_t k_end(std::int64_t kt) const noexcept {
    return k_len - kt * block_k < block_k ? k_len : (kt + 1) * block_k;
  }
  // Whether tile (qt, kt) is whole: not cut short by Q or K.
  MASKLENS_HOST_DEVICE constexpr bool whole(std::int64_t qt, std::int64_t kt) const noexcept {
    return q_end(qt) - q_begin(qt) == block_q && k_end(kt) - k_begin(kt) == block_k;
  }
  // The state of tile (qt, kt) holding `attending` attending elements. Compared by
  // division: block_q * block_k may exceed 64 bits where the tile is ragged anyway.
  MASKLENS_HOST_DEVICE constexpr TileState state_of(std::int64_t qt, std::int64_t kt,
                                                    std::int64_t attending) const noexcept {
    if (attending == 0) return TileState::empty;
    const bool every_pair = attending % block_k == 0 && attending / block_k == block_q;
    return every_pair && whole(qt, kt) ? TileState::full : TileState::partial;
  }
};

// torch BlockMask's eight tensors as raw int32 arrays, each contiguous over
// [distinct slice][...] (the shapes in brackets). The kv side drives the forward pass,
// the q side (its transpose) the backward. A null pointer is skipped by the writers.
// flash-attn's CuTe kernels take the kv side under other names: mask_block_cnt =
// kv_num_blocks, mask_block_idx = kv_indices, full_block_cnt = full_kv_num_blocks,
// full_block_idx = full_kv_indices (docs/tiles.md).
struct BlockMaskArrays {
  std::int32_t* kv_num_blocks = nullptr;       // [q_tiles]: partial k tiles of each q tile
  std::int32_t* kv_indices = nullptr;          // [q_tiles][k_tiles]: those k tiles, then the rest
  std::int32_t* full_kv_num_blocks = nullptr;  // [q_tiles]: full k tiles of each q tile
  std::int32_t* full_kv_indices = nullptr;     // [q_tiles][k_tiles]
  std::int32_t* q_num_blocks = nullptr;        // [k_tiles]: partial q tiles of each k tile
  std::int32_t* q_indices = nullptr;           // [k_tiles][q_tiles]
  std::int32_t* full_q_num_blocks = nullptr;   // [k_tiles]
  std::int32_t* full_q_indices = nullptr;      // [k_tiles][q_tiles]
};

namespace detail {

// torch's _dense_to_ordered on one line of n tiles read `stride` apart, for the partial
// and the full tiles at once: per state, the indices of the tiles in that state in
// ascending order, then the others in ascending order (a stable descending argsort of
// the 0/1 line), and how many are in the state. The first `*count` entries are the ones
// a kernel reads; the rest is torch's padding. Two passes: the counts, then each index
// straight to its place (a tile not in a state goes after that state's tiles, at
// count + i - (that state's tiles before i)).
MASKLENS_HOST_DEVICE inline void write_ordered(const TileState* first, std::int64_t stride, std::int64_t n,
                                               std::int32_t* part_count, std::int32_t* part_idx,
                                               std::int32_t* full_count, std::int32_t* full_idx) noexcept {
  std::int32_t parts = 0, fulls = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const TileState st = first[i * stride];
    parts += st == TileState::partial ? 1 : 0;
    fulls += st == TileState::full ? 1 : 0;
  }
  if (part_count) *part_count = parts;
  if (full_count) *full_count = fulls;
  if (part_idx == nullptr && full_idx == nullptr) return;
  std::int32_t parts_before = 0, fulls_before = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const TileState st = first[i * stride];
    const auto index = static_cast<std::int32_t>(i);
    if (part_idx) part_idx[st == TileState::partial ? parts_before : parts + (index - parts_before)] = index;
    if (full_idx) full_idx[st == TileState::full ? fulls_before : fulls + (index - fulls_before)] = index;
    parts_before += st == TileState::partial ? 1 : 0;
    fulls_before += st == TileState::full ? 1 : 0;
  }
}

}  // namespace detail

// Writes the kv side of q tile qt of stored slice `slice` from `states` (the grid's
// tiles, [slice][q tile][k tile]): partial tiles into kv_*, full ones into full_kv_*.
MASKLENS_HOST_DEVICE inline void write_kv_row(const TileGrid& g, const TileState* states, std::int64_t slice,
                                              std::int64_t qt, const BlockMaskArrays& out) noexcept {
  const std::int64_t nq = g.q_tiles(), nk = g.k_tiles(), row = slice * nq + qt;
  detail::write_ordered(states + g.tile_index(slice, qt, 0), 1, nk,
                        out.kv_num_blocks ? out.kv_num_blocks + row : nullptr,
                        out.kv_indices ? out.kv_indices + row * nk : nullptr,
                        out.full_kv_num_blocks ? out.full_kv_num_blocks + row : nullptr,
                        out.full_kv_indices ? out.full_kv_indices + row * nk : nullptr);
}

// Writes the q side of k tile kt of stored slice `slice`: the column of tiles, as torch's
// _transpose_ordered derives it from the kv side.
MASKLENS_HOST_DEVICE inline void write_q_column(const TileGrid& g, const TileState* states, std::int64_t slice,
                                                std::int64_t kt, const BlockMaskArrays& out) noexcept {
  const std::int64_t nq = g.q_tiles(), nk = g.k_tiles(), column = slice * nk + kt;
  detail::write_ordered(states + g.tile_index(slice, 0, kt), nk, nq,
                        out.q_num_blocks ? out.q_num_blocks + column : nullptr,
                        out.q_indices ? out.q_indices + column * nq : nullptr,
                        out.full_q_num_blocks ? out.full_q_num_blocks + column : nullptr,
                        out.full_q_indices ? out.full_q_indices + column * nq : nullptr);
}

}  // namespace masklens
