// How the device counts tiles in the pass that scans the row spans, for any compiler: the
// agent of agent_tile_scan.cuh follows this plan, and a host test replays it (the agent
// on the CPU, tests/test_tile_agent_on_host.cpp), so the division of keys into k tiles,
// the split of q tiles into units and the counter sizes are tested without a GPU. No
// CUDA headers.
//
// A row that is one interval gets its tiles' counts from its bounds after it is read;
// the others are counted 16-byte vector by vector (tiles_from_intervals below).
//
// The rows are cut into units of consecutive rows of one q tile (a warp per row, several
// rows at once; the plan also serves a kernel of a block per row, rows_at_once 1), and
// each block of the grid takes two ranges of consecutive units, one from each end
// (range_of: as many blocks as the device holds at once, so every block starts at once
// and none waits for a second wave; two ends, so that rows' uneven work evens out). A
// block adds each row's attending keys per k tile into its own counters in shared
// memory: one 32-bit counter per k tile and *copy*, the lanes of a warp spread over the
// copies so that lanes reading keys of one tile rarely add to one address in one
// instruction. Where its next unit is of another q tile, and at the end of each range,
// the block adds each tile's copies into the q tile's 64-bit count in global memory
// (skipping zeros): a flush costs two barriers and a pass over the counters, so a block
// flushes about once per q tile it meets, not once per unit. Where the counters of a
// row's k tiles do not fit the shared-memory budget (tiny k tiles, huge rows), or a
// 32-bit counter could overflow, every add goes to the 64-bit counts directly (or, where
// only a whole q tile's rows could overflow one, the block flushes after every unit).
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>

#include "../config.hpp"
#include "../tile_grid.hpp"
#include "temp_storage.hpp"
#include "tuning.cuh"

namespace masklens::gpu::detail {

// k / block_k for the keys of a row. A device divides a key by an invariant divisor
// with a multiply and a shift (Granlund-Montgomery, the round-up method): with
// l = ceil(log2 d), p = 31 + l and m = ceil(2^p / d) < 2^32, floor(k * m / 2^p) = floor(k / d)
// for every k < 2^31 (the error k * (m d - 2^p) / (d 2^p) stays below 2^-l <= 1/d). Rows
// of more than 2^31 keys take a 64-bit division. `divisor` is min(block_k, k_len): a k
// tile wider than the row holds every key, and the divisor stays below 2^31 where
// the multiply serves.
struct KeyTileDivider {
  std::int64_t divisor = 1;      // keys per k tile, as counted: min(block_k, k_len)
  std::uint32_t multiplier = 0;  // m (unused when wide)
  int shift = 31;                // p
  bool wide = false;             // k_len > 2^31: keys / divisor in 64 bits

  static constexpr std::int64_t kFastKeys = std::int64_t{1} << 31;

  [[nodiscard]] static constexpr KeyTileDivider make(std::int64_t block_k, std::int64_t k_len) noexcept {
    KeyTileDivider d;
    d.divisor = block_k < k_len ? block_k : k_len;
    d.wide = k_len > kFastKeys;
    if (!d.wide) {
      const int l = static_cast<int>(std::bit_width(static_cast<std::uint64_t>(d.divisor - 1)));  // ceil(log2 divisor)
      d.shift = 31 + l;
      const std::uint64_t p = std::uint64_t{1} << d.shift, div = static_cast<std::uint64_t>(d.divisor);
      d.multiplier = static_cast<std::uint32_t>((p + div - 1) / div);  // < 2^32: see above
    }
    return d;
  }

