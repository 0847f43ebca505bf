// The device scanner's entry points (scan.hpp) in a build without CUDA: the same
// functions, each a clear device_error, so a program that offers a GPU scan compiles
// and links either way and says why it cannot scan there. Meson builds this file into
// masklens_cuda_dep when nvcc is not found or -Dcuda=disabled.
#include <masklens/cuda/scan.hpp>

#include "without_cuda.hpp"

namespace masklens::gpu {

using detail::without_cuda;

bool built_with_cuda() noexcept { return false; }

Result<int> device_count() { return without_cuda(); }

Status load_scan_kernels() { return without_cuda(); }

Status scan_spans(void* d_temp_storage, std::size_t& temp_storage_bytes, const MaskView&, RowSpan*, Stream) {
  // The size query needs no device, as in the CUDA build.
  if (detail::answer_size_query(d_temp_storage, temp_storage_bytes, detail::kScanSpansTempBytes)) return {};
  return without_cuda();
}

Status scan_to_host(void* d_temp_storage, std::size_t& temp_storage_bytes, const MaskView& device_view, RowSpan*,
                    Stream) {
  // The same size as the CUDA build answers: the spans' bytes, then scan_spans()'s.
  const std::size_t needed = detail::device_span_bytes(device_view) + detail::kScanSpansTempBytes;
  if (detail::answer_size_query(d_temp_storage, temp_storage_bytes, needed)) return {};
  return without_cuda();
}

Result<SpanTable> scan(const MaskView&, Stream) { return without_cuda(); }

Result<SpanTable> scan_host_mask(const MaskView&, std::int64_t, Stream) { return without_cuda(); }

}  // namespace masklens::gpu
