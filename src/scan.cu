// The device scanner's entry points (declared in masklens/cuda/scan.hpp), compiled once
// with nvcc. Meson builds this file into masklens_cuda_dep; another build system compiles
// it into the program (it is installed as share/masklens/src/scan.cu). Every CUDA call's
// result is checked and returned as a Status naming the call; cleanup failures (a free,
// the one synchronisation) are reported too, after any earlier failure, never dropped.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include <masklens/cuda/check.cuh>
#include <masklens/cuda/scan.cuh>
#include <masklens/cuda/scan.hpp>
#include <masklens/cuda/temp_storage.hpp>
#include <masklens/scan.hpp>

namespace masklens::gpu {

namespace {

using detail::allocate;
using detail::check;
using detail::keep_first;

// The kernels dispatch_scan<SpanAccumulator> can launch with Policy for this element
// size: a block per row (long rows) and a warp per row (short ones).
template <class Policy, int Esize>
Status load_span_scan_with() {
  using detail::SpanAccumulator;
  const std::string size = std::to_string(Esize) + "-byte elements";
  return detail::load_kernels_named(
      {{reinterpret_cast<const void*>(&detail::scan_rows_block_kernel<Policy, Esize, SpanAccumulator>),
        "scan_rows_block_kernel, " + size},
       {reinterpret_cast<const void*>(&detail::scan_rows_warp_kernel<Policy, Esize, SpanAccumulator>),
        "scan_rows_warp_kernel, " + size}});
}

}  // namespace

bool built_with_cuda() noexcept { return true; }

Status load_scan_kernels() {
  // Every element size a view can have, as dispatch_scan switches.
  return detail::load_for_current_arch<detail::ScanTuning>([](auto policy, auto esize) {
    return load_span_scan_with<typename decltype(policy)::type, decltype(esize)::value>();
  });
}

Result<int> device_count() {
  int n = 0;
  if (Status st = check(cudaGetDeviceCount(&n), "cudaGetDeviceCount"); !st.ok()) return st;
  if (n < 1) return error(ErrorCode::device_error, "cudaGetDeviceCount: no CUDA device is present");
  return n;
}

Status scan_spans(void* d_temp_storage, std::size_t& temp_storage_bytes, const MaskView& device_view,
                  RowSpan* d_rows, Stream stream) {
  if (detail::answer_size_query(d_temp_storage, temp_storage_bytes, detail::kScanSpansTempBytes)) return {};
  if (Status st = detail::check_temp_storage_bytes(temp_storage_bytes, detail::kScanSpansTempBytes); !st.ok())
    return st;
  if (device_view.data() == nullptr) return error(ErrorCode::invalid_argument, "view is empty (data is null)");
  if (d_rows == nullptr) return error(ErrorCode::invalid_argument, "d_rows is null");
  if (reinterpret_cast<std::uintptr_t>(d_rows) % alignof(RowSpan) != 0)
    return error(ErrorCode::misaligned_pointer, "d_rows is not aligned to RowSpan");
  return check(detail::dispatch_scan<detail::SpanAccumulator>(device_view, d_rows, stream),
               "cudaLaunchKernelEx(scan kernel)");
}

Status scan_to_host(void* d_temp_storage, std::size_t& temp_storage_bytes, const MaskView& device_view,
                    RowSpan* h_rows, Stream stream) {
  const std::size_t span_bytes = detail::device_span_bytes(device_view);
  std::size_t scan_bytes = 0;
  if (Status st = scan_spans(nullptr, scan_bytes, device_view, nullptr, stream); !st.ok()) return st;
  if (detail::answer_size_query(d_temp_storage, temp_storage_bytes, span_bytes + scan_bytes)) return {};
  if (temp_storage_bytes < span_bytes + scan_bytes)
    return error(ErrorCode::invalid_argument, "temp_storage_bytes is " + std::to_string(temp_storage_bytes) +
                                                  "; this view needs " + std::to_string(span_bytes + scan_bytes) +
                                                  " (what the size query set)");
  if (reinterpret_cast<std::uintptr_t>(d_temp_storage) % alignof(RowSpan) != 0)
    return error(ErrorCode::misaligned_pointer, "d_temp_storage is not aligned to RowSpan (8 bytes)");
  if (h_rows == nullptr) return error(ErrorCode::invalid_argument, "h_rows is null");
  if (reinterpret_cast<std::uintptr_t>(h_rows) % alignof(RowSpan) != 0)
    return error(ErrorCode::misaligned_pointer, "h_rows is not aligned to RowSpan");
  auto* d_rows = static_cast<RowSpan*>(d_temp_storage);
  if (Status st = scan_spans(static_cast<std::uint8_t*>(d_temp_storage) + span_bytes, scan_bytes, device_view, d_rows,
                             stream);
      !st.ok())
    return st;
  return check(cudaMemcpyAsync(h_rows, d_rows, static_cast<std::size_t>(span_rows(device_view)) * sizeof(RowSpan),
                               cudaMemcpyDeviceToHost, stream),
               "cudaMemcpyAsync(spans to the host)");
}

Result<SpanTable> scan(const MaskView& device_view, Stream stream) {
  if (device_view.data() == nullptr) return error(ErrorCode::invalid_argument, "view is empty (data is null)");
  Result<SpanTable> made = SpanTable::for_view(device_view);
  if (!made) return made.status();
  std::size_t temp_bytes = 0;
  Status st = scan_to_host(nullptr, temp_bytes, device_view, nullptr, stream);
  void* temp = nullptr;
  if (st.ok()) st = allocate(&temp, temp_bytes, stream, "cudaMallocAsync(temp storage)");
  if (st.ok()) st = scan_to_host(temp, temp_bytes, device_view, made->rows.data(), stream);
  if (temp) {
    keep_first(st, check(cudaFreeAsync(temp, stream), "cudaFreeAsync(temp storage)"));
    // The one synchronisation: the table is read on the host only after it.
    keep_first(st, check(cudaStreamSynchronize(stream), "cudaStreamSynchronize"));
  }
  if (!st.ok()) return st;
  if (Status bad = masklens::detail::check_flagged_rows(*made); !bad.ok()) return bad;
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
  // One block: the mask copy `offset_bytes` past a 256-byte boundary, then scan_to_host()'s
  // temporary storage at the next one (the same view shape, so the size query on the host
  // view answers for the device one); 255 spare bytes, as the pool's alignment is not
  // documented.
  std::size_t temp_bytes = 0;
  Status st = scan_to_host(nullptr, temp_bytes, host_view, nullptr, stream);
  if (!st.ok()) return st;
  detail::StorageLayout layout;
  const std::size_t mask_at = layout.add(bytes + static_cast<std::size_t>(offset_bytes));
  const std::size_t temp_at = layout.add(temp_bytes);
  void* raw = nullptr;
  st = allocate(&raw, layout.bytes() + detail::kStorageAlignment - 1, stream, "cudaMallocAsync(mask and temp storage)");
  if (!st.ok()) return st;
  std::uint8_t* block = detail::align_up(raw);
  std::uint8_t* base = block + mask_at + offset_bytes;
  void* temp = block + temp_at;
  st = check(cudaMemcpyAsync(base, host_view.data(), bytes, cudaMemcpyHostToDevice, stream),
             "cudaMemcpyAsync(mask to the device)");
  if (st.ok()) {
    // The same view (shape, strides, encoding) over the device copy.
    auto view = MaskView::make(base, host_view.dtype(), host_view.shape(), host_view.strides(), host_view.encoding());
    st = view ? scan_to_host(temp, temp_bytes, *view, made->rows.data(), stream) : view.status();
  }
  keep_first(st, check(cudaFreeAsync(raw, stream), "cudaFreeAsync(mask and temp storage)"));
  keep_first(st, check(cudaStreamSynchronize(stream), "cudaStreamSynchronize"));
  if (!st.ok()) return st;
  // The mask is on the host: name the element, as the host scanner does.
  if (Status bad = masklens::detail::check_scanned_rows(host_view, *made); !bad.ok()) return bad;
  return made;
}

}  // namespace masklens::gpu
