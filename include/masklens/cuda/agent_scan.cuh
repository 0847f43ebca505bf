// The device scanner's agent: one thread's share of one row, as CUB's agents hold the
// per-tile work of an algorithm. It reads the row (16-byte loads between a scalar head
// and tail when the key stride is 1, one element at a time otherwise), classifies what
// it reads, and feeds an accumulator (accumulators.cuh); the kernels that reduce the
// threads' accumulators and the launch live in dispatch_scan.cuh. nvcc only, with one
// exception: the host suite runs the agent on the CPU through a stand-in for the few
// CUDA builtins it uses (uint4, __ldg, __popc, __ffs, __clz, __activemask, __all_sync;
// tests/test_agent_on_host.cpp), so a builtin added here is added there too.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "../additive_bits.hpp"
#include "../element.hpp"
#include "../mask_view.hpp"
#include "accumulators.cuh"
#include "scan.hpp"

namespace masklens::gpu::detail {

// What a kernel needs of a view: plain values, strides in bytes.
struct ScanParams {
  const std::uint8_t* data;
  std::int64_t stride_bytes[4];
  std::int64_t distinct_heads;  // heads scanned per batch: 1 when the head stride is 0
  std::int64_t q_len;
  std::int64_t k_len;
  std::int64_t rows;  // distinct slices x q_len
  Polarity polarity;  // 1-byte masks
  AdditiveBits bits;  // 2- and 4-byte masks: the threshold and the specials as bit patterns
};

// The kernel's parameters for a view (validated by MaskView::make): byte strides, the
// distinct slices only, the additive threshold as bits computed by the host's decoders.
inline ScanParams scan_params(const MaskView& view) noexcept {
  ScanParams s{};
  s.data = static_cast<const std::uint8_t*>(view.data());
  for (int d = 0; d < kMaxDims; ++d) s.stride_bytes[d] = view.stride(d) * element_size(view.dtype());
  s.distinct_heads = view.stride(kHeads) == 0 ? 1 : view.heads();
  s.q_len = view.q_len();
  s.k_len = view.k_len();
  s.rows = span_rows(view);
  s.polarity = view.encoding().polarity;
  s.bits = additive_bits(view.dtype(), view.encoding().masked_threshold);
  return s;
}

// Asynchronous 16-byte copies from global into shared memory (cp.async.cg: L2 only, as a
// stream read wants), committed in groups and waited for by count, for a warp's ring of
// staged batches (ScanPolicy::kStagedBatches). Each thread waits for its own copies and
// reads back only what it copied, so no barrier is needed. Before sm_80 (no cp.async) the
// copy is a load and a store; on the host (the agent's replay through the stand-in for
// the CUDA headers, the only host compiler that sees this file) the stand-in's copies,
// which land as late as a wait allows.
__device__ __forceinline__ void stage_vector(uint4* to, const uint4* from) {
#if !defined(__CUDACC__)
  cuda_host_shim::stage(to, from);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(static_cast<unsigned>(__cvta_generic_to_shared(to))),
               "l"(from)
               : "memory");
#elif defined(__CUDA_ARCH__)
  *to = __ldg(from);
#endif
}
__device__ __forceinline__ void commit_staged() {
#if !defined(__CUDACC__)
  cuda_host_shim::commit();
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
// Waits until at most `Pending` of this thread's committed groups are still in flight.
template <int Pending>
__device__ __forceinline__ void wait_staged() {
#if !defined(__CUDACC__)
  cuda_host_shim::wait(Pending);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;" ::"n"(Pending) : "memory");
#endif
}

// Vector j of slot `slot` of lane `lane` in a warp's ring of batches of `in_flight`
// vectors: a lane's vectors 32 apart, so that a warp's 32 lanes reading vector j of one
// slot read 512 consecutive bytes (no bank conflict beyond a 16-byte load's four
// wavefronts), and no two (lane, slot, j) share a vector.
__device__ __forceinline__ constexpr int ring_vector(int lane, int slot, int j, int in_flight) {
  return (slot * in_flight + j) * 32 + lane;
}

// 0x80 in every byte of w that attends (invert = 0x80808080 for true_masks).
__device__ __forceinline__ std::uint32_t attending_bytes(std::uint32_t w, std::uint32_t invert) {
  return ((((w & 0x7f7f7f7fu) + 0x7f7f7f7fu) | w) & 0x80808080u) ^ invert;
}

// How a thread reads its elements, per element size: bytes against the polarity, or
// additive values through the lane classifier the host scanner uses too.
template <int Esize>
struct ElementReader {
  using Lanes = AdditiveLanes<Esize, std::uint32_t>;
  static constexpr int kLanes = Lanes::kLanes;
  Lanes lanes;
  // Masks repeat one masked value: once this thread has classified a vector of it
  // (four equal words, no lane attending), the flags are in its accumulator and equal
  // vectors add nothing. 0 is never such a word (all-zero vectors attend and are taken
  // first), so 0 means "none yet". Per row: a new accumulator has none of the flags.
  std::uint32_t known_masked = 0;

  __device__ explicit ElementReader(const ScanParams& s) : lanes(s.bits) {}

  template <class Acc>
  __device__ __forceinline__ void element(Acc& acc, const std::uint8_t* p, std::int64_t k, const ScanParams& s) const {
    std::uint32_t v;
    if constexpr (Esize == 2) v = *reinterpret_cast<const std::uint16_t*>(p);
    else v = *reinterpret_cast<const std::uint32_t*>(p);
    const ElementClass c = classify_bits(v, s.bits);
    if (attends(c)) acc.add_run(k, 1);
    acc.add_flags(row_flag(c));
  }

  // Whether vector() would add nothing for any of these vectors: each is four words of
  // the masked value this thread already knows.
  template <int N>
  __device__ __forceinline__ bool adds_nothing(const uint4 (&x)[N]) const {
    bool same = known_masked != 0;
    MASKLENS_UNROLL
    for (int j = 0; j < N; ++j)
      same = same && x[j].x == known_masked && x[j].y == known_masked && x[j].z == known_masked &&
             x[j].w == known_masked;
    return same;
  }

  template <class Acc>
  __device__ __forceinline__ void vector(Acc& acc, const uint4& v, std::int64_t k0) {
    if ((v.x | v.y | v.z | v.w) == 0) {  // every lane +0: all attend
      acc.add_run(k0, kLanes);
      return;
    }
    if (v.x == known_masked && v.y == known_masked && v.z == known_masked && v.w == known_masked) return;
    const std::uint32_t words[4] = {v.x, v.y, v.z, v.w};
    const VectorClass c = lanes.classify(words);
    acc.add(c.attend, k0);
    acc.add_flags(c.flags);
    if (c.attend == 0 && v.x == v.y && v.x == v.z && v.x == v.w) known_masked = v.x;
  }
};

template <>
struct ElementReader<1> {
  static constexpr int kLanes = 16;
  std::uint32_t invert;  // 0x80808080 where true masks

  __device__ explicit ElementReader(const ScanParams& s)
      : invert(s.polarity == Polarity::true_attends ? 0u : 0x80808080u) {}

  template <class Acc>
  __device__ __forceinline__ void element(Acc& acc, const std::uint8_t* p, std::int64_t k, const ScanParams&) const {
    if ((*p != 0) == (invert == 0)) acc.add_run(k, 1);
  }

  // Whether vector() would add nothing for any of these vectors: where true attends, a
  // batch of zero bytes (most of a structured mask's) costs one OR a word instead of a
  // SWAR test each; where true masks, it is left to vector().
  template <int N>
  __device__ __forceinline__ bool adds_nothing(const uint4 (&x)[N]) const {
    if (invert != 0) return false;
    std::uint32_t any = 0;
    MASKLENS_UNROLL
    for (int j = 0; j < N; ++j) any |= x[j].x | x[j].y | x[j].z | x[j].w;
    return any == 0;
  }

  // Four 32-bit SWAR tests; a vector that attends everywhere or nowhere (most of a
  // structured mask) needs no bit gathering.
  template <class Acc>
  __device__ __forceinline__ void vector(Acc& acc, const uint4& v, std::int64_t k0) const {
    // Where true attends, a vector of zero bytes attends nowhere: one OR, not four SWAR
    // tests (the lanes that leave here are the ones the test below would let go).
    if (invert == 0 && (v.x | v.y | v.z | v.w) == 0) return;
    const std::uint32_t m0 = attending_bytes(v.x, invert), m1 = attending_bytes(v.y, invert),
                        m2 = attending_bytes(v.z, invert), m3 = attending_bytes(v.w, invert);
    if ((m0 | m1 | m2 | m3) == 0) return;
    if ((m0 & m1 & m2 & m3) == 0x80808080u) {
      acc.add_run(k0, 16);
      return;
    }
    acc.add(lanes::gather_tops<std::uint32_t, 8>(m0) | lanes::gather_tops<std::uint32_t, 8>(m1) << 4 |
                lanes::gather_tops<std::uint32_t, 8>(m2) << 8 | lanes::gather_tops<std::uint32_t, 8>(m3) << 12,
            k0);
  }
};

// One thread's share of a row: the thread is `lane` of the ThreadsPerRow threads (a
// warp, or a block) that read the row together.
template <class Policy, int Esize, RowAccumulator Accumulator, int ThreadsPerRow>
struct AgentScanRow {
  const ScanParams& s;
  const ElementReader<Esize> fresh_reader;  // built once per kernel: its constants are the view's
  // The reading warp's ring of Policy::kStagedBatches batches in shared memory
  // (Policy::kStageBytesPerWarp, 16-byte aligned); unused where the policy stages none.
  // A kernel with a staging policy gives each warp its own (the tile scan's warp_ring).
  uint4* const ring;

  __device__ explicit AgentScanRow(const ScanParams& params, uint4* warp_ring = nullptr)
      : s(params), fresh_reader(params), ring(warp_ring) {}

  // The first byte of row q of distinct slice `slice`.
  __device__ __forceinline__ const std::uint8_t* row_address(std::int64_t slice, std::int64_t q) const {
    const std::int64_t b = slice / s.distinct_heads, h = slice - b * s.distinct_heads;
    return s.data + b * s.stride_bytes[0] + h * s.stride_bytes[1] + q * s.stride_bytes[2];
  }

  // Row r's keys this thread reads, added to `acc` (a fresh accumulator: A{}, or one
  // the kernel set up, as a tile accumulator with its block's counters).
  __device__ Accumulator scan(std::int64_t r, int lane, Accumulator acc = Accumulator{}) const {
    const std::int64_t slice = r / s.q_len;
    return scan_at(row_address(slice, r - slice * s.q_len), lane, acc);
  }

  // The same for the row at `row` (row_address): a kernel that walks a slice's rows
  // steps from one to the next without the divisions scan() takes.
  __device__ Accumulator scan_at(const std::uint8_t* row, int lane, Accumulator acc = Accumulator{}) const {
    ElementReader<Esize> reader = fresh_reader;  // nothing known of this row yet
    if (s.stride_bytes[3] != Esize) {
      for (std::int64_t k = lane; k < s.k_len; k += ThreadsPerRow)
        reader.element(acc, row + k * s.stride_bytes[3], k, s);
      return acc;
    }
    // Up to the first 16-byte boundary one element at a time, then whole vectors, then
    // the tail: any base address aligned to the element size works.
    const RowVectors vectors = vectors_of(row);
    const std::int64_t head = vectors.head, n_vec = vectors.count;
    for (std::int64_t k = lane; k < head; k += ThreadsPerRow) reader.element(acc, row + k * Esize, k, s);
    const uint4* vec = vectors.first;
    constexpr int kInFlight = Policy::kVectorsInFlight;
    std::int64_t v = lane;
    if constexpr (Policy::kStagedBatches > 0) {
      static_assert(ThreadsPerRow == 32, "a ring is a warp's");
      v = scan_staged(reader, acc, vectors, lane);
    } else {
      for (; v + (kInFlight - 1) * ThreadsPerRow < n_vec; v += kInFlight * ThreadsPerRow) {
        uint4 x[kInFlight];
        MASKLENS_UNROLL
        for (int j = 0; j < kInFlight; ++j) x[j] = __ldg(vec + v + j * ThreadsPerRow);
        classify_batch(reader, acc, x, head, v);
      }
    }
    for (; v < n_vec; v += ThreadsPerRow) reader.vector(acc, __ldg(vec + v), head + v * kPerVector);
    for (std::int64_t k = head + n_vec * kPerVector + lane; k < s.k_len; k += ThreadsPerRow)
      reader.element(acc, row + k * Esize, k, s);
    return acc;
  }

 private:
  static constexpr std::int64_t kPerVector = 16 / Esize;

  // The batch x of vectors v, v + ThreadsPerRow, ... (key head + vector * kPerVector).
  __device__ __forceinline__ static void classify_batch(ElementReader<Esize>& reader, Accumulator& acc,
                                                        const uint4 (&x)[Policy::kVectorsInFlight], std::int64_t head,
                                                        std::int64_t v) {
    // Skipped where every lane reading along has nothing here (Policy::kSkipMaskedBatches):
    // one lane alone skipping would leave the others' work as long and add a divergent
    // branch (a block-sparse mask's scattered blocks: a per-vector test measured 1.29x
    // a read for the tile scan against 1.20x with the vote). Skipping is right lane by
    // lane, so the vote may be over whichever lanes run together.
    if constexpr (Policy::kSkipMaskedBatches)
      if (__all_sync(__activemask(), reader.adds_nothing(x))) return;
    MASKLENS_UNROLL
    for (int j = 0; j < Policy::kVectorsInFlight; ++j)
      reader.vector(acc, x[j], head + (v + j * ThreadsPerRow) * kPerVector);
  }

  // A row's 16-byte vectors: those past its first `head` elements (up to the first 16-byte
  // boundary), `count` of them, then the tail's elements.
  struct RowVectors {
    const uint4* first;
    std::int64_t head, count;
  };
  __device__ __forceinline__ RowVectors vectors_of(const std::uint8_t* row) const {
    const auto misalign = static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(row) & 15);
    std::int64_t head = misalign ? (16 - misalign) / Esize : 0;
    head = head < s.k_len ? head : s.k_len;
    return {reinterpret_cast<const uint4*>(row + head * Esize), head, (s.k_len - head) / kPerVector};
  }

  // The whole batches this lane reads of `count` vectors: batch b is whole where its last
  // vector, lane + b * kBatch + (kInFlight - 1) * 32, is in the row.
  __device__ __forceinline__ static std::int64_t whole_batches(std::int64_t count, int lane) {
    constexpr std::int64_t kBatch = std::int64_t{Policy::kVectorsInFlight} * ThreadsPerRow;
    const std::int64_t last_offset = lane + (Policy::kVectorsInFlight - 1) * ThreadsPerRow;
    return count > last_offset ? (count - last_offset + kBatch - 1) / kBatch : 0;
  }

  // The whole batches of the row's vectors this lane reads, through the warp's ring of S
  // batches: batch b + S - 1 is copied into the ring (slot (b + S - 1) % S) before batch b
  // is classified, so S - 1 batches stay in flight while the warp classifies one (with
  // loads into registers none are). Batch b's copies are this lane's own, waited for by
  // count (wait_staged: every step commits a group, empty past the lane's last batch, so
  // that the count stays S - 1), and its slot is copied into again only after the lane
  // has read it back into registers (the vote and the classification depend on those
  // reads). Each row starts the ring afresh: nothing is in flight when it returns.
  // Returns the next vector this lane reads past its last whole batch (as the loop of
  // registers leaves v).
  __device__ __forceinline__ std::int64_t scan_staged(ElementReader<Esize>& reader, Accumulator& acc,
                                                      const RowVectors& vectors, int lane) const {
    constexpr int kStages = Policy::kStagedBatches, kInFlight = Policy::kVectorsInFlight;
    constexpr std::int64_t kBatch = std::int64_t{kInFlight} * ThreadsPerRow;
    const std::int64_t batches = whole_batches(vectors.count, lane);
    const uint4* const from = vectors.first + lane;
    std::int64_t issued = 0;
    int fill = 0, drain = 0;  // the slots copied into and read next
    const auto issue = [&] {
      if (issued < batches) {
        MASKLENS_UNROLL
        for (int j = 0; j < kInFlight; ++j)
          stage_vector(ring + ring_vector(lane, fill, j, kInFlight), from + issued * kBatch + j * ThreadsPerRow);
      }
      commit_staged();
      ++issued;
      fill = fill + 1 == kStages ? 0 : fill + 1;
    };
    MASKLENS_UNROLL
    for (int p = 0; p < kStages - 1; ++p) issue();
    for (std::int64_t b = 0; b < batches; ++b) {
      issue();
      wait_staged<kStages - 1>();
      uint4 x[kInFlight];
      MASKLENS_UNROLL
      for (int j = 0; j < kInFlight; ++j) x[j] = ring[ring_vector(lane, drain, j, kInFlight)];
      drain = drain + 1 == kStages ? 0 : drain + 1;
      classify_batch(reader, acc, x, vectors.head, lane + b * kBatch);
    }
    return lane + batches * kBatch;
  }
};

}  // namespace masklens::gpu::detail
