// A stand-in for <cuda_runtime.h> with only what masklens/cuda/agent_scan.cuh,
// accumulators.cuh and tile_accumulator.cuh use (and cp.async, below), so that the host suite runs the device
// agent's per-row logic on the CPU (tests/test_agent_on_host.cpp,
// tests/test_tile_agent_on_host.cpp), one thread after another. Never on an include path
// with the real CUDA headers: only that test's program sees this directory.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <utility>
#include <vector>

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

// cp.async on the CPU (agent_scan.cuh's stage_vector, commit_staged, wait_staged), as
// late as PTX allows: a copy's source is read when it is issued, but its destination is
// written only when a wait lets its group land; a wait for at most P pending groups lands
// every group but the newest P, the least it promises. So a slot read before its group is
// waited for holds its old bytes, and a wrong wait count or a prologue of the wrong depth
// gives wrong keys. One thread at a time: the replay checks that a thread's row leaves no
// copy in flight (staged_copies_in_flight) and then forgets its groups, which on the
// device are complete or empty.
namespace cuda_host_shim {
struct StagedCopy {
  uint4* to;
  uint4 value;
};
inline std::deque<std::vector<StagedCopy>> committed_groups;  // oldest first
inline std::vector<StagedCopy> open_group;

inline void stage(uint4* to, const uint4* from) { open_group.push_back({to, __ldg(from)}); }
inline void commit() { committed_groups.push_back(std::exchange(open_group, {})); }
inline void wait(int pending) {
  while (committed_groups.size() > static_cast<std::size_t>(pending)) {
    for (const StagedCopy& c : committed_groups.front()) *c.to = c.value;
    committed_groups.pop_front();
  }
}
inline std::size_t staged_copies_in_flight() {
  std::size_t n = open_group.size();
  for (const auto& g : committed_groups) n += g.size();
  return n;
}
inline void forget_groups() {
  committed_groups.clear();
  open_group.clear();
}
}  // namespace cuda_host_shim
