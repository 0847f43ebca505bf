// The cost model decide() ranks correct calls with: time = per-call overhead + rate x
// work, where work is the (query, key) pairs a kernel computes, times heads and
// head_dim / 128, in units of 10^9. A kernel that skips masked tiles (causal, windows,
// varlen, block-sparse) computes the attended pairs; one that reads a dense mask, or
// the math kernel, computes every pair; FlexAttention computes the pairs of its full and
// partial tiles (flex_pairs).
//
// Rates are milliseconds per unit, forward and backward, bf16, each backend's in its
// registry row (backends/registry.hpp), measured on an H200 (sm90) with torch 2.11 /
// cuDNN 9.19 by bench/backend_costs.py on 2026-12-03 (1 x 4 x 16384 x 128; the windowed
// and varlen rates from its 69632-token runs, where they matter; bench/README.md).
// Libraries that machine lacks carry estimates, marked as such. Other architectures use
// the sm90 ratios until measured there: only the ranking matters.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string_view>

#include "backend_call.hpp"
#include "call.hpp"
#include "structure.hpp"

namespace masklens {

struct CostRates {
  double native = 0;  // ms per unit of attended work, the mask dropped or replaced
  double dense = 0;   // ms per unit of full work, the dense mask kept (0: takes none)
  bool measured = false;
};

// Milliseconds a call costs before any work: launch, slicing, packing.
inline constexpr double kCallOverheadMs = 0.03;

// What a backend computes, and so what its rate multiplies (each registry row says
// which): the attended pairs where it skips masked tiles natively and every pair with a
// dense mask; every pair either way (torch's math kernel); or the pairs of the BlockMask
// tiles it computes, a compiled kernel that may first have to compile (FlexAttention:
// flex_pairs, kFlexColdCompileMs).
enum class WorkModel : std::uint8_t { attended, every_pair, flex_tiles };

namespace detail {

// Sum over rows t = 0..n-1 of clamp(t + first, 0, cap): the pairs of a causal band whose
// row t attends min(t + first, cap) keys.
inline double clamped_ramp(std::int64_t n, std::int64_t first, std::int64_t cap) noexcept {
  if (n <= 0 || cap <= 0) return 0;
  // Rows with t + first <= 0 attend nothing; rows with t + first >= cap attend cap.
  const std::int64_t t0 = std::clamp<std::int64_t>(-first + 1, 0, n);        // first row with a key
  const std::int64_t t1 = std::clamp<std::int64_t>(cap - first, t0, n);      // first row at the cap
  const double ramp_rows = static_cast<double>(t1 - t0);
  const double ramp = ramp_rows * (static_cast<double>(t0 + first) + static_cast<double>(t1 - 1 + first)) / 2;
  return ramp + static_cast<double>(n - t1) * static_cast<double>(cap);
}

// Attended pairs of one square document of length n under the structure's base rule.
inline double document_pairs(const MaskStructure& s, std::int64_t n) noexcept {
  switch (s.kind) {
    case StructureKind::full: return static_cast<double>(n) * static_cast<double>(n);
    case StructureKind::sliding_window: return clamped_ramp(n, 1, std::min(s.window, n));
    case StructureKind::chunked: {
      const std::int64_t c = std::max<std::int64_t>(1, std::min(s.chunk, n));
      return static_cast<double>(n / c) * clamped_ramp(c, 1, c) + clamped_ramp(n % c, 1, c);
    }
    default: return clamped_ramp(n, 1, n);  // causal, and the causal part of the others
  }
}

}  // namespace detail

// Attended (query, key) pairs of the structure over its batch, per head: exact for the
// base kinds on one sequence, an estimate with modifiers (documents summed, kv_valid
// scaling by its share of keys). O(batch + documents), no allocation.
inline double attended_pairs(const MaskStructure& s) noexcept {
  const double q = static_cast<double>(s.q_len), k = static_cast<double>(s.k_len);
  double per_batch = 0;
  const std::int64_t d = s.key_position(0);
  switch (s.kind) {
    case StructureKind::full:
    case StructureKind::arbitrary: per_batch = q * k; break;
    case StructureKind::sliding_window: per_batch = detail::clamped_ramp(s.q_len, d + 1, std::min(s.window, s.k_len)); break;
    case StructureKind::chunked:
      per_batch = q * static_cast<double>(std::min(s.chunk, s.k_len) + 1) / 2;
      break;
    case StructureKind::prefix_lm: {
      const double p = static_cast<double>(std::min(s.prefix, s.k_len));
      per_batch = detail::clamped_ramp(s.q_len, d + 1, s.k_len) + p * p / 2;
      break;
    }
    case StructureKind::causal_blocks: {
      per_batch = detail::clamped_ramp(s.q_len, d + 1, s.k_len);
      for (const KeyRange& r : s.blocks) per_batch += static_cast<double>(r.end - r.start) * static_cast<double>(r.end - r.start) / 2;
      break;
    }
    case StructureKind::causal: per_batch = detail::clamped_ramp(s.q_len, d + 1, s.k_len); break;
  }
  if (!s.has_segments() && !s.has_kv_valid() && !s.has_q_valid()) return per_batch * static_cast<double>(s.batch);
  double total = 0;
  for (std::int64_t b = 0; b < s.batch; ++b) {
    double pairs = per_batch;
    if (s.has_segments() && s.kind != StructureKind::arbitrary) {
      pairs = 0;
      const auto& seg = s.segments_of(b);
      for (std::size_t i = 1; i < seg.size(); ++i) pairs += detail::document_pairs(s, seg[i] - seg[i - 1]);
    }
    if (s.has_kv_valid()) {
      const KeyRange& kv = s.kv_valid_of(b);
      pairs *= static_cast<double>(kv.end - kv.start) / k;
    }
    if (s.has_q_valid()) {
      const KeyRange& rows = s.q_valid_of(b);
      pairs *= static_cast<double>(rows.end - rows.start) / q;
    }
    total += pairs;
  }
  return total;
}

// Every (query, key) pair of the structure over its batch, per head.
inline double every_pair(const MaskStructure& s) noexcept {
  return static_cast<double>(s.batch) * static_cast<double>(s.q_len) * static_cast<double>(s.k_len);
}

// The pairs a backend of work model `w` (not flex_tiles: flex_pairs) computes: the
// attended ones where it runs natively and skips masked tiles, every pair otherwise.
inline double computed_pairs(WorkModel w, bool dense_mask, const MaskStructure& s) noexcept {
  return w == WorkModel::attended && !dense_mask ? attended_pairs(s) : every_pair(s);
}

// FlexAttention skips empty tiles and computes every pair of the others; on a partial
// tile it also evaluates the mask_mod on every pair, which a full tile skips. What a
// partial tile costs over a full one, measured by bench/backend_costs.py (H200, torch
// 2.11, 1 x 4 x 8192 x 128 bf16 forward + backward, every tile partial against every
// tile full, 2026-12-03; bench/README.md): reading the dense mask 1.54; with an index
// rule 0.90, within the run's noise of a full tile, so charged as one (torch's BlockMask
// documentation puts skipping the mask_mod at "about a 15% speedup" for causal).
inline constexpr double kFlexPartialTileRule = 1.0;
inline constexpr double kFlexPartialTileMaskRead = 1.54;

// Tile shares to charge flex on when a mask's tiles are unknown (an arbitrary mask
// decided without its tile_fractions): every tile computed, every one partial.
inline constexpr TileFractions kEveryTilePartial{128, 128, 1.0, 0.0};

// The pairs flex is charged for, per head: those of its full tiles, and of its partial
// ones at the partial-tile factor (reading the mask or not).
inline double flex_pairs(const MaskStructure& s, const TileFractions& tiles, bool mask_mod_reads_mask) noexcept {
  const double factor = mask_mod_reads_mask ? kFlexPartialTileMaskRead : kFlexPartialTileRule;
  return static_cast<double>(s.batch) * static_cast<double>(s.q_len) * static_cast<double>(s.k_len) *
         (tiles.full + factor * tiles.partial);
}

// What a FlexAttention call costs before its first run where no compiled kernel for its
// shape bucket is warm: Dynamo's trace and Inductor's Triton kernels, forward and
// backward. Measured on an H200 (torch 2.11, a 4096 window, 1 x 4 x L x 128 bf16, 14 new
// lengths from 16384 to 28069, train and eval steps alternating; issue 31): 0.4 to 17.7 s
// a compile, 48.8 s for the 14, 3.5 s on average. decide() charges it only where the
// caller says the kernel is cold (DecideOptions::flex_compile_ms, which may carry the
// caller's own estimate instead); masklens.torch passes it for a bucket it has not
// compiled (docs/python.md, "Lengths that change").
inline constexpr double kFlexColdCompileMs = 3500;

// Work units of `pairs` (query, key) pairs for the call: heads and head_dim / 128 scale them.
inline double work_units(double pairs, const AttentionCall& call) noexcept {
  // Summed as doubles: two head dims of up to 2^62 (AttentionCall::validate) overflow int64.
  const double width = (static_cast<double>(call.head_dim) + static_cast<double>(call.value_head_dim())) / 256.0;
  return pairs * static_cast<double>(call.heads) * width / 1e9;
}

}  // namespace masklens
