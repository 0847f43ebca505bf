// Blocks of a kernel the device holds at once, asked once per (device, kernel, threads,
// shared memory) and kept: the grid of a pass whose blocks each take a share of the work
// (the tile scan's). Host code with the CUDA runtime, for the dispatch layers (nvcc).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>

namespace masklens::gpu::detail {

// Blocks of `kernel` the device holds at once (its SMs x the blocks an SM holds with
// `threads` threads and `smem` bytes of dynamic shared memory): the grid of a scan whose
// blocks each take a share of the units. The answer depends on nothing else, so each
// (device, kernel, threads, smem) is asked once: the attribute and occupancy queries cost
// microseconds of host time, spent before the scan's launch on every read.
template <class Kernel>
cudaError_t resident_blocks(Kernel kernel, int threads, std::size_t smem, std::int64_t& blocks) {
  // One entry per device, kernel and shared size met (the shared size follows the k
  // tiles: up to a few thousand over every mask width), looked up in O(log n).
  using Key = std::tuple<int, const void*, int, std::size_t>;
  static std::mutex mutex;
  static std::map<Key, std::int64_t> known;
  int device = 0, sms = 0, per_sm = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return e;
  const Key key{device, reinterpret_cast<const void*>(kernel), threads, smem};
  {
    const std::lock_guard<std::mutex> lock(mutex);
    if (const auto it = known.find(key); it != known.end()) {
      blocks = it->second;
      return cudaSuccess;
    }
  }
  e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem);
  blocks = static_cast<std::int64_t>(sms) * (per_sm > 0 ? per_sm : 1);
  if (e == cudaSuccess) {
    const std::lock_guard<std::mutex> lock(mutex);
    known.emplace(key, blocks);
  }
  return e;
}

}  // namespace masklens::gpu::detail
