#include "gpu_scan.hpp"

#include <masklens/cuda/scan.cuh>

namespace masklens::cli {

Result<SpanTable> scan_on_gpu(const MaskView& host_view) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0)
    return error(ErrorCode::device_error, "--device cuda: no CUDA device is present");
  std::int64_t elems = 1;
  for (int d = 0; d < kMaxDims; ++d) elems += (host_view.shape(d) - 1) * host_view.stride(d);
  const auto bytes = static_cast<std::size_t>(elems * element_size(host_view.dtype()));
  void* device = nullptr;
  if (cudaMalloc(&device, bytes) != cudaSuccess) return error(ErrorCode::out_of_memory, "cudaMalloc of the mask failed");
  Result<SpanTable> out = error(ErrorCode::device_error, "copying the mask to the device failed");
  if (cudaMemcpy(device, host_view.data(), bytes, cudaMemcpyHostToDevice) == cudaSuccess) {
    auto view = MaskView::make(device, host_view.dtype(), host_view.shape(), host_view.strides(), host_view.encoding());
    out = view ? gpu::scan(*view) : Result<SpanTable>(view.status());
  }
  cudaFree(device);
  return out;
}

}  // namespace masklens::cli
