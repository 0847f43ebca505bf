// Tile summaries on the host: which block_q x block_k tiles of a mask are empty, partial
// or full, per (batch, head, q tile, k tile), in the layout torch's
// BlockMask.from_kv_blocks takes (and flash-attn's CuTe block-sparse kernels).
//   scan_with_tiles(view, size)   the row spans and the tiles in one read of the mask
//   scan_tiles(view, size)        the tiles alone (the same pass)
//   tiles_from_structure(s, size) an exact structure's tiles from its fields, no read
//   block_mask_tensors(summary)   the eight int32 tensors of a BlockMask
// Slices a stride-0 batch or head dimension broadcasts are summarised once. The
// device-side vocabulary (TileGrid, TileState, the row writers) is tile_grid.hpp;
// docs/tiles.md has the layout and an example.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "additive_bits.hpp"
#include "mask_view.hpp"
#include "row_span.hpp"
#include "scan.hpp"
#include "scan_threads.hpp"
#include "span_table.hpp"
#include "status.hpp"
#include "structure.hpp"
#include "structure_tiles.hpp"
#include "tile_grid.hpp"

namespace masklens {

// A TileGrid whose every member is safe to call: extents and tile sizes in [1, 2^62],
// distinct slices 1 or the whole dimension, tile counts that fit torch's int32 indices
// and a tile total that fits 64 bits. invalid_argument naming the field otherwise.
inline Result<TileGrid> make_tile_grid(std::int64_t batch, std::int64_t heads, std::int64_t q_len, std::int64_t k_len,
                                       TileSize size, std::int64_t distinct_batch = 1, std::int64_t distinct_heads = 1) {
  const auto text = [](std::int64_t v) { return std::to_string(v); };
  const auto bad = [](std::string message) { return error(ErrorCode::invalid_argument, std::move(message)); };
  if (size.q < 1 || size.q > kMaxExtent) return bad("tile size q (block_q) must be in [1, 2^62], got " + text(size.q));
  if (size.k < 1 || size.k > kMaxExtent) return bad("tile size k (block_k) must be in [1, 2^62], got " + text(size.k));
  const std::pair<const char*, std::int64_t> dims[] = {{"batch", batch}, {"heads", heads}, {"q_len", q_len}, {"k_len", k_len}};
  for (const auto& [name, v] : dims)
    if (v < 1 || v > kMaxExtent)
      return error(ErrorCode::invalid_shape, std::string("tile grid ") + name + " must be in [1, 2^62], got " + text(v));
  if (distinct_batch != 1 && distinct_batch != batch)
    return bad("tile grid distinct_batch must be 1 or batch (" + text(batch) + "), got " + text(distinct_batch));
  if (distinct_heads != 1 && distinct_heads != heads)
    return bad("tile grid distinct_heads must be 1 or heads (" + text(heads) + "), got " + text(distinct_heads));
  TileGrid g{batch, heads, q_len, k_len, size.q, size.k, distinct_batch, distinct_heads};
  const std::int64_t nq = g.q_tiles(), nk = g.k_tiles();
  if (nq > INT32_MAX || nk > INT32_MAX)
    return bad("a tile size of " + text(size.q) + " x " + text(size.k) + " gives " + text(nq) + " x " + text(nk) +
               " tiles; torch's block indices are int32 (at most 2^31 - 1 tiles a side)");
  if (distinct_batch > INT64_MAX / distinct_heads || g.slices() > INT64_MAX / nq || g.slices() * nq > INT64_MAX / nk)
    return bad("a tile size of " + text(size.q) + " x " + text(size.k) + " gives more than 2^63 tiles");
  return g;
}

// A TileGrid a caller built, checked as make_tile_grid checks its members.
inline Result<TileGrid> make_tile_grid(const TileGrid& g) {
  return make_tile_grid(g.batch, g.heads, g.q_len, g.k_len, TileSize{g.block_q, g.block_k}, g.distinct_batch,
                        g.distinct_heads);
}

// The tiles of a mask: one TileState per tile, [distinct slice][q tile][k tile].
struct TileSummary {
  TileGrid grid;
  std::vector<TileState> states;

