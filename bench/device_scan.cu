// Device scanner throughput, each case side by side in the same run with a plain read of
// the same bytes (a vectorised 16-byte load kernel that only reads: the ceiling):
//   bool 65536^2 causal (4 GiB), and the same mask broadcast over 8 batches (stride 0);
//   additive causal masks in bf16, fp16 and fp32, masked by -inf, finfo.min or -1e4
//   (-9984 in bf16), at 32768^2 and 65536^2 (2 to 16 GiB).
// CUDA events, median of --reps (20). Prints a markdown table for bench/README.md; with
// a path (or --json PATH), also one JSON line per case (bench/torch_baselines.py reads
// it). Exits 1 if a case's verdict is not causal (then its figures mean nothing).
//
//   ./build-gpu/bench/device_scan [out.jsonl] [--reps N] [--only SUBSTRING]
//
// nvcc for its own kernels (the plain read, the fills); the scanner comes from
// masklens_cuda_dep as any program gets it.
#include <cuda_runtime.h>
#include <masklens/cuda/scan.hpp>
#include <masklens/masklens.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "device_bench.cuh"

using namespace masklens;

namespace {

using namespace masklens_bench;  // the timer, the baseline, the command line

// An L x L causal mask: `attend` on and below the diagonal, `masked` above.
template <class T>
__global__ void fill_causal(T* m, std::int64_t L, T attend, T masked) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < L * L;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    m[i] = (i % L) <= (i / L) ? attend : masked;
}

struct Bench {
  BenchOptions options;
  PlainRead read;
  bool all_causal = true;

  // The plain read of `bytes` bytes at `data` (a multiple of 16).
  float plain_read_ms(const void* data, std::int64_t bytes) const { return read.ms(data, bytes, options.reps); }

  // One row of the table: the scan beside `read_ms`, the plain read of the bytes it reads.
  void run_case(const std::string& name, const MaskView& view, double bytes_read, float read_ms) {
    const std::int64_t rows = gpu::span_rows(view);
    RowSpan* d_rows = nullptr;
    CHECK_CUDA(cudaMalloc(&d_rows, static_cast<std::size_t>(rows) * sizeof(RowSpan)));
    std::size_t temp_bytes = 0;
    if (Status s = gpu::scan_spans(nullptr, temp_bytes, view, nullptr); !s.ok())
      std::fprintf(stderr, "%s\n", s.to_string().c_str()), std::exit(1);
    void* temp = nullptr;
    CHECK_CUDA(cudaMalloc(&temp, temp_bytes));
    const float scan_ms = median_ms(options.reps, [&] {
      if (Status s = gpu::scan_spans(temp, temp_bytes, view, d_rows); !s.ok())
        std::fprintf(stderr, "%s\n", s.to_string().c_str()), std::exit(1);
    });
    // End to end as a framework runs it: scan, copy the spans back, classify on the host.
    const auto t0 = std::chrono::steady_clock::now();
    auto table = gpu::scan(view);
    auto verdict = table ? classify(*table) : Result<MaskStructure>(table.status());
    const double e2e_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const double scan_gbs = bytes_read / (scan_ms * 1e-3) / 1e9, read_gbs = bytes_read / (read_ms * 1e-3) / 1e9;
    const bool causal = verdict && verdict->kind == StructureKind::causal;
    all_causal = all_causal && causal;
    const std::string said = verdict ? describe(*verdict) : verdict.status().to_string();
    std::printf("| %s | %.3f ms | %.0f | %.3f ms | %.0f | **%.2f** | %.2f ms | %s%s |\n", name.c_str(), read_ms,
                read_gbs, scan_ms, scan_gbs, read_ms / scan_ms, e2e_ms, said.c_str(), causal ? "" : " (NOT CAUSAL)");
    std::fflush(stdout);
    if (options.json)
      std::fprintf(options.json,
                   "{\"case\": \"%s\", \"bytes\": %.0f, \"scan_ms\": %.4f, \"gbs\": %.1f, \"plain_read_ms\": %.4f, "
                   "\"plain_read_gbs\": %.1f, \"ratio\": %.4f, \"end_to_end_ms\": %.3f, \"causal\": %s}\n",
                   name.c_str(), bytes_read, scan_ms, scan_gbs, read_ms, read_gbs, read_ms / scan_ms, e2e_ms,
                   causal ? "true" : "false");
    CHECK_CUDA(cudaFree(d_rows));
    CHECK_CUDA(cudaFree(temp));
  }

