// torch BlockMask's writer: its kernel and launch. A block per line of tiles (a q tile's
// k tiles, or a k tile's q tiles; agent_block_mask.cuh) turns the line's states into
// torch's counts and indices, the states taken from a source of tile_state_sources.cuh:
// the tile scan's counts, states the caller has, or a structure's ranges. Launched with
// cudaLaunchKernelEx (its result is the launch's own status: the caller's CUDA "last
// error" is neither read nor cleared). nvcc only; the entry points are declared in
// tiles.hpp and defined in src/tiles.cu.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "../tile_grid.hpp"
#include "agent_block_mask.cuh"
#include "dependent_launch.cuh"
#include "tile_state_sources.cuh"
#include "tuning.cuh"

namespace masklens::gpu::detail {

// Blocks [0, slices x q_tiles) write the kv side (and the states, if asked), the next
// slices x k_tiles blocks the q side; each takes its tiles' states from `source`.
template <class Source>
__global__ void __launch_bounds__(kBlockMaskThreads, kBlockMaskBlocksPerSM)
    block_mask_kernel(Source source, BlockMaskArrays out, TileState* states) {
  __shared__ LineCounts counts;
  wait_for_previous_kernel();  // chained after the scan: its counts, and every write, after it
  const AgentBlockMask<Source> agent(source, out, states, counts);
  for (std::int64_t w = blockIdx.x; w < agent.lines; w += gridDim.x) agent.write(w);
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
  // The CUDA suite's grids pass kBlockMaskMaxGrid, so the loop's reuse of a block's
  // LineCounts is tested.
  cudaLaunchConfig_t config{};
  config.blockDim = dim3(kBlockMaskThreads);
  config.gridDim = dim3(static_cast<unsigned>(blocks < kBlockMaskMaxGrid ? blocks : kBlockMaskMaxGrid));
  config.stream = stream;
  cudaLaunchAttribute attribute{};
  chain_launch(config, attribute, chained);
  return cudaLaunchKernelEx(&config, block_mask_kernel<Source>, source, out, states_out);
}

}  // namespace masklens::gpu::detail
