// masklens::gpu — the device scanner: MaskView (device memory) -> RowSpans in one pass
// at memory bandwidth. Same result as the host scanner (scan.hpp) for every element
// type, polarity, shape and stride the view accepts; the classification rules stay in
// classify.hpp. CUB conventions: a two-phase call (null temp storage -> bytes needed,
// then run), the stream last, every CUDA call checked, no synchronisation inside.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include <cub/block/block_reduce.cuh>
#include <cub/warp/warp_reduce.cuh>

#include "../element.hpp"
#include "../mask_view.hpp"
#include "../row_span.hpp"
#include "../span_table.hpp"
#include "../status.hpp"

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
  ElementType dtype;
  Polarity polarity;
  float masked_threshold;
};

struct MergeSpans {
  __device__ __forceinline__ RowSpan operator()(const RowSpan& a, const RowSpan& b) const { return merge(a, b); }
};

__device__ __forceinline__ void add_element(RowSpan& acc, const std::uint8_t* p, std::int64_t k, const ScanParams& s) {
  switch (classify_element(p, s.dtype, s.polarity, s.masked_threshold)) {
    case ElementClass::bias: acc.flags |= kRowBias; [[fallthrough]];
    case ElementClass::allowed:
      acc.first = k < acc.first ? k : acc.first;
      acc.last = k > acc.last ? k : acc.last;
      ++acc.count;
      break;
    case ElementClass::finite_masked: acc.flags |= kRowFiniteMasked; break;
    case ElementClass::invalid: acc.flags |= kRowInvalid; break;
    case ElementClass::masked: break;
  }
}

__device__ __forceinline__ std::uint64_t nonzero_bytes(std::uint64_t w) {
  constexpr std::uint64_t low7 = 0x7f7f7f7f7f7f7f7fULL, high = 0x8080808080808080ULL;
  return (((w & low7) + low7) | w) & high;
}

// 16 bytes of a row starting at key k0.
__device__ __forceinline__ void add_vector(RowSpan& acc, const uint4& v, std::int64_t k0, const ScanParams& s) {
  if (element_size(s.dtype) == 1) {
    const std::uint64_t invert = s.polarity == Polarity::true_attends ? 0 : 0x8080808080808080ULL;
    const std::uint64_t lo = nonzero_bytes((static_cast<std::uint64_t>(v.y) << 32) | v.x) ^ invert;
    const std::uint64_t hi = nonzero_bytes((static_cast<std::uint64_t>(v.w) << 32) | v.z) ^ invert;
    if ((lo | hi) == 0) return;
    const std::int64_t first = k0 + (lo ? __ffsll(static_cast<long long>(lo)) / 8 - 1
                                        : 8 + __ffsll(static_cast<long long>(hi)) / 8 - 1);
    const std::int64_t last = k0 + (hi ? 8 + (63 - __clzll(static_cast<long long>(hi))) / 8
                                       : (63 - __clzll(static_cast<long long>(lo))) / 8);
    acc.first = first < acc.first ? first : acc.first;
    acc.last = last > acc.last ? last : acc.last;
    acc.count += __popcll(lo) + __popcll(hi);
    return;
  }
  const auto* bytes = reinterpret_cast<const std::uint8_t*>(&v);
  const int esize = element_size(s.dtype);
#pragma unroll 8
  for (int i = 0; i < 16 / esize; ++i) add_element(acc, bytes + i * esize, k0 + i, s);
}

