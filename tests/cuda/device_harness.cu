#include "device_harness.hpp"

#include <masklens/cuda/scan.cuh>

namespace masklens::testing::gpu {

bool device_available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

namespace {

__global__ void fill_causal(std::uint8_t* m, std::int64_t L) {
  const std::int64_t n = L * L;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    m[i] = (i % L) <= (i / L);
}

}  // namespace

Result<SpanTable> scan_copy_on_device(const MaskView& host_view, std::int64_t offset_bytes) {
  return masklens::gpu::scan_host_mask(host_view, offset_bytes);
}

Result<SpanTable> scan_device_causal(std::int64_t L, std::int64_t flip_q, std::int64_t flip_k) {
  std::uint8_t* m = nullptr;
  if (cudaMalloc(&m, static_cast<std::size_t>(L * L)) != cudaSuccess)
    return error(ErrorCode::device_error, "cudaMalloc failed");
  fill_causal<<<4096, 256>>>(m, L);
  if (flip_q >= 0) {
    const std::uint8_t v = (flip_k <= flip_q) ? 0 : 1;
    cudaMemcpy(m + flip_q * L + flip_k, &v, 1, cudaMemcpyHostToDevice);
  }
  const std::int64_t shape[] = {L, L};
  auto view = MaskView::contiguous(m, ElementType::boolean, shape);
  Result<SpanTable> out = view ? masklens::gpu::scan(*view) : Result<SpanTable>(view.status());
  cudaFree(m);
  return out;
}

}  // namespace masklens::testing::gpu
