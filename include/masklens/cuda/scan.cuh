// masklens::gpu — the device scanner's kernels: MaskView (device memory) -> RowSpans in
// one pass at memory bandwidth. Same result as the host scanner (scan.hpp) for every
// element type, polarity, shape and stride the view accepts; the classification rules
// stay in classify.hpp. nvcc only. The entry points are declared for any compiler in
// scan.hpp and defined in scan.cu, the one translation unit that launches these.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <cub/block/block_reduce.cuh>
#include <cub/warp/warp_reduce.cuh>

#include "../additive_bits.hpp"
#include "../element.hpp"
#include "../mask_view.hpp"
#include "../row_span.hpp"
#include "scan.hpp"

namespace masklens::gpu {

namespace detail {

// What a kernel needs of a view: plain values, strides in bytes.
struct ScanParams {
  const std::uint8_t* data;
  std::int64_t stride_bytes[4];
  std::int64_t distinct_heads;
  std::int64_t q_len;
  std::int64_t k_len;
  std::int64_t rows;  // distinct slices x q_len
  Polarity polarity;  // 1-byte masks
  AdditiveBits bits;  // 2- and 4-byte masks: the threshold and specials as bit patterns
};

struct MergeSpans {
  __device__ __forceinline__ RowSpan operator()(const RowSpan& a, const RowSpan& b) const { return merge(a, b); }
};

// A thread's running span: first and last attending key and the count so far, plus
// byte-lane counters (1-byte masks) flushed into the count before they can overflow.
struct ThreadSpan {
  std::int64_t first = RowSpan::kNoKey, last = -1, count = 0;
  std::uint32_t flags = 0;
  std::uint32_t lanes = 0;  // four byte lanes of attending-byte counts
  int pending = 0;          // vectors added to `lanes` since the last flush

  __device__ __forceinline__ void attend(std::int64_t k) {
    first = k < first ? k : first;
    last = k > last ? k : last;
    ++count;
  }
  __device__ __forceinline__ void flush() {
    const std::uint32_t pairs = (lanes & 0x00ff00ffu) + ((lanes >> 8) & 0x00ff00ffu);
    count += (pairs + (pairs >> 16)) & 0xffffu;
    lanes = 0;
    pending = 0;
  }
  __device__ __forceinline__ RowSpan span() {
    flush();
    RowSpan s;
    if (count > 0) {
      s.first = first;
      s.last = last;
      s.count = count;
    }
    s.flags = flags;
    return s;
  }
};

__device__ __forceinline__ void add_class(ThreadSpan& t, ElementClass c, std::int64_t k) {
  switch (c) {
    case ElementClass::bias: t.flags |= kRowBias; [[fallthrough]];
    case ElementClass::allowed: t.attend(k); break;
    case ElementClass::finite_masked: t.flags |= kRowFiniteMasked; break;
    case ElementClass::invalid: t.flags |= kRowInvalid; break;
    case ElementClass::masked: break;
  }
}

// Kernels are instantiated per element size (1: bool / uint8 / int8, 2: fp16 / bf16,
// 4: fp32), so each carries only its own path and registers.
template <int Esize>
__device__ __forceinline__ void add_element(ThreadSpan& t, const std::uint8_t* p, std::int64_t k, const ScanParams& s) {
  if constexpr (Esize == 1) {
    const bool truth = *p != 0;
    if (truth == (s.polarity == Polarity::true_attends)) t.attend(k);
  } else if constexpr (Esize == 2) {
    add_class(t, classify_bits(*reinterpret_cast<const std::uint16_t*>(p), s.bits), k);
  } else {
    add_class(t, classify_bits(*reinterpret_cast<const std::uint32_t*>(p), s.bits), k);
  }
}

// Keys k0 + i for every bit i of m attend (m: up to 8 keys of one 16-byte vector).
__device__ __forceinline__ void attend_bits(ThreadSpan& t, std::uint32_t m, std::int64_t k0) {
  if (m == 0) return;
  t.count += __popc(m);
  if (t.first == RowSpan::kNoKey) t.first = k0 + __ffs(static_cast<int>(m)) - 1;
  t.last = k0 + 31 - __clz(static_cast<int>(m));  // vectors arrive in increasing key order per thread
}

// An additive vector whose every value is +-0 (attends) or exactly -inf (masked), the
// usual 0 / -inf mask, needs no per-value classification: its attending keys as bits,
// or false when some value is anything else (bias, finite masked, NaN, +inf).
template <int Esize>
__device__ __forceinline__ bool zero_or_neg_inf(const std::uint32_t (&words)[4], const AdditiveBits& b,
                                                std::uint32_t& attend) {
  const std::uint32_t neg_inf = b.sign | b.inf_mag;
  attend = 0;
  if constexpr (Esize == 4) {
    bool plain = true;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const bool zero = (words[i] & 0x7fffffffu) == 0;
      plain &= zero || words[i] == neg_inf;
      attend |= static_cast<std::uint32_t>(zero) << i;
    }
    return plain;
  }
  // Two 16-bit lanes per word. Magnitudes keep bit 15 clear, so adding 0x7fff per lane
  // cannot carry into the next lane: bit 15 of the sum is set iff the lane is non-zero.
  const std::uint32_t neg_inf2 = neg_inf | (neg_inf << 16);
  std::uint32_t other = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const std::uint32_t w = words[i], x = w ^ neg_inf2;
    const std::uint32_t nonzero = ((w & 0x7fff7fffu) + 0x7fff7fffu) & 0x80008000u;
    const std::uint32_t not_neg_inf = (((x & 0x7fff7fffu) + 0x7fff7fffu) | x) & 0x80008000u;
    other |= nonzero & not_neg_inf;
    const std::uint32_t zero = ~nonzero & 0x80008000u;
    attend |= ((zero >> 15) | (zero >> 30)) << (2 * i) & (3u << (2 * i));
  }
  return other == 0;
}