// This thread's share of row r: 16-byte loads between a scalar head and tail when the
// key stride is 1, one element at a time otherwise.
template <int Threads>
__device__ RowSpan scan_row_share(const ScanParams& s, std::int64_t r, int lane) {
  const std::int64_t slice = r / s.q_len, q = r - slice * s.q_len;
  const std::int64_t b = slice / s.distinct_heads, h = slice - b * s.distinct_heads;
  const std::uint8_t* row = s.data + b * s.stride_bytes[0] + h * s.stride_bytes[1] + q * s.stride_bytes[2];
  const int esize = element_size(s.dtype);
  RowSpan acc;
  if (s.stride_bytes[3] != esize) {
    for (std::int64_t k = lane; k < s.k_len; k += Threads) add_element(acc, row + k * s.stride_bytes[3], k, s);
    return acc;
  }
  const auto misalign = static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(row) & 15);
  std::int64_t head = misalign ? (16 - misalign) / esize : 0;
  head = head < s.k_len ? head : s.k_len;
  const std::int64_t per_vec = 16 / esize;
  const std::int64_t n_vec = (s.k_len - head) / per_vec;
  for (std::int64_t k = lane; k < head; k += Threads) add_element(acc, row + k * esize, k, s);
  const auto* vec = reinterpret_cast<const uint4*>(row + head * esize);
  std::int64_t v = lane;
  // Four independent 16-byte loads in flight per thread.
  for (; v + 3 * Threads < n_vec; v += 4 * Threads) {
    const uint4 x0 = __ldg(vec + v), x1 = __ldg(vec + v + Threads), x2 = __ldg(vec + v + 2 * Threads),
                x3 = __ldg(vec + v + 3 * Threads);
    add_vector(acc, x0, head + v * per_vec, s);
    add_vector(acc, x1, head + (v + Threads) * per_vec, s);
    add_vector(acc, x2, head + (v + 2 * Threads) * per_vec, s);
    add_vector(acc, x3, head + (v + 3 * Threads) * per_vec, s);
  }
  for (; v < n_vec; v += Threads) add_vector(acc, __ldg(vec + v), head + v * per_vec, s);
  for (std::int64_t k = head + n_vec * per_vec + lane; k < s.k_len; k += Threads) add_element(acc, row + k * esize, k, s);
  return acc;
}

// One block of 256 threads per row: long rows.
template <int Threads>
__global__ void __launch_bounds__(Threads) scan_rows_block(ScanParams s, RowSpan* out) {
  using Reduce = cub::BlockReduce<RowSpan, Threads>;
  __shared__ typename Reduce::TempStorage temp;
  for (std::int64_t r = blockIdx.x; r < s.rows; r += gridDim.x) {
    const RowSpan mine = scan_row_share<Threads>(s, r, static_cast<int>(threadIdx.x));
    const RowSpan row = Reduce(temp).Reduce(mine, MergeSpans{});
    if (threadIdx.x == 0) out[r] = row;
    __syncthreads();  // temp is reused by the next row
  }
}

// One warp per row: short rows, 8 rows per block.
__global__ void __launch_bounds__(256) scan_rows_warp(ScanParams s, RowSpan* out) {
  using Reduce = cub::WarpReduce<RowSpan>;
  __shared__ typename Reduce::TempStorage temp[8];
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  for (std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * 8 + warp; r < s.rows;
       r += static_cast<std::int64_t>(gridDim.x) * 8) {
    const RowSpan mine = scan_row_share<32>(s, r, lane);
    const RowSpan row = Reduce(temp[warp]).Reduce(mine, MergeSpans{});
    if (lane == 0) out[r] = row;
    __syncwarp();
  }
}

inline Status check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return {};
  return error(ErrorCode::device_error, std::string(what) + ": " + cudaGetErrorString(e));
}

}  // namespace detail

// RowSpans the output must hold for `view`: one per row of each distinct slice, laid
// out as SpanTable::rows (stride-0 batch / head dimensions are scanned once).
inline std::int64_t span_rows(const MaskView& view) noexcept {
  const std::int64_t slices = (view.stride(kBatch) == 0 ? 1 : view.batch()) *
                              (view.stride(kHeads) == 0 ? 1 : view.heads());
  return slices * view.q_len();
}

