// The device's tile summary, replayed on the CPU: the plan the kernels follow
// (masklens/cuda/tile_plan.hpp: the key-to-tile divider, units of rows, counter copies
// and their bounds) and the agent with the tile accumulator (cuda/tile_accumulator.cuh)
// through the stand-in for the CUDA builtins, every "thread" of a row in turn, the unit's
// counters flushed as agent_tile_scan.cuh flushes them. Held to an element-by-element
// count per tile, to the host's scan_with_tiles (states) and scan() (spans), on generated
// masks of every type, layout, additive encoding, start alignment and tile shape, at
// both thread counts the kernels use, with the counters in "shared memory" and in the
// 64-bit counts. The CUDA suite (tests/cuda/test_device_tiles.cpp) runs the kernels.
#include <cuda_runtime.h>  // the stand-in: this program's include path has no CUDA

#include <doctest/doctest.h>

#include <masklens/cuda/agent_scan.cuh>
#include <masklens/cuda/tile_accumulator.cuh>
#include <masklens/cuda/tile_plan.hpp>
#include <masklens/cuda/tuning.cuh>
#include <masklens/tiles.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <utility>
#include <cstring>
#include <string>
#include <vector>

#include "support/additive_encodings.hpp"
#include "support/block_masks.hpp"
#include "support/mask_gen.hpp"

using namespace masklens;
using namespace masklens::testing;
using namespace masklens::gpu::detail;

