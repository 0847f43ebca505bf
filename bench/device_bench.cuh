// What the CUDA benchmarks (device_scan.cu, device_step.cu, device_tiles.cu) share: the
// check that exits on a failed CUDA call, the baseline every figure is a ratio to (a
// vectorised 16-byte read of the same bytes that only reads), the median of CUDA event
// times after a warm-up, and device_scan's and device_tiles' command line and device
// line. nvcc; each benchmark is one translation unit.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#define CHECK_CUDA(x)                                                      \
  do {                                                                     \
    cudaError_t e_ = (x);                                                  \
    if (e_ != cudaSuccess) {                                               \
      std::fprintf(stderr, "%s failed: %s\n", #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                        \
    }                                                                      \
  } while (0)

// The program owns the CUDA error state (every call before is checked and exits on
// failure), so peeking after a <<<>>> launch reads this launch's error.
#define CHECK_LAUNCH() CHECK_CUDA(cudaPeekAtLastError())

namespace masklens_bench {

// The ceiling: every 16-byte vector of p[0, n) loaded, four in flight per thread, nothing
// written unless a value that never occurs is met (which keeps the loads alive).
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
  if (acc == 0x9e3779b9u) *out = acc;
}

// Median milliseconds of `reps` launches on the legacy default stream (CUDA events), after
// one warm-up launch checked and synchronised.
template <class F>
float median_ms(int reps, F&& launch) {
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  launch();  // warm-up
  CHECK_LAUNCH();
  CHECK_CUDA(cudaDeviceSynchronize());
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

// device_scan's and device_tiles' command line: [out.jsonl | --json PATH] [--reps N]
// [--only SUBSTRING], and --sweep where the benchmark has one.
struct BenchOptions {
  FILE* json = nullptr;  // one JSON line per case, where asked
  int reps = 20;
  std::string only;  // run only cases whose name holds it
  bool sweep = false;

  bool wanted(const std::string& name) const { return only.empty() || name.find(only) != std::string::npos; }
};

// argv into `options`: 0 to go on, else the exit code, the usage line or the path that
// cannot be written said on stderr.
inline int parse_options(int argc, char** argv, BenchOptions& options, bool has_sweep) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--reps" && i + 1 < argc) {
      options.reps = std::max(1, std::atoi(argv[++i]));
    } else if (arg == "--sweep" && has_sweep) {
      options.sweep = true;
    } else if (arg == "--only" && i + 1 < argc) {
      options.only = argv[++i];
    } else if ((arg == "--json" && i + 1 < argc) || (arg[0] != '-' && options.json == nullptr)) {
      const char* path = arg == "--json" ? argv[++i] : argv[i];
      if ((options.json = std::fopen(path, "w")) == nullptr) {
        std::fprintf(stderr, "cannot write %s\n", path);
        return 1;
      }
    } else {
      std::fprintf(stderr, "usage: %s [out.jsonl | --json out.jsonl] [--reps N] [--only SUBSTRING]%s\n", argv[0],
                   has_sweep ? " [--sweep]" : "");
      return 2;
    }
  }
  return 0;
}

// The baseline on this device: plain_read of `bytes` bytes (a multiple of 16) at `data`,
// 8 blocks an SM, into a sink of its own.
struct PlainRead {
  unsigned* sink = nullptr;
  unsigned grid = 0;

  float ms(const void* data, std::int64_t bytes, int reps) const {
    return median_ms(reps, [&] { plain_read<<<grid, 256>>>(static_cast<const uint4*>(data), bytes / 16, sink); });
  }
};

// The baseline for device 0, after printing its line: name, SMs, architecture, CUDA
// driver and runtime, "median of `reps`", then `more`.
inline PlainRead open_device(int reps, const char* more) {
  PlainRead read;
  CHECK_CUDA(cudaMalloc(&read.sink, sizeof(unsigned)));
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  read.grid = static_cast<unsigned>(prop.multiProcessorCount) * 8;
  int driver = 0, runtime = 0;
  CHECK_CUDA(cudaDriverGetVersion(&driver));
  CHECK_CUDA(cudaRuntimeGetVersion(&runtime));
  std::printf("%s, %d SMs, sm_%d%d, CUDA driver %d, runtime %d; median of %d%s\n\n", prop.name,
              prop.multiProcessorCount, prop.major, prop.minor, driver, runtime, reps, more);
  return read;
}

// Frees the baseline's sink and closes the JSON lines: false, said on stderr, where
// writing them failed.
inline bool close_bench(PlainRead& read, BenchOptions& options) {
  CHECK_CUDA(cudaFree(read.sink));
  read.sink = nullptr;
  if (options.json && std::fclose(options.json) != 0) {
    std::fprintf(stderr, "writing the JSON lines failed\n");
    return false;
  }
  options.json = nullptr;
  return true;
}

}  // namespace masklens_bench
