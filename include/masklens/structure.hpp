// MaskStructure: the canonical description of a mask, and its semantics — which keys
// each query row attends. Coordinates follow docs/structures.md: query row q sits at
// key position p = q (top_left) or p = q + K - Q (bottom_right), and every parameter
// is in key coordinates.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string_view>
#include <vector>

#include "row_span.hpp"

namespace masklens {

// In tie-break order: among equally short exact descriptions the earlier kind wins.
enum class StructureKind : std::uint8_t { full, causal, sliding_window, chunked, prefix_lm, causal_blocks, arbitrary };
enum class Alignment : std::uint8_t { top_left, bottom_right };

constexpr std::string_view to_string(StructureKind k) noexcept {
  switch (k) {
    case StructureKind::full: return "full";
    case StructureKind::causal: return "causal";
    case StructureKind::sliding_window: return "sliding_window";
    case StructureKind::chunked: return "chunked";
    case StructureKind::prefix_lm: return "prefix_lm";
    case StructureKind::causal_blocks: return "causal_blocks";
    case StructureKind::arbitrary: return "arbitrary";
  }
  return "unknown";
}
constexpr std::string_view to_string(Alignment a) noexcept {
  return a == Alignment::top_left ? "top_left" : "bottom_right";
}

// Half-open key range [start, end).
struct KeyRange {
  std::int64_t start = 0;
  std::int64_t end = 0;
  friend bool operator==(const KeyRange&, const KeyRange&) = default;
};

struct MaskStructure {
  std::int64_t batch = 1, heads = 1, q_len = 1, k_len = 1;  // the logical shape described

  StructureKind kind = StructureKind::arbitrary;
  Alignment alignment = Alignment::top_left;  // meaningful for every kind but full and arbitrary
  std::int64_t window = 0;  // sliding_window: p - window < k <= p (HF sliding_window)
  std::int64_t chunk = 0;   // chunked: floor(k / chunk) == floor(p / chunk) and k <= p
  std::int64_t prefix = 0;  // prefix_lm: k <= p or k < prefix
  std::vector<KeyRange> blocks;  // causal_blocks: sorted, disjoint bidirectional blocks

  // Modifiers, per batch; empty = absent (JSON null).
  // segments[b] = {0, e1, ..., q_len}: packed documents, attention stays inside p's document (Q == K).
  std::vector<std::vector<std::int64_t>> segments;
  // kv_valid[b] = [s, e): only these keys are real (padding).
  std::vector<KeyRange> kv_valid;

  std::int64_t empty_rows = 0;          // query rows with no attending key, over all B*H slices
  std::int64_t finite_masked_rows = 0;  // of those, rows masked by finite values (dense math attends uniformly)
  bool bias = false;                    // some attending element carries a non-zero additive value

  [[nodiscard]] bool has_segments() const noexcept { return !segments.empty(); }
  [[nodiscard]] bool has_kv_valid() const noexcept { return !kv_valid.empty(); }

  [[nodiscard]] std::int64_t key_position(std::int64_t q) const noexcept {
    return alignment == Alignment::bottom_right ? q + (k_len - q_len) : q;
  }

  // Keys row q attends under the base kind alone, as an inclusive interval clipped to [0, K).
  // Precondition: kind != arbitrary.
  [[nodiscard]] RowSpan base_row(std::int64_t q) const noexcept {
    const std::int64_t p = key_position(q), last_key = k_len - 1;
    std::int64_t lo = 0, hi = std::min(p, last_key);
    switch (kind) {
      case StructureKind::full: hi = last_key; break;
      case StructureKind::causal: break;
      case StructureKind::sliding_window: lo = p - window + 1; break;
      case StructureKind::chunked: lo = p >= 0 ? p / chunk * chunk : last_key + 1; break;
      case StructureKind::prefix_lm: hi = std::min(std::max(p, prefix - 1), last_key); break;
      case StructureKind::causal_blocks: {
        // The block holding p, if any: blocks are sorted by start.
        auto it = std::upper_bound(blocks.begin(), blocks.end(), p,
                                   [](std::int64_t v, const KeyRange& r) { return v < r.start; });
        if (it != blocks.begin() && p < std::prev(it)->end) hi = std::min(std::prev(it)->end - 1, last_key);
        break;
      }
      case StructureKind::arbitrary: return {};
    }
    return RowSpan::interval(std::max<std::int64_t>(lo, 0), hi);
  }