  bool wanted(const std::string& name) const { return options.wanted(name); }
};

// An additive type's bits for 0 and the three masked values frameworks write.
struct AdditiveCase {
  const char* type_name;
  ElementType dtype;
  int esize;
  std::uint32_t neg_inf, lowest, minus_1e4;
};

const char* gib(double bytes) {
  static char text[32];
  std::snprintf(text, sizeof text, "%g GiB", bytes / (1024.0 * 1024.0 * 1024.0));
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  Bench bench;
  if (const int exit_code = parse_options(argc, argv, bench.options, false); exit_code != 0) return exit_code;
  bench.read = open_device(bench.options.reps, "");
  std::printf("| case | plain read | GB/s | masklens scan | GB/s | ratio to plain read | end-to-end | verdict |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");

  // One buffer for every case: the largest mask, 65536^2 fp32 (16 GiB).
  const std::int64_t kLargest = 65536;
  void* buffer = nullptr;
  CHECK_CUDA(cudaMalloc(&buffer, static_cast<std::size_t>(kLargest * kLargest * 4)));

  {  // bool 65536^2, 4 GiB, and the same slice broadcast over 8 batches
    const std::int64_t L = 65536;
    const std::string name = "bool 65536^2 causal (4 GiB)", batch_name = "bool 65536^2 x8 batch, stride 0";
    if (bench.wanted(name) || bench.wanted(batch_name)) {
      auto* m = static_cast<std::uint8_t*>(buffer);
      fill_causal<std::uint8_t><<<8192, 256>>>(m, L, 1, 0);
      CHECK_LAUNCH();
      const double bytes = static_cast<double>(L) * L;
      const float read_ms = bench.plain_read_ms(m, L * L);
      const std::int64_t shape[] = {L, L};
      auto view = MaskView::contiguous(m, ElementType::boolean, shape);
      if (bench.wanted(name)) bench.run_case(name, *view, bytes, read_ms);
      // Read once: the plain read of one slice is its ceiling.
      if (bench.wanted(batch_name)) bench.run_case(batch_name, *view->broadcast_to(8, 1), bytes, read_ms);
    }
  }

  const AdditiveCase types[] = {
      {"bf16", ElementType::bfloat16, 2, 0xff80u, 0xff7fu, 0xc61cu},  // -1e4 is -9984 in bf16
      {"fp16", ElementType::float16, 2, 0xfc00u, 0xfbffu, 0xf0e2u},   // finfo.min = -65504
      {"fp32", ElementType::float32, 4, 0xff800000u, 0xff7fffffu, 0xc61c4000u},
  };
  for (const std::int64_t L : {std::int64_t{32768}, std::int64_t{65536}}) {
    for (const AdditiveCase& t : types) {
      const std::pair<const char*, std::uint32_t> encodings[] = {
          {"-inf", t.neg_inf}, {"finfo.min", t.lowest}, {"-1e4", t.minus_1e4}};
      for (const auto& [encoding, masked] : encodings) {
        const double bytes = static_cast<double>(L) * L * t.esize;
        const std::string name = std::string(t.type_name) + " " + std::to_string(L) + "^2 causal, masked " +
                                 encoding + " (" + gib(bytes) + ")";
        if (!bench.wanted(name)) continue;
        if (t.esize == 2)
          fill_causal<std::uint16_t><<<8192, 256>>>(static_cast<std::uint16_t*>(buffer), L, 0,
                                                    static_cast<std::uint16_t>(masked));
        else
          fill_causal<std::uint32_t><<<8192, 256>>>(static_cast<std::uint32_t*>(buffer), L, 0u, masked);
        CHECK_LAUNCH();
        // Side by side: the plain read of these bytes right before their scan.
        const float read_ms = bench.plain_read_ms(buffer, L * L * t.esize);
        const std::int64_t shape[] = {L, L};
        auto view = MaskView::contiguous(buffer, t.dtype, shape);
        bench.run_case(name, *view, bytes, read_ms);
      }
    }
  }
  CHECK_CUDA(cudaFree(buffer));
  if (!close_bench(bench.read, bench.options)) return 1;
  if (!bench.all_causal) {
    std::fprintf(stderr, "a case's verdict was not causal: its figures measure a wrong scan\n");
    return 1;
  }
  return 0;
}