namespace {

// `view` copied `offset` bytes past an 8-byte boundary (strides unchanged).
struct Placed {
  std::vector<std::uint64_t> storage;
  MaskView view;
  Placed(const MaskView& from, std::int64_t offset) : storage(static_cast<std::size_t>(from.extent_bytes() / 8 + 4)) {
    auto* base = reinterpret_cast<std::uint8_t*>(storage.data()) + offset;
    std::memcpy(base, from.data(), static_cast<std::size_t>(from.extent_bytes()));
    view = *MaskView::make(base, from.dtype(), from.shape(), from.strides(), from.encoding());
  }
};

// What the device pass leaves: every row's span and every tile's count.
struct Replayed {
  std::vector<RowSpan> rows;
  std::vector<unsigned long long> counts;  // what the kernels' 64-bit atomics add into
  // Rows whose tiles came from their bounds, and rows guessed to be intervals that were
  // not (read again, counting).
  std::int64_t rows_from_bounds = 0, rows_read_twice = 0;
};

// One thread's read of a row: on the device its copies into the ring have all landed by
// the time it returns (it waited for each batch it read), and its later groups are empty.
template <class F>
auto one_thread(F&& read) {
  auto result = read();
  REQUIRE(cuda_host_shim::staged_copies_in_flight() == 0);
  cuda_host_shim::forget_groups();
  return result;
}

// The tile scan (agent_tile_scan.cuh) on the CPU: `blocks` blocks in turn, each taking its
// two ranges of units (range_of), each row read by `Threads` agents (merged in an order
// unlike the threads'), each thread adding into its copy of the block's counters
// (Shared) or into the q tile's counts, the counters flushed where the plan says
// (flush_after).
template <int Esize>
using TunedTiles = typename TileScanTuning<Esize, 900>::Policy;

template <int Esize, int Threads, bool Shared, bool Vote = TunedTiles<Esize>::kSkipMaskedBatches,
          int Stages = Threads == 32 ? TunedTiles<Esize>::kStagedBatches : 0>
Replayed replay(const ScanParams& s, const TileScanPlan& plan, std::int64_t blocks) {
  // The tile scan's own policy (dispatch_tiles.cuh launches TileScanTuning's): its loads
  // in flight, and its warps per block, which decide the rows each warp's guess follows;
  // its vote on masked batches, or (Vote false) none; its ring of staged batches, or
  // Stages' (a warp per row only: a block per row stages none).
  using Policy = WithStagedBatches<WithBatchVote<TunedTiles<Esize>, Vote>, Stages>;
  using Count = std::conditional_t<Shared, unsigned, unsigned long long>;
  using Acc = SpanTileAccumulator<Count>;
  // The warp's ring, its lanes' slots apart as on the device (one thread after another: a
  // copy lands at once, so a slot read before its copy, or copied over before it is
  // read, gives wrong keys).
  std::vector<uint4> ring(Policy::kStageBytesPerWarp / sizeof(uint4) + 1);
  const AgentScanRow<Policy, Esize, Acc, Threads> agent(s, ring.data());
  const AgentScanRow<Policy, Esize, SpanAccumulator, Threads> span_agent(s, ring.data());
  const TileGrid& g = plan.grid;
  // Each warp's guess, as the kernel keeps it: whether its last row was no interval.
  const std::int64_t rows_at_once = Threads == 32 ? Policy::kWarpRowsPerBlock : 1;
  std::vector<char> count_vectors(static_cast<std::size_t>(rows_at_once));
  Replayed out;
  std::int64_t& rows_from_bounds = out.rows_from_bounds;
  std::int64_t& rows_read_twice = out.rows_read_twice;
  out.rows.assign(static_cast<std::size_t>(s.rows), RowSpan{});
  out.counts.assign(static_cast<std::size_t>(g.tiles()), 0);
  std::vector<unsigned> block(static_cast<std::size_t>(plan.slots()), 0);
  const std::int64_t copies = std::int64_t{1} << plan.copy_shift;
  const auto scan_unit = [&](const TileUnit& unit) {
    const auto init = [&](int thread) {
      Acc a{};
      if constexpr (Shared) {
        a.tiles.counts = block.data() + ((thread & 31) & (copies - 1));
        a.tiles.copy_shift = plan.copy_shift;
      } else {
        a.tiles.counts = out.counts.data() + g.tile_index(unit.slice, unit.qt, 0);
      }
      a.tiles.keys = plan.keys;
      return a;
    };
    const std::uint8_t* slice_rows = agent.row_address(unit.slice, 0);  // as the kernel steps through a unit
    for (std::int64_t q = unit.q_begin; q < unit.q_end; ++q) {
      const std::int64_t r = unit.slice * s.q_len + q;
      const std::uint8_t* address = slice_rows + q * s.stride_bytes[2];
      char& counting = count_vectors[static_cast<std::size_t>((q - unit.q_begin) % rows_at_once)];
      const auto read = [&](int t) {
        return one_thread([&] {
          return counting ? agent.scan_at(address, t, init(t)).spans : span_agent.scan_at(address, t);
        });
      };
      SpanAccumulator row{};
      for (int t = Threads - 1; t >= 0; t -= 2) row = SpanAccumulator::merge(read(t), row);
      for (int t = 0; t < Threads; t += 2) row = SpanAccumulator::merge(row, read(t));
      row.store(out.rows.data(), r);
      const bool interval = row.span.is_interval();
      if (!counting) {
        for (int t = 0; t < Threads; ++t) {
          if (!interval) one_thread([&] { return agent.scan_at(address, t, init(t)); });  // read again, counting
          else if (row.span.count != 0) init(t).tiles.add_interval(row.span.first, row.span.count, t, Threads);
        }
        ++(interval ? rows_from_bounds : rows_read_twice);
      }
      counting = !plan.tiles_from_intervals || !interval;
    }
  };
  const auto flush = [&](const TileUnit& unit) {
    for (std::int64_t kt = 0; kt < g.k_tiles(); ++kt)
      for (std::int64_t c = 0; c < copies; ++c) {
        unsigned& slot = block[static_cast<std::size_t>((kt << plan.copy_shift) + c)];
        out.counts[static_cast<std::size_t>(g.tile_index(unit.slice, unit.qt, kt))] += slot;
        slot = 0;
      }
  };
  for (std::int64_t b = 0; b < blocks; ++b) {
    std::fill(block.begin(), block.end(), 0u);  // a block's counters start zeroed
    std::fill(count_vectors.begin(), count_vectors.end(), 1);  // a warp's first row is counted by vector
    for (int part = 0; part < TileScanPlan::kRangesPerBlock; ++part) {
      const UnitRange range = plan.range_of(b, blocks, part);
      for (std::int64_t u = range.begin; u < range.end; ++u) {
        const TileUnit unit = plan.unit(u);
        scan_unit(unit);
        if (Shared && plan.flush_after(u, range.end)) flush(unit);
      }
    }
    for (const unsigned left : block) REQUIRE(left == 0);  // its last flush took every count
  }
  return out;
}

// The plan of the kernel `threads` stands for (a warp per row: the block's warps read
// rows side by side), replayed with its counters where the plan puts them, or in the
// 64-bit counts when `force_global`.
// vote = false: the tuned policy without its vote on masked batches, 32 threads only.
// stages >= 0: a warp's ring of that many staged batches (0 none, 2 to 4), 32 threads only;
// -1: the tuned policy's.
Replayed replay(const MaskView& view, const TileGrid& g, int threads, bool force_global, std::int64_t blocks,
                TileScanPlan* used = nullptr, bool from_intervals = true, bool vote = true, int stages = -1) {
  REQUIRE((vote || threads == 32));
  REQUIRE((stages < 0 || (threads == 32 && vote && stages != 1 && stages <= 4)));
  const ScanParams s = scan_params(view);
  const int esize = element_size(view.dtype());
  // A warp per row: the tuned kernel's rows at once (its warps per block, as the replay
  // of each element size takes them).
  static_assert(TileScanTuning<1, 900>::Policy::kWarpRowsPerBlock == TileScanTuning<2, 900>::Policy::kWarpRowsPerBlock &&
                TileScanTuning<1, 900>::Policy::kWarpRowsPerBlock == TileScanTuning<4, 900>::Policy::kWarpRowsPerBlock);
  TileScanPlan plan = plan_tile_scan(g, esize, threads == 32 ? TileScanTuning<1, 900>::Policy::kWarpRowsPerBlock : 1);
  plan.tiles_from_intervals = from_intervals;
  if (force_global) {
    plan.shared = false;
    plan.copy_shift = 0;
    plan.shared_bytes = 0;
  }
  if (used) *used = plan;
  blocks = std::clamp<std::int64_t>(blocks, 1, plan.units);
  const auto staged = [&]<int E, int Stages>() {
    return plan.shared ? replay<E, 32, true, true, Stages>(s, plan, blocks)
                       : replay<E, 32, false, true, Stages>(s, plan, blocks);
  };
  const auto run = [&]<int E>() {
    switch (stages) {
      case 0: return staged.template operator()<E, 0>();
      case 2: return staged.template operator()<E, 2>();
      case 3: return staged.template operator()<E, 3>();
      case 4: return staged.template operator()<E, 4>();
      default: break;
    }
    if (!vote)  // a warp per row, as the kernel reads
      return plan.shared ? replay<E, 32, true, false>(s, plan, blocks) : replay<E, 32, false, false>(s, plan, blocks);
    if (threads == 32) return plan.shared ? replay<E, 32, true>(s, plan, blocks) : replay<E, 32, false>(s, plan, blocks);
    return plan.shared ? replay<E, 256, true>(s, plan, blocks) : replay<E, 256, false>(s, plan, blocks);
  };
  switch (esize) {
    case 1: return run.template operator()<1>();
    case 2: return run.template operator()<2>();
    default: return run.template operator()<4>();
  }
}

std::string text(const TileSize& t) { return std::to_string(t.q) + "x" + std::to_string(t.k); }

}  // namespace

