// What the device scanner accumulates while it reads a row: the agent (agent_scan.cuh)
// is templated on it, so one pass over the mask can produce other per-row results
// (per-tile summaries of a block-sparse mask, say) beside or instead of the RowSpan.
// nvcc only.
//
// The RowAccumulator concept. Each thread owns one accumulator per row it takes part
// in; the agent feeds it the thread's keys in increasing order, then the threads'
// accumulators of the row are merged (CUB WarpReduce / BlockReduce) and one thread
// stores the result:
//   A{}                  init: nothing seen
//   a.add(bits, k0)      keys k0 + i attend, for every set bit i of `bits` (a 16-byte
//                        vector's lanes: up to 16); keys rise across calls of one thread
//   a.add_run(k0, n)     keys k0 .. k0 + n - 1 all attend (a whole vector, or one key)
//   a.add_flags(f)       RowFlag bits of elements seen (bias, finite masked, invalid)
//   A::merge(a, b)       the accumulator of both threads' keys; associative and
//                        commutative (the reductions merge in any order)
//   a.store(out, row)    writes row `row`'s result into `out` (an A::Output*)
// A must be trivially copyable (the reductions move it through shared memory).
#pragma once

#include <concepts>
#include <cstdint>
#include <type_traits>

#include "../row_span.hpp"

namespace masklens::gpu::detail {

template <class A>
concept RowAccumulator =
    std::default_initializable<A> && std::is_trivially_copyable_v<A> &&
    requires(A a, const A c, std::uint32_t bits, std::int64_t k, int n, typename A::Output* out) {
      a.add(bits, k);
      a.add_run(k, n);
      a.add_flags(bits);
      { A::merge(c, c) } -> std::same_as<A>;
      c.store(out, k);
    };

// The RowSpan of a row: first and last attending key, how many, and the flags.
struct SpanAccumulator {
  using Output = RowSpan;
  RowSpan span;

  __device__ __forceinline__ void add(std::uint32_t bits, std::int64_t k0) {
    if (bits == 0) return;
    if (span.count == 0) span.first = k0 + (__ffs(static_cast<int>(bits)) - 1);
    span.last = k0 + (31 - __clz(static_cast<int>(bits)));  // keys rise: the latest vector holds the last key
    span.count += __popc(bits);
  }
  __device__ __forceinline__ void add_run(std::int64_t k0, int n) {
    if (span.count == 0) span.first = k0;
    span.last = k0 + n - 1;
    span.count += n;
  }
  __device__ __forceinline__ void add_flags(std::uint32_t f) { span.flags |= f; }
  __device__ __forceinline__ static SpanAccumulator merge(const SpanAccumulator& a, const SpanAccumulator& b) {
    return SpanAccumulator{masklens::merge(a.span, b.span)};
  }
  // All 32 bytes, padding included (RowSpan::reserved is 0): copying the spans to the
  // host reads no uninitialised memory.
  __device__ __forceinline__ void store(RowSpan* out, std::int64_t row) const { out[row] = span; }
};

static_assert(RowAccumulator<SpanAccumulator>);

// A::merge as the operator CUB's BlockReduce / WarpReduce take.
template <class Accumulator>
struct MergeAccumulators {
  __device__ __forceinline__ Accumulator operator()(const Accumulator& a, const Accumulator& b) const {
    return Accumulator::merge(a, b);
  }
};

}  // namespace masklens::gpu::detail
