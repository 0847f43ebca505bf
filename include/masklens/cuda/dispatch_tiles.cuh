// Tile summaries on the device, in the pass that scans the row spans: the kernels and
// their launch. nvcc only; the entry points are declared in tiles.hpp and defined in
// tiles.cu.
//   1. the scan: dispatch_scan.cuh's agent, a warp per row; as many blocks as the device
//      holds at once, each taking two ranges of consecutive units of rows, one from each
//      end (tile_plan.hpp); its warps reduce each row's span with CUB and store it, and
//      add the row's attending keys into the block's per-k-tile counters: from the span's
//      bounds where the row is one interval, else key by key as they are read
//      (SpanTileAccumulator); where the block's next unit is of another q tile (and at
//      the end of each range) it adds the counters into the q tile's 64-bit counts
//      (temporary storage, zeroed before the scan);
//   2. torch's BlockMask: a block per q tile (its row of k tiles) and a block per k tile
//      (its column of q tiles) turns the counts into states (TileGrid::state_of), or
//      reads states the caller has (write_block_mask), and writes the tiles of each
//      state in ascending order, then the others in ascending order: what write_kv_row
//      / write_q_column write (tile_grid.hpp), with ballots and a block prefix in place
//      of their loops.
// Launched with cudaLaunchKernelEx (its result is the launch's own status: the caller's
// CUDA "last error" is neither read nor cleared).
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <limits>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>

#include <cub/warp/warp_reduce.cuh>

#include "../mask_view.hpp"
#include "../structure_tiles.hpp"
#include "../tile_grid.hpp"
#include "accumulators.cuh"
#include "agent_scan.cuh"
#include "dependent_launch.cuh"
#include "dispatch_scan.cuh"
#include "tile_accumulator.cuh"
#include "tile_plan.hpp"
#include "tuning.cuh"

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

// A block may take 48 KiB of dynamic shared memory without opting in: the counters'
// budget and the rings stay within it (launch_tile_plan). The kernel's static shared
// memory, CUB's WarpReduce storage, is empty (a reduction by shuffles): static shared
// memory added to it would take from the same 48 KiB, and the widest plans would then
// fail to launch (an error, not a wrong result).
inline constexpr std::size_t kDefaultDynamicShared = 48 * 1024;

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

// A warp per row, rows of any length: the block's warps read the unit's rows side by
// side. (A block per row, as the span scan takes for long rows, measured slower here: the
// tile sink's registers leave fewer blocks per SM, and a block waits at a barrier per
// row; bench/device_tiles.cu --sweep.) A warp guesses, from its previous row, whether a
// row is one interval (plan.tiles_from_intervals): if so it reads it for the span alone
// and its lanes add the tiles' counts from the bounds; a row that turns out not to be
// one is read again, counting vector by vector, and so is the next row at once. Its
// first row is counted vector by vector: a guess of "interval" there would cost every
// warp of a block-sparse mask a second read (about one row in ten at 32768^2, where a
// warp reads ten rows: 1.26x against 1.14x a read for the scan kernel on an H200).
// With a ring of staged batches (Policy::kStagedBatches) each warp reads its rows
// through its own ring in shared memory (after the block's counters).
template <class Policy, int Esize, bool Shared>
__global__ void __launch_bounds__(Policy::kBlockThreads, Policy::kMinBlocksPerSM)
    scan_tiles_warp_kernel(ScanParams s, TileScanPlan plan, RowSpan* rows, unsigned long long* counts) {
  using Accumulator = SpanTileAccumulator<TileCount<Shared>>;
  using Reduce = cub::WarpReduce<SpanAccumulator>;
  constexpr int kRowsAtOnce = Policy::kWarpRowsPerBlock;
  __shared__ typename Reduce::TempStorage temp[kRowsAtOnce];
  // The counters (plan.shared_bytes), then each warp's ring of staged batches.
  extern __shared__ __align__(16) unsigned shared_counts[];
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  uint4* const ring = warp_ring<Policy>(shared_counts, plan, warp);
  const AgentScanRow<Policy, Esize, Accumulator, 32> agent(s, ring);
  const AgentScanRow<Policy, Esize, SpanAccumulator, 32> span_agent(s, ring);
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

// Blocks of `kernel` the device holds at once (its SMs x the blocks an SM holds with
// `threads` threads and `smem` bytes of dynamic shared memory): the grid of a scan whose
// blocks each take a share of the units. The answer depends on nothing else, so each
// (device, kernel, threads, smem) is asked once: the attribute and occupancy queries cost
// microseconds of host time, spent before the scan's launch on every read.
template <class Kernel>
cudaError_t resident_blocks(Kernel kernel, int threads, std::size_t smem, std::int64_t& blocks) {
  // One entry per device, kernel and shared size met (the shared size follows the k
  // tiles: up to a few thousand over every mask width), looked up in O(log n).
  using Key = std::tuple<int, const void*, int, std::size_t>;
  static std::mutex mutex;
  static std::map<Key, std::int64_t> known;
  int device = 0, sms = 0, per_sm = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return e;
  const Key key{device, reinterpret_cast<const void*>(kernel), threads, smem};
  {
    const std::lock_guard<std::mutex> lock(mutex);
    if (const auto it = known.find(key); it != known.end()) {
      blocks = it->second;
      return cudaSuccess;
    }
  }
  e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem);
  blocks = static_cast<std::int64_t>(sms) * (per_sm > 0 ? per_sm : 1);
  if (e == cudaSuccess) {
    const std::lock_guard<std::mutex> lock(mutex);
    known.emplace(key, blocks);
  }
  return e;
}

