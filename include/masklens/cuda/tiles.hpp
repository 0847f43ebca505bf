// masklens::gpu — tile summaries on the device: the row spans of a mask and its tiles
// (empty, partial or full, per distinct slice, q tile and k tile; tiles.hpp on the host)
// from one read of the mask, and torch's BlockMask tensors written from them into the
// caller's device arrays (torch tensors' memory, say) without a trip to the host.
// Declared for any C++20 compiler, as scan.hpp: the kernels are in dispatch_tiles.cuh
// and dispatch_block_mask.cuh, the definitions in src/tiles.cu (Meson:
// masklens_cuda_dep), and src/tiles_none.cpp answers "built without CUDA".
//
// Conventions are scan.hpp's: two-phase temporary storage, the stream last, every CUDA
// call checked and returned as a Status naming it, no allocation and no synchronisation
// in scan_spans_tiles() and one synchronisation in the convenience calls, the CUDA "last
// error" neither read nor cleared. Slices a stride-0 batch or head dimension broadcasts
// are read and summarised once (the grid's distinct_batch / distinct_heads are 1), as
// torch's BlockMask broadcasts a batch or head dimension of 1.
#pragma once

#include <cstddef>
#include <cstdint>

#include "../mask_view.hpp"
#include "../row_span.hpp"
#include "../span_table.hpp"
#include "../status.hpp"
#include "../tile_grid.hpp"
#include "../tiles.hpp"
#include "scan.hpp"
#include "tile_plan.hpp"

namespace masklens::gpu {

// Loads the tile kernels (the tile scan for every element size, with its counters in
// shared memory and in the 64-bit counts, under the tuning policy the current device's
// architecture takes; the BlockMask writer from the scan's counts and from states given)
// on the current device now rather than at their first launch: what
// load_scan_kernels() (scan.hpp) does for the scan, with its errors and its cost.
[[nodiscard]] Status load_tile_kernels();

// Scans a view of device memory into its RowSpans (d_rows: span_rows(view) of them,
// laid out as SpanTable::rows, exactly what scan_spans() writes) and, in the same read,
// counts the attending elements of every tile of `size` (temporary storage), then
// writes from the counts:
//   d_block_mask  torch BlockMask's eight int32 arrays (tile_grid.hpp), in device
//                 memory, each contiguous over [distinct slice][...] as BlockMaskTensors
//                 holds them: kv_num_blocks and full_kv_num_blocks slices x q_tiles,
//                 kv_indices and full_kv_indices slices x q_tiles x k_tiles, the q side
//                 slices x k_tiles and slices x k_tiles x q_tiles (the grid is
//                 tile_grid_for(view, size)). Entry for entry what block_mask_tensors()
//                 gives on the host for the same mask; a null pointer is skipped (a
//                 forward pass needs only the kv side).
//   d_states      optional: one TileState per tile, [slice][q tile][k tile] (TileSummary::states).
// Two-phase: with d_temp_storage == nullptr only temp_storage_bytes is set (one 64-bit
// count per tile; no CUDA call is made); the storage may start at any address.
// Enqueues a memset, the scan and the writer on `stream` and returns; everything is
// there once the stream reaches that point. A row holding NaN / +inf carries
// kRowInvalid in its span (such elements attend nowhere in the tiles): the caller
// rejects it, as after scan_spans(). Errors, before any CUDA call: the view empty, a tile
// size out of range or with more than 2^31 - 1 tiles a side (make_tile_grid),
// temp_storage_bytes short of the size query's, d_rows null, no tile output at all (every
// d_block_mask pointer and d_states null), a pointer off its type's alignment.
[[nodiscard]] Status scan_spans_tiles(void* d_temp_storage, std::size_t& temp_storage_bytes,
                                      const MaskView& device_view, TileSize size, RowSpan* d_rows,
                                      const BlockMaskArrays& d_block_mask, TileState* d_states = nullptr,
                                      Stream stream = nullptr);

// torch BlockMask's eight int32 arrays (laid out as scan_spans_tiles() writes them; a
// null pointer is skipped) written on the device from tile states the caller has there:
// d_states holds grid.tiles() TileStates, [slice][q tile][k tile], as TileSummary::states
// (tiles_from_structure() gives an exact structure's without reading a mask: copy them
// over and the BlockMask needs no host writer). `grid` as make_tile_grid() makes it.
// Enqueues one kernel on `stream`: no allocation, no synchronisation. Errors, before any
// CUDA call: the grid invalid (make_tile_grid's words), d_states null, every array
// null, an array off int32 alignment.
[[nodiscard]] Status write_block_mask(const TileGrid& grid, const TileState* d_states,
                                      const BlockMaskArrays& d_block_mask, Stream stream = nullptr);

// The same arrays of an exact structure from its tile ranges on the device: d_ranges
// holds grid.slices() x grid.q_tiles() TileRowRanges, [slice][q tile], as
// structure_tile_ranges() gives them (its grid is `grid`): 32 bytes a q tile cross to
// the device instead of a byte a tile, and no states are filled on the host. Ranges
// outside [0, k_tiles] give wrong arrays, never a write outside them. Enqueues one kernel;
// errors as write_block_mask()'s (d_ranges null or off 8-byte alignment too).
[[nodiscard]] Status write_block_mask_from_ranges(const TileGrid& grid, const TileRowRanges* d_ranges,
                                                  const BlockMaskArrays& d_block_mask, Stream stream = nullptr);

// A mask's spans, tiles and BlockMask tensors, on the host, from one device pass.
struct TileScan {
  SpanTable spans;              // scan()'s, row for row
  TileSummary tiles;            // scan_with_tiles()'s on the host, tile for tile
  BlockMaskTensors block_mask;  // block_mask_tensors(tiles)'s, entry for entry
};

// The spans, tiles and BlockMask tensors of a view of device memory: allocates on the
// stream (cudaMallocAsync), runs scan_spans_tiles(), copies everything to the host,
// frees, synchronises the stream once. A row holding NaN / +inf is invalid_value naming
// the row, as scan() says it.
[[nodiscard]] Result<TileScan> scan_with_tiles(const MaskView& device_view, TileSize size = {},
                                               Stream stream = nullptr);

// The same for a mask in host memory: copies the bytes the view spans to the device,
// `offset_bytes` past a 256-byte boundary (a multiple of the element size below 256: the
// tests place rows at every alignment), then as scan_with_tiles(). A NaN / +inf is
// invalid_value naming the element, as the host scanner says it.
[[nodiscard]] Result<TileScan> scan_host_mask_with_tiles(const MaskView& host_view, TileSize size = {},
                                                         std::int64_t offset_bytes = 0, Stream stream = nullptr);

}  // namespace masklens::gpu