TEST_SUITE("host") {

TEST_CASE("device tile divider: k / block_k exactly, by multiply and shift below 2^31 keys") {
  Rng rng(test_seed(1401));
  const std::int64_t top = std::int64_t{1} << 31;
  std::vector<std::int64_t> divisors;
  for (std::int64_t d = 1; d <= 300; ++d) divisors.push_back(d);
  for (int p = 1; p <= 31; ++p) {
    const std::int64_t two = std::int64_t{1} << p;
    for (const std::int64_t d : {two - 1, two, two + 1, two / 3 * 2 + 1}) divisors.push_back(d);
  }
  for (int i = 0; i < 300; ++i) divisors.push_back(uniform(rng, 1, top));
  std::int64_t checked = 0;
  for (const std::int64_t d : divisors) {
    if (d < 1 || d > top) continue;
    for (const std::int64_t k_len : {top, std::max(d, top - uniform(rng, 0, 1000)), uniform(rng, d, top)}) {
      const KeyTileDivider div = KeyTileDivider::make(d, k_len);
      REQUIRE_FALSE(div.wide);
      REQUIRE(div.divisor == d);
      const auto check = [&](std::int64_t k) {
        if (k < 0 || k >= k_len) return;
        if (div.tile_of(k) != k / d) FAIL("d=" << d << " k_len=" << k_len << " k=" << k << ": " << div.tile_of(k));
        ++checked;
      };
      for (std::int64_t k = 0; k < 300; ++k) check(k);
      for (std::int64_t k = k_len - 300; k < k_len; ++k) check(k);
      // Around multiples of d, where a wrong quotient would show first.
      for (int i = 0; i < 40; ++i) {
        const std::int64_t m = uniform(rng, 0, (k_len - 1) / d) * d;
        for (std::int64_t k = m - 2; k <= m + 2; ++k) check(k);
        check(m + d - 1);
      }
    }
  }
  MESSAGE(checked << " quotients exact");
  // A tile wider than the row holds every key; rows past 2^31 keys divide in 64 bits.
  const KeyTileDivider wide_tile = KeyTileDivider::make(std::int64_t{1} << 40, 1000);
  CHECK(wide_tile.divisor == 1000);
  for (std::int64_t k = 0; k < 1000; ++k) CHECK(wide_tile.tile_of(k) == 0);
  const std::int64_t long_row = (std::int64_t{1} << 33) + 5;
  for (const std::int64_t d : {std::int64_t{1}, std::int64_t{128}, std::int64_t{96}, (std::int64_t{1} << 32) + 7}) {
    const KeyTileDivider div = KeyTileDivider::make(d, long_row);
    CHECK(div.wide);
    for (const std::int64_t k : {std::int64_t{0}, d - 1, d, top - 1, top, top + 1, long_row - 1})
      if (k >= 0 && k < long_row) CHECK(div.tile_of(k) == k / d);
  }
}

TEST_CASE("device tile plan: units cover every row of every q tile once; counters fit and never overflow") {
  Rng rng(test_seed(1402));
  int plans = 0;
  for (int i = 0; i < 3000; ++i) {
    const std::int64_t B = uniform(rng, 1, 3), H = uniform(rng, 1, 3);
    const std::int64_t Q = coin(rng) ? uniform(rng, 1, 300) : uniform(rng, 1, 100000);
    const std::int64_t K = coin(rng, 0.1) ? uniform(rng, 1, std::int64_t{1} << 40) : uniform(rng, 1, 70000);
    const TileSize size{coin(rng) ? uniform(rng, 1, 300) : 128, coin(rng, 0.1) ? uniform(rng, 1, std::int64_t{1} << 36)
                                                                               : uniform(rng, 1, 300)};
    auto grid = make_tile_grid(B, H, Q, K, size, coin(rng) ? 1 : B, coin(rng) ? 1 : H);
    if (!grid) continue;  // more than 2^31 - 1 tiles a side
    const int esize = static_cast<int>(std::int64_t{1} << uniform(rng, 0, 2));
    const int at_once = std::array{1, 4, 8}[static_cast<std::size_t>(uniform(rng, 0, 2))];
    const TileScanPlan p = plan_tile_scan(*grid, esize, at_once);
    INFO("grid " << B << "x" << H << "x" << Q << "x" << K << " tiles " << text(size) << " esize " << esize);
    REQUIRE(p.rows_per_unit >= 1);
    REQUIRE(p.keys.divisor == std::min(size.k, K));
    if (p.shared) {
      CHECK(p.copy_shift >= 0);
      CHECK(p.copy_shift <= 5);
      CHECK(p.shared_bytes == static_cast<std::size_t>(grid->k_tiles() << p.copy_shift) * 4);
      CHECK(p.shared_bytes <= kTileSharedBudget);
      // A 32-bit counter holds a unit's rows x a tile's keys.
      CHECK(p.rows_per_unit <= ((std::int64_t{1} << 32) - 1) / p.keys.divisor);
    } else {
      CHECK((grid->k_tiles() * 4 > static_cast<std::int64_t>(kTileSharedBudget) ||
             p.keys.divisor > (std::int64_t{1} << 32) - 1));
      CHECK(p.shared_bytes == 0);
    }
    // Units: q tiles in order, each split into consecutive row groups.
    if (grid->slices() * Q <= 20000) {
      std::int64_t expect_slice = 0, expect_q = 0;
      for (std::int64_t u = 0; u < p.units; ++u) {
        const TileUnit t = p.unit(u);
        REQUIRE(t.q_begin <= t.q_end);
        REQUIRE(t.q_end - t.q_begin <= p.rows_per_unit);
        if (t.q_begin == t.q_end) continue;  // past a ragged last q tile
        REQUIRE(t.slice == expect_slice);
        REQUIRE(t.q_begin == expect_q);
        REQUIRE(t.qt == t.q_begin / size.q);
        REQUIRE((t.q_end - 1) / size.q == t.qt);
        expect_q = t.q_end;
        if (expect_q == Q) expect_q = 0, ++expect_slice;
      }
      CHECK(expect_slice == grid->slices());
      CHECK(expect_q == 0);
    }
    // A block's warps take a unit's rows in turn: a multiple of the rows read at once gives
    // each as many rows of every unit (but where a unit is a whole q tile, or the 32-bit
    // counters allow fewer rows).
    const std::int64_t tile_rows = std::min(size.q, Q);
    if (p.rows_per_unit < tile_rows && (p.keys.divisor > (std::int64_t{1} << 32) - 1 ||
                                        p.rows_per_unit < ((std::int64_t{1} << 32) - 1) / p.keys.divisor))
      CHECK(p.rows_per_unit % at_once == 0);
    // Counters flushed once per q tile hold a whole q tile's rows.
    if (p.flush_per_q_tile) {
      CHECK(p.shared);
      CHECK(std::min(size.q, Q) <= ((std::int64_t{1} << 32) - 1) / p.keys.divisor);
    }
    // Blocks' ranges: consecutive from 0 to units, sizes one apart at most; a flush at the
    // end of each range and before each new q tile, nowhere else (or after every unit).
    for (const std::int64_t blocks : {std::int64_t{1}, std::int64_t{7}, std::int64_t{528}, p.units}) {
      if (blocks > p.units) continue;
      std::int64_t next = 0, smallest = p.units, largest = 0;
      for (const std::int64_t b : {std::int64_t{0}, blocks / 2, blocks - 1}) {
        const UnitRange r = p.units_of(b, blocks);
        smallest = std::min(smallest, r.end - r.begin);
        largest = std::max(largest, r.end - r.begin);
        CHECK(r.end - r.begin >= 1);
        CHECK(p.flush_after(r.end - 1, r.end));
        const std::int64_t u = r.begin;
        if (u + 1 < r.end)
          CHECK(p.flush_after(u, r.end) == (!p.flush_per_q_tile || p.unit(u).slice != p.unit(u + 1).slice ||
                                            p.unit(u).qt != p.unit(u + 1).qt));
      }
      CHECK(largest - smallest <= 1);
      if (blocks <= 600) {
        for (std::int64_t b = 0; b < blocks; ++b) {
          const UnitRange r = p.units_of(b, blocks);
          REQUIRE(r.begin == next);
          next = r.end;
        }
        CHECK(next == p.units);
        // Folded (the kernel's ranges): both parts of every block cover each unit once,
        // a block's second part from the far end, each part flushed at its end.
        std::vector<int> seen(static_cast<std::size_t>(p.units), 0);
        for (std::int64_t b = 0; b < blocks; ++b)
          for (int part = 0; part < TileScanPlan::kRangesPerBlock; ++part) {
            const UnitRange r = p.range_of(b, blocks, part);
            if (r.end > r.begin) CHECK(p.flush_after(r.end - 1, r.end));
            for (std::int64_t u = r.begin; u < r.end; ++u) ++seen[static_cast<std::size_t>(u)];
          }
        CHECK(std::count(seen.begin(), seen.end(), 1) == p.units);
        if (p.units >= 2 * blocks) {
          CHECK(p.range_of(0, blocks, 0).begin == 0);
          CHECK(p.range_of(0, blocks, 1).end == p.units);
        }
        TileScanPlan unfolded = p;
        unfolded.fold_ranges = false;
        CHECK(unfolded.range_of(blocks - 1, blocks, 0).end == p.units);
        CHECK(unfolded.range_of(0, blocks, 1).end == unfolded.range_of(0, blocks, 1).begin);
      }
    }
    ++plans;
  }
  MESSAGE(plans << " plans");
  // The bench's shapes: counters in shared memory, one copy per 16-byte vector of a tile.
  const auto at = [](std::int64_t L, int esize) {
    return plan_tile_scan(*make_tile_grid(1, 1, L, L, TileSize{}), esize, 1);
  };
  CHECK(at(65536, 1).shared);
  CHECK(at(65536, 1).copy_shift == 3);
  CHECK(at(65536, 2).copy_shift == 4);
  CHECK(at(65536, 4).copy_shift == 4);  // 32 would pass the budget at 512 k tiles
  CHECK(at(32768, 4).copy_shift == 5);
  CHECK(at(65536, 1).units >= kTileTargetUnits);
  // Tiny k tiles over a long row: the counters go to the 64-bit counts.
  CHECK_FALSE(plan_tile_scan(*make_tile_grid(1, 1, 64, 65536, TileSize{64, 4}), 1, 1).shared);
  // A tile of 2^32 keys a row cannot be counted in 32 bits.
  const TileScanPlan huge = plan_tile_scan(*make_tile_grid(1, 1, 4, std::int64_t{1} << 33, TileSize{4, std::int64_t{1} << 32}), 1, 1);
  CHECK_FALSE(huge.shared);
  // 65536 x 65536 tiles: 2^32 elements in one tile, 65535 rows at most per 32-bit counter.
  const TileScanPlan big = plan_tile_scan(*make_tile_grid(1, 1, 65536, 65536, TileSize{65536, 65536}), 1, 1);
  CHECK(big.shared);
  CHECK(big.rows_per_unit * 65536 <= (std::int64_t{1} << 32) - 1);
}

TEST_CASE("device agent with the tile accumulator on the CPU: spans, counts and states of every tile") {
  Rng rng(test_seed(1403));
  const ElementType types[] = {ElementType::boolean, ElementType::uint8,    ElementType::int8,
                               ElementType::float16, ElementType::bfloat16, ElementType::float32};
  int compared = 0;
  std::int64_t rows_from_bounds = 0, rows_read_twice = 0;
  for (int i = 0; i < 700; ++i) {
    const std::int64_t q_len = uniform(rng, 1, 14);
    const std::int64_t k_len = coin(rng) ? uniform(rng, 1, 200) : uniform(rng, 1, 3000);
    const ElementType dtype = types[uniform(rng, 0, 5)];
    const Layout layout = static_cast<Layout>(uniform(rng, 0, 3));
    const std::int64_t batch = uniform(rng, 1, 2);
    const MaskStructure spec = layout == Layout::expand ? repeat_batches(random_structure(rng, 1, q_len, k_len), batch)
                                                        : random_structure(rng, batch, q_len, k_len);
    DenseMask dense = render(spec, uniform(rng, 1, 2), dtype,
                             coin(rng, 0.3) ? Polarity::true_masks : Polarity::true_attends, layout, rng,
                             coin(rng, 0.3) ? 0.2 : 0.0);
    std::string encoding = "rendered";
    if (is_additive(dtype) && coin(rng, 0.7)) {
      const Encoding e = kEncodings[uniform(rng, 0, std::ssize(kEncodings) - 1)];
      reencode(dense.view, e, rng);
      encoding = to_string(e);
    }
    auto* raw = const_cast<std::uint8_t*>(dense.view.element_ptr(0, 0, 0, 0));
    const int esize = element_size(dtype);
    for (int f = static_cast<int>(uniform(rng, 0, 3)); f > 0; --f) {
      const std::int64_t q = uniform(rng, 0, q_len - 1), k = uniform(rng, 0, k_len - 1);
      const bool was = attends(dense.view.at(0, 0, q, k));
      write_value(raw + dense.view.offset(0, 0, q, k) * esize, dtype, dense.view.encoding().polarity,
                  was ? Value::masked : Value::allowed, f);
    }
    const TileSize shapes[] = {{128, 128}, {64, 128}, {96, 80}, {1, 1}, {3, 16}, {4, 17}, {2, 5},
                               {uniform(rng, 1, 16), uniform(rng, 1, 300)}};
    const TileSize size = shapes[uniform(rng, 0, 7)];
    const Placed placed(dense.view, esize * uniform(rng, 0, 16 / esize - 1));
    const MaskView& view = placed.view;
    auto grid = tile_grid_for(view, size);
    REQUIRE(grid.ok());
    auto host = scan_with_tiles(view, size);
    REQUIRE(host.ok());
    auto spans = scan(view);
    REQUIRE(spans.ok());
    const std::vector<unsigned long long> want = reference_tile_counts(view, *grid);
    // Blocks: one for every unit, a few (ranges cut inside q tiles), one for all.
    const std::int64_t blocks = coin(rng) ? std::int64_t{1} << 40 : uniform(rng, 1, 5);
    // A warp per row reads through a ring of staged batches of a size drawn here (0: into
    // registers), or the tuned policy's.
    const int ring_sizes[] = {-1, 0, 2, 3, 4};
    const int stages = ring_sizes[uniform(rng, 0, 4)];
    for (const int threads : {32, 256})
      for (const bool force_global : {false, true})
        for (const bool from_intervals : {true, false}) {
        TileScanPlan plan;
        const Replayed got = replay(view, *grid, threads, force_global, blocks, &plan, from_intervals, true,
                                    threads == 32 ? stages : -1);
        rows_from_bounds += got.rows_from_bounds;
        rows_read_twice += got.rows_read_twice;
        if (!from_intervals) REQUIRE(got.rows_from_bounds + got.rows_read_twice == 0);
        INFO(dense.describe << " encoding " << encoding << " tiles " << text(size) << " threads " << threads
                            << std::string(from_intervals ? " intervals from bounds" : " every row by vector")
                            << (plan.shared ? " shared copies " + std::to_string(1 << plan.copy_shift) : " global")
                            << " rows/unit " << plan.rows_per_unit << " blocks " << std::min(blocks, plan.units)
                            << " ring " << (threads == 32 ? stages : -1)
                            << " base +" << (reinterpret_cast<std::uintptr_t>(view.data()) & 15));
        REQUIRE(got.rows.size() == spans->rows.size());
        for (std::size_t r = 0; r < got.rows.size(); ++r) {
          INFO("row " << r);
          REQUIRE(got.rows[r].count == spans->rows[r].count);
          REQUIRE(got.rows[r].same_keys(spans->rows[r]));
          REQUIRE(got.rows[r].flags == spans->rows[r].flags);
        }
        for (std::size_t t = 0; t < want.size(); ++t) {
          INFO("tile " << t);
          REQUIRE(got.counts[t] == want[t]);
          const std::int64_t nk = grid->k_tiles(), qt = static_cast<std::int64_t>(t) / nk % grid->q_tiles();
          REQUIRE(grid->state_of(qt, static_cast<std::int64_t>(t) % nk, static_cast<std::int64_t>(got.counts[t])) ==
                  host->tiles.states[t]);
        }
        ++compared;
      }
  }
  MESSAGE(compared << " replays: spans == scan(), counts == element counts, states == scan_with_tiles(); "
                    << rows_from_bounds << " rows counted from their bounds, " << rows_read_twice
                    << " guessed intervals read again");
  // Both ways a guessed interval ends were met, many times.
  CHECK(rows_from_bounds > 1000);
  CHECK(rows_read_twice > 100);
}

TEST_CASE("device tile scan on the CPU: long rows of one masked value skip whole batches, and a flag or key in a later batch is still seen") {
  // Rows of 16391 keys (past one batch of every element size's loads, per warp: 1024 keys
  // for 1-byte masks, 2048 for 2-byte, 512 for 4-byte), every element the masked value but a few
  // placed in later batches: a bias, a finite masked value, a NaN, a window, two keys.
  // The vote skips a batch only where a lane knows the masked value (2- and 4-byte: from
  // its first batch) or reads zero bytes (bool); what it skips must add nothing. Held to
  // the host's element-by-element row scan (spans and flags) and to element counts, with
  // the vote and without.
  struct Kind {
    ElementType dtype;
    std::uint32_t masked, finite_masked, bias, nan;  // bit patterns; attend = 0 (1 for bool)
  };
  const Kind kinds[] = {{ElementType::float16, 0xFC00u, 0xF0E2u, 0x3800u, 0x7E00u},
                        {ElementType::bfloat16, 0xFF80u, 0xC61Cu, 0x3F00u, 0x7FC0u},
                        {ElementType::float32, 0xFF800000u, 0xC61C4000u, 0x3F000000u, 0x7FC00000u},
                        {ElementType::boolean, 0u, 0u, 0u, 0u}};
  const std::int64_t q_len = 7, k_len = 16391;
  std::int64_t compared = 0;
  for (const Kind& kind : kinds) {
    const int esize = element_size(kind.dtype);
    const bool additive = kind.dtype != ElementType::boolean;
    std::vector<std::uint8_t> bytes(static_cast<std::size_t>(q_len * k_len * esize));
    const auto put = [&](std::int64_t q, std::int64_t k, std::uint32_t v) {
      std::memcpy(bytes.data() + (q * k_len + k) * esize, &v, static_cast<std::size_t>(esize));
    };
    const std::uint32_t attend = additive ? 0u : 1u;
    for (std::int64_t q = 0; q < q_len; ++q)
      for (std::int64_t k = 0; k < k_len; ++k) put(q, k, kind.masked);
    if (additive) {
      put(0, 9001, kind.bias);           // attends, with a bias
      put(1, 12007, kind.finite_masked);  // masked, finite
      put(2, 15013, kind.nan);            // invalid
    } else {
      put(0, 9001, attend);
      put(1, 16390, attend);  // the last key, in the tail past the vectors
    }
    for (std::int64_t k = 5000; k < 5100; ++k) put(3, k, attend);  // one interval
    put(5, 10000, attend);                                          // two keys: no interval
    put(5, 14000, attend);
    // row 4 and row 6: nothing attends
    const std::int64_t shape[] = {q_len, k_len};
    for (const std::int64_t offset : {std::int64_t{0}, std::int64_t{esize}}) {
      std::vector<std::uint8_t> placed_bytes(bytes.size() + 16 + 64);
      auto* base = reinterpret_cast<std::uint8_t*>((reinterpret_cast<std::uintptr_t>(placed_bytes.data()) + 15) &
                                                   ~std::uintptr_t{15}) + offset;
      std::memcpy(base, bytes.data(), bytes.size());
      const MaskView view = *MaskView::contiguous(base, kind.dtype, shape);
      // Element by element (scan() itself refuses the NaN, naming it).
      std::vector<RowSpan> reference;
      for (std::int64_t q = 0; q < q_len; ++q)
        reference.push_back(detail::scan_generic_row(view.element_ptr(0, 0, q, 0), k_len, esize, kind.dtype,
                                                     view.encoding()));
      for (const TileSize size : {TileSize{128, 128}, TileSize{7, 2048}, TileSize{3, 100}}) {
        const TileGrid g = *tile_grid_for(view, size);
        const std::vector<unsigned long long> want = reference_tile_counts(view, g);
        // (vote, ring): the tuned policy, no vote, and rings of 0 (registers) to 4 batches
        // with the vote, which wrap several times over a row of 16391 keys.
        const std::pair<bool, int> ways[] = {{true, -1}, {false, -1}, {true, 0}, {true, 2}, {true, 3}, {true, 4}};
        for (const auto& way : ways)
          for (const bool force_global : {false, true}) {
            // Named, not bound: INFO's lambda captures them (clang 14 takes no structured binding there).
            const bool vote = way.first;
            const int stages = way.second;
            INFO(to_string(kind.dtype) << " base +" << offset << " tiles " << text(size)
                                       << std::string(vote ? " vote" : " no vote") << " ring " << stages
                                       << std::string(force_global ? " global" : " shared"));
            const Replayed got = replay(view, g, 32, force_global, std::int64_t{1} << 40, nullptr, true, vote, stages);
            for (std::size_t r = 0; r < got.rows.size(); ++r) {
              INFO("row " << r);
              REQUIRE(got.rows[r].count == reference[r].count);
              REQUIRE(got.rows[r].same_keys(reference[r]));
              REQUIRE(got.rows[r].flags == reference[r].flags);
            }
            REQUIRE(got.counts == want);
            ++compared;
          }
      }
      // The placed elements were seen (the reference agrees with what they are).
      if (additive) {
        CHECK(reference[0].count == 1);
        CHECK((reference[0].flags & kRowBias) != 0);
        CHECK((reference[1].flags & kRowFiniteMasked) != 0);
        CHECK((reference[2].flags & kRowInvalid) != 0);
      } else {
        CHECK(reference[1].count == 1);
      }
      CHECK(reference[3].count == 100);
      CHECK(reference[5].count == 2);
      CHECK(reference[4].count == 0);
    }
  }
  MESSAGE(compared << " replays of long masked rows");
}

TEST_CASE("device tile scan on the CPU: a warp's ring of staged batches, wrapping many times over rows of several units") {
  // Rows of many batches (thousands of keys), several units a block, ragged q tiles and
  // every start alignment, each ring size. On the CPU a copy lands at once: a slot read
  // before its copy, or copied over before it is read, gives wrong keys.
  Rng rng(test_seed(1406));
  const ElementType types[] = {ElementType::boolean, ElementType::bfloat16, ElementType::float32};
  std::int64_t compared = 0;
  for (int i = 0; i < 40; ++i) {
    const std::int64_t q_len = uniform(rng, 20, 300), k_len = uniform(rng, 2000, 9000);
    const ElementType dtype = types[uniform(rng, 0, 2)];
    const MaskStructure spec = random_structure(rng, 1, q_len, k_len);
    DenseMask dense = render(spec, 1, dtype, coin(rng, 0.3) ? Polarity::true_masks : Polarity::true_attends,
                             Layout::contiguous, rng, coin(rng, 0.3) ? 0.2 : 0.0);
    const int esize = element_size(dtype);
    auto* raw = const_cast<std::uint8_t*>(dense.view.element_ptr(0, 0, 0, 0));
    for (int f = static_cast<int>(uniform(rng, 0, 6)); f > 0; --f) {  // flipped keys: rows that are no interval
      const std::int64_t q = uniform(rng, 0, q_len - 1), k = uniform(rng, 0, k_len - 1);
      write_value(raw + dense.view.offset(0, 0, q, k) * esize, dtype, dense.view.encoding().polarity,
                  attends(dense.view.at(0, 0, q, k)) ? Value::masked : Value::allowed, f);
    }
    const Placed placed(dense.view, esize * uniform(rng, 0, 16 / esize - 1));
    const MaskView& view = placed.view;
    const TileSize size{std::array<std::int64_t, 3>{128, 48, 7}[static_cast<std::size_t>(uniform(rng, 0, 2))], 128};
    const TileGrid g = *tile_grid_for(view, size);
    auto spans = scan(view);
    REQUIRE(spans.ok());
    const std::vector<unsigned long long> want = reference_tile_counts(view, g);
    for (const int stages : {2, 3, 4})
      for (const std::int64_t blocks : {std::int64_t{1}, std::int64_t{3}}) {
        INFO(dense.describe << " tiles " << text(size) << " ring " << stages << " blocks " << blocks << " base +"
                            << (reinterpret_cast<std::uintptr_t>(view.data()) & 15));
        const Replayed got = replay(view, g, 32, false, blocks, nullptr, true, true, stages);
        for (std::size_t r = 0; r < got.rows.size(); ++r) {
          INFO("row " << r);
          REQUIRE(got.rows[r].count == spans->rows[r].count);
          REQUIRE(got.rows[r].same_keys(spans->rows[r]));
          REQUIRE(got.rows[r].flags == spans->rows[r].flags);
        }
        REQUIRE(got.counts == want);
        ++compared;
      }
  }
  MESSAGE(compared << " replays through rings of 2, 3 and 4 batches");
}

TEST_CASE("device ring layout: every lane's slots its own, inside the warp's ring, after the block's counters") {
  // The replay runs one lane after another, so lanes sharing a slot would not show there:
  // the layout is checked here instead. ring_vector over (lane, slot, vector) of each ring
  // shape, and the tile scan's shared memory (counters, then a ring a warp) for plans of
  // every counter size.
  std::int64_t checked = 0;
  for (const auto& [stages, in_flight] : {std::pair{2, 4}, std::pair{3, 2}, std::pair{4, 2}, std::pair{8, 1}}) {
    const int vectors = stages * in_flight * 32;  // kStageBytesPerWarp / 16
    std::vector<int> owner(static_cast<std::size_t>(vectors), -1);
    for (int lane = 0; lane < 32; ++lane)
      for (int slot = 0; slot < stages; ++slot)
        for (int j = 0; j < in_flight; ++j) {
          const int at = ring_vector(lane, slot, j, in_flight);
          REQUIRE(at >= 0);
          REQUIRE(at < vectors);
          REQUIRE(owner[static_cast<std::size_t>(at)] == -1);
          owner[static_cast<std::size_t>(at)] = lane;
          // Vector j of one slot: the warp's lanes side by side (512 consecutive bytes).
          CHECK(at - lane == ring_vector(0, slot, j, in_flight));
          ++checked;
        }
  }
  using Tuned = TunedTiles<1>;
  for (const std::int64_t k_len : {std::int64_t{1}, std::int64_t{100}, std::int64_t{32768}, std::int64_t{65536},
                                   std::int64_t{69632}, std::int64_t{131072}, std::int64_t{1} << 20}) {
    const TileScanPlan plan = plan_tile_scan(*make_tile_grid(1, 1, 256, k_len, TileSize{}), 1, Tuned::kWarpRowsPerBlock);
    const std::size_t rings = tile_scan_ring_offset(plan.shared_bytes);
    INFO("k_len " << k_len << " counters " << plan.shared_bytes);
    CHECK(rings % 16 == 0);
    CHECK(rings >= plan.shared_bytes);
    CHECK(rings < plan.shared_bytes + 16);
    CHECK(tile_scan_shared_bytes<Tuned>(plan) ==
          rings + std::size_t{Tuned::kStageBytesPerWarp} * Tuned::kWarpRowsPerBlock);
    CHECK(tile_scan_shared_bytes<Tuned>(plan) <= kTileSharedBudget + 16 * 1024);  // within 48 KiB
    ++checked;
  }
  MESSAGE(checked << " ring places");
}

TEST_CASE("device tile scan on the CPU: each warp guesses from its own previous row, across units") {
  // The kernel's warp w of W reads rows q_begin + w, q_begin + w + W, ... of each unit and
  // keeps its guess from unit to unit. Rows q with q % 2W == 1 are two keys apart (no
  // interval), every other row one interval: warp 1's rows alternate, so each of its
  // non-interval rows but its first is met guessed an interval (read again), and its
  // interval rows are counted by vector (after a row that was not one); every warp's
  // first row is counted by vector, the other warps' later rows all come from their
  // bounds. A replay with another number of warps, or one guess per block, counts
  // otherwise.
  constexpr int W = TileScanTuning<1, 900>::Policy::kWarpRowsPerBlock;
  const std::int64_t q_len = 8 * W, k_len = 48;
  std::vector<std::uint8_t> mask(static_cast<std::size_t>(q_len * k_len), 0);
  for (std::int64_t q = 0; q < q_len; ++q) {
    std::uint8_t* row = mask.data() + q * k_len;
    if (q % (2 * W) == 1) {
      row[3] = row[40] = 1;
    } else {
      for (std::int64_t k = q % 7; k <= 20 + q % 11; ++k) row[k] = 1;
    }
  }
  const std::int64_t shape[] = {q_len, k_len};
  const MaskView view = *MaskView::contiguous(mask.data(), ElementType::boolean, shape);
  const TileGrid g = *tile_grid_for(view, TileSize{q_len, 16});
  // Two units of 4W rows, both taken by one block.
  const TileScanPlan plan = plan_tile_scan(g, 1, W, 2, 16);
  REQUIRE(plan.shared);
  REQUIRE(plan.units == 2);
  REQUIRE(plan.rows_per_unit == 4 * W);
  const Replayed got = replay<1, 32, true>(scan_params(view), plan, 1);
  CHECK(got.rows_read_twice == q_len / (2 * W) - 1);
  CHECK(got.rows_from_bounds == (W - 1) * (q_len / W - 1));
  CHECK(got.counts == reference_tile_counts(view, g));
  auto host = scan(view);
  REQUIRE(host.ok());
  for (std::size_t r = 0; r < host->rows.size(); ++r) CHECK(got.rows[r].same_keys(host->rows[r]));
}

TEST_CASE("device tile sink: an interval's tiles from its bounds, rows past 2^31 keys and tiles wider than the row") {
  // TileSink::add_interval shared among 1, 32 and 256 lanes, each tile's count against
  // its overlap with the interval: the multiply-and-shift divider up to 2^31 keys, the
  // 64-bit one past it, and a tile wider than the row (the divisor is the row's length).
  Rng rng(test_seed(1404));
  const std::int64_t two31 = std::int64_t{1} << 31;
  struct Case {
    std::int64_t block_k, k_len;
  };
  const Case cases[] = {{1, 300},
                        {7, 1000},
                        {128, 70000},
                        {two31 >> 12, two31},
                        {(two31 >> 12) + 3, two31},
                        {std::int64_t{1} << 22, (std::int64_t{1} << 33) + 5},
                        {two31 + 1, (std::int64_t{1} << 33) + 5},
                        {(std::int64_t{1} << 32) + 7, (std::int64_t{1} << 34)},
                        {std::int64_t{1} << 40, (std::int64_t{1} << 33) + 5},
                        {std::int64_t{1} << 40, 1000}};
  std::int64_t checked = 0;
  for (const Case& c : cases) {
    const KeyTileDivider keys = KeyTileDivider::make(c.block_k, c.k_len);
    const std::int64_t nk = (c.k_len + keys.divisor - 1) / keys.divisor;
    REQUIRE(nk <= 100000);
    for (int i = 0; i < 40; ++i) {
      // Whole rows, intervals at either end (the last key of a 2^31-key row among them),
      // and anywhere.
      std::int64_t first = 0, n = c.k_len;
      if (i % 4 == 1) {
        n = uniform(rng, 1, c.k_len);
        first = c.k_len - n;
      } else if (i % 4 == 2) {
        n = uniform(rng, 1, std::min<std::int64_t>(c.k_len, 3 * keys.divisor));
      } else if (i % 4 == 3) {
        first = uniform(rng, 0, c.k_len - 1);
        n = uniform(rng, 1, c.k_len - first);
      }
      for (const int lanes : {1, 32, 256}) {
        std::vector<unsigned long long> counts(static_cast<std::size_t>(nk), 0);
        TileSink<unsigned long long> sink;
        sink.counts = counts.data();
        sink.keys = keys;
        for (int lane = 0; lane < lanes; ++lane) sink.add_interval(first, n, lane, lanes);
        for (std::int64_t kt = 0; kt < nk; ++kt) {
          const std::int64_t lo = kt * keys.divisor, hi = std::min(c.k_len, lo + keys.divisor);
          const std::int64_t want = std::max<std::int64_t>(0, std::min(hi, first + n) - std::max(lo, first));
          INFO("block_k " << c.block_k << " K=" << c.k_len << " keys " << first << " + " << n << " lanes " << lanes
                          << " k tile " << kt);
          REQUIRE(counts[static_cast<std::size_t>(kt)] == static_cast<unsigned long long>(want));
          ++checked;
        }
      }
    }
  }
  MESSAGE(checked << " tile counts exact");
}

TEST_CASE("device tile accumulator on the CPU: whole and striped rows, every length to 100, start and tile width") {
  // Rows cut by tile boundaries at every position a 16-byte vector, the head or the tail
  // can meet them: every key of the row attends (runs), or every other one (bits).
  struct Kind {
    ElementType dtype;
    std::uint32_t attend, masked;
  };
  const Kind kinds[] = {{ElementType::boolean, 1, 0}, {ElementType::bfloat16, 0, 0xff80}, {ElementType::float32, 0, 0xff800000u}};
  std::int64_t checked = 0;
  for (const Kind& kind : kinds) {
    const int esize = element_size(kind.dtype);
    for (std::int64_t k_len = 1; k_len <= 100; k_len += (k_len < 40 ? 1 : 7)) {
      const std::int64_t q_len = 2;  // row 0 attends everywhere, row 1 on even keys
      std::vector<std::uint64_t> storage(static_cast<std::size_t>((q_len * k_len * esize + 7) / 8));
      auto* bytes = reinterpret_cast<std::uint8_t*>(storage.data());
      for (std::int64_t q = 0; q < q_len; ++q)
        for (std::int64_t k = 0; k < k_len; ++k) {
          const std::uint32_t v = q == 0 || k % 2 == 0 ? kind.attend : kind.masked;
          std::uint8_t* p = bytes + (q * k_len + k) * esize;
          if (esize == 1) *p = static_cast<std::uint8_t>(v);
          else store_bits(p, kind.dtype, v);
        }
      const std::int64_t shape[] = {q_len, k_len};
      const MaskView view = *MaskView::contiguous(bytes, kind.dtype, shape);
      for (std::int64_t start = 0; start < 16 / esize; ++start) {
        const Placed placed(view, start * esize);
        for (std::int64_t width = 1; width <= 40; ++width) {
          const TileGrid g = *tile_grid_for(placed.view, TileSize{1, width});
          for (const int threads : {32, 256})
            for (const bool from_intervals : {true, false}) {
            const Replayed got = replay(placed.view, g, threads, false, 3, nullptr, from_intervals);
            for (std::int64_t kt = 0; kt < g.k_tiles(); ++kt) {
              const std::int64_t lo = kt * width, hi = std::min(k_len, lo + width);
              const std::int64_t even = (hi + 1) / 2 - (lo + 1) / 2;
              INFO(to_string(kind.dtype) << " K=" << k_len << " start +" << start << " width " << width << " threads "
                                         << threads << std::string(from_intervals ? " from bounds" : " by vector") << " k tile "
                                         << kt);
              REQUIRE(got.counts[static_cast<std::size_t>(kt)] == static_cast<unsigned long long>(hi - lo));
              REQUIRE(got.counts[static_cast<std::size_t>(g.k_tiles() + kt)] == static_cast<unsigned long long>(even));
              ++checked;
            }
          }
        }
      }
    }
  }
  MESSAGE(checked << " tiles exact");
}

}  // TEST_SUITE
