// The host scanner: MaskView -> SpanTable in one pass over each distinct slice. It is
// the oracle every other scanner (the GPU one included) is tested against, and it is
// fast enough to be the real thing for host masks: 1-byte masks with unit key stride
// read 8 bytes at a time, additive masks 16 bytes at a time (additive_bits.hpp). This
// header scans on the calling thread; scan_threads.hpp splits the rows over threads (kept
// apart: <thread> is a tenth of a second of every consumer's parse, bench/HISTORY.md).
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "additive_bits.hpp"
#include "mask_view.hpp"
#include "row_span.hpp"
#include "span_table.hpp"
#include "status.hpp"

namespace masklens {

namespace detail {

inline constexpr std::uint64_t kLow7 = 0x7f7f7f7f7f7f7f7fULL;
inline constexpr std::uint64_t kHigh = 0x8080808080808080ULL;

inline std::uint64_t load_u64(const std::uint8_t* p) noexcept {
  std::uint64_t w;
  std::memcpy(&w, p, sizeof w);
  return w;
}
// 0x80 in every byte of w that is non-zero, 0 elsewhere.
inline std::uint64_t nonzero_bytes(std::uint64_t w) noexcept { return (((w & kLow7) + kLow7) | w) & kHigh; }
// 0x80 in every byte that attends under the polarity (invert = true_masks).
inline std::uint64_t attending_bytes(std::uint64_t w, std::uint64_t invert) noexcept {
  return nonzero_bytes(w) ^ invert;
}

// Attending bytes in [begin, end) of a byte row, 8 bytes at a time, per-byte lane
// counters flushed before they can overflow.
inline std::int64_t count_attending_bytes(const std::uint8_t* row, std::int64_t begin, std::int64_t end,
                                          std::uint64_t invert) noexcept {
  std::int64_t total = 0;
  std::int64_t i = begin;
  const auto flush = [&total](std::uint64_t lanes) {
    // Sum of 8 byte lanes (each <= 255) without overflow: pairwise into 16-bit lanes.
    const std::uint64_t pairs = (lanes & 0x00ff00ff00ff00ffULL) + ((lanes >> 8) & 0x00ff00ff00ff00ffULL);
    total += static_cast<std::int64_t>((pairs * 0x0001000100010001ULL) >> 48);
  };
  while (end - i >= 32) {
    std::uint64_t lanes = 0;
    // 4 words per step for ILP; 63 steps keep each lane <= 252.
    for (int step = 0; step < 63 && end - i >= 32; ++step, i += 32) {
      lanes += attending_bytes(load_u64(row + i), invert) >> 7;
      lanes += attending_bytes(load_u64(row + i + 8), invert) >> 7;
      lanes += attending_bytes(load_u64(row + i + 16), invert) >> 7;
      lanes += attending_bytes(load_u64(row + i + 24), invert) >> 7;
    }
    flush(lanes);
  }
  const bool attend_nonzero = invert == 0;
  for (; i < end; ++i) total += ((row[i] != 0) == attend_nonzero) ? 1 : 0;
  return total;
}

// The bounds of a 1-byte row with unit key stride (count 0; first kNoKey where nothing
// attends): the first attending key found from the left, the last from the right, so
// that a caller counts only between them — about K bytes read in all.
inline RowSpan byte_row_bounds(const std::uint8_t* row, std::int64_t k_len, std::uint64_t invert) noexcept {
  const bool attend_nonzero = invert == 0;
  RowSpan span;
  std::int64_t i = 0;
  if (attend_nonzero)  // 32 masked (zero) bytes at a time: three ORs and a test
    while (i + 32 <= k_len &&
           (load_u64(row + i) | load_u64(row + i + 8) | load_u64(row + i + 16) | load_u64(row + i + 24)) == 0)
      i += 32;
  for (; i + 8 <= k_len; i += 8) {
    if (const std::uint64_t m = attending_bytes(load_u64(row + i), invert)) {
      span.first = i + std::countr_zero(m) / 8;
      break;
    }
  }
  if (span.first == RowSpan::kNoKey) {
    for (; i < k_len; ++i)
      if ((row[i] != 0) == attend_nonzero) {
        span.first = i;
        break;
      }
    if (span.first == RowSpan::kNoKey) return span;  // nothing attends
  }
  std::int64_t j = k_len;
  if (attend_nonzero)
    while (j - 32 >= span.first &&
           (load_u64(row + j - 32) | load_u64(row + j - 24) | load_u64(row + j - 16) | load_u64(row + j - 8)) == 0)
      j -= 32;
  for (; j - 8 >= span.first; j -= 8) {
    if (const std::uint64_t m = attending_bytes(load_u64(row + j - 8), invert)) {
      span.last = j - 8 + (63 - std::countl_zero(m)) / 8;
      break;
    }
  }
  if (span.last < 0) {
    for (std::int64_t k = j - 1; k >= span.first; --k)
      if ((row[k] != 0) == attend_nonzero) {
        span.last = k;
        break;
      }
  }
  return span;
}

// 0 where true attends, else every byte's high bit: the `invert` of the byte counters.
inline std::uint64_t byte_invert(Polarity polarity) noexcept { return polarity == Polarity::true_attends ? 0 : kHigh; }

// A 1-byte row with unit key stride: its bounds, then the keys between them counted.
inline RowSpan scan_byte_row(const std::uint8_t* row, std::int64_t k_len, Polarity polarity) noexcept {
  const std::uint64_t invert = byte_invert(polarity);
  RowSpan span = byte_row_bounds(row, k_len, invert);
  if (span.first != RowSpan::kNoKey) span.count = count_attending_bytes(row, span.first, span.last + 1, invert);
  return span;
}

// Key k of a row, of class c, scanned in increasing key order.
inline void add_element(RowSpan& span, ElementClass c, std::int64_t k) noexcept {
  switch (c) {
    case ElementClass::bias: span.flags |= kRowBias; [[fallthrough]];
    case ElementClass::allowed:
      if (span.count == 0) span.first = k;
      span.last = k;
      ++span.count;
      break;
    case ElementClass::finite_masked: span.flags |= kRowFiniteMasked; break;
    case ElementClass::invalid: span.flags |= kRowInvalid; break;
    case ElementClass::masked: break;
  }
}

// An additive row (2- or 4-byte values) with unit key stride, 16 bytes at a time through
// the lane classifier the device kernel uses too (additive_bits.hpp): all-zero vectors
// attend outright, a vector equal to an all-masked one already classified adds nothing,
// any other vector is classified lane by lane at once. Same answer as scan_generic_row.
template <int Esize>
inline RowSpan scan_additive_row(const std::uint8_t* row, std::int64_t k_len, const AdditiveBits& b) noexcept {
  static_assert(Esize == 2 || Esize == 4);
  using Lanes = AdditiveLanes<Esize, std::uint64_t>;
  constexpr int kLanes = Lanes::kLanes;
  const Lanes lanes(b);
  RowSpan span;
  const auto attend = [&span](std::uint32_t bits, std::int64_t k0) {
    if (bits == 0) return;
    if (span.count == 0) span.first = k0 + std::countr_zero(bits);
    span.last = k0 + 31 - std::countl_zero(bits);
    span.count += std::popcount(bits);
  };
  // Masks repeat one masked value: once a vector of it (both words equal) is classified
  // as attending nowhere, its flags are in the span and equal vectors add nothing. 0 is
  // never such a word (all-zero vectors attend, and are taken first): 0 means "none yet".
  std::uint64_t known_masked = 0;
  std::int64_t k = 0;
  // Runs of equal vectors (all zero, or all the known masked value) are stepped over in
  // loops of their own that touch nothing but the index: with the span updated per
  // vector, g++ kept the span on the stack in some builds and the loop ran at half speed
  // (bench/README.md, tiles).
  const auto run_end = [&](std::int64_t from, std::uint64_t word) {
    while (from + kLanes <= k_len && load_u64(row + from * Esize) == word && load_u64(row + from * Esize + 8) == word)
      from += kLanes;
    return from;
  };
  for (; k + kLanes <= k_len; k += kLanes) {
    const std::uint64_t words[2] = {load_u64(row + k * Esize), load_u64(row + k * Esize + 8)};
    if ((words[0] | words[1]) == 0) {
      const std::int64_t end = run_end(k + kLanes, 0);
      if (span.count == 0) span.first = k;
      span.last = end - 1;
      span.count += end - k;
      k = end - kLanes;
      continue;
    }
    if (words[0] == known_masked && words[1] == known_masked) {
      k = run_end(k + kLanes, known_masked) - kLanes;
      continue;
    }
    const VectorClass c = lanes.classify(words);
    attend(c.attend, k);
    span.flags |= c.flags;
    if (c.attend == 0 && words[0] == words[1]) known_masked = words[0];
  }
  for (; k < k_len; ++k) {
    std::uint32_t v;
    if constexpr (Esize == 2) {
      std::uint16_t h;
      std::memcpy(&h, row + k * 2, 2);
      v = h;
    } else {
      std::memcpy(&v, row + k * 4, 4);
    }
    add_element(span, classify_bits(v, b), k);
  }
  return span;
}

// Any element type and key stride, one element at a time.
inline RowSpan scan_generic_row(const std::uint8_t* row, std::int64_t k_len, std::int64_t k_stride_bytes,
                                ElementType dtype, const MaskEncoding& enc) noexcept {
  RowSpan span;
  const std::uint8_t* p = row;
  for (std::int64_t k = 0; k < k_len; ++k, p += k_stride_bytes) {
    add_element(span, classify_element(p, dtype, enc.polarity, enc.masked_threshold), k);
  }
  return span;
}

inline RowSpan scan_row(const MaskView& view, const AdditiveBits& bits, std::int64_t b, std::int64_t h,
                        std::int64_t q) noexcept {
  const std::uint8_t* row = view.element_ptr(b, h, q, 0);
  if (view.stride(kKey) == 1) {
    switch (element_size(view.dtype())) {
      case 1: return scan_byte_row(row, view.k_len(), view.encoding().polarity);
      case 2: return scan_additive_row<2>(row, view.k_len(), bits);
      default: return scan_additive_row<4>(row, view.k_len(), bits);
    }
  }
  return scan_generic_row(row, view.k_len(), view.stride(kKey) * element_size(view.dtype()), view.dtype(),
                          view.encoding());
}

// The first invalid element of a row that has kRowInvalid, for the error message.
inline Status invalid_element_error(const MaskView& view, std::int64_t b, std::int64_t h, std::int64_t q) {
  for (std::int64_t k = 0; k < view.k_len(); ++k) {
    if (view.at(b, h, q, k) == ElementClass::invalid)
      return error(ErrorCode::invalid_value, "mask element [" + std::to_string(b) + ", " + std::to_string(h) +
                                                 ", " + std::to_string(q) + ", " + std::to_string(k) +
                                                 "] is NaN or +inf; an additive mask holds 0, a bias, or "
                                                 "-inf / a value <= the masked threshold");
  }
  return error(ErrorCode::invalid_value, "mask holds NaN or +inf");
}

// The table for `view`, its rows not yet scanned, or why there is none.
inline Result<SpanTable> table_for_scan(const MaskView& view) {
  if (view.data() == nullptr) return error(ErrorCode::invalid_argument, "view is empty (data is null)");
  return SpanTable::for_view(view);
}

// Scans rows [begin, end) of `table` (row r: distinct slice r / q_len, query r % q_len).
inline void scan_rows(const MaskView& view, SpanTable& table, std::int64_t begin, std::int64_t end) noexcept {
  const AdditiveBits bits = additive_bits(view.dtype(), view.encoding().masked_threshold);
  const std::int64_t q_len = table.q_len;
  for (std::int64_t r = begin; r < end; ++r) {
    const std::int64_t slice = r / q_len;
    const std::int64_t b = slice / table.distinct_heads, h = slice % table.distinct_heads;
    table.rows[static_cast<std::size_t>(r)] = scan_row(view, bits, b, h, r % q_len);
  }
}

// Once every row is scanned: the error naming the first NaN / +inf element, or ok.
inline Status check_scanned_rows(const MaskView& view, const SpanTable& table) {
  const std::int64_t q_len = table.q_len;
  for (std::int64_t r = 0; r < table.distinct_slices() * q_len; ++r) {
    if (table.rows[static_cast<std::size_t>(r)].flags & kRowInvalid) {
      const std::int64_t slice = r / q_len;
      return invalid_element_error(view, slice / table.distinct_heads, slice % table.distinct_heads, r % q_len);
    }
  }
  return {};
}

}  // namespace detail

// Scans every distinct slice of `view` into a SpanTable, on the calling thread
// (scan_threads.hpp: scan(view, ScanOptions{threads})).
inline Result<SpanTable> scan(const MaskView& view) {
  Result<SpanTable> made = detail::table_for_scan(view);
  if (!made) return made;
  detail::scan_rows(view, *made, 0, made->distinct_slices() * made->q_len);
  if (Status invalid = detail::check_scanned_rows(view, *made); !invalid.ok()) return invalid;
  return made;
}

}  // namespace masklens
