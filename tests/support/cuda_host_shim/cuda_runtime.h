// A stand-in for <cuda_runtime.h> with only what masklens/cuda/agent_scan.cuh,
// accumulators.cuh and tile_accumulator.cuh use, so that the host suite runs the device
// agent's per-row logic on the CPU (tests/test_agent_on_host.cpp,
// tests/test_tile_agent_on_host.cpp), one thread after another. Never on an include path
// with the real CUDA headers: only that test's program sees this directory.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>

#define __device__
#define __forceinline__ inline

struct uint4 {
  unsigned x, y, z, w;
};

inline uint4 __ldg(const uint4* p) {  // the bytes, whatever type wrote them
  uint4 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline int __popc(unsigned x) { return std::popcount(x); }
inline int __ffs(int x) { return x == 0 ? 0 : std::countr_zero(static_cast<unsigned>(x)) + 1; }
inline int __clz(int x) { return std::countl_zero(static_cast<unsigned>(x)); }
// One thread at a time on the CPU: a vote of one, and a plain add is the atomic one.
inline unsigned __activemask() { return 1u; }
inline int __all_sync(unsigned, int predicate) { return predicate; }
inline unsigned atomicAdd(unsigned* p, unsigned v) {
  const unsigned old = *p;
  *p = old + v;
  return old;
}
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  const unsigned long long old = *p;
  *p = old + v;
  return old;
}