  // The k tile of key k, 0 <= k < k_len.
  [[nodiscard]] MASKLENS_HOST_DEVICE constexpr std::int64_t tile_of(std::int64_t k) const noexcept {
    if (wide) return k / divisor;
    // k < 2^31 here: its low 32 bits are all of it, and a 32 x 32-bit product is one
    // multiply where the 64-bit key would take three.
    return static_cast<std::int64_t>(
        (std::uint64_t{static_cast<std::uint32_t>(k)} * std::uint64_t{multiplier}) >> shift);
  }
};

// The rows of one unit: rows [q_begin, q_end) of q tile qt of stored slice `slice`
// (empty past a ragged last q tile).
struct TileUnit {
  std::int64_t slice = 0, qt = 0, q_begin = 0, q_end = 0;
};

// Units [begin, end) of the plan: one block's share.
struct UnitRange {
  std::int64_t begin = 0, end = 0;
};

struct TileScanPlan {
  TileGrid grid;
  KeyTileDivider keys;
  bool shared = true;               // counters in shared memory (false: 64-bit atomics on the counts)
  int copy_shift = 0;               // 2^copy_shift copies of each k tile's counter
  std::int64_t rows_per_unit = 1;   // consecutive rows of one q tile
  std::int64_t groups = 1;          // units per (slice, q tile)
  std::int64_t units = 1;           // slices x q tiles x groups
  std::size_t shared_bytes = 0;     // k_tiles << copy_shift 32-bit counters (0 when not shared)
  // A 32-bit counter holds a whole q tile's rows x a tile's keys: a block flushes where
  // its next unit is of another q tile (false: after every unit).
  bool flush_per_q_tile = true;
  // A row that is one interval (every row of a structured mask) has its tiles' counts
  // from its span's bounds, a few adds a lane once the row is read, instead of an add per
  // 16-byte vector while it is read: a warp reads a row counting vector by vector only
  // where it is its first or its previous row was not an interval, and reads a row
  // again, counting, where it guessed wrong (from L2: the row was just read). false:
  // every row counted vector by vector (bench/device_tiles.cu --sweep compares the two).
  bool tiles_from_intervals = true;
  // Each block takes two ranges of half the size, one from each end of the units
  // (range_of): a causal or block-sparse mask's rows hold more keys the further down
  // they are, so blocks of consecutive ranges would end far apart (the one wave waits
  // for its slowest block); a block's two halves add up to about the same work for
  // every block. false: one range a block (bench/device_tiles.cu --sweep compares).
  bool fold_ranges = true;

  // Counter slots of the block: k tile kt's copy c is slot (kt << copy_shift) + c.
  [[nodiscard]] MASKLENS_HOST_DEVICE constexpr std::int64_t slots() const noexcept {
    return grid.k_tiles() << copy_shift;
  }

  // The units block b of `blocks` (1 <= blocks, b < blocks) takes: consecutive, the
  // first units % blocks blocks one more than the others. (b * base <= units: no overflow.)
  [[nodiscard]] MASKLENS_HOST_DEVICE constexpr UnitRange units_of(std::int64_t b, std::int64_t blocks) const noexcept {
    const std::int64_t base = units / blocks, extra = units % blocks;
    const std::int64_t begin = b * base + (b < extra ? b : extra);
    return {begin, begin + base + (b < extra ? 1 : 0)};
  }

  // Range `part` (0 or 1, kRangesPerBlock) of block b of `blocks`: with fold_ranges,
  // share b and share 2 blocks - 1 - b of 2 blocks shares; else units_of and an empty
  // second range. Over every block and both parts, each unit exactly once.
  static constexpr int kRangesPerBlock = 2;
  [[nodiscard]] MASKLENS_HOST_DEVICE constexpr UnitRange range_of(std::int64_t b, std::int64_t blocks,
                                                                  int part) const noexcept {
    if (!fold_ranges) return part == 0 ? units_of(b, blocks) : UnitRange{};
    return units_of(part == 0 ? b : 2 * blocks - 1 - b, 2 * blocks);
  }

  // Whether a block whose range ends at `end` flushes its counters after unit u: at its
  // last unit, before a unit of another q tile, or after every unit where a q tile's rows
  // could overflow a counter.
  [[nodiscard]] MASKLENS_HOST_DEVICE constexpr bool flush_after(std::int64_t u, std::int64_t end) const noexcept {
    return !flush_per_q_tile || u + 1 == end || (u + 1) % groups == 0;
  }

