// The run reduction's entry points (runs.hpp) in a build without CUDA: each a clear
// device_error, so a program that offers them compiles and links either way. Meson builds
// this file into masklens_cuda_dep beside scan_none.cpp when nvcc is not found or
// -Dcuda=disabled.
#include <masklens/cuda/runs.hpp>

#include "without_cuda.hpp"

namespace masklens::gpu {

using detail::without_cuda;

Status load_runs_kernels() { return without_cuda(); }

// The size query too: the temporary storage is the kernels' tile arrays, and there are none.
Status reduce_runs(void*, std::size_t&, const RowSpan*, std::int64_t, std::int64_t, SpanRun*, std::int64_t,
                   std::int64_t*, std::int64_t*, Stream) {
  return without_cuda();
}

// The block's size query too: its temporaries are the kernels', and there are none.
Result<RunsBlock> runs_block_for(const MaskView&) { return without_cuda(); }
Result<RunsBlock> runs_block_for(const MaskView&, TileSize) { return without_cuda(); }
Status scan_runs_into(const RunsBlock&, void*, const MaskView&, void*, Stream) { return without_cuda(); }
Status scan_runs_tiles_into(const RunsBlock&, void*, const MaskView&, TileSize, const BlockMaskArrays&, TileState*,
                            void*, Stream) {
  return without_cuda();
}
Status copy_rest_runs(const RunsBlock&, void*, std::int64_t, SpanRun*, SpanRun*, Stream) { return without_cuda(); }

Result<SpanRuns> scan_runs(const MaskView&, Stream) { return without_cuda(); }

}  // namespace masklens::gpu