// The scan kernel `plan` takes (counters in shared memory or not), and how many of its
// blocks the device holds at once with the plan's shared memory (plan.shared_bytes is 0
// where the counters are not shared).
template <class Policy, int Esize>
auto tile_scan_kernel(const TileScanPlan& plan) {
  return plan.shared ? scan_tiles_warp_kernel<Policy, Esize, true> : scan_tiles_warp_kernel<Policy, Esize, false>;
}

template <class Policy, int Esize>
cudaError_t resident_tile_blocks(const TileScanPlan& plan, std::int64_t& blocks) {
  return resident_blocks(tile_scan_kernel<Policy, Esize>(plan), Policy::kBlockThreads,
                         tile_scan_shared_bytes<Policy>(plan), blocks);
}

// The scan with `Policy` and `plan` (plan_tile_scan's with kWarpRowsPerBlock rows at once)
// on `blocks` blocks (0: as many as the device holds at once; never more than the units);
// chained: started while the kernel zeroing the counts runs (dependent_launch.cuh).
template <class Policy, int Esize>
cudaError_t launch_tile_plan(const ScanParams& s, const TileScanPlan& plan, RowSpan* rows, unsigned long long* counts,
                             cudaStream_t stream, std::int64_t blocks = 0, bool chained = false) {
  static_assert(tile_scan_ring_offset(kTileSharedBudget) + tile_scan_ring_bytes<Policy>() <= kDefaultDynamicShared,
                "the counters and the rings fit a block's shared memory without opting in");
  if (blocks <= 0)
    if (const cudaError_t e = resident_tile_blocks<Policy, Esize>(plan, blocks); e != cudaSuccess) return e;
  if (blocks > plan.units) blocks = plan.units;
  if (blocks > Policy::kMaxGrid) blocks = Policy::kMaxGrid;
  cudaLaunchConfig_t config{};
  config.blockDim = dim3(Policy::kBlockThreads);
  config.gridDim = dim3(static_cast<unsigned>(blocks));
  config.dynamicSmemBytes = tile_scan_shared_bytes<Policy>(plan);
  config.stream = stream;
  cudaLaunchAttribute attribute{};
  chain_launch(config, attribute, chained);
  return cudaLaunchKernelEx(&config, tile_scan_kernel<Policy, Esize>(plan), s, plan, rows, counts);
}

// The scan with `Policy` and its plan.
template <class Policy, int Esize>
cudaError_t launch_tiles_with(const ScanParams& s, const TileGrid& g, RowSpan* rows, unsigned long long* counts,
                              cudaStream_t stream, bool chained) {
  const TileScanPlan plan = plan_tile_scan(g, Esize, Policy::kWarpRowsPerBlock);
  return launch_tile_plan<Policy, Esize>(s, plan, rows, counts, stream, 0, chained);
}

template <int Esize>
cudaError_t launch_tiles_for_arch(int arch, const ScanParams& s, const TileGrid& g, RowSpan* rows,
                                  unsigned long long* counts, cudaStream_t stream, bool chained) {
  switch (tuned_arch(arch)) {
    case 900:
      return launch_tiles_with<typename TileScanTuning<Esize, 900>::Policy, Esize>(s, g, rows, counts, stream, chained);
    default:
      return launch_tiles_with<typename TileScanTuning<Esize, 800>::Policy, Esize>(s, g, rows, counts, stream, chained);
  }
}

