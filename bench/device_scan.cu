// Device scanner throughput on an H200-class GPU, side by side in the same run with a
// plain vectorised read of the same bytes (the ceiling): 65536^2 bool causal (4 GiB),
// the same mask broadcast over 8 batches with stride 0, and 32768^2 bf16 additive
// (2 GiB). CUDA events, median of N. Writes a JSON line per case to argv[1] if given.
// nvcc for its own kernels (the plain read, the fills); the scanner comes from
// masklens_cuda_dep as any program gets it.
#include <cuda_runtime.h>
#include <masklens/cuda/scan.hpp>
#include <masklens/masklens.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

using namespace masklens;

namespace {

#define CHECK_CUDA(x)                                                                   \
  do {                                                                                  \
    cudaError_t e_ = (x);                                                               \
    if (e_ != cudaSuccess) {                                                            \
      std::fprintf(stderr, "%s failed: %s\n", #x, cudaGetErrorString(e_));              \
      std::exit(1);                                                                     \
    }                                                                                   \
  } while (0)

// The program owns the CUDA error state (every call before is checked and exits on
// failure), so peeking after a <<<>>> launch reads this launch's error.
#define CHECK_LAUNCH() CHECK_CUDA(cudaPeekAtLastError())

__global__ void plain_read(const uint4* p, std::int64_t n, unsigned* out) {
  unsigned acc = 0;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    const uint4 a = __ldg(p + i), b = __ldg(p + i + stride), c = __ldg(p + i + 2 * stride), d = __ldg(p + i + 3 * stride);
    acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
  }
  for (; i < n; i += stride) {
    const uint4 a = __ldg(p + i);
    acc ^= a.x ^ a.y ^ a.z ^ a.w;
  }
  if (acc == 0x9e3779b9u) *out = acc;  // keeps the loads alive
}

__global__ void fill_causal_bool(std::uint8_t* m, std::int64_t L) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < L * L;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    m[i] = (i % L) <= (i / L);
}

__global__ void fill_causal_bf16(std::uint16_t* m, std::int64_t L) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < L * L;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    m[i] = (i % L) <= (i / L) ? 0x0000 : 0xFF7F;  // 0 / finfo(bf16).min
}

template <class F>
float median_ms(int reps, F&& launch) {
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  launch();  // warm-up
  CHECK_LAUNCH();
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) {
    CHECK_CUDA(cudaEventRecord(a));
    launch();
    CHECK_CUDA(cudaEventRecord(b));
    CHECK_CUDA(cudaEventSynchronize(b));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  CHECK_CUDA(cudaEventDestroy(a));
  CHECK_CUDA(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

FILE* json = nullptr;

void run_case(const char* name, const MaskView& view, double bytes_read, float read_ms, int reps) {
  RowSpan* d_rows = nullptr;
  const std::int64_t rows = gpu::span_rows(view);
  CHECK_CUDA(cudaMalloc(&d_rows, rows * sizeof(RowSpan)));
  std::size_t temp_bytes = 0;
  if (Status s = gpu::scan_spans(nullptr, temp_bytes, view, nullptr); !s.ok())
    std::fprintf(stderr, "%s\n", s.to_string().c_str()), std::exit(1);
  void* temp = nullptr;
  CHECK_CUDA(cudaMalloc(&temp, temp_bytes));
  const float scan_ms = median_ms(reps, [&] {
    Status s = gpu::scan_spans(temp, temp_bytes, view, d_rows);
    if (!s.ok()) std::fprintf(stderr, "%s\n", s.to_string().c_str()), std::exit(1);
  });
  // End to end as a framework would run it: scan, copy spans back, classify on the host.
  const auto t0 = std::chrono::steady_clock::now();
  auto table = gpu::scan(view);
  auto verdict = table ? classify(*table) : Result<MaskStructure>(table.status());
  const double e2e_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const double gbs = bytes_read / (scan_ms * 1e-3) / 1e9;
  std::printf("%-34s scan %8.3f ms %7.1f GB/s | plain read %8.3f ms | ratio %.3f | end-to-end %7.2f ms | %s\n",
              name, scan_ms, gbs, read_ms, read_ms / scan_ms, e2e_ms,
              verdict ? describe(*verdict).c_str() : verdict.status().to_string().c_str());
  if (json)
    std::fprintf(json,
                 "{\"case\": \"%s\", \"bytes\": %.0f, \"scan_ms\": %.4f, \"gbs\": %.1f, \"plain_read_ms\": %.4f, "
                 "\"ratio\": %.4f, \"end_to_end_ms\": %.3f}\n",
                 name, bytes_read, scan_ms, gbs, read_ms, read_ms / scan_ms, e2e_ms);
  CHECK_CUDA(cudaFree(d_rows));
  CHECK_CUDA(cudaFree(temp));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && (json = std::fopen(argv[1], "w")) == nullptr) {
    std::fprintf(stderr, "cannot write %s\n", argv[1]);
    return 1;
  }
  const int reps = 20;
  unsigned* sink = nullptr;
  CHECK_CUDA(cudaMalloc(&sink, sizeof(unsigned)));
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  const unsigned read_grid = static_cast<unsigned>(prop.multiProcessorCount) * 8;

  {  // 65536^2 bool, 4 GiB
    const std::int64_t L = 65536;
    std::uint8_t* m = nullptr;
    CHECK_CUDA(cudaMalloc(&m, L * L));
    fill_causal_bool<<<8192, 256>>>(m, L);
    CHECK_LAUNCH();
    const double bytes = static_cast<double>(L) * L;
    const float read_ms = median_ms(reps, [&] {
      plain_read<<<read_grid, 256>>>(reinterpret_cast<const uint4*>(m), L * L / 16, sink);
    });
    const std::int64_t shape[] = {L, L};
    auto view = MaskView::contiguous(m, ElementType::boolean, shape);
    run_case("bool 65536^2 causal (4 GiB)", *view, bytes, read_ms, reps);
    auto batch8 = view->broadcast_to(8, 1);
    run_case("bool 65536^2 x8 batch, stride 0", *batch8, bytes, read_ms, reps);
    CHECK_CUDA(cudaFree(m));
  }
  {  // 32768^2 bf16 additive, 2 GiB
    const std::int64_t L = 32768;
    std::uint16_t* m = nullptr;
    CHECK_CUDA(cudaMalloc(&m, L * L * 2));
    fill_causal_bf16<<<8192, 256>>>(m, L);
    CHECK_LAUNCH();
    const double bytes = static_cast<double>(L) * L * 2;
    const float read_ms = median_ms(reps, [&] {
      plain_read<<<read_grid, 256>>>(reinterpret_cast<const uint4*>(m), L * L * 2 / 16, sink);
    });
    const std::int64_t shape[] = {L, L};
    auto view = MaskView::contiguous(m, ElementType::bfloat16, shape);
    run_case("bf16 32768^2 additive causal (2 GiB)", *view, bytes, read_ms, reps);
    CHECK_CUDA(cudaFree(m));
  }
  CHECK_CUDA(cudaFree(sink));
  if (json && std::fclose(json) != 0) {
    std::fprintf(stderr, "writing %s failed\n", argv[1]);
    return 1;
  }
  return 0;
}
