// The tile scan's agent: one block's share of the pass that counts tiles beside the row
// spans — its ranges of units of rows (tile_plan.hpp), each row read by a warp with
// agent_scan.cuh's AgentScanRow, the row's span reduced and stored, its attending keys
// added into the block's per-k-tile counters (or the q tile's 64-bit counts), and the
// counters flushed into the counts once per q tile. The kernel and its launch are in
// dispatch_tiles.cuh. nvcc only (the host suite replays the plan and the accumulator,
// tests/test_tile_agent_on_host.cpp).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <cub/warp/warp_reduce.cuh>

#include "accumulators.cuh"
#include "agent_scan.cuh"
#include "dependent_launch.cuh"
#include "tile_accumulator.cuh"
#include "tile_plan.hpp"

namespace masklens::gpu::detail {

// The accumulator a thread starts each row with: the block's counters (Shared) or the
// unit's q tile's counts.
template <bool Shared>
using TileCount = std::conditional_t<Shared, unsigned, unsigned long long>;

template <bool Shared>
__device__ __forceinline__ SpanTileAccumulator<TileCount<Shared>> tile_accumulator(const TileScanPlan& plan,
                                                                                   const TileUnit& unit,
                                                                                   unsigned* shared_counts,
                                                                                   unsigned long long* counts) {
  SpanTileAccumulator<TileCount<Shared>> acc{};
  if constexpr (Shared) {
    const int copy = static_cast<int>(threadIdx.x & 31u) & ((1 << plan.copy_shift) - 1);
    acc.tiles.counts = shared_counts + copy;
    acc.tiles.copy_shift = plan.copy_shift;
  } else {
    acc.tiles.counts = counts + plan.grid.tile_index(unit.slice, unit.qt, 0);
    acc.tiles.copy_shift = 0;
  }
  acc.tiles.keys = plan.keys;
  return acc;
}

// Adds the block's counters into the unit's q tile's counts, zeroing them for the next
// unit. Between two __syncthreads: every add of the unit is before, the next unit after.
// The counts are the zeroing kernel's until it completes (a chained launch: the block has
// read its rows meanwhile); after the first flush the wait returns at once.
__device__ __forceinline__ void flush_tile_counters(const TileScanPlan& plan, const TileUnit& unit,
                                                    unsigned* shared_counts, unsigned long long* counts) {
  wait_for_previous_kernel();
  const std::int64_t nk = plan.grid.k_tiles(), copies = std::int64_t{1} << plan.copy_shift;
  unsigned long long* q_tile = counts + plan.grid.tile_index(unit.slice, unit.qt, 0);
  for (std::int64_t kt = threadIdx.x; kt < nk; kt += blockDim.x) {
    unsigned* slot = shared_counts + (kt << plan.copy_shift);
    unsigned long long sum = 0;
    for (std::int64_t c = 0; c < copies; ++c) {
      sum += slot[c];
      slot[c] = 0;
    }
    if (sum != 0) atomicAdd(q_tile + kt, sum);
  }
}

__device__ __forceinline__ void zero_tile_counters(const TileScanPlan& plan, unsigned* shared_counts) {
  for (std::int64_t i = threadIdx.x; i < plan.slots(); i += blockDim.x) shared_counts[i] = 0;
}

// Warp `warp`'s ring in the tile scan's dynamic shared memory (tile_scan_shared_bytes).
template <class Policy>
__device__ __forceinline__ uint4* warp_ring(unsigned* shared, const TileScanPlan& plan, int warp) {
  if constexpr (Policy::kStagedBatches == 0) {
    return nullptr;
  } else {
    auto* base = reinterpret_cast<unsigned char*>(shared) + tile_scan_ring_offset(plan.shared_bytes);
    return reinterpret_cast<uint4*>(base + std::size_t{Policy::kStageBytesPerWarp} * warp);
  }
}

// A block's share of the scan, a warp per row, rows of any length: the block's warps
// read the unit's rows side by side (a block per row, as the span scan takes for long
// rows, holds fewer blocks per SM here and waits at a barrier per row: tuning.cuh). A
// warp guesses, from its previous row, whether a row is one interval
// (plan.tiles_from_intervals): if so it reads it for the span alone and its lanes add
// the tiles' counts from the bounds; a row that turns out not to be one is read again,
// counting vector by vector, and so is the next row at once. Its first row is counted
// vector by vector: a guess of "interval" there would cost every warp of a block-sparse
// mask a second read (about one row in ten at 32768^2, where a warp reads ten rows).
// With a ring of staged batches (Policy::kStagedBatches) each warp reads its rows
// through its own ring in shared memory (after the block's counters).
template <class Policy, int Esize, bool Shared>
struct AgentTileScan {
  using Accumulator = SpanTileAccumulator<TileCount<Shared>>;
  using Reduce = cub::WarpReduce<SpanAccumulator>;
  static constexpr int kRowsAtOnce = Policy::kWarpRowsPerBlock;
  // The warps' reductions, in the kernel's static shared memory.
  using TempStorage = typename Reduce::TempStorage[kRowsAtOnce];