  [[nodiscard]] TileState state(std::int64_t slice, std::int64_t qt, std::int64_t kt) const noexcept {
    return states[static_cast<std::size_t>(grid.tile_index(slice, qt, kt))];
  }
  // Tile (qt, kt) of logical batch b, head h (broadcast slices read the stored one).
  [[nodiscard]] TileState state_at(std::int64_t b, std::int64_t h, std::int64_t qt, std::int64_t kt) const noexcept {
    return state(grid.slice_index(b, h), qt, kt);
  }
  // Counts over the stored slices (what block_mask_tensors() holds).
  [[nodiscard]] TileTally tally() const noexcept {
    TileTally t;
    for (TileState s : states) {
      if (s == TileState::empty) ++t.empty;
      else if (s == TileState::partial) ++t.partial;
      else ++t.full;
    }
    return t;
  }
  // The shares decide() takes (MaskStructure::tile_fractions). Broadcast slices stand
  // for equally many logical ones each, so the stored slices give the same shares.
  [[nodiscard]] TileFractions fractions() const noexcept {
    const TileTally t = tally();
    const double total = static_cast<double>(t.total());
    return {grid.block_q, grid.block_k, static_cast<double>(t.partial) / total, static_cast<double>(t.full) / total};
  }

  // Storage for every tile of `grid` (checked by make_tile_grid), all empty.
  static Result<TileSummary> for_grid(const TileGrid& grid) {
    if (grid.tiles() > static_cast<std::int64_t>(SIZE_MAX / 2))
      return error(ErrorCode::out_of_memory, "a tile summary of " + std::to_string(grid.tiles()) + " tiles is too large");
    return catch_alloc([&]() -> Result<TileSummary> {
      TileSummary s;
      s.grid = grid;
      s.states.assign(static_cast<std::size_t>(grid.tiles()), TileState::empty);
      return s;
    });
  }
};

// The grid of a view's tiles: stride-0 batch and head dimensions are stored once.
inline Result<TileGrid> tile_grid_for(const MaskView& view, TileSize size) {
  return make_tile_grid(view.batch(), view.heads(), view.q_len(), view.k_len(), size,
                        view.stride(kBatch) == 0 ? 1 : view.batch(), view.stride(kHeads) == 0 ? 1 : view.heads());
}

namespace detail {

// Attending keys in [lo, hi) of a row, for any element type and key stride.
inline std::int64_t count_attending(const MaskView& view, const AdditiveBits& bits, const std::uint8_t* row,
                                    std::int64_t lo, std::int64_t hi) noexcept {
  const int esize = element_size(view.dtype());
  if (view.stride(kKey) == 1) {
    if (esize == 1)
      return count_attending_bytes(row, lo, hi, byte_invert(view.encoding().polarity));
    if (esize == 2) return scan_additive_row<2>(row + lo * 2, hi - lo, bits).count;
    return scan_additive_row<4>(row + lo * 4, hi - lo, bits).count;
  }
  const std::int64_t step = view.stride(kKey) * esize;
  return scan_generic_row(row + lo * step, hi - lo, step, view.dtype(), view.encoding()).count;
}

// Adds a row's attending keys in [first, last] to its k tiles' counters when the row is
// that one interval: by arithmetic, nothing read.
inline void add_interval_to_tiles(const RowSpan& span, const TileGrid& g, std::int64_t* counts) noexcept {
  for (std::int64_t kt = span.first / g.block_k; kt <= span.last / g.block_k; ++kt)
    counts[kt] += std::min(g.k_end(kt), span.last + 1) - std::max(g.k_begin(kt), span.first);
}

// A 1-byte row with unit key stride: its bounds, then its keys counted once. Where the
// previous row of the unit was one interval (`expect_interval`: every row of a
// structured mask), the span is counted whole and an interval's tiles follow by
// arithmetic (a row that turns out not to be one is counted again tile by tile, from
// cache); otherwise each k tile is counted between the bounds and the row's count is
// their sum, one pass where counting whole and then per tile would take two (a
// block-sparse mask's rows). The guess follows the row.
inline RowSpan scan_byte_row_tiled(const std::uint8_t* row, std::int64_t k_len, std::uint64_t invert,
                                   const TileGrid& g, std::int64_t* counts, bool& expect_interval) noexcept {
  RowSpan span = byte_row_bounds(row, k_len, invert);
  if (span.first == RowSpan::kNoKey) return span;
  const std::int64_t first_tile = span.first / g.block_k, last_tile = span.last / g.block_k;
  const auto tile_keys = [&](std::int64_t kt) {
    return count_attending_bytes(row, std::max(g.k_begin(kt), span.first), std::min(g.k_end(kt), span.last + 1),
                                 invert);
  };
  if (expect_interval) {
    span.count = count_attending_bytes(row, span.first, span.last + 1, invert);
    if (span.is_interval()) {
      add_interval_to_tiles(span, g, counts);
      return span;
    }
    for (std::int64_t kt = first_tile; kt <= last_tile; ++kt) counts[kt] += tile_keys(kt);
  } else {
    for (std::int64_t kt = first_tile; kt <= last_tile; ++kt) {
      const std::int64_t n = tile_keys(kt);
      counts[kt] += n;
      span.count += n;
    }
  }
  expect_interval = span.is_interval();
  return span;
}

// Row q of slice (b, h): its span, exactly as scan() reads it, with the attending keys
// of each k tile added into counts[kt]. 1-byte rows with unit key stride as above. Any
// other row: a row that is an interval gives its tiles' counts by arithmetic; any other
// is counted again tile by tile between its first and last keys, from cache (a row is K
// elements).
inline RowSpan scan_row_tiled(const MaskView& view, const AdditiveBits& bits, const TileGrid& g, std::int64_t b,
                              std::int64_t h, std::int64_t q, std::int64_t* counts, bool& expect_interval) noexcept {
  if (view.stride(kKey) == 1 && element_size(view.dtype()) == 1)
    return scan_byte_row_tiled(view.element_ptr(b, h, q, 0), view.k_len(), byte_invert(view.encoding().polarity), g,
                               counts, expect_interval);
  const RowSpan span = scan_row(view, bits, b, h, q);
  if (span.count == 0) return span;
  if (span.is_interval()) {
    add_interval_to_tiles(span, g, counts);
    return span;
  }
  const std::uint8_t* row = view.element_ptr(b, h, q, 0);
  for (std::int64_t kt = span.first / g.block_k; kt <= span.last / g.block_k; ++kt)
    counts[kt] += count_attending(view, bits, row, std::max(g.k_begin(kt), span.first), std::min(g.k_end(kt), span.last + 1));
  return span;
}

}  // namespace detail

// A mask's row spans and its tiles, from one read of every distinct slice.
struct SpansAndTiles {
  SpanTable spans;
  TileSummary tiles;
};

// Scans `view` into its SpanTable (as scan() does, row for row) and its tile summary at
// `size`. Work is split over (slice, q tile) pairs, each thread with its own counters.
inline Result<SpansAndTiles> scan_with_tiles(const MaskView& view, TileSize size = {}, ScanOptions options = {}) {
  if (view.data() == nullptr) return error(ErrorCode::invalid_argument, "view is empty (data is null)");
  Result<TileGrid> grid = tile_grid_for(view, size);
  if (!grid) return grid.status();
  const TileGrid& g = *grid;
  Result<SpanTable> spans = SpanTable::for_view(view);
  if (!spans) return spans.status();
  Result<TileSummary> tiles = TileSummary::for_grid(g);
  if (!tiles) return tiles.status();
  SpanTable& table = *spans;
  TileSummary& summary = *tiles;
  const std::int64_t nq = g.q_tiles(), nk = g.k_tiles(), units = g.slices() * nq;
  const AdditiveBits bits = additive_bits(view.dtype(), view.encoding().masked_threshold);

  const unsigned threads = detail::split_threads(options, units);
  std::vector<std::vector<std::int64_t>> counters;
  if (Status made = catch_alloc([&]() -> Status {
        counters.assign(threads, std::vector<std::int64_t>(static_cast<std::size_t>(nk)));
        return {};
      });
      !made.ok())
    return made;

  const auto scan_units = [&](std::int64_t begin, std::int64_t end, std::int64_t* counts) noexcept {
    for (std::int64_t unit = begin; unit < end; ++unit) {
      const std::int64_t slice = unit / nq, qt = unit % nq;
      const std::int64_t b = slice / g.distinct_heads, h = slice % g.distinct_heads;
      std::fill(counts, counts + nk, std::int64_t{0});
      bool expect_interval = true;  // the unit's first row: guess a structured mask's
      for (std::int64_t q = g.q_begin(qt); q < g.q_end(qt); ++q)
        table.rows[static_cast<std::size_t>(slice * g.q_len + q)] =
            detail::scan_row_tiled(view, bits, g, b, h, q, counts, expect_interval);
      TileState* out = summary.states.data() + g.tile_index(slice, qt, 0);
      for (std::int64_t kt = 0; kt < nk; ++kt) out[kt] = g.state_of(qt, kt, counts[kt]);
    }
  };

  if (Status spawn = detail::parallel_for_ranges(units, threads,
                                                 [&](std::int64_t begin, std::int64_t end, unsigned share) {
                                                   scan_units(begin, end, counters[share].data());
                                                 });
      !spawn.ok())
    return spawn;

  if (Status bad = detail::check_scanned_rows(view, table); !bad.ok()) return bad;
  return SpansAndTiles{std::move(table), std::move(summary)};
}

// A summary over tile states a caller has: `count` bytes, one per tile of `grid`
// (checked as make_tile_grid checks it), [slice][q tile][k tile] as TileSummary::states and the
// device's d_states hold them (a device summary copied back, say). Each byte must be a
// TileState (0 empty, 1 partial, 2 full) and a ragged tile (cut short by Q or K) is never
// full; invalid_argument naming the first tile that is not so.
inline Result<TileSummary> tile_summary_from_states(const TileGrid& given, const std::uint8_t* states,
                                                    std::size_t count) {
  Result<TileGrid> checked = make_tile_grid(given);
  if (!checked) return checked.status();
  const TileGrid& grid = *checked;
  if (states == nullptr && count != 0) return error(ErrorCode::invalid_argument, "states is null");
  if (count != static_cast<std::size_t>(grid.tiles()))
    return error(ErrorCode::invalid_argument, "states hold " + std::to_string(count) + " bytes; the grid has " +
                                                  std::to_string(grid.tiles()) + " tiles");
  Result<TileSummary> summary = TileSummary::for_grid(grid);
  if (!summary) return summary.status();
  const std::int64_t nq = grid.q_tiles(), nk = grid.k_tiles();
  for (std::int64_t i = 0; i < grid.tiles(); ++i) {
    const std::uint8_t v = states[i];
    const std::int64_t qt = (i / nk) % nq, kt = i % nk;
    if (v > 2 || (v == 2 && !grid.whole(qt, kt)))
      return error(ErrorCode::invalid_argument,
                   "tile [" + std::to_string(i / (nq * nk)) + ", " + std::to_string(qt) + ", " + std::to_string(kt) +
                       "] (slice, q tile, k tile) holds " + std::to_string(v) +
                       (v > 2 ? "; a state is 0 (empty), 1 (partial) or 2 (full)" : ", full, but the tile is ragged"));
    summary->states[static_cast<std::size_t>(i)] = static_cast<TileState>(v);
  }
  return summary;
}

// The tile summary alone (the same single read; the spans are dropped).
inline Result<TileSummary> scan_tiles(const MaskView& view, TileSize size = {}, ScanOptions options = {}) {
  Result<SpansAndTiles> both = scan_with_tiles(view, size, options);
  if (!both) return both.status();
  return std::move(both->tiles);
}

// An exact structure's tiles as ranges (structure_tiles.hpp): for each distinct slice and
// q tile, the k tiles it touches and the ones it fills (rows[slice x q_tiles + qt]),
// O(q tiles) values for O(q tiles x k tiles) tiles. A device writes a BlockMask
// from them (gpu::write_block_mask_from_ranges), 32 bytes a q tile crossing to it.
struct StructureTileRanges {
  TileGrid grid;
  std::vector<TileRowRanges> rows;  // [distinct slice][q tile]
};

// One slice per batch when the structure's modifiers are given per batch, else one;
// heads are alike. An arbitrary structure has no tiles to derive: scan the mask.
inline Result<StructureTileRanges> structure_tile_ranges(const MaskStructure& s, TileSize size = {}) {
  if (Status st = s.validate(); !st.ok()) return st;
  if (s.kind == StructureKind::arbitrary)
    return error(ErrorCode::invalid_argument,
                 "tiles_from_structure needs an exact structure; an arbitrary mask's tiles come from scanning it (scan_tiles)");
  const TileGrid shape = structure_tile_grid(s, size);
  Result<TileGrid> grid = make_tile_grid(s.batch, s.heads, s.q_len, s.k_len, size, shape.distinct_batch, 1);
  if (!grid) return grid.status();
  StructureTileRanges out{*grid, {}};
  const TileGrid& g = out.grid;
  out.rows.reserve(static_cast<std::size_t>(g.slices() * g.q_tiles()));
  for (std::int64_t b = 0; b < g.distinct_batch; ++b) {
    const KeyRange attending = detail::attending_rows(s, b, g);
    for (std::int64_t qt = 0; qt < g.q_tiles(); ++qt) out.rows.push_back(structure_tile_row(s, b, g, qt, attending));
  }
  return out;
}

// The tiles of an exact structure from its fields (structure_tile_ranges, each range
// filled in): equal, tile for tile, to scanning any mask the structure describes.
inline Result<TileSummary> tiles_from_structure(const MaskStructure& s, TileSize size = {}) {
  Result<StructureTileRanges> ranges = structure_tile_ranges(s, size);
  if (!ranges) return ranges.status();
  const TileGrid& g = ranges->grid;
  Result<TileSummary> made = TileSummary::for_grid(g);
  if (!made) return made;
  for (std::int64_t line = 0; line < g.slices() * g.q_tiles(); ++line) {
    const TileRowRanges& r = ranges->rows[static_cast<std::size_t>(line)];
    TileState* row = made->states.data() + line * g.k_tiles();
    std::fill(row + r.touched_begin, row + r.touched_end, TileState::partial);
    std::fill(row + r.full_begin, row + r.full_end, TileState::full);
  }
  return made;
}

// The eight tensors of torch's BlockMask, by name.
enum class BlockMaskField : std::uint8_t {
  kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices,
  q_num_blocks, q_indices, full_q_num_blocks, full_q_indices,
};
inline constexpr BlockMaskField kBlockMaskFields[] = {
    BlockMaskField::kv_num_blocks, BlockMaskField::kv_indices, BlockMaskField::full_kv_num_blocks,
    BlockMaskField::full_kv_indices, BlockMaskField::q_num_blocks, BlockMaskField::q_indices,
    BlockMaskField::full_q_num_blocks, BlockMaskField::full_q_indices};

// Entries of one BlockMask array of grid g: a count per line ([slices][q tiles] for the kv
// side, [slices][k tiles] for the q side) or an index per tile.
[[nodiscard]] constexpr std::int64_t block_mask_entries(const TileGrid& g, BlockMaskField f) noexcept {
  switch (f) {
    case BlockMaskField::kv_num_blocks:
    case BlockMaskField::full_kv_num_blocks: return g.slices() * g.q_tiles();
    case BlockMaskField::q_num_blocks:
    case BlockMaskField::full_q_num_blocks: return g.slices() * g.k_tiles();
    default: return g.tiles();
  }
}

// torch's name (BlockMask's attribute and from_kv_blocks' keyword).
constexpr std::string_view to_string(BlockMaskField f) noexcept {
  switch (f) {
    case BlockMaskField::kv_num_blocks: return "kv_num_blocks";
    case BlockMaskField::kv_indices: return "kv_indices";
    case BlockMaskField::full_kv_num_blocks: return "full_kv_num_blocks";
    case BlockMaskField::full_kv_indices: return "full_kv_indices";
    case BlockMaskField::q_num_blocks: return "q_num_blocks";
    case BlockMaskField::q_indices: return "q_indices";
    case BlockMaskField::full_q_num_blocks: return "full_q_num_blocks";
    case BlockMaskField::full_q_indices: return "full_q_indices";
  }
  return "unknown";
}

// The kv side (what from_kv_blocks takes, and flash-attn's CuTe forward), or the q side.
constexpr bool is_kv_side(BlockMaskField f) noexcept {
  switch (f) {
    case BlockMaskField::kv_num_blocks: case BlockMaskField::kv_indices:
    case BlockMaskField::full_kv_num_blocks: case BlockMaskField::full_kv_indices: return true;
    case BlockMaskField::q_num_blocks: case BlockMaskField::q_indices:
    case BlockMaskField::full_q_num_blocks: case BlockMaskField::full_q_indices: return false;
  }
  return false;
}

// flash-attn's CuTe name (BlockSparseTensorsTorch). Its forward takes the kv side; its
// backward takes the q side under the same four names.
constexpr std::string_view cute_name(BlockMaskField f) noexcept {
  switch (f) {
    case BlockMaskField::kv_num_blocks: case BlockMaskField::q_num_blocks: return "mask_block_cnt";
    case BlockMaskField::kv_indices: case BlockMaskField::q_indices: return "mask_block_idx";
    case BlockMaskField::full_kv_num_blocks: case BlockMaskField::full_q_num_blocks: return "full_block_cnt";
    case BlockMaskField::full_kv_indices: case BlockMaskField::full_q_indices: return "full_block_idx";
  }
  return "unknown";
}

// A contiguous int32 tensor: data and shape (rank 3 or 4), what a binding wraps as an
// array without copying.
struct Int32Tensor {
  const std::int32_t* data = nullptr;
  int rank = 0;
  std::array<std::int64_t, 4> shape{};
  [[nodiscard]] std::int64_t numel() const noexcept {
    std::int64_t n = 1;
    for (int d = 0; d < rank; ++d) n *= shape[static_cast<std::size_t>(d)];
    return n;
  }
};

// torch's BlockMask as masklens writes it: the tensors BlockMask.from_kv_blocks takes
// (kv side, partial and full apart) and the q side it would derive for the backward,
// each contiguous int32 of shape [distinct_batch, distinct_heads, ...]; a broadcast
// dimension is 1, as torch's own BlockMask for B=None or H=None.
struct BlockMaskTensors {
  TileGrid grid;
  std::vector<std::int32_t> kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices;
  std::vector<std::int32_t> q_num_blocks, q_indices, full_q_num_blocks, full_q_indices;