// Enqueues the scan of `view` (device memory, validated) into `rows` (span_rows(view)
// RowSpans) and the per-tile counts of grid `g` (tile_grid_for(view, size)) into
// `counts` (g.tiles() 64-bit counts, zeroed by the kernel before: launch_zero_counts) on
// `stream` with the policy of `arch` (current_arch); chained (dependent_launch.cuh) to
// that kernel where `chained` (tile_pass_chains). The launch's own status.
inline cudaError_t dispatch_scan_tiles(const MaskView& view, const TileGrid& g, RowSpan* rows,
                                       unsigned long long* counts, cudaStream_t stream, int arch, bool chained) {
  const ScanParams s = scan_params(view);
  switch (element_size(view.dtype())) {
    case 1: return launch_tiles_for_arch<1>(arch, s, g, rows, counts, stream, chained);
    case 2: return launch_tiles_for_arch<2>(arch, s, g, rows, counts, stream, chained);
    default: return launch_tiles_for_arch<4>(arch, s, g, rows, counts, stream, chained);
  }
}

// The tile scan's counts zeroed by a kernel rather than a memset, so that the scan can be
// chained to it (dependent_launch.cuh). It lets the scan launch at once: the scan waits
// for it before its first add. (A template: a header's kernel is then defined once
// however many .cu files include it.)
template <class Count>
__global__ void __launch_bounds__(256) zero_counts_kernel(Count* counts, std::int64_t n) {
  launch_dependents();
  const std::int64_t stride = std::int64_t{gridDim.x} * blockDim.x;
  for (std::int64_t i = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) counts[i] = 0;
}

// Whether the tile pass chains its kernels on the current device (chains_launches over
// the kernels of this header, compiled together), asked once per device.
inline cudaError_t tile_pass_chains(bool& chained) {
  constexpr int kDevices = 64;  // devices past this are asked each time
  static std::atomic<signed char> known[kDevices] = {};  // 0 unknown, 1 no, 2 yes
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  if (device < kDevices && known[device].load(std::memory_order_relaxed) != 0) {
    chained = known[device].load(std::memory_order_relaxed) == 2;
    return cudaSuccess;
  }
  const cudaError_t e = chains_launches(zero_counts_kernel<unsigned long long>, chained);
  if (e == cudaSuccess && device < kDevices) known[device].store(chained ? 2 : 1, std::memory_order_relaxed);
  return e;
}

// Enqueues zero_counts_kernel over n counts (a plain launch: it runs after everything
// before it on the stream); the launch's own status.
inline cudaError_t launch_zero_counts(unsigned long long* counts, std::int64_t n, cudaStream_t stream) {
  // One wave covers 2^18 counts (the 128 x 128 tiles of a 65536^2 mask); more loop.
  constexpr std::int64_t kThreads = 256, kMaxBlocks = 1024;
  const std::int64_t blocks = (n + kThreads - 1) / kThreads;
  cudaLaunchConfig_t config{};
  config.blockDim = dim3(static_cast<unsigned>(kThreads));
  config.gridDim = dim3(static_cast<unsigned>(blocks < 1 ? 1 : blocks < kMaxBlocks ? blocks : kMaxBlocks));
  config.stream = stream;
  return cudaLaunchKernelEx(&config, zero_counts_kernel<unsigned long long>, counts, n);
}

// --- torch's BlockMask from the counts ---

inline constexpr int kBlockMaskThreads = 256;
inline constexpr int kBlockMaskWarps = kBlockMaskThreads / 32;
// Blocks an SM holds at once (registers capped to fit): the lines a 32768^2 mask has at
// 128, 512, all in flight at once on an H200's 132 SMs.
inline constexpr int kBlockMaskBlocksPerSM = 4;

// Tiles each thread of a line's block holds at once, at most: a line of up to 256 x 4
// tiles (every k tile of a 131072-key row at 128) is read once, and its states stay in
// registers between the counts and the indices. Shorter lines take fewer (write_line's
// Chunk): 1 to 256 tiles one a thread, as a 32768^2 mask's lines at 128.
inline constexpr int kLineChunk = 4;

// Each warp's count of each state in each chunk of a round: the block's prefix of ranks.
struct LineCounts {
  std::int32_t part[kLineChunk][kBlockMaskWarps];
  std::int32_t full[kLineChunk][kBlockMaskWarps];
};

