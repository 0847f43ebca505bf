// masklens::gpu — the device scanner's entry points, declared for any C++20 compiler:
// a g++ or clang translation unit (a framework's C++, a Python binding) includes this
// header and needs neither nvcc nor the CUDA headers. The kernels are in scan.cuh (and
// the layers it includes); the definitions are compiled once, with nvcc, from
// src/scan.cu (Meson: masklens_cuda_dep).
// Where no CUDA is built, src/scan_none.cpp defines the same functions and each returns
// device_error "masklens was built without CUDA", so callers compile either way.
//
// CUB conventions: two-phase temporary storage, the stream last, every CUDA call
// checked and returned as a Status naming the call. scan_spans() and scan_to_host()
// allocate nothing and never synchronise; the convenience calls (scan, scan_host_mask,
// inspect) allocate on the stream and synchronise it once.
// None reads or clears the CUDA "last error", which belongs to the caller.
#pragma once

#include <cstddef>
#include <cstdint>

#include "../classify.hpp"
#include "../mask_view.hpp"
#include "../row_span.hpp"
#include "../span_table.hpp"
#include "../status.hpp"
#include "../structure.hpp"
#include "temp_storage.hpp"

// cudaStream_t is `CUstream_st*` (driver_types.h). Declaring the struct lets this header
// name a stream without cuda_runtime.h, and a caller's cudaStream_t passes unchanged.
struct CUstream_st;

namespace masklens::gpu {

using Stream = CUstream_st*;  // nullptr: the legacy default stream

// False in a build without CUDA (src/scan_none.cpp), where every call below returns
// device_error.
[[nodiscard]] bool built_with_cuda() noexcept;

// How many CUDA devices this process sees; device_error naming cudaGetDeviceCount when
// none can be used (no driver, no device) or when built without CUDA.
[[nodiscard]] Result<int> device_count();

// Loads the scan's kernels (what scan_spans and the calls over it launch: every element
// size, the tuning policy the current device's architecture takes, a block and a warp
// per row) on the current device now rather than at their first launch, where CUDA's
// lazy loading (the default) would add its cost to the first scan of the process.
// gpu::load_kernels() (load_kernels.hpp) loads these and every other entry point's. The
// first failure as device_error naming the kernel ("cudaFuncGetAttributes(...): ...");
// calling it again is cheap. It creates the device's primary context if there is none.
[[nodiscard]] Status load_scan_kernels();

// RowSpans the output must hold for `view`: one per row of each distinct slice, laid
// out as SpanTable::rows (stride-0 batch / head dimensions are scanned once).
[[nodiscard]] inline std::int64_t span_rows(const MaskView& view) noexcept {
  const std::int64_t slices = (view.stride(kBatch) == 0 ? 1 : view.batch()) *
                              (view.stride(kHeads) == 0 ? 1 : view.heads());
  return slices * view.q_len();
}

// Scans a view of device memory into d_rows (span_rows(view) RowSpans, device memory)
// on `stream`. Two-phase: with d_temp_storage == nullptr only temp_storage_bytes is
// set (no CUDA call is made). No temporary storage is needed today; the call asks for
// 1 byte (CUB's habit) so that a null pointer always means "size query". Enqueues the
// kernel and returns: the spans are in d_rows once the stream reaches that point. A row
// holding NaN / +inf carries kRowInvalid (row_span.hpp), for the caller to reject.
[[nodiscard]] Status scan_spans(void* d_temp_storage, std::size_t& temp_storage_bytes, const MaskView& device_view,
                                RowSpan* d_rows, Stream stream = nullptr);

namespace detail {

// The device spans' bytes inside scan_to_host()'s temporary storage, rounded up to 256
// so that the scan's own temporary storage after them starts aligned as cudaMalloc's.
[[nodiscard]] inline std::size_t device_span_bytes(const MaskView& view) noexcept {
  return align_up(static_cast<std::size_t>(span_rows(view)) * sizeof(RowSpan));
}

// scan_spans()'s temporary storage: it uses none, and asks for one byte so that a null
// pointer always means "size query".
inline constexpr std::size_t kScanSpansTempBytes = 1;

}  // namespace detail

// The device step of a guard before an attention call, with every byte of memory from
// the caller: scans a view of device memory into spans held in d_temp_storage, then
// copies them into h_rows (span_rows(view) RowSpans of host memory: a
// SpanTable::for_view(view).rows.data(); pinned memory keeps the copy asynchronous).
// Two-phase: with d_temp_storage == nullptr only temp_storage_bytes is set (the spans'
// bytes and scan_spans()'s, which depend on the view; no CUDA call is made). Enqueues
// the scan and the copy on `stream` and returns without synchronising: h_rows holds the
// spans once the stream reaches that point (then classify(), after rejecting a row with
// kRowInvalid). d_temp_storage must be aligned to a RowSpan (8 bytes; any allocator's
// blocks are).
[[nodiscard]] Status scan_to_host(void* d_temp_storage, std::size_t& temp_storage_bytes, const MaskView& device_view,
                                  RowSpan* h_rows, Stream stream = nullptr);

// The SpanTable of a view of device memory, on the host: allocates scan_to_host()'s
// temporary storage on the stream (cudaMallocAsync), runs it, frees, synchronises the
// stream once. A row holding NaN / +inf is invalid_value naming the row.
[[nodiscard]] Result<SpanTable> scan(const MaskView& device_view, Stream stream = nullptr);

// Scans a mask held in host memory on the GPU: copies the bytes the view spans to the
// device, `offset_bytes` past a 256-byte boundary (a multiple of the element size; the
// tests use it to exercise unaligned rows), scans the same view there, synchronises
// once, frees. A NaN / +inf is invalid_value naming the element, as the host scanner
// says it.
[[nodiscard]] Result<SpanTable> scan_host_mask(const MaskView& host_view, std::int64_t offset_bytes = 0,
                                               Stream stream = nullptr);

// A view of device memory to its structure in one call: scan() then classify().
[[nodiscard]] inline Result<MaskStructure> inspect(const MaskView& device_view, Stream stream = nullptr) {
  Result<SpanTable> table = scan(device_view, stream);
  if (!table) return table.status();
  return classify(*table);
}

}  // namespace masklens::gpu
