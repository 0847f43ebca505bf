// Tile summaries on the device, in the pass that scans the row spans: its kernels and
// their launches. nvcc only; the entry points are declared in tiles.hpp and defined in
// src/tiles.cu. Three kernels, the last two chained to the one before where the device
// allows (dependent_launch.cuh):
//   1. the 64-bit count of every tile zeroed (temporary storage);
//   2. the scan: as many blocks as the device holds at once (resident_blocks.cuh), each
//      taking its ranges of units of rows (tile_plan.hpp) with agent_tile_scan.cuh's
//      agent: a warp per row, the row's span stored, its attending keys counted into the
//      block's per-k-tile counters and flushed into the counts once per q tile;
//   3. torch's BlockMask from the counts (dispatch_block_mask.cuh).
// Launch shapes are tuning.cuh's. Launched with cudaLaunchKernelEx (its result is the
// launch's own status: the caller's CUDA "last error" is neither read nor cleared).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "../mask_view.hpp"
#include "../tile_grid.hpp"
#include "agent_scan.cuh"
#include "agent_tile_scan.cuh"
#include "dependent_launch.cuh"
#include "device_policy.cuh"
#include "dispatch_block_mask.cuh"
#include "resident_blocks.cuh"
#include "tile_plan.hpp"
#include "tuning.cuh"

namespace masklens::gpu::detail {

// A block may take 48 KiB of dynamic shared memory without opting in: the counters'
// budget and the rings stay within it (launch_tile_plan). The kernel's static shared
// memory, CUB's WarpReduce storage, is empty (a reduction by shuffles): static shared
// memory added to it would take from the same 48 KiB, and the widest plans would then
// fail to launch (an error, not a wrong result).
inline constexpr std::size_t kDefaultDynamicShared = 48 * 1024;

// The scan: a block's share of the units (AgentTileScan), counters in shared memory
// (Shared) or adds straight into the counts.
template <class Policy, int Esize, bool Shared>
__global__ void __launch_bounds__(Policy::kBlockThreads, Policy::kMinBlocksPerSM)
    scan_tiles_warp_kernel(ScanParams s, TileScanPlan plan, RowSpan* rows, unsigned long long* counts) {
  using Agent = AgentTileScan<Policy, Esize, Shared>;
  __shared__ typename Agent::TempStorage temp;
  // The counters (plan.shared_bytes), then each warp's ring of staged batches.
  extern __shared__ __align__(16) unsigned shared_counts[];
  Agent(s, plan, temp, shared_counts).consume_ranges(rows, counts);
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

// The scan with the policy of `arch` for this element size.
template <int Esize>
cudaError_t launch_tiles_for_arch(int arch, const ScanParams& s, const TileGrid& g, RowSpan* rows,
                                  unsigned long long* counts, cudaStream_t stream, bool chained) {
  return with_tuned_policy<TileScanTuning, Esize>(arch, [&](auto policy) {
    return launch_tiles_with<typename decltype(policy)::type, Esize>(s, g, rows, counts, stream, chained);
  });
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
__global__ void __launch_bounds__(kZeroCountsThreads) zero_counts_kernel(Count* counts, std::int64_t n) {
  launch_dependents();
  const std::int64_t stride = std::int64_t{gridDim.x} * blockDim.x;
  for (std::int64_t i = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) counts[i] = 0;
}

// Whether the tile pass chains its kernels on the current device (chains_launches over
// the kernels of this header, compiled together), asked once per device.
inline cudaError_t tile_pass_chains(bool& chained) {
  return chains_launches_on_current_device<zero_counts_kernel<unsigned long long>>(chained);
}

// Enqueues zero_counts_kernel over n counts (a plain launch: it runs after everything
// before it on the stream); the launch's own status.
inline cudaError_t launch_zero_counts(unsigned long long* counts, std::int64_t n, cudaStream_t stream) {
  const std::int64_t blocks = (n + kZeroCountsThreads - 1) / kZeroCountsThreads;
  cudaLaunchConfig_t config{};
  config.blockDim = dim3(static_cast<unsigned>(kZeroCountsThreads));
  config.gridDim =
      dim3(static_cast<unsigned>(blocks < 1 ? 1 : blocks < kZeroCountsMaxGrid ? blocks : kZeroCountsMaxGrid));
  config.stream = stream;
  return cudaLaunchKernelEx(&config, zero_counts_kernel<unsigned long long>, counts, n);
}

}  // namespace masklens::gpu::detail