// One block writes one line of n tiles (a q tile's k tiles, or a k tile's q tiles; tile
// i's state is state(i)): into part_* the partial tiles, into full_* the full ones, each
// as detail::write_ordered writes it — the count, the indices in the state in ascending
// order, then the others in ascending order. Null pointers are skipped; states[i] gets
// each state where states is not null. Every thread of the block calls it with the same
// arguments. A round holds tiles base + c x 256 + thread (c < Chunk), so (c, warp, lane)
// is index order: a tile's rank in its state is the round's tiles of that state before
// its (c, warp) — a prefix over `counts` — plus its lane's in its warp's ballot. Tile i
// not in a state goes after that state's `count` tiles, at count + i - (its tiles before
// i). A line longer than a round is read twice: the counts, then the indices. (A warp per
// line, as before, left an H200 idle: 512 lines at 32768^2, 28 us of latency; a block
// per line has 8 times the threads, each with one load of a 256-tile line in flight.)
template <int Chunk, class StateOf>
__device__ void write_line(std::int64_t n, StateOf state, std::int32_t* part_count, std::int32_t* part_idx,
                           std::int32_t* full_count, std::int32_t* full_idx, TileState* states, LineCounts& counts) {
  static_assert(Chunk >= 1 && Chunk <= kLineChunk);
  constexpr std::int64_t kRound = std::int64_t{kBlockMaskThreads} * Chunk;
  const int thread = static_cast<int>(threadIdx.x), warp = thread / 32;
  const unsigned below = (1u << (thread % 32)) - 1u;
  const auto tile = [&](std::int64_t base, int c) { return base + std::int64_t{c} * kBlockMaskThreads + thread; };
  TileState st[Chunk];
  unsigned part[Chunk], full[Chunk];  // the warp's ballots
  // Reads a round's states and counts them into `counts`; ends at a barrier.
  const auto read_round = [&](std::int64_t base) {
#pragma unroll
    for (int c = 0; c < Chunk; ++c) {
      const std::int64_t i = tile(base, c);
      st[c] = i < n ? state(i) : TileState::empty;
    }
#pragma unroll
    for (int c = 0; c < Chunk; ++c) {
      part[c] = __ballot_sync(0xffffffffu, st[c] == TileState::partial);
      full[c] = __ballot_sync(0xffffffffu, st[c] == TileState::full);
      if (thread % 32 == 0) {
        counts.part[c][warp] = __popc(part[c]);
        counts.full[c][warp] = __popc(full[c]);
      }
    }
    __syncthreads();
  };
  const bool one_round = n <= kRound;
  std::int32_t parts = 0, fulls = 0;  // the line's
  for (std::int64_t base = 0; base < n; base += kRound) {
    read_round(base);
    if (states)
#pragma unroll
      for (int c = 0; c < Chunk; ++c)
        if (tile(base, c) < n) states[tile(base, c)] = st[c];
#pragma unroll
    for (int c = 0; c < Chunk; ++c)
#pragma unroll
      for (int w = 0; w < kBlockMaskWarps; ++w) {
        parts += counts.part[c][w];
        fulls += counts.full[c][w];
      }
    if (!one_round) __syncthreads();  // the next round rewrites the counts (one round keeps them)
  }
  if (thread == 0) {
    if (part_count) *part_count = parts;
    if (full_count) *full_count = fulls;
  }
  if (part_idx != nullptr || full_idx != nullptr) {
    std::int32_t parts_before = 0, fulls_before = 0;  // tiles of each state in the rounds before
    for (std::int64_t base = 0; base < n; base += kRound) {
      if (!one_round) read_round(base);
      std::int32_t part_at[Chunk], full_at[Chunk];  // before (c, this warp) in the round
      std::int32_t p = 0, f = 0;
#pragma unroll
      for (int c = 0; c < Chunk; ++c)
#pragma unroll
        for (int w = 0; w < kBlockMaskWarps; ++w) {
          if (w == warp) {
            part_at[c] = p;
            full_at[c] = f;
          }
          p += counts.part[c][w];
          f += counts.full[c][w];
        }
#pragma unroll
      for (int c = 0; c < Chunk; ++c) {
        const std::int64_t i = tile(base, c);
        if (i >= n) continue;
        const auto index = static_cast<std::int32_t>(i);
        const std::int32_t p_rank = parts_before + part_at[c] + __popc(part[c] & below);
        const std::int32_t f_rank = fulls_before + full_at[c] + __popc(full[c] & below);
        if (part_idx) part_idx[st[c] == TileState::partial ? p_rank : parts + (index - p_rank)] = index;
        if (full_idx) full_idx[st[c] == TileState::full ? f_rank : fulls + (index - f_rank)] = index;
      }
      parts_before += p;
      fulls_before += f;
      __syncthreads();  // the counts are rewritten by the next round or line
    }
  } else {
    __syncthreads();  // the next line rewrites the counts
  }
}