// 0x80 in every byte of w that attends (invert = 0x80808080 for true_masks).
__device__ __forceinline__ std::uint32_t attending_bytes(std::uint32_t w, std::uint32_t invert) {
  return ((((w & 0x7f7f7f7fu) + 0x7f7f7f7fu) | w) & 0x80808080u) ^ invert;
}

// 16 bytes of a row starting at key k0. For 1-byte masks: four 32-bit SWAR tests, the
// count in byte lanes, first / last located only where they can change.
template <int Esize>
__device__ __forceinline__ void add_vector(ThreadSpan& t, const uint4& v, std::int64_t k0, const ScanParams& s) {
  if constexpr (Esize == 1) {
    const std::uint32_t invert = s.polarity == Polarity::true_attends ? 0u : 0x80808080u;
    const std::uint32_t m0 = attending_bytes(v.x, invert), m1 = attending_bytes(v.y, invert),
                        m2 = attending_bytes(v.z, invert), m3 = attending_bytes(v.w, invert);
    t.lanes += (m0 >> 7) + (m1 >> 7) + (m2 >> 7) + (m3 >> 7);
    if (++t.pending == 63) t.flush();
    if ((m0 | m1 | m2 | m3) == 0) return;
    if (t.first == RowSpan::kNoKey) {
      const int word = m0 ? 0 : m1 ? 1 : m2 ? 2 : 3;
      const std::uint32_t m = word == 0 ? m0 : word == 1 ? m1 : word == 2 ? m2 : m3;
      t.first = k0 + 4 * word + (__ffs(static_cast<int>(m)) - 1) / 8;
    }
    // Vectors arrive in increasing key order per thread: the last one wins.
    const int word = m3 ? 3 : m2 ? 2 : m1 ? 1 : 0;
    const std::uint32_t m = word == 3 ? m3 : word == 2 ? m2 : word == 1 ? m1 : m0;
    t.last = k0 + 4 * word + (31 - __clz(static_cast<int>(m))) / 8;
  } else {
    const std::uint32_t words[4] = {v.x, v.y, v.z, v.w};
    if (std::uint32_t attend; zero_or_neg_inf<Esize>(words, s.bits, attend)) {
      attend_bits(t, attend, k0);
      return;
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (Esize == 2) {
        add_class(t, classify_bits(words[i] & 0xffffu, s.bits), k0 + 2 * i);
        add_class(t, classify_bits(words[i] >> 16, s.bits), k0 + 2 * i + 1);
      } else {
        add_class(t, classify_bits(words[i], s.bits), k0 + i);
      }
    }
  }
}

