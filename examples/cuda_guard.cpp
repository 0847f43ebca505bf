// What a C++ framework puts before its attention call: scan the device mask on the
// framework's stream with the two-phase API, synchronise once, classify, decide. And at
// its start-up: gpu::load_kernels(), so that the first guard does not load the kernels.
// Plain C++: the host compiler builds it against masklens/cuda/scan.hpp and the CUDA
// runtime API; the scanner's entry points come compiled from masklens_cuda_dep.
#include <cuda_runtime_api.h>
#include <masklens/cuda/load_kernels.hpp>
#include <masklens/cuda/scan.hpp>
#include <masklens/masklens.hpp>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace {

// Every CUDA call is checked; the first failure is reported and the rest skipped.
bool ok(cudaError_t e, const char* call) {
  if (e != cudaSuccess) std::fprintf(stderr, "%s: %s\n", call, cudaGetErrorString(e));
  return e == cudaSuccess;
}

bool ok(const masklens::Status& s, const char* what) {
  if (!s.ok()) std::fprintf(stderr, "%s: %s\n", what, s.to_string().c_str());
  return s.ok();
}

}  // namespace

int main() {
  if (auto devices = masklens::gpu::device_count(); !devices) {
    std::printf("no CUDA device (%s): nothing to guard\n", devices.status().message().c_str());
    return 77;
  }
  // The framework's dense bool mask on its device: here a sliding window built on the
  // host and copied, in a framework the storage of a tensor.
  const std::int64_t L = 8192, W = 1024;
  std::vector<std::uint8_t> host(static_cast<std::size_t>(L * L));
  for (std::int64_t q = 0; q < L; ++q)
    for (std::int64_t k = 0; k < L; ++k) host[static_cast<std::size_t>(q * L + k)] = k <= q && q - k < W;
  cudaStream_t stream = nullptr;
  if (!ok(cudaStreamCreate(&stream), "cudaStreamCreate")) return 1;
  void* d_mask = nullptr;
  void* d_temp = nullptr;
  void* d_rows = nullptr;
  // Start-up, the context made: masklens' kernels loaded now rather than inside the first
  // guard (CUDA loads a kernel at its first launch).
  bool good = ok(masklens::gpu::load_kernels(), "load_kernels") &&
              ok(cudaMallocAsync(&d_mask, host.size(), stream), "cudaMallocAsync(mask)") &&
              ok(cudaMemcpyAsync(d_mask, host.data(), host.size(), cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync");

  // The guard.
  const std::int64_t shape[] = {L, L};
  auto view = masklens::MaskView::contiguous(d_mask, masklens::ElementType::boolean, shape);
  auto table = view ? masklens::SpanTable::for_view(*view)  // host side of the O(rows) result
                    : masklens::Result<masklens::SpanTable>(view.status());
  good = good && ok(view.status(), "view") && ok(table.status(), "table");
  const std::size_t row_bytes = good ? table->rows.size() * sizeof(masklens::RowSpan) : 0;
  std::size_t temp_bytes = 0;
  // Two-phase, stream-ordered, no synchronisation inside: size query, the caller's
  // allocator, the scan, the copy back; then the one synchronisation.
  good = good && ok(masklens::gpu::scan_spans(nullptr, temp_bytes, *view, nullptr, stream), "size query") &&
         ok(cudaMallocAsync(&d_temp, temp_bytes, stream), "cudaMallocAsync(temp)") &&
         ok(cudaMallocAsync(&d_rows, row_bytes, stream), "cudaMallocAsync(rows)") &&
         ok(masklens::gpu::scan_spans(d_temp, temp_bytes, *view, static_cast<masklens::RowSpan*>(d_rows), stream),
            "scan") &&
         ok(cudaMemcpyAsync(table->rows.data(), d_rows, row_bytes, cudaMemcpyDeviceToHost, stream),
            "cudaMemcpyAsync(rows)") &&
         ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  // (Or in one call: masklens::gpu::inspect(*view, stream), which does all of the above.)

  bool sliding = false;
  if (good) {
    auto verdict = masklens::classify(*table);
    masklens::AttentionCall call;
    masklens::Environment env;  // an H200 with torch 2.11 and flash-attn 2.8.3
    env.available = masklens::kFamilyTorch | masklens::kFamilyFlashAttn;
    env.flash_attn = masklens::version(2, 8, 3);
    auto policy = verdict ? masklens::decide(*verdict, call, env) : masklens::Result<masklens::Policy>(verdict.status());
    good = ok(policy.status(), "classify / decide");
    if (good) {
      std::printf("structure: %s\nbackend:   %s\n", masklens::describe(*verdict).c_str(),
                  std::string(masklens::to_string(policy->backend())).c_str());
      sliding = verdict->kind == masklens::StructureKind::sliding_window && verdict->window == W;
    }
  }

  // Cleanup is checked like the rest: a failed free is a failure of the program.
  if (d_rows) good = ok(cudaFreeAsync(d_rows, stream), "cudaFreeAsync(rows)") && good;
  if (d_temp) good = ok(cudaFreeAsync(d_temp, stream), "cudaFreeAsync(temp)") && good;
  if (d_mask) good = ok(cudaFreeAsync(d_mask, stream), "cudaFreeAsync(mask)") && good;
  good = ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize") && good;
  good = ok(cudaStreamDestroy(stream), "cudaStreamDestroy") && good;
  return good && sliding ? 0 : 1;
}
