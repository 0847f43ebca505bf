// The run reduction's dispatch layer, its kernels and their launch: RowSpans in device
// memory -> the SpanRuns of span_runs.hpp (the same runs SpanRuns::encode gives on the
// host), so that only the runs cross to the host. nvcc only; the entry points are
// declared in runs.hpp and defined in src/runs.cu.
//
// Every row's run position is a prefix composition of the rows' transitions
// (detail::RunStep, associative); a head starts a run. Rows are cut into tiles of
// kRunsThreads x kRunsRowsPerThread (tuning.cuh), each thread taking consecutive rows
// (the per-thread work is agent_runs.hpp's, which a host test replays):
//   1. tile summaries: each tile's composed transition and, for each position the tile
//      may start in, how many heads it holds (CUB BlockScan / BlockReduce);
//   2. one block walks the tiles in order: the position each tile starts in, where its
//      runs go, and the run count;
//   3. each tile again, now knowing its starting position: every head writes its run;
//   4. each run's length, from the next run's first row.
// Passes 1 and 2 also find the first row flagged kRowInvalid (a NaN / +inf element), so
// that a caller that brings back no run (or only the first) still learns of it.
// Launched with cudaLaunchKernelEx, whose result is the launch's own status: no CUDA
// "last error" is read or cleared (CUB's device-wide algorithms peek at it, which would
// take a caller's pending error for ours; scan.hpp's contract forbids that).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "../row_span.hpp"
#include "../span_runs.hpp"
#include "agent_runs.hpp"
#include "temp_storage.hpp"
#include "tuning.cuh"

