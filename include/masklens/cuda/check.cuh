// CUDA runtime results as a Status naming the call, for the translation units that call
// the runtime themselves: src/scan.cu, runs.cu, tiles.cu and the Python extension
// (python/src/cuda.cpp).
// It needs only the CUDA runtime API header, so a host compiler builds it as well as
// nvcc; a program without the CUDA toolkit never includes it (cuda/scan.hpp does not).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <initializer_list>
#include <string>
#include <utility>

#include "../status.hpp"

namespace masklens::gpu::detail {

// "cudaMallocAsync(spans): cudaErrorMemoryAllocation: out of memory". It reads only
// the result it is given: the CUDA "last error" stays the caller's.
inline Status check(cudaError_t e, const char* call) {
  if (e == cudaSuccess) return {};
  return error(ErrorCode::device_error, std::string(call) + ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

// cudaMallocAsync of `bytes` into *p on `stream`, checked. *p is null on failure
// (cudaMallocAsync leaves it unspecified), so that a cleanup frees only what was made.
inline Status allocate(void** p, std::size_t bytes, cudaStream_t stream, const char* call) {
  Status st = check(cudaMallocAsync(p, bytes, stream), call);
  if (!st.ok()) *p = nullptr;
  return st;
}

// Loads `kernel` (a __global__ function's address) on the current device, or says why
// it could not: "cudaFuncGetAttributes(scan_rows_warp_kernel, 2-byte elements): ...".
// Under CUDA's lazy loading (the default since CUDA 12.2) a kernel is loaded at its first
// launch; querying its attributes loads it now (the CUDA programming guide's Lazy Loading
// section names this call for it). A kernel already loaded answers from what the runtime
// holds, so a second call is cheap. gpu::load_kernels() and its parts call this.
inline Status load_kernel(const void* kernel, const std::string& name) {
  cudaFuncAttributes attributes{};
  const cudaError_t e = cudaFuncGetAttributes(&attributes, kernel);
  if (e == cudaSuccess) return {};
  return error(ErrorCode::device_error,
               "cudaFuncGetAttributes(" + name + "): " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

// Each kernel in turn, named (a kernel's address and what the error calls it); the first
// failure is the answer.
inline Status load_kernels_named(std::initializer_list<std::pair<const void*, std::string>> kernels) {
  for (const auto& [kernel, name] : kernels)
    if (Status st = load_kernel(kernel, name); !st.ok()) return st;
  return {};
}

// The first failure is the answer; a later one (a cleanup after it) is added to its
// message, so the caller learns of a free or a synchronisation that failed as well.
inline void keep_first(Status& first, Status next) {
  if (next.ok()) return;
  if (first.ok()) first = std::move(next);
  else first = Status(first.code(), first.message() + "; then " + next.message());
}

}  // namespace masklens::gpu::detail
