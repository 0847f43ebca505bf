// Programmatic dependent launch (sm_90 and newer): a kernel launched with programmatic
// stream serialisation may start while the kernel before it on the stream still runs,
// and waits where it first needs that kernel's results. The tile pass chains its three
// kernels so (dispatch_tiles.cuh): the scan's blocks start reading the mask while the
// counts are zeroed and wait only before their first add into them; the BlockMask
// writer's blocks are launched while the scan's last blocks drain and wait before reading
// the counts. What it saves is the gap between kernels: a launch's latency and the drain
// of the kernel before (bench/device_tiles.cu --sweep times the pass both ways).
//
// The rules, from the CUDA programming guide's "Programmatic Dependent Launch":
// - a dependent kernel is launched once every block of the kernel before has called
//   launch_dependents() or exited, so every block of the kernel before is resident (or
//   done) by then: the dependent's blocks never take the place of one that has to run;
// - wait_for_previous_kernel() returns once the kernel before has completed and its
//   writes are visible; a kernel that never calls it must not read what that kernel
//   writes, nor write what it reads. The kernel before may itself have started early:
//   a chained kernel that is followed by another waits before it exits, on every path,
//   so that "completed" covers everything before it on the stream;
// - the first kernel of a chain is launched as usual (after everything earlier on the
//   stream completed), so the mask and everything earlier is readable at once.
// Below sm_90 the device functions compile to nothing. Whether a launch is chained is
// decided by the code the device runs, not by the device alone: a kernel built for an
// older architecture (its PTX compiled for sm_90 at load time) has no waits, and is
// launched plainly (chains_launches below).
// nvcc only.
#pragma once

#include <cuda_runtime.h>

#include <atomic>

namespace masklens::gpu::detail {

// The oldest architecture (major * 100 + minor * 10) that chains launches.
inline constexpr int kDependentLaunchArch = 900;

// Blocks until the kernel before on the stream has completed and its writes are visible
// (a no-op where this kernel was launched plainly: the stream already ordered it).
__device__ __forceinline__ void wait_for_previous_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the next kernel on the stream, if launched chained, start launching now: it
// waits itself before reading this kernel's results.
__device__ __forceinline__ void launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

// Whether kernels compiled beside `kernel` (one translation unit, one set of
// architectures) may be chained on the current device: the code it runs there was
// compiled from sm_90 or newer (cudaFuncAttributes::ptxVersion; a binary for sm_80 run
// through its PTX on an H200 reads 80) and the device is sm_90 or newer. Cached per
// device and kernel by the caller; an attribute query, no stream work.
template <class Kernel>
cudaError_t chains_launches(Kernel kernel, bool& chained) {
  cudaFuncAttributes attributes{};
  const cudaError_t e = cudaFuncGetAttributes(&attributes, reinterpret_cast<const void*>(kernel));
  chained = e == cudaSuccess && attributes.ptxVersion * 10 >= kDependentLaunchArch &&
            attributes.binaryVersion * 10 >= kDependentLaunchArch;
  return e;
}

// chains_launches(Kernel) on the current device, asked once per device and kept (an
// attribute query costs microseconds of host time, spent before a pass's launches on
// every read). Kernel stands for the kernels compiled beside it, as chains_launches says.
template <auto Kernel>
cudaError_t chains_launches_on_current_device(bool& chained) {
  constexpr int kDevices = 64;  // devices past this are asked each time
  static std::atomic<signed char> known[kDevices] = {};  // 0 unknown, 1 no, 2 yes
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  if (device < kDevices && known[device].load(std::memory_order_relaxed) != 0) {
    chained = known[device].load(std::memory_order_relaxed) == 2;
    return cudaSuccess;
  }
  const cudaError_t e = chains_launches(Kernel, chained);
  if (e == cudaSuccess && device < kDevices) known[device].store(chained ? 2 : 1, std::memory_order_relaxed);
  return e;
}

// Sets `config` (with `attribute` as its storage) to launch chained when `chained`.
inline void chain_launch(cudaLaunchConfig_t& config, cudaLaunchAttribute& attribute, bool chained) {
  if (!chained) return;
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
}

}  // namespace masklens::gpu::detail
