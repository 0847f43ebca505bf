// Tile summaries on the device (tiles.hpp) in a build without CUDA: each call a clear
// device_error, so a program that offers them compiles and links either way. The size
// query answers as the CUDA build does (it is host arithmetic: one 64-bit count per
// tile), after the same checks. Meson builds this file into masklens_cuda_dep beside
// scan_none.cpp and runs_none.cpp when nvcc is not found or -Dcuda=disabled.
#include <string>

#include <masklens/cuda/tiles.hpp>

#include "without_cuda.hpp"

namespace masklens::gpu {

using detail::without_cuda;

Status load_tile_kernels() { return without_cuda(); }

Status scan_spans_tiles(void* d_temp_storage, std::size_t& temp_storage_bytes, const MaskView& device_view,
                        TileSize size, RowSpan*, const BlockMaskArrays&, TileState*, Stream) {
  if (d_temp_storage != nullptr) return without_cuda();
  if (device_view.data() == nullptr) return error(ErrorCode::invalid_argument, "view is empty (data is null)");
  Result<TileGrid> grid = tile_grid_for(device_view, size);
  if (!grid) return grid.status();
  const std::size_t needed = detail::tile_scan_temp_bytes(*grid);
  if (needed == 0)
    return error(ErrorCode::out_of_memory, "the counts of " + std::to_string(grid->tiles()) + " tiles do not fit in memory");
  temp_storage_bytes = needed;
  return {};
}

Status write_block_mask(const TileGrid&, const TileState*, const BlockMaskArrays&, Stream) { return without_cuda(); }

Status write_block_mask_from_ranges(const TileGrid&, const TileRowRanges*, const BlockMaskArrays&, Stream) {
  return without_cuda();
}

Result<TileScan> scan_with_tiles(const MaskView&, TileSize, Stream) { return without_cuda(); }

Result<TileScan> scan_host_mask_with_tiles(const MaskView&, TileSize, std::int64_t, Stream) { return without_cuda(); }

}  // namespace masklens::gpu
