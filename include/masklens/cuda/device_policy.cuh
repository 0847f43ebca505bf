// Which of tuning.cuh's policies the running device takes: its architecture (two host
// attribute reads), the tuned architecture at or below it, and a call with that policy as
// a type, for the dispatch layers' launches and gpu::load_kernels' loaders. Host code,
// nvcc only as the dispatch layers are (the CUDA runtime API, no kernels).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <iterator>
#include <type_traits>

#include "../status.hpp"
#include "check.cuh"
#include "tuning.cuh"

namespace masklens::gpu::detail {

// The current device's architecture as major * 100 + minor * 10 (900 for sm_90). Two
// host-side attribute reads: no stream work, so a graph capture is undisturbed.
inline cudaError_t current_arch(int& arch) {
  int device = 0, major = 0, minor = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  arch = major * 100 + minor * 10;
  return e;
}

// The first tuned architecture at or below `arch` (the oldest one if none is).
constexpr int tuned_arch(int arch) noexcept {
  for (const int tuned : kTunedArchs)
    if (tuned <= arch) return tuned;
  return kTunedArchs[sizeof kTunedArchs / sizeof kTunedArchs[0] - 1];
}

// f(std::type_identity<Policy>{}) with the Policy of Tuning<Esize, A> for the architecture
// A of kTunedArchs that tuned_arch(arch) picks, walking kTunedArchs at compile time: an
// architecture added to the table is covered without a change at the callers (the
// launches, and gpu::load_kernels' loaders, which so load what the launches launch).
template <template <int, int> class Tuning, int Esize, std::size_t I = 0, class F>
auto with_tuned_policy(int arch, F&& f) {
  constexpr int kTuned = kTunedArchs[I];
  if constexpr (I + 1 < std::size(kTunedArchs)) {
    if (tuned_arch(arch) != kTuned) return with_tuned_policy<Tuning, Esize, I + 1>(arch, f);
  }
  return f(std::type_identity<typename Tuning<Esize, kTuned>::Policy>{});
}

// load(std::type_identity<Policy>{}, std::integral_constant<int, Esize>{}) for every
// element size a view can have (1, 2, 4: what the launches switch on), each under the
// Policy of Tuning that the current device's architecture takes: the first failure, or
// the device query's (gpu::load_kernels' loaders of the scan and of the tile scan).
template <template <int, int> class Tuning, class Load>
Status load_for_current_arch(Load&& load) {
  int arch = 0;
  if (Status st = check(current_arch(arch), "cudaGetDevice / cudaDeviceGetAttribute(compute capability)"); !st.ok())
    return st;
  const auto each = [&](auto esize) {
    return with_tuned_policy<Tuning, decltype(esize)::value>(arch, [&](auto policy) { return load(policy, esize); });
  };
  Status st = each(std::integral_constant<int, 1>{});
  if (st.ok()) st = each(std::integral_constant<int, 2>{});
  if (st.ok()) st = each(std::integral_constant<int, 4>{});
  return st;
}

}  // namespace masklens::gpu::detail
