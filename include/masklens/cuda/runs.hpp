// masklens::gpu — runs on the device: the RowSpans of a scan reduced to the SpanRuns of
// span_runs.hpp before they cross to the host, so the copy and the host's classify are
// O(runs), not O(rows) (a causal mask: one run per slice instead of 69632 rows). Declared
// for any C++20 compiler, as scan.hpp: the kernels are in dispatch_runs.cuh, the
// definitions in src/runs.cu (Meson: masklens_cuda_dep), and src/runs_none.cpp answers
// "built without CUDA".
//
// Conventions are scan.hpp's: two-phase temporary storage, the stream last, every CUDA
// call checked and returned as a Status naming it, no synchronisation in reduce_runs()
// and one in the convenience calls, the CUDA "last error" neither read nor cleared.
//
// The composite pass in the caller's memory (what a framework's binding calls, with its
// own allocator and stream): runs_block_for() is the size query (the block's layout,
// runs_block.hpp), scan_runs_into() enqueues the scan, the run reduction and the head's
// one copy into that block, copy_rest_runs() brings the runs past the head where there
// are; the caller synchronises the stream and reads the head (read_runs_head). scan_runs()
// below is that protocol with memory of its own.
#pragma once

#include <cstddef>
#include <cstdint>

#include "../classify_runs.hpp"
#include "../mask_view.hpp"
#include "../row_span.hpp"
#include "../span_runs.hpp"
#include "../status.hpp"
#include "../structure.hpp"
#include "../tile_grid.hpp"
#include "runs_block.hpp"
#include "scan.hpp"

namespace masklens::gpu {

// Loads the run reduction's four kernels (what reduce_runs and scan_runs launch, beside
// the scan's) on the current device now rather than at their first launch: what
// load_scan_kernels() (scan.hpp) does for the scan, with its errors and its cost.
[[nodiscard]] Status load_runs_kernels();

// Reduces `rows` RowSpans at d_rows (device memory, slices of `q_len` rows laid out as
// SpanTable::rows) to their runs, exactly the runs SpanRuns::encode gives for the same
// rows: their number n in *d_run_count and the first min(n, max_runs) in d_runs (device
// memory with room for max_runs runs; `rows` runs are the most there can be, and a
// caller who finds n > max_runs calls again with room for n). Two-phase: with
// d_temp_storage == nullptr only temp_storage_bytes is set (no CUDA call is made); the
// storage may start at any address. Enqueues on `stream` and
// returns; the runs are there once the stream reaches that point. Where
// d_first_invalid_row (device memory, 8-byte aligned, apart from d_run_count and the
// temporary storage) is given, the first row flagged kRowInvalid (an element that is NaN
// or +inf) goes there, -1 where none is: a caller that brings back
// the count alone (or the first runs) still learns of every invalid row. invalid_argument
// for rows < 1 or past 2^31 - 1, q_len < 1, rows not a multiple of q_len, max_runs < 1,
// null pointers (but d_first_invalid_row); misaligned_pointer for pointers off their
// type's alignment.
[[nodiscard]] Status reduce_runs(void* d_temp_storage, std::size_t& temp_storage_bytes, const RowSpan* d_rows,
                                 std::int64_t rows, std::int64_t q_len, SpanRun* d_runs, std::int64_t max_runs,
                                 std::int64_t* d_run_count, std::int64_t* d_first_invalid_row = nullptr,
                                 Stream stream = nullptr);

// The block of a composite run scan of this view (the size query of scan_runs_into(): no
// CUDA call); with `tiles`, of scan_runs_tiles_into(), whose scan counts tiles too and
// needs another temporary. Errors: the view empty or with more than kMaxRunRows span
// rows, a tile size out of range (make_tile_grid's words).
[[nodiscard]] Result<RunsBlock> runs_block_for(const MaskView& device_view);
[[nodiscard]] Result<RunsBlock> runs_block_for(const MaskView& device_view, TileSize tiles);

// Enqueues on `stream` the composite pass of runs_block_for(device_view)'s `block` into
// d_block (device memory of block.bytes, 256-byte aligned: the caller's): the scan into
// the block's spans, the head zeroed (the copy then reads no byte the kernels leave
// unwritten), the run reduction, and the head's one copy to h_head (host memory of
// block.head_bytes(); pinned memory makes the copy asynchronous). No allocation, no
// synchronisation: once the stream has reached that point, read_runs_head(block, h_head)
// gives the count, and the head holds the first min(count, block.eager) runs at
// block.runs_at. Errors, before any CUDA call: a block laid out for another view, d_block
// or h_head null, d_block off 256 bytes.
[[nodiscard]] Status scan_runs_into(const RunsBlock& block, void* d_block, const MaskView& device_view, void* h_head,
                                    Stream stream = nullptr);

// The same with a scan that also counts the tiles of `tiles` in its one read and writes
// torch BlockMask's eight int32 arrays (and, given d_states, one TileState a tile) as
// scan_spans_tiles() (tiles.hpp) does; `block` is runs_block_for(device_view, tiles)'s.
[[nodiscard]] Status scan_runs_tiles_into(const RunsBlock& block, void* d_block, const MaskView& device_view,
                                          TileSize tiles, const BlockMaskArrays& d_block_mask, TileState* d_states,
                                          void* h_head, Stream stream = nullptr);

// After the head said `count` runs, more than block.eager: enqueues the copy of runs
// [eager, count) to h_rest (host memory for count - eager runs). Past the block's room
// the reduction runs again first, from the spans still in the block, into d_more (device
// memory for `count` runs, the caller's; ignored within the room). No synchronisation.
// Errors, before any CUDA call: count outside (eager, rows], d_block or h_rest null,
// d_more null past the room.
[[nodiscard]] Status copy_rest_runs(const RunsBlock& block, void* d_block, std::int64_t count, SpanRun* d_more,
                                    SpanRun* h_rest, Stream stream = nullptr);

// The SpanRuns of a view of device memory, on the host: the protocol above with memory
// of its own (the block from cudaMallocAsync on the stream, the head in host memory):
// the run count with the first 256 runs in one copy (the rest, if any, in a second; past
// 4096 runs it reduces again into room for them all), then frees. It synchronises the
// stream once, twice past 256 runs. A row holding NaN / +inf is
// invalid_value naming the row, as scan() says it.
[[nodiscard]] Result<SpanRuns> scan_runs(const MaskView& device_view, Stream stream = nullptr);

// A view of device memory to its structure: scan_runs() then classify(SpanRuns) on the
// host — the verdict of inspect() (scan.hpp), with O(runs) crossing to the host.
[[nodiscard]] inline Result<MaskStructure> inspect_runs(const MaskView& device_view, Stream stream = nullptr) {
  Result<SpanRuns> runs = scan_runs(device_view, stream);
  if (!runs) return runs.status();
  return classify(*runs);
}

}  // namespace masklens::gpu