// This thread's share of row r: 16-byte loads between a scalar head and tail when the
// key stride is 1, one element at a time otherwise.
template <int Threads, int Esize>
__device__ RowSpan scan_row_share(const ScanParams& s, std::int64_t r, int lane) {
  const std::int64_t slice = r / s.q_len, q = r - slice * s.q_len;
  const std::int64_t b = slice / s.distinct_heads, h = slice - b * s.distinct_heads;
  const std::uint8_t* row = s.data + b * s.stride_bytes[0] + h * s.stride_bytes[1] + q * s.stride_bytes[2];
  constexpr int esize = Esize;
  ThreadSpan acc;
  if (s.stride_bytes[3] != esize) {
    for (std::int64_t k = lane; k < s.k_len; k += Threads) add_element<Esize>(acc, row + k * s.stride_bytes[3], k, s);
    return acc.span();
  }
  const auto misalign = static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(row) & 15);
  std::int64_t head = misalign ? (16 - misalign) / esize : 0;
  head = head < s.k_len ? head : s.k_len;
  const std::int64_t per_vec = 16 / esize;
  const std::int64_t n_vec = (s.k_len - head) / per_vec;
  for (std::int64_t k = lane; k < head; k += Threads) add_element<Esize>(acc, row + k * esize, k, s);
  const auto* vec = reinterpret_cast<const uint4*>(row + head * esize);
  std::int64_t v = lane;
  // Four independent 16-byte loads in flight per thread.
  for (; v + 3 * Threads < n_vec; v += 4 * Threads) {
    const uint4 x0 = __ldg(vec + v), x1 = __ldg(vec + v + Threads), x2 = __ldg(vec + v + 2 * Threads),
                x3 = __ldg(vec + v + 3 * Threads);
    add_vector<Esize>(acc, x0, head + v * per_vec, s);
    add_vector<Esize>(acc, x1, head + (v + Threads) * per_vec, s);
    add_vector<Esize>(acc, x2, head + (v + 2 * Threads) * per_vec, s);
    add_vector<Esize>(acc, x3, head + (v + 3 * Threads) * per_vec, s);
  }
  for (; v < n_vec; v += Threads) add_vector<Esize>(acc, __ldg(vec + v), head + v * per_vec, s);
  for (std::int64_t k = head + n_vec * per_vec + lane; k < s.k_len; k += Threads) add_element<Esize>(acc, row + k * esize, k, s);
  return acc.span();
}

// One block of 256 threads per row: long rows.
template <int Threads, int Esize>
__global__ void __launch_bounds__(Threads) scan_rows_block(ScanParams s, RowSpan* out) {
  using Reduce = cub::BlockReduce<RowSpan, Threads>;
  __shared__ typename Reduce::TempStorage temp;
  for (std::int64_t r = blockIdx.x; r < s.rows; r += gridDim.x) {
    const RowSpan mine = scan_row_share<Threads, Esize>(s, r, static_cast<int>(threadIdx.x));
    const RowSpan row = Reduce(temp).Reduce(mine, MergeSpans{});
    if (threadIdx.x == 0) out[r] = row;
    __syncthreads();  // temp is reused by the next row
  }
}

// One warp per row: short rows, 8 rows per block.
template <int Esize>
__global__ void __launch_bounds__(256) scan_rows_warp(ScanParams s, RowSpan* out) {
  using Reduce = cub::WarpReduce<RowSpan>;
  __shared__ typename Reduce::TempStorage temp[8];
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  for (std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * 8 + warp; r < s.rows;
       r += static_cast<std::int64_t>(gridDim.x) * 8) {
    const RowSpan mine = scan_row_share<32, Esize>(s, r, lane);
    const RowSpan row = Reduce(temp[warp]).Reduce(mine, MergeSpans{});
    if (lane == 0) out[r] = row;
    __syncwarp();
  }
}

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

// Enqueues the scan of `view` (device memory, validated by MaskView::make) into d_rows
// on `stream` and returns the launch's own status. cudaLaunchKernelEx returns it
// directly, so the caller's "last error" is neither read (a stale error of theirs is
// not taken for ours, as cudaPeekAtLastError after <<<>>> would) nor cleared (as
// cudaGetLastError would).
inline cudaError_t launch_scan(const MaskView& view, RowSpan* d_rows, cudaStream_t stream) {
  const ScanParams s = scan_params(view);
  const std::int64_t esize = element_size(view.dtype());
  // A block per row from 2 KiB, a warp per shorter row: enough threads to keep 16-byte
  // loads in flight without idling on short rows.
  const bool long_rows = view.k_len() * esize >= 2048;
  // Enough blocks to fill the device several times over; rows beyond loop.
  constexpr std::int64_t kMaxGrid = 1 << 20;
  cudaLaunchConfig_t config{};
  config.blockDim = dim3(256);
  config.stream = stream;
  const auto launch = [&](auto esize_constant) -> cudaError_t {
    constexpr int kEsize = decltype(esize_constant)::value;
    if (long_rows) {
      config.gridDim = dim3(static_cast<unsigned>(s.rows < kMaxGrid ? s.rows : kMaxGrid));
      return cudaLaunchKernelEx(&config, scan_rows_block<256, kEsize>, s, d_rows);
    }
    const std::int64_t blocks = (s.rows + 7) / 8;
    config.gridDim = dim3(static_cast<unsigned>(blocks < kMaxGrid ? blocks : kMaxGrid));
    return cudaLaunchKernelEx(&config, scan_rows_warp<kEsize>, s, d_rows);
  };
  switch (esize) {
    case 1: return launch(std::integral_constant<int, 1>{});
    case 2: return launch(std::integral_constant<int, 2>{});
    default: return launch(std::integral_constant<int, 4>{});
  }
}

}  // namespace detail

}  // namespace masklens::gpu