// Scans a view of device memory into d_rows (span_rows(view) RowSpans, device memory)
// on `stream`. Two-phase: with d_temp_storage == nullptr only temp_storage_bytes is
// set. No temporary storage is needed today; the call asks for 1 byte (CUB's habit)
// so that a null pointer always means "size query". Never synchronises.
inline Status scan_spans(void* d_temp_storage, std::size_t& temp_storage_bytes, const MaskView& view,
                         RowSpan* d_rows, cudaStream_t stream = nullptr) {
  if (d_temp_storage == nullptr) {
    temp_storage_bytes = 1;
    return {};
  }
  if (view.data() == nullptr) return error(ErrorCode::invalid_argument, "view is empty (data is null)");
  if (d_rows == nullptr) return error(ErrorCode::invalid_argument, "d_rows is null");
  if (reinterpret_cast<std::uintptr_t>(d_rows) % alignof(RowSpan) != 0)
    return error(ErrorCode::misaligned_pointer, "d_rows is not aligned to RowSpan");
  detail::ScanParams s{};
  s.data = static_cast<const std::uint8_t*>(view.data());
  for (int d = 0; d < kMaxDims; ++d) s.stride_bytes[d] = view.stride(d) * element_size(view.dtype());
  s.distinct_heads = view.stride(kHeads) == 0 ? 1 : view.heads();
  s.q_len = view.q_len();
  s.k_len = view.k_len();
  s.rows = span_rows(view);
  s.dtype = view.dtype();
  s.polarity = view.encoding().polarity;
  s.masked_threshold = view.encoding().masked_threshold;

  // Enough blocks to fill the device several times over; rows beyond loop.
  constexpr std::int64_t kMaxGrid = 1 << 20;
  const bool long_rows = view.k_len() * element_size(view.dtype()) >= 2048;
  if (long_rows) {
    const auto grid = static_cast<unsigned>(s.rows < kMaxGrid ? s.rows : kMaxGrid);
    detail::scan_rows_block<256><<<grid, 256, 0, stream>>>(s, d_rows);
  } else {
    const std::int64_t blocks = (s.rows + 7) / 8;
    const auto grid = static_cast<unsigned>(blocks < kMaxGrid ? blocks : kMaxGrid);
    detail::scan_rows_warp<<<grid, 256, 0, stream>>>(s, d_rows);
  }
  return detail::check(cudaGetLastError(), "launching the scan kernel");
}

// Convenience for callers that want the SpanTable on the host: allocates on the stream,
// scans, copies the O(rows) table back, and synchronises the stream once.
inline Result<SpanTable> scan(const MaskView& device_view, cudaStream_t stream = nullptr) {
  Result<SpanTable> made = SpanTable::for_view(device_view);
  if (!made) return made.status();
  SpanTable& table = made.value();
  const std::size_t bytes = table.rows.size() * sizeof(RowSpan);
  std::size_t temp_bytes = 0;
  if (Status st = scan_spans(nullptr, temp_bytes, device_view, nullptr, stream); !st.ok()) return st;
  void* temp = nullptr;
  RowSpan* d_rows = nullptr;
  if (Status st = detail::check(cudaMallocAsync(&temp, temp_bytes, stream), "allocating temp storage"); !st.ok())
    return st;
  Status st = detail::check(cudaMallocAsync(reinterpret_cast<void**>(&d_rows), bytes, stream), "allocating spans");
  if (st.ok()) st = scan_spans(temp, temp_bytes, device_view, d_rows, stream);
  if (st.ok())
    st = detail::check(cudaMemcpyAsync(table.rows.data(), d_rows, bytes, cudaMemcpyDeviceToHost, stream),
                       "copying spans to the host");
  if (d_rows) (void)cudaFreeAsync(d_rows, stream);
  (void)cudaFreeAsync(temp, stream);
  const Status synced = detail::check(cudaStreamSynchronize(stream), "synchronising the stream");
  if (!st.ok()) return st;
  if (!synced.ok()) return synced;
  for (std::size_t r = 0; r < table.rows.size(); ++r)
    if (table.rows[r].flags & kRowInvalid) {
      const auto slice = static_cast<std::int64_t>(r) / table.q_len;
      return error(ErrorCode::invalid_value,
                   "mask row [" + std::to_string(slice / table.distinct_heads) + ", " +
                       std::to_string(slice % table.distinct_heads) + ", " +
                       std::to_string(static_cast<std::int64_t>(r) % table.q_len) +
                       "] holds NaN or +inf; an additive mask holds 0, a bias, or -inf / a value <= the threshold");
    }
  return made;
}

}  // namespace masklens::gpu