namespace masklens::gpu::detail {

struct ThenStep {
  __device__ __forceinline__ RunStep operator()(const RunStep& a, const RunStep& b) const { return RunStep::then(a, b); }
};
struct AddHeadCounts {
  __device__ __forceinline__ HeadCounts operator()(const HeadCounts& a, const HeadCounts& b) const { return add(a, b); }
};
struct MaxRank {
  __device__ __forceinline__ std::int64_t operator()(std::int64_t a, std::int64_t b) const { return a > b ? a : b; }
};

// Where the per-tile arrays live in the caller's temporary storage.
struct RunsTemp {
  RunStep* tile_step;         // [tiles] each tile's composed transition
  HeadCounts* tile_heads;     // [tiles] its heads per position of the row before it
  std::uint8_t* tile_start;   // [tiles] the position of the row before it
  std::int64_t* tile_offset;  // [tiles] the index of its first run
  std::int64_t* tile_invalid; // [tiles] its largest invalid_rank (0: no invalid row)
  std::int64_t* next_row;     // [1] the first row of run max_runs, where the last stored run ends
};

// Bytes of temporary storage for `rows` rows (every part whole 256-byte blocks, the last
// one too), and the layout over `base` (a 256-byte boundary; null: sizes only).
inline std::size_t runs_temp_layout(std::int64_t rows, void* base, RunsTemp* out) noexcept {
  const auto tiles = static_cast<std::size_t>(runs_tiles(rows));
  StorageLayout layout;
  const std::size_t step_at = layout.add(tiles * sizeof(RunStep));
  const std::size_t heads_at = layout.add(tiles * sizeof(HeadCounts));
  const std::size_t start_at = layout.add(tiles);
  const std::size_t offset_at = layout.add(tiles * sizeof(std::int64_t));
  const std::size_t invalid_at = layout.add(tiles * sizeof(std::int64_t));
  const std::size_t next_row_at = layout.add(sizeof(std::int64_t));
  if (base && out) {
    auto* p = static_cast<std::uint8_t*>(base);
    out->tile_step = reinterpret_cast<RunStep*>(p + step_at);
    out->tile_heads = reinterpret_cast<HeadCounts*>(p + heads_at);
    out->tile_start = p + start_at;
    out->tile_offset = reinterpret_cast<std::int64_t*>(p + offset_at);
    out->tile_invalid = reinterpret_cast<std::int64_t*>(p + invalid_at);
    out->next_row = reinterpret_cast<std::int64_t*>(p + next_row_at);
  }
  return align_up(layout.bytes());
}

// 1. Tile summaries: the tile's transition and its heads per position of the row before it.
__global__ void __launch_bounds__(kRunsThreads) runs_tile_summary(const RowSpan* rows, std::int64_t n_rows,
                                                                   std::int64_t q_len, RunsTemp temp) {
  using Scan = cub::BlockScan<RunStep, kRunsThreads>;
  using Reduce = cub::BlockReduce<HeadCounts, kRunsThreads>;
  using RankReduce = cub::BlockReduce<std::int64_t, kRunsThreads>;
  __shared__ typename Scan::TempStorage scan;
  __shared__ typename Reduce::TempStorage reduce;
  __shared__ typename RankReduce::TempStorage rank_reduce;
  const ThreadRows mine = thread_rows(rows, n_rows, q_len, blockIdx.x, static_cast<int>(threadIdx.x));
  RunStep before = identity_step(), tile = identity_step();
  Scan(scan).ExclusiveScan(mine.all, before, identity_step(), ThenStep{}, tile);
  const HeadCounts total = Reduce(reduce).Reduce(heads_per_start(mine, before), AddHeadCounts{});
  const std::int64_t rank = RankReduce(rank_reduce).Reduce(invalid_rank(mine, rows, n_rows), MaxRank{});
  if (threadIdx.x == 0) {
    temp.tile_step[blockIdx.x] = tile;
    temp.tile_heads[blockIdx.x] = total;
    temp.tile_invalid[blockIdx.x] = rank;
  }
}

// 2. One block over the tiles, in order: where each starts and where its runs go; the
// first invalid row (-1: none) into *d_first_invalid_row where it is given.
__global__ void __launch_bounds__(kRunsThreads) runs_tile_prefix(std::int64_t n_rows, std::int64_t tiles, RunsTemp temp,
                                                                 std::int64_t* d_run_count,
                                                                 std::int64_t* d_first_invalid_row) {
  using StepScan = cub::BlockScan<RunStep, kRunsThreads>;
  using CountScan = cub::BlockScan<std::int64_t, kRunsThreads>;
  using RankReduce = cub::BlockReduce<std::int64_t, kRunsThreads>;
  __shared__ typename StepScan::TempStorage step_scan;
  __shared__ typename CountScan::TempStorage count_scan;
  __shared__ typename RankReduce::TempStorage rank_reduce;
  RunStep carried = identity_step();  // every tile before this pass, composed
  std::int64_t runs_before = 0, rank = 0;  // rank: this thread's tiles' largest
  for (std::int64_t base = 0; base < tiles; base += kRunsThreads) {
    const std::int64_t t = base + threadIdx.x;
    const RunStep mine = t < tiles ? temp.tile_step[t] : identity_step();
    RunStep before = identity_step(), all = identity_step();
    StepScan(step_scan).ExclusiveScan(mine, before, identity_step(), ThenStep{}, all);
    // Row 0 maps every position to a head: the composition from row 0 is a constant.
    const std::uint8_t start = RunStep::then(carried, before).apply(kRunHead);
    const std::int64_t heads = t < tiles ? temp.tile_heads[t].n[start] : 0;
    std::int64_t offset = 0, sum = 0;
    CountScan(count_scan).ExclusiveSum(heads, offset, sum);
    if (t < tiles) {
      temp.tile_start[t] = start;
      temp.tile_offset[t] = runs_before + offset;
      rank = rank > temp.tile_invalid[t] ? rank : temp.tile_invalid[t];
    }
    carried = RunStep::then(carried, all);
    runs_before += sum;
    __syncthreads();  // the scans' storage is reused by the next pass
  }
  rank = RankReduce(rank_reduce).Reduce(rank, MaxRank{});
  if (threadIdx.x == 0) {
    *d_run_count = runs_before;
    if (d_first_invalid_row != nullptr) *d_first_invalid_row = first_invalid_row(rank, n_rows);
  }
}

// 3. Every head writes its run (those past max_runs are counted, not stored).
__global__ void __launch_bounds__(kRunsThreads) runs_write(const RowSpan* rows, std::int64_t n_rows, std::int64_t q_len,
                                                           RunsTemp temp, SpanRun* d_runs, std::int64_t max_runs) {
  using Scan = cub::BlockScan<RunStep, kRunsThreads>;
  using CountScan = cub::BlockScan<std::int64_t, kRunsThreads>;
  __shared__ typename Scan::TempStorage scan;
  __shared__ typename CountScan::TempStorage count_scan;
  const ThreadRows mine = thread_rows(rows, n_rows, q_len, blockIdx.x, static_cast<int>(threadIdx.x));
  RunStep before = identity_step();
  Scan(scan).ExclusiveScan(mine.all, before, identity_step(), ThenStep{});
  const std::uint8_t start = before.apply(temp.tile_start[blockIdx.x]);
  std::int64_t at = 0;
  CountScan(count_scan).ExclusiveSum(heads_from(mine, start), at);
  write_runs(mine, start, rows, n_rows, q_len, d_runs, max_runs, temp.next_row, temp.tile_offset[blockIdx.x] + at);
}

// 4. Lengths: each stored run ends where the next begins.
__global__ void __launch_bounds__(kRunsThreads) runs_lengths(std::int64_t n_rows, const std::int64_t* d_run_count,
                                                             SpanRun* d_runs, std::int64_t max_runs,
                                                             const std::int64_t* next_row) {
  const std::int64_t n = *d_run_count, stored = n < max_runs ? n : max_runs;
  for (std::int64_t k = static_cast<std::int64_t>(blockIdx.x) * kRunsThreads + threadIdx.x; k < stored;
       k += static_cast<std::int64_t>(gridDim.x) * kRunsThreads)
    set_length(d_runs, k, n, n_rows, max_runs, next_row);
}

// Enqueues the four kernels on `stream`; the first failing launch's status, or success.
// d_first_invalid_row may be null.
// Preconditions (checked by the entry point): 1 <= n_rows < 2^31, q_len >= 1, n_rows a
// multiple of q_len, temp laid out by runs_temp_layout for n_rows, d_runs with room for
// max_runs >= 1 runs.
inline cudaError_t launch_reduce_runs(const RowSpan* d_rows, std::int64_t n_rows, std::int64_t q_len, RunsTemp temp,
                                      SpanRun* d_runs, std::int64_t max_runs, std::int64_t* d_run_count,
                                      std::int64_t* d_first_invalid_row, cudaStream_t stream) {
  const std::int64_t tiles = runs_tiles(n_rows);
  cudaLaunchConfig_t config{};
  config.blockDim = dim3(kRunsThreads);
  config.stream = stream;
  config.gridDim = dim3(static_cast<unsigned>(tiles));
  if (cudaError_t e = cudaLaunchKernelEx(&config, runs_tile_summary, d_rows, n_rows, q_len, temp); e != cudaSuccess)
    return e;
  config.gridDim = dim3(1);
  if (cudaError_t e = cudaLaunchKernelEx(&config, runs_tile_prefix, n_rows, tiles, temp, d_run_count,
                                         d_first_invalid_row);
      e != cudaSuccess)
    return e;
  config.gridDim = dim3(static_cast<unsigned>(tiles));
  if (cudaError_t e = cudaLaunchKernelEx(&config, runs_write, d_rows, n_rows, q_len, temp, d_runs, max_runs);
      e != cudaSuccess)
    return e;
  // Up to min(n_rows, max_runs) runs: blocks past the count return at once.
  const std::int64_t most = n_rows < max_runs ? n_rows : max_runs;
  const std::int64_t blocks = (most + kRunsThreads - 1) / kRunsThreads;
  config.gridDim = dim3(static_cast<unsigned>(blocks < kRunsMaxGrid ? blocks : kRunsMaxGrid));
  return cudaLaunchKernelEx(&config, runs_lengths, n_rows, static_cast<const std::int64_t*>(d_run_count), d_runs,
                            max_runs, static_cast<const std::int64_t*>(temp.next_row));
}

}  // namespace masklens::gpu::detail
