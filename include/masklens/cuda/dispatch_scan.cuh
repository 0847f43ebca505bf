// The device scanner's dispatch layer: the tuning policy for a view's element size and
// the device's architecture (tuning.cuh, picked by device_policy.cuh), the kernel that
// fits its rows (a block per long row, a warp per short one), and the launch on the
// caller's stream. The kernels reduce the agents' per-thread accumulators
// (agent_scan.cuh) with CUB and store one result per row. nvcc only; the entry points
// that call this are in src/scan.cu and declared for any compiler in scan.hpp.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include <cub/block/block_reduce.cuh>
#include <cub/warp/warp_reduce.cuh>

#include "../mask_view.hpp"
#include "accumulators.cuh"
#include "agent_scan.cuh"
#include "device_policy.cuh"
#include "scan.hpp"
#include "tuning.cuh"

namespace masklens::gpu::detail {

// A block per row: long rows. Rows beyond the grid loop.
template <class Policy, int Esize, RowAccumulator Accumulator>
__global__ void __launch_bounds__(Policy::kBlockThreads)
    scan_rows_block_kernel(ScanParams s, typename Accumulator::Output* out) {
  using Reduce = cub::BlockReduce<Accumulator, Policy::kBlockThreads>;
  __shared__ typename Reduce::TempStorage temp;
  const AgentScanRow<Policy, Esize, Accumulator, Policy::kBlockThreads> agent(s);
  for (std::int64_t r = blockIdx.x; r < s.rows; r += gridDim.x) {
    const Accumulator mine = agent.scan(r, static_cast<int>(threadIdx.x));
    const Accumulator row = Reduce(temp).Reduce(mine, MergeAccumulators<Accumulator>{});
    if (threadIdx.x == 0) row.store(out, r);
    __syncthreads();  // temp is reused by the next row
  }
}

// A warp per row: short rows, Policy::kWarpRowsPerBlock rows per block.
template <class Policy, int Esize, RowAccumulator Accumulator>
__global__ void __launch_bounds__(Policy::kBlockThreads)
    scan_rows_warp_kernel(ScanParams s, typename Accumulator::Output* out) {
  using Reduce = cub::WarpReduce<Accumulator>;
  constexpr int kRowsPerBlock = Policy::kWarpRowsPerBlock;
  __shared__ typename Reduce::TempStorage temp[kRowsPerBlock];
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  const AgentScanRow<Policy, Esize, Accumulator, 32> agent(s);
  for (std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * kRowsPerBlock + warp; r < s.rows;
       r += static_cast<std::int64_t>(gridDim.x) * kRowsPerBlock) {
    const Accumulator mine = agent.scan(r, lane);
    const Accumulator row = Reduce(temp[warp]).Reduce(mine, MergeAccumulators<Accumulator>{});
    if (lane == 0) row.store(out, r);
    __syncwarp();
  }
}

// Launches one kernel with Policy: a block per row from Policy::kLongRowBytes, a warp
// per shorter row.
template <class Policy, int Esize, class Accumulator>
cudaError_t launch_with(const ScanParams& s, typename Accumulator::Output* out, cudaStream_t stream) {
  cudaLaunchConfig_t config{};
  config.blockDim = dim3(Policy::kBlockThreads);
  config.stream = stream;
  const auto grid = [](std::int64_t blocks) {
    return dim3(static_cast<unsigned>(blocks < Policy::kMaxGrid ? blocks : Policy::kMaxGrid));
  };
  if (s.k_len * Esize >= Policy::kLongRowBytes) {
    config.gridDim = grid(s.rows);
    return cudaLaunchKernelEx(&config, scan_rows_block_kernel<Policy, Esize, Accumulator>, s, out);
  }
  config.gridDim = grid((s.rows + Policy::kWarpRowsPerBlock - 1) / Policy::kWarpRowsPerBlock);
  return cudaLaunchKernelEx(&config, scan_rows_warp_kernel<Policy, Esize, Accumulator>, s, out);
}

// The policy of `arch` for this element size.
template <int Esize, class Accumulator>
cudaError_t launch_for_arch(int arch, const ScanParams& s, typename Accumulator::Output* out, cudaStream_t stream) {
  return with_tuned_policy<ScanTuning, Esize>(arch, [&](auto policy) {
    return launch_with<typename decltype(policy)::type, Esize, Accumulator>(s, out, stream);
  });
}

// Enqueues the scan of `view` (device memory, validated by MaskView::make) into `out`
// (one Accumulator::Output per row of span_rows(view)) on `stream`, and returns the
// launch's own status. cudaLaunchKernelEx returns it directly, so the caller's "last
// error" is neither read (a stale error of theirs is not taken for ours, as
// cudaPeekAtLastError after <<<>>> would) nor cleared (as cudaGetLastError would).
template <RowAccumulator Accumulator>
cudaError_t dispatch_scan(const MaskView& view, typename Accumulator::Output* out, cudaStream_t stream) {
  int arch = 0;
  if (const cudaError_t e = current_arch(arch); e != cudaSuccess) return e;
  const ScanParams s = scan_params(view);
  switch (element_size(view.dtype())) {
    case 1: return launch_for_arch<1, Accumulator>(arch, s, out, stream);
    case 2: return launch_for_arch<2, Accumulator>(arch, s, out, stream);
    default: return launch_for_arch<4, Accumulator>(arch, s, out, stream);
  }
}

}  // namespace masklens::gpu::detail
