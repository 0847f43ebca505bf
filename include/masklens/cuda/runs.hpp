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
#pragma once

#include <cstddef>
#include <cstdint>

#include "../classify_runs.hpp"
#include "../mask_view.hpp"
#include "../row_span.hpp"
#include "../span_runs.hpp"
#include "../status.hpp"
#include "../structure.hpp"
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

// The SpanRuns of a view of device memory, on the host: allocates on the stream
// (cudaMallocAsync: the spans and room for 4096 runs), scans (scan_spans), reduces,
// copies back the run count with the first 256 runs in one copy (the rest, if any, in a
// second; past 4096 runs it reduces again into room for them all), frees. It
// synchronises the stream once, twice past 256 runs. A row holding NaN / +inf is
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