  [[nodiscard]] MASKLENS_HOST_DEVICE constexpr TileUnit unit(std::int64_t u) const noexcept {
    const std::int64_t group = u % groups, rest = u / groups, nq = grid.q_tiles();
    TileUnit t;
    t.slice = rest / nq;
    t.qt = rest % nq;
    const std::int64_t tile_end = grid.q_end(t.qt);
    t.q_begin = grid.q_begin(t.qt) + group * rows_per_unit;
    if (t.q_begin > tile_end) t.q_begin = tile_end;
    t.q_end = tile_end - t.q_begin < rows_per_unit ? tile_end : t.q_begin + rows_per_unit;
    return t;
  }
};

// The plan for `g` (checked by make_tile_grid) and a mask of `esize`-byte elements read
// by a kernel that reads `rows_at_once` rows at a time per block (1 with a block per
// row, the warps of a block with a warp per row). The last two arguments are tuning.cuh's
// (bench/device_tiles.cu --sweep varies them).
[[nodiscard]] constexpr TileScanPlan plan_tile_scan(const TileGrid& g, int esize, int rows_at_once,
                                                    std::int64_t target_units = kTileTargetUnits,
                                                    std::int64_t max_rows_per_parallel_row =
                                                        kTileMaxRowsPerParallelRow) noexcept {
  TileScanPlan p;
  p.grid = g;
  p.keys = KeyTileDivider::make(g.block_k, g.k_len);
  const std::int64_t nk = g.k_tiles(), tile_rows = g.block_q < g.q_len ? g.block_q : g.q_len;
  const std::int64_t rows = g.slices() * g.q_len;

  // Rows per unit: enough units to balance the device, few enough flushes to be free; a
  // multiple of the rows a block reads at once (rounded down), so that its warps, which
  // take a unit's rows in turn, each take as many rows of every unit and reach the q
  // tile's flush together (69632 rows made 9-row units: one warp took 43 rows of each q
  // tile, the others 29, and the pass ran at 1.12-1.24x a read on an H200 against
  // 1.05-1.09x at 65536 rows, whose units are 8 rows).
  const std::int64_t at_once = rows_at_once < 1 ? 1 : rows_at_once;
  std::int64_t r = (rows + target_units - 1) / target_units;
  if (r > max_rows_per_parallel_row * at_once) r = max_rows_per_parallel_row * at_once;
  r = r / at_once * at_once;
  if (r < at_once) r = at_once;
  if (r > tile_rows) r = tile_rows;

  // A 32-bit counter holds at most r rows x divisor keys of one tile.
  const std::int64_t max_count = (std::int64_t{1} << 32) - 1;
  if (p.keys.divisor > max_count) {
    p.shared = false;
  } else if (r > max_count / p.keys.divisor) {
    r = max_count / p.keys.divisor;
  }

  // Copies: about as many as the 16-byte vectors of one k tile (the lanes of a warp that
  // can land in one tile), at most 32, halved until the counters fit the budget.
  if (p.shared) {
    const std::int64_t bytes_per_tile = p.keys.divisor * esize;
    const std::int64_t vectors = bytes_per_tile / 16 + (bytes_per_tile % 16 != 0 ? 1 : 0);
    int shift = 0;
    while (shift < 5 && (std::int64_t{1} << shift) < vectors) ++shift;
    const auto budget_slots = static_cast<std::int64_t>(kTileSharedBudget / sizeof(std::uint32_t));
    while (shift > 0 && nk > (budget_slots >> shift)) --shift;
    if (nk > budget_slots) {
      p.shared = false;
    } else {
      p.copy_shift = shift;
      p.shared_bytes = static_cast<std::size_t>(nk << shift) * sizeof(std::uint32_t);
    }
  }
  if (!p.shared) p.copy_shift = 0;
  p.flush_per_q_tile = p.shared && tile_rows <= max_count / p.keys.divisor;

  p.rows_per_unit = r;
  p.groups = tile_rows / r + (tile_rows % r != 0 ? 1 : 0);
  p.units = g.slices() * g.q_tiles() * p.groups;
  return p;
}

// The tile scan's dynamic shared memory: the block's counters (plan.shared_bytes), then,
// at the first 16-byte boundary after them, a ring of staged batches for each warp where
// `Policy` stages its loads (ScanPolicy::kStagedBatches, tuning.cuh).
[[nodiscard]] constexpr std::size_t tile_scan_ring_offset(std::size_t counter_bytes) noexcept {
  return (counter_bytes + 15) / 16 * 16;
}
template <class Policy>
[[nodiscard]] constexpr std::size_t tile_scan_ring_bytes() noexcept {  // a block's rings, all warps
  return std::size_t{Policy::kStageBytesPerWarp} * Policy::kWarpRowsPerBlock;
}
template <class Policy>
[[nodiscard]] constexpr std::size_t tile_scan_shared_bytes(const TileScanPlan& plan) noexcept {
  constexpr std::size_t rings = tile_scan_ring_bytes<Policy>();
  return rings == 0 ? plan.shared_bytes : tile_scan_ring_offset(plan.shared_bytes) + rings;
}

// scan_spans_tiles()'s temporary storage: one 64-bit count per tile, at the first
// 256-byte boundary of the storage (255 spare bytes: any address will do). 0 where the
// count array would not fit in memory addresses.
[[nodiscard]] constexpr std::size_t tile_scan_temp_bytes(const TileGrid& g) noexcept {
  constexpr std::size_t kSpare = kStorageAlignment - 1;
  const std::int64_t tiles = g.tiles();
  if (tiles < 0 || static_cast<std::uint64_t>(tiles) > (SIZE_MAX - kSpare) / sizeof(std::uint64_t)) return 0;
  return static_cast<std::size_t>(tiles) * sizeof(std::uint64_t) + kSpare;
}

}  // namespace masklens::gpu::detail
