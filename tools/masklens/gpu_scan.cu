#include "gpu_scan.hpp"

#include <masklens/cuda/scan.cuh>

namespace masklens::cli {

Result<SpanTable> scan_on_gpu(const MaskView& host_view) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0)
    return error(ErrorCode::device_error, "--device cuda: no CUDA device is present");
  return gpu::scan_host_mask(host_view);
}

}  // namespace masklens::cli
