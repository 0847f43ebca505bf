// What a C++ framework puts before its attention call: scan the device mask on the
// framework's stream with the two-phase API, synchronise once, classify, decide.
#include <masklens/cuda/scan.cuh>
#include <masklens/masklens.hpp>

#include <cstdio>
#include <vector>

namespace {

__global__ void fill_sliding_window(std::uint8_t* m, std::int64_t L, std::int64_t W) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < L * L;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t q = i / L, k = i % L;
    m[i] = k <= q && q - k < W;
  }
}

int fail(const char* what, const masklens::Status& s) {
  std::fprintf(stderr, "%s: %s\n", what, s.to_string().c_str());
  return 1;
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::puts("no CUDA device: nothing to guard");
    return 77;
  }
  const std::int64_t L = 8192, W = 1024;
  cudaStream_t stream;
  cudaStreamCreate(&stream);
  std::uint8_t* d_mask = nullptr;
  cudaMallocAsync(&d_mask, L * L, stream);
  fill_sliding_window<<<1024, 256, 0, stream>>>(d_mask, L, W);  // the framework's dense bool mask

  const std::int64_t shape[] = {L, L};
  auto view = masklens::MaskView::contiguous(d_mask, masklens::ElementType::boolean, shape);
  if (!view) return fail("view", view.status());
  auto table = masklens::SpanTable::for_view(*view);  // host side of the O(rows) result
  if (!table) return fail("table", table.status());

  // Two-phase, stream-ordered, no synchronisation inside.
  std::size_t temp_bytes = 0;
  masklens::gpu::scan_spans(nullptr, temp_bytes, *view, nullptr, stream);
  void* d_temp = nullptr;
  masklens::RowSpan* d_rows = nullptr;
  cudaMallocAsync(&d_temp, temp_bytes, stream);
  cudaMallocAsync(reinterpret_cast<void**>(&d_rows), table->rows.size() * sizeof(masklens::RowSpan), stream);
  if (auto s = masklens::gpu::scan_spans(d_temp, temp_bytes, *view, d_rows, stream); !s.ok()) return fail("scan", s);
  cudaMemcpyAsync(table->rows.data(), d_rows, table->rows.size() * sizeof(masklens::RowSpan), cudaMemcpyDeviceToHost,
                  stream);
  cudaStreamSynchronize(stream);  // the one synchronisation

  auto verdict = masklens::classify(*table);
  if (!verdict) return fail("classify", verdict.status());
  masklens::AttentionCall call;
  call.available = masklens::kFamilyTorch | masklens::kFamilyFlashAttn;
  call.flash_attn = masklens::version(2, 8, 3);
  auto policy = masklens::decide(*verdict, call);
  if (!policy) return fail("decide", policy.status());
  std::printf("structure: %s\nbackend:   %s\n", masklens::describe(*verdict).c_str(),
              std::string(masklens::to_string(policy->backend)).c_str());

  cudaFreeAsync(d_rows, stream);
  cudaFreeAsync(d_temp, stream);
  cudaFreeAsync(d_mask, stream);
  cudaStreamDestroy(stream);
  return verdict->kind == masklens::StructureKind::sliding_window && verdict->window == W ? 0 : 1;
}
