// The accumulator of a pass that counts tiles beside the row spans (accumulators.cuh
// has the RowAccumulator concept): a RowSpan as SpanAccumulator keeps it, and every
// attending key added to its k tile's counter as it is seen, so one read of the mask
// gives the spans and the per-tile counts (agent_tile_scan.cuh reduces the spans and
// flushes the counters; tile_plan.hpp says where the counters are). A row that is one
// interval needs no per-key counting: the kernel reads it with the plain SpanAccumulator
// and its lanes add the tiles' counts from the span's bounds (TileSink::add_interval).
// nvcc only, with the exception agent_scan.cuh has: the host suite runs it on the CPU
// through the stand-in for the CUDA builtins (tests/test_tile_agent_on_host.cpp), which
// has atomicAdd too.
#pragma once

#include <cstdint>

#include "accumulators.cuh"
#include "tile_plan.hpp"

namespace masklens::gpu::detail {

// Where one thread's attending keys go, per k tile: `counts` is this thread's copy of
// k tile 0's counter and k tile kt's is counts[kt << copy_shift] — the block's 32-bit
// counters in shared memory (Count = unsigned), or the q tile's 64-bit counts in global
// memory with one copy (Count = unsigned long long). Atomic adds: the copies are shared
// by the warps of a block, the global counts by every block of the q tile.
template <class Count>
struct TileSink {
  Count* counts = nullptr;
  int copy_shift = 0;
  KeyTileDivider keys;

  // n <= keys.divisor, which a 32-bit counter holds where the counters are 32-bit
  // (plan_tile_scan).
  __device__ __forceinline__ void count(std::int64_t kt, std::int64_t n) const {
    atomicAdd(counts + (kt << copy_shift), static_cast<Count>(n));
  }

  // Keys k0 + i for the set bits i of `bits` (nonzero; lanes below 32): the bits of
  // each k tile the keys cross are counted together (one tile, or two where a vector
  // crosses a tile boundary, unless tiles are narrower than a vector).
  __device__ __forceinline__ void add(std::uint32_t bits, std::int64_t k0) const {
    std::int64_t kt = keys.tile_of(k0);
    std::int64_t room = (kt + 1) * keys.divisor - k0;  // lanes before the next k tile
    for (;;) {
      const std::uint32_t part = room >= 32 ? bits : bits & ((1u << room) - 1u);
      if (part != 0) count(kt, __popc(part));
      bits ^= part;
      if (bits == 0) return;
      ++kt;
      room += keys.divisor;
    }
  }

  // Keys k0 .. k0 + n - 1 (n >= 1).
  __device__ __forceinline__ void add_run(std::int64_t k0, int n) const {
    std::int64_t kt = keys.tile_of(k0);
    std::int64_t room = (kt + 1) * keys.divisor - k0;
    for (;;) {
      const int part = room >= n ? n : static_cast<int>(room);
      count(kt, part);
      n -= part;
      if (n == 0) return;
      ++kt;
      room = keys.divisor;
    }
  }

  // Keys first .. first + n - 1 (n >= 1) of a row that is one interval, its k tiles
  // shared among `lanes` threads, this one `lane` (< lanes): tiles t0 + lane, t0 + lane +
  // lanes, ... each get their overlap with the interval. A row of 32768 keys at 128 is
  // 8 adds a lane of a warp, where counting it vector by vector is 64.
  __device__ __forceinline__ void add_interval(std::int64_t first, std::int64_t n, int lane, int lanes) const {
    const std::int64_t end = first + n, last_tile = keys.tile_of(end - 1);
    for (std::int64_t kt = keys.tile_of(first) + lane; kt <= last_tile; kt += lanes) {
      const std::int64_t lo = kt * keys.divisor, hi = lo + keys.divisor;
      count(kt, (hi < end ? hi : end) - (lo > first ? lo : first));
    }
  }
};

// The RowSpan of a row and its attending keys per k tile. The spans merge as
// SpanAccumulator's (the kernels reduce only `spans`); the counts are already in the
// counters, so a merge keeps the first sink. A{} has no sink: the kernels hand the agent
// one with the block's counters (AgentScanRow::scan's `init`).
template <class Count>
struct SpanTileAccumulator {
  using Output = RowSpan;
  SpanAccumulator spans;
  TileSink<Count> tiles;

  __device__ __forceinline__ void add(std::uint32_t bits, std::int64_t k0) {
    if (bits == 0) return;
    spans.add(bits, k0);
    tiles.add(bits, k0);
  }
  __device__ __forceinline__ void add_run(std::int64_t k0, int n) {
    spans.add_run(k0, n);
    tiles.add_run(k0, n);
  }
  __device__ __forceinline__ void add_flags(std::uint32_t f) { spans.add_flags(f); }
  __device__ __forceinline__ static SpanTileAccumulator merge(const SpanTileAccumulator& a,
                                                              const SpanTileAccumulator& b) {
    return SpanTileAccumulator{SpanAccumulator::merge(a.spans, b.spans), a.tiles};
  }
  __device__ __forceinline__ void store(RowSpan* out, std::int64_t row) const { spans.store(out, row); }
};

static_assert(RowAccumulator<SpanTileAccumulator<unsigned>>);
static_assert(RowAccumulator<SpanTileAccumulator<unsigned long long>>);

}  // namespace masklens::gpu::detail
