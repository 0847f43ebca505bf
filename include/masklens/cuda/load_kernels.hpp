// masklens::gpu::load_kernels() — every kernel the device entry points can launch,
// loaded on the current device at a moment the program chooses (start-up), for any C++20
// compiler.
//
// Why: CUDA loads a kernel at its first launch (lazy loading, the default since CUDA
// 12.2), so the process's first scan also pays for loading the scanner's kernels
// (0.7–1.0 ms on an H200, bench/README.md's device_step). CUDA_MODULE_LOADING=EAGER moves
// that to start-up for every library of the process; this moves only masklens' kernels,
// and a framework can call it once its CUDA context exists. Each kernel is loaded by
// asking for its attributes (cudaFuncGetAttributes), which the CUDA programming guide's
// Lazy Loading section names as a way to force a kernel's loading.
//
// The parts are defined beside their kernels' dispatch, each with its "built without
// CUDA" stub, and declared in the pass's header: one a pass of device_passes.def
// (load_scan_kernels() in src/scan.cu, load_tile_kernels() in src/tiles.cu, ...). So a
// program that calls load_kernels() links every pass, as Meson's masklens_cuda_dep and
// CMake's masklens_CUDA_SOURCES do; one that compiles only scan.cu calls
// load_scan_kernels().
#pragma once

#include "../status.hpp"
#include "scan.hpp"

namespace masklens::gpu {

// Each pass's loader, as its header declares it.
#define MASKLENS_DEVICE_PASS(pass, loader) [[nodiscard]] Status loader();
#include "device_passes.def"
#undef MASKLENS_DEVICE_PASS

// Loads, on the current device, every kernel masklens' device entry points can launch
// there: the scan (every element size, the tuning policy this device's architecture
// takes, a block and a warp per row), the run reduction's four kernels, the tile scan
// (counters in shared memory and in the 64-bit counts), the BlockMask writer (states
// from the scan's counts, and states given) and a definition's table reader. Nothing is enqueued on any stream and
// nothing is allocated; it creates the device's primary context if there is none. The
// first failure comes back as device_error naming what failed ("cudaFuncGetAttributes
// (scan_rows_block_kernel, 1-byte elements): cudaErrorNoKernelImageForDevice: ...": a
// device outside -Dgpu_archs) and the rest is not tried; without CUDA, "masklens was
// built without CUDA". Idempotent: a second call finds every kernel loaded and only
// queries their attributes again (bench/device_step --preload times both calls). Like
// every entry point it neither reads nor clears the caller's CUDA "last error" (a failing
// call records its error there, as any failing runtime call does).
[[nodiscard]] inline Status load_kernels() {
#define MASKLENS_DEVICE_PASS(pass, loader) \
  if (Status st = loader(); !st.ok()) return st;
#include "device_passes.def"
#undef MASKLENS_DEVICE_PASS
  return Status();
}

}  // namespace masklens::gpu
