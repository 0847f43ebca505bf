// The device scanner's entry points (declared in scan.hpp), compiled once with nvcc.
// Meson builds this file into masklens_cuda_dep; another build system compiles it into
// the program (it is installed beside the headers). Every CUDA call's result is
// checked and returned as a Status naming the call; cleanup failures (a free, the one
// synchronisation) are reported too, after any earlier failure, never dropped.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "../scan.hpp"
#include "scan.cuh"
#include "scan.hpp"

namespace masklens::gpu {

namespace {

// "cudaMallocAsync(spans): cudaErrorMemoryAllocation: out of memory"
Status check(cudaError_t e, const char* call) {
  if (e == cudaSuccess) return {};
  return error(ErrorCode::device_error, std::string(call) + ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

// The first failure is the answer; a later one (a cleanup after it) is added to its
// message, so the caller learns of a free or a synchronisation that failed as well.
void keep_first(Status& first, Status next) {
  if (next.ok()) return;
  if (first.ok()) first = std::move(next);
  else first = Status(first.code(), first.message() + "; then " + next.message());
}

// cudaMallocAsync leaves *p unspecified on failure; null means "nothing to free".
Status allocate(void** p, std::size_t bytes, cudaStream_t stream, const char* call) {
  Status st = check(cudaMallocAsync(p, bytes, stream), call);
  if (!st.ok()) *p = nullptr;
  return st;
}

// Enqueues on `stream`: temporary storage and spans allocated, the scan, the copy of
// the spans into table.rows, both freed. Synchronises nothing. `enqueued` says whether
// any work reached the stream (then the caller synchronises before reading the table).
Status enqueue_scan_to_host(const MaskView& device_view, SpanTable& table, cudaStream_t stream, bool& enqueued) {
  const std::size_t bytes = table.rows.size() * sizeof(RowSpan);
  std::size_t temp_bytes = 0;
  Status st = scan_spans(nullptr, temp_bytes, device_view, nullptr, stream);
  void* temp = nullptr;
  void* d_rows = nullptr;
  if (st.ok()) st = allocate(&temp, temp_bytes, stream, "cudaMallocAsync(temp storage)");
  enqueued = temp != nullptr;
  if (st.ok()) st = allocate(&d_rows, bytes, stream, "cudaMallocAsync(spans)");
  if (st.ok()) st = scan_spans(temp, temp_bytes, device_view, static_cast<RowSpan*>(d_rows), stream);
  if (st.ok())
    st = check(cudaMemcpyAsync(table.rows.data(), d_rows, bytes, cudaMemcpyDeviceToHost, stream),
               "cudaMemcpyAsync(spans to the host)");
  if (d_rows) keep_first(st, check(cudaFreeAsync(d_rows, stream), "cudaFreeAsync(spans)"));
  if (temp) keep_first(st, check(cudaFreeAsync(temp, stream), "cudaFreeAsync(temp storage)"));
  return st;
}

// The first row of the table flagged NaN / +inf, as an error naming it; ok if none.
Status first_invalid_row(const SpanTable& table) {
  for (std::size_t r = 0; r < table.rows.size(); ++r)
    if (table.rows[r].flags & kRowInvalid) {
      const auto slice = static_cast<std::int64_t>(r) / table.q_len;
      return error(ErrorCode::invalid_value,
                   "mask row [" + std::to_string(slice / table.distinct_heads) + ", " +
                       std::to_string(slice % table.distinct_heads) + ", " +
                       std::to_string(static_cast<std::int64_t>(r) % table.q_len) +
                       "] holds NaN or +inf; an additive mask holds 0, a bias, or -inf / a value <= the threshold");
    }
  return {};
}

}  // namespace

bool built_with_cuda() noexcept { return true; }

Result<int> device_count() {
  int n = 0;
  if (Status st = check(cudaGetDeviceCount(&n), "cudaGetDeviceCount"); !st.ok()) return st;
  if (n < 1) return error(ErrorCode::device_error, "cudaGetDeviceCount: no CUDA device is present");
  return n;
}

Status scan_spans(void* d_temp_storage, std::size_t& temp_storage_bytes, const MaskView& device_view,
                  RowSpan* d_rows, Stream stream) {
  if (d_temp_storage == nullptr) {
    temp_storage_bytes = 1;
    return {};
  }
  if (temp_storage_bytes < 1)
    return error(ErrorCode::invalid_argument, "temp_storage_bytes is 0; pass what the size query set (1)");
  if (device_view.data() == nullptr) return error(ErrorCode::invalid_argument, "view is empty (data is null)");
  if (d_rows == nullptr) return error(ErrorCode::invalid_argument, "d_rows is null");
  if (reinterpret_cast<std::uintptr_t>(d_rows) % alignof(RowSpan) != 0)
    return error(ErrorCode::misaligned_pointer, "d_rows is not aligned to RowSpan");
  return check(detail::launch_scan(device_view, d_rows, stream), "cudaLaunchKernelEx(scan kernel)");
}

Result<SpanTable> scan(const MaskView& device_view, Stream stream) {
  if (device_view.data() == nullptr) return error(ErrorCode::invalid_argument, "view is empty (data is null)");
  Result<SpanTable> made = SpanTable::for_view(device_view);
  if (!made) return made.status();
  bool enqueued = false;
  Status st = enqueue_scan_to_host(device_view, *made, stream, enqueued);
  // The one synchronisation: the table is read on the host only after it.
  if (enqueued) keep_first(st, check(cudaStreamSynchronize(stream), "cudaStreamSynchronize"));
  if (!st.ok()) return st;
  if (Status bad = first_invalid_row(*made); !bad.ok()) return bad;
  return made;
}

Result<SpanTable> scan_host_mask(const MaskView& host_view, std::int64_t offset_bytes, Stream stream) {
  if (host_view.data() == nullptr) return error(ErrorCode::invalid_argument, "view is empty (data is null)");
  const int esize = element_size(host_view.dtype());
  if (offset_bytes < 0 || offset_bytes >= 256 || offset_bytes % esize != 0)
    return error(ErrorCode::misaligned_pointer, "offset_bytes must be a multiple of the element size (" +
                                                    std::to_string(esize) + ") in [0, 256), got " +
                                                    std::to_string(offset_bytes));
  Result<SpanTable> made = SpanTable::for_view(host_view);
  if (!made) return made.status();
  const auto bytes = static_cast<std::size_t>(host_view.extent_bytes());
  // The pool's alignment is not documented: 255 spare bytes give a 256-byte boundary.
  void* raw = nullptr;
  Status st = allocate(&raw, bytes + 255 + static_cast<std::size_t>(offset_bytes), stream, "cudaMallocAsync(mask)");
  if (!st.ok()) return st;
  auto* base = reinterpret_cast<std::uint8_t*>((reinterpret_cast<std::uintptr_t>(raw) + 255) & ~std::uintptr_t{255}) +
               offset_bytes;
  st = check(cudaMemcpyAsync(base, host_view.data(), bytes, cudaMemcpyHostToDevice, stream),
             "cudaMemcpyAsync(mask to the device)");
  if (st.ok()) {
    // The same view (shape, strides, encoding) over the device copy.
    auto view = MaskView::make(base, host_view.dtype(), host_view.shape(), host_view.strides(), host_view.encoding());
    bool enqueued = false;
    st = view ? enqueue_scan_to_host(*view, *made, stream, enqueued) : view.status();
  }
  keep_first(st, check(cudaFreeAsync(raw, stream), "cudaFreeAsync(mask)"));
  keep_first(st, check(cudaStreamSynchronize(stream), "cudaStreamSynchronize"));
  if (!st.ok()) return st;
  // The mask is on the host: name the element, as the host scanner does.
  for (std::size_t r = 0; r < made->rows.size(); ++r)
    if (made->rows[r].flags & kRowInvalid) {
      const std::int64_t slice = static_cast<std::int64_t>(r) / made->q_len;
      return masklens::detail::invalid_element_error(host_view, slice / made->distinct_heads,
                                                     slice % made->distinct_heads,
                                                     static_cast<std::int64_t>(r) % made->q_len);
    }
  return made;
}

}  // namespace masklens::gpu