// write_line with as few tiles a thread as hold the line in one round (a line of more
// than 256 x kLineChunk tiles takes kLineChunk a thread, round after round): a line of
// up to 512 tiles then has no chunk wholly past its end (at 32768^2 and 128, four tiles
// a thread had three of its four chunks past every line's 256 tiles).
template <class StateOf>
__device__ void write_line_of(std::int64_t n, StateOf state, std::int32_t* part_count, std::int32_t* part_idx,
                              std::int32_t* full_count, std::int32_t* full_idx, TileState* states,
                              LineCounts& counts) {
  if (n <= kBlockMaskThreads)
    write_line<1>(n, state, part_count, part_idx, full_count, full_idx, states, counts);
  else if (n <= 2 * kBlockMaskThreads)
    write_line<2>(n, state, part_count, part_idx, full_count, full_idx, states, counts);
  else
    write_line<kLineChunk>(n, state, part_count, part_idx, full_count, full_idx, states, counts);
}

// The writer's lines: slices x q_tiles rows of k tiles (the kv side), then slices x
// k_tiles columns of q tiles (the q side). Counted once on the host: TileGrid's counts
// divide, and a source's lines index with them at every tile.
struct TileLines {
  std::int64_t slices = 1, q_tiles = 1, k_tiles = 1;
  static TileLines of(const TileGrid& g) { return {g.slices(), g.q_tiles(), g.k_tiles()}; }
};

// Where the writer takes each tile's state from: the scan's 64-bit counts, states the
// caller has (a host tile summary copied over, say), or an exact structure's ranges. A
// source gives the states of one line at a time — kv_line(slice, q tile) over its k
// tiles, q_line(slice, k tile) over its q tiles — from what it works out once a line.
//
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

// Blocks [0, slices x q_tiles) write the kv side (and the states, if asked), the next
// slices x k_tiles blocks the q side; each takes its tiles' states from `source`.
template <class Source>
__global__ void __launch_bounds__(kBlockMaskThreads, kBlockMaskBlocksPerSM)
    block_mask_kernel(Source source, BlockMaskArrays out, TileState* states) {
  __shared__ LineCounts counts;
  wait_for_previous_kernel();  // chained after the scan: its counts, and every write, after it
  const std::int64_t nq = source.lines.q_tiles, nk = source.lines.k_tiles;
  const std::int64_t kv_lines = source.lines.slices * nq, lines = kv_lines + source.lines.slices * nk;
  for (std::int64_t w = blockIdx.x; w < lines; w += gridDim.x) {
    if (w < kv_lines) {
      const std::int64_t slice = w / nq, qt = w - slice * nq;
      write_line_of(nk, source.kv_line(slice, qt), out.kv_num_blocks ? out.kv_num_blocks + w : nullptr,
                    out.kv_indices ? out.kv_indices + w * nk : nullptr,
                    out.full_kv_num_blocks ? out.full_kv_num_blocks + w : nullptr,
                    out.full_kv_indices ? out.full_kv_indices + w * nk : nullptr, states ? states + w * nk : nullptr,
                    counts);
    } else {
      const std::int64_t column = w - kv_lines, slice = column / nk, kt = column - slice * nk;
      write_line_of(nq, source.q_line(slice, kt), out.q_num_blocks ? out.q_num_blocks + column : nullptr,
                    out.q_indices ? out.q_indices + column * nq : nullptr,
                    out.full_q_num_blocks ? out.full_q_num_blocks + column : nullptr,
                    out.full_q_indices ? out.full_q_indices + column * nq : nullptr, nullptr, counts);
    }
  }
}

// Enqueues the BlockMask writer over `source`'s lines (states_out: where to store the
// states too, [slice][q tile][k tile], or null); chained: launched while the scan kernel
// before it drains (only after a kernel: a copy before it is not waited for). The
// launch's own status.
template <class Source>
cudaError_t launch_block_mask(const Source& source, const BlockMaskArrays& out, TileState* states_out,
                              cudaStream_t stream, bool chained = false) {
  const TileLines& l = source.lines;
  const std::int64_t blocks = l.slices * (l.q_tiles + l.k_tiles);  // a block per line
  // Past this many lines a block takes several in turn (more blocks than an H200 holds
  // at once several times over; a 65536^2 mask has 1024 lines). The CUDA suite's grids
  // reach it, so the loop's reuse of a block's LineCounts is tested.
  constexpr std::int64_t kMaxBlocks = 4096;
  cudaLaunchConfig_t config{};
  config.blockDim = dim3(kBlockMaskThreads);
  config.gridDim = dim3(static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks));
  config.stream = stream;
  cudaLaunchAttribute attribute{};
  chain_launch(config, attribute, chained);
  return cudaLaunchKernelEx(&config, block_mask_kernel<Source>, source, out, states_out);
}

}  // namespace masklens::gpu::detail