  // The document [start, end) holding position p of batch b (the whole sequence without segments).
  [[nodiscard]] KeyRange document(std::int64_t b, std::int64_t p) const noexcept {
    if (!has_segments()) return {0, k_len};
    const auto& s = segments[static_cast<std::size_t>(b)];
    auto it = std::upper_bound(s.begin(), s.end(), p);
    if (it == s.begin() || it == s.end()) return {0, 0};
    return {*std::prev(it), *it};
  }

  // Keys row q of batch b attends: the base interval, inside p's document and kv_valid.
  [[nodiscard]] RowSpan row(std::int64_t b, std::int64_t q) const noexcept {
    const RowSpan base = base_row(q);
    if (base.empty()) return base;
    std::int64_t lo = base.first, hi = base.last;
    if (has_segments()) {
      const KeyRange doc = document(b, key_position(q));
      lo = std::max(lo, doc.start);
      hi = std::min(hi, doc.end - 1);
    }
    if (has_kv_valid()) {
      const KeyRange& kv = kv_valid[static_cast<std::size_t>(b)];
      lo = std::max(lo, kv.start);
      hi = std::min(hi, kv.end - 1);
    }
    return RowSpan::interval(lo, hi);
  }

  // Element-wise semantics, written straight from the definitions (not from row()),
  // so tests can check one against the other. Precondition: kind != arbitrary.
  [[nodiscard]] bool allows(std::int64_t b, std::int64_t q, std::int64_t k) const noexcept {
    const std::int64_t p = key_position(q);
    bool base = false;
    switch (kind) {
      case StructureKind::full: base = true; break;
      case StructureKind::causal: base = k <= p; break;
      case StructureKind::sliding_window: base = p - window < k && k <= p; break;
      case StructureKind::chunked: base = k <= p && p >= 0 && k / chunk == p / chunk; break;
      case StructureKind::prefix_lm: base = k <= p || k < prefix; break;
      case StructureKind::causal_blocks:
        base = k <= p;
        for (const KeyRange& r : blocks) base = base || (r.start <= p && p < r.end && r.start <= k && k < r.end);
        break;
      case StructureKind::arbitrary: return false;
    }
    if (has_segments()) {
      const KeyRange doc = document(b, p);
      base = base && doc.start <= k && k < doc.end;
    }
    if (has_kv_valid()) {
      const KeyRange& kv = kv_valid[static_cast<std::size_t>(b)];
      base = base && kv.start <= k && k < kv.end;
    }
    return base;
  }

  // How many numbers the description takes; the canonical structure is the exact one
  // with the fewest (ties: the earlier kind). window, chunk, prefix: 1; each block: 2;
  // segments: every listed offset; kv_valid: 2 per batch.
  [[nodiscard]] std::int64_t description_cost() const noexcept {
    std::int64_t cost = 0;
    switch (kind) {
      case StructureKind::sliding_window:
      case StructureKind::chunked:
      case StructureKind::prefix_lm: cost = 1; break;
      case StructureKind::causal_blocks: cost = 2 * static_cast<std::int64_t>(blocks.size()); break;
      default: break;
    }
    for (const auto& s : segments) cost += static_cast<std::int64_t>(s.size());
    cost += 2 * static_cast<std::int64_t>(kv_valid.size());
    return cost;
  }
};

// A structure of `kind` over [batch, 1, q_len, k_len], parameters and modifiers unset.
inline MaskStructure make_structure(StructureKind kind, std::int64_t batch, std::int64_t q_len, std::int64_t k_len,
                                    Alignment alignment = Alignment::top_left) {
  MaskStructure s;
  s.kind = kind;
  s.batch = batch;
  s.q_len = q_len;
  s.k_len = k_len;
  s.alignment = alignment;
  return s;
}

}  // namespace masklens