  // BLOCK_SIZE=(q, k) and seq_lengths=(Q, K) for from_kv_blocks.
  [[nodiscard]] std::array<std::int64_t, 2> block_size() const noexcept { return {grid.block_q, grid.block_k}; }
  [[nodiscard]] std::array<std::int64_t, 2> seq_lengths() const noexcept { return {grid.q_len, grid.k_len}; }

  [[nodiscard]] const std::vector<std::int32_t>& values(BlockMaskField f) const noexcept {
    switch (f) {
      case BlockMaskField::kv_num_blocks: return kv_num_blocks;
      case BlockMaskField::kv_indices: return kv_indices;
      case BlockMaskField::full_kv_num_blocks: return full_kv_num_blocks;
      case BlockMaskField::full_kv_indices: return full_kv_indices;
      case BlockMaskField::q_num_blocks: return q_num_blocks;
      case BlockMaskField::q_indices: return q_indices;
      case BlockMaskField::full_q_num_blocks: return full_q_num_blocks;
      case BlockMaskField::full_q_indices: return full_q_indices;
    }
    return kv_num_blocks;
  }
  // One tensor with its shape: [B', H', q_tiles] for kv counts, [B', H', q_tiles,
  // k_tiles] for kv indices, [B', H', k_tiles] and [B', H', k_tiles, q_tiles] for the q side.
  [[nodiscard]] Int32Tensor tensor(BlockMaskField f) const noexcept {
    const std::int64_t nq = grid.q_tiles(), nk = grid.k_tiles();
    const bool q_side = f >= BlockMaskField::q_num_blocks;
    const bool counts = f == BlockMaskField::kv_num_blocks || f == BlockMaskField::full_kv_num_blocks ||
                        f == BlockMaskField::q_num_blocks || f == BlockMaskField::full_q_num_blocks;
    Int32Tensor t;
    t.data = values(f).data();
    t.rank = counts ? 3 : 4;
    t.shape = {grid.distinct_batch, grid.distinct_heads, q_side ? nk : nq, counts ? 0 : (q_side ? nq : nk)};
    return t;
  }
  // Writable pointers for the row writers (tile_grid.hpp).
  [[nodiscard]] BlockMaskArrays arrays() noexcept {
    return {kv_num_blocks.data(), kv_indices.data(), full_kv_num_blocks.data(), full_kv_indices.data(),
            q_num_blocks.data(), q_indices.data(), full_q_num_blocks.data(), full_q_indices.data()};
  }
};

// A summary's BlockMask tensors, entry for entry what torch's create_block_mask builds
// for the same mask (a mask_mod reading it) at the same BLOCK_SIZE: each row lists its
// k tiles in ascending order, then the others in ascending order (torch's padding).
inline Result<BlockMaskTensors> block_mask_tensors(const TileSummary& summary) {
  const TileGrid& g = summary.grid;
  if (summary.states.size() != static_cast<std::size_t>(g.tiles()))
    return error(ErrorCode::invalid_argument, "tile summary holds " + std::to_string(summary.states.size()) +
                                                  " states for a grid of " + std::to_string(g.tiles()) + " tiles");
  if (g.tiles() > static_cast<std::int64_t>(SIZE_MAX / 16))
    return error(ErrorCode::out_of_memory, "BlockMask tensors of " + std::to_string(g.tiles()) + " tiles are too large");
  return catch_alloc([&]() -> Result<BlockMaskTensors> {
    BlockMaskTensors t;
    t.grid = g;
    const auto rows = static_cast<std::size_t>(g.slices() * g.q_tiles());
    const auto columns = static_cast<std::size_t>(g.slices() * g.k_tiles());
    const auto tiles = static_cast<std::size_t>(g.tiles());
    t.kv_num_blocks.resize(rows);
    t.full_kv_num_blocks.resize(rows);
    t.kv_indices.resize(tiles);
    t.full_kv_indices.resize(tiles);
    t.q_num_blocks.resize(columns);
    t.full_q_num_blocks.resize(columns);
    t.q_indices.resize(tiles);
    t.full_q_indices.resize(tiles);
    const BlockMaskArrays out = t.arrays();
    for (std::int64_t s = 0; s < g.slices(); ++s) {
      for (std::int64_t qt = 0; qt < g.q_tiles(); ++qt) write_kv_row(g, summary.states.data(), s, qt, out);
      for (std::int64_t kt = 0; kt < g.k_tiles(); ++kt) write_q_column(g, summary.states.data(), s, kt, out);
    }
    return t;
  });
}

}  // namespace masklens