  const ScanParams& s;
  const TileScanPlan& plan;
  TempStorage& temp;
  unsigned* shared_counts;  // the kernel's dynamic shared memory: the counters, then each warp's ring
  const int warp, lane;
  uint4* const ring;
  const AgentScanRow<Policy, Esize, Accumulator, 32> agent;
  const AgentScanRow<Policy, Esize, SpanAccumulator, 32> span_agent;

  __device__ __forceinline__ AgentTileScan(const ScanParams& s_, const TileScanPlan& plan_, TempStorage& temp_,
                                           unsigned* shared_counts_)
      : s(s_),
        plan(plan_),
        temp(temp_),
        shared_counts(shared_counts_),
        warp(static_cast<int>(threadIdx.x / 32)),
        lane(static_cast<int>(threadIdx.x % 32)),
        ring(warp_ring<Policy>(shared_counts_, plan_, warp)),
        agent(s_, ring),
        span_agent(s_, ring) {}

  // The block's ranges of units: spans into `rows`, tiles' counts into `counts`.
  __device__ __forceinline__ void consume_ranges(RowSpan* rows, unsigned long long* counts) const {
    launch_dependents();  // the writer's blocks wait for this kernel themselves
    if constexpr (Shared) {
      zero_tile_counters(plan, shared_counts);
      __syncthreads();
    } else {
      wait_for_previous_kernel();  // every add goes to the counts: they must be zeroed first
    }
    bool count_vectors = true;  // warp-uniform: no row read yet, or the warp's last row was no interval
    // The warps run ahead into the next unit of the same q tile: only a flush waits for all.
    for (int part = 0; part < TileScanPlan::kRangesPerBlock; ++part) {
      const UnitRange range = plan.range_of(blockIdx.x, gridDim.x, part);
      for (std::int64_t u = range.begin; u < range.end; ++u) {
        const TileUnit unit = plan.unit(u);
        const Accumulator init = tile_accumulator<Shared>(plan, unit, shared_counts, counts);
        const std::uint8_t* slice_rows = agent.row_address(unit.slice, 0);  // the unit's slice: one division a unit
        for (std::int64_t q = unit.q_begin + warp; q < unit.q_end; q += kRowsAtOnce) {
          const std::int64_t r = unit.slice * s.q_len + q;
          const std::uint8_t* address = slice_rows + q * s.stride_bytes[2];
          const SpanAccumulator mine =
              count_vectors ? agent.scan_at(address, lane, init).spans : span_agent.scan_at(address, lane);
          const SpanAccumulator row = Reduce(temp[warp]).Reduce(mine, MergeAccumulators<SpanAccumulator>{});
          if (lane == 0) row.store(rows, r);
          // The row's span in every lane (the reduction leaves it in lane 0).
          const std::int64_t first = __shfl_sync(0xffffffffu, row.span.first, 0);
          const std::int64_t n = __shfl_sync(0xffffffffu, row.span.count, 0);
          const bool interval = __shfl_sync(0xffffffffu, static_cast<int>(row.span.is_interval()), 0) != 0;
          if (!count_vectors) {
            if (!interval) agent.scan_at(address, lane, init);  // the row again, counting (its spans are stored)
            else if (n != 0) init.tiles.add_interval(first, n, lane, 32);
          }
          count_vectors = !plan.tiles_from_intervals || !interval;
          __syncwarp();
        }
        if constexpr (Shared) {
          if (plan.flush_after(u, range.end)) {
            __syncthreads();
            flush_tile_counters(plan, unit, shared_counts, counts);
            __syncthreads();
          }
        }
      }
    }
    // The writer chained after this kernel waits for it alone: every block waits for the
    // zeroing before it exits, flushed or not (at once where it already has).
    wait_for_previous_kernel();
  }
};

}  // namespace masklens::gpu::detail
