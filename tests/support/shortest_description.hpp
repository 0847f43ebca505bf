// Test support: the shortest exact description of a small mask, by brute force. Every
// base (each kind, alignment and parameter, every set of blocks) is tried with every
// modifier entry per batch, and the winner is the one docs/structures.md's canonical
// form names: fewest numbers, then the earlier kind, then without q_valid, then
// top_left. Rows are key bitsets (K <= 63), the base rules come from
// MaskStructure::allows (the element-wise definition) and the modifiers are applied
// here from their definitions, so nothing is shared with the classifier's row
// arithmetic. Small on purpose: Q, K up to about 6.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include <masklens/row_span.hpp>
#include <masklens/span_table.hpp>
#include <masklens/structure.hpp>

namespace masklens::testing {

using KeyBits = std::uint64_t;  // bit k: key k attends

// A mask [batch, 1, q_len, k_len] as one key bitset per row, batch-major.
struct SmallMask {
  std::int64_t batch = 1, q_len = 1, k_len = 1;
  std::vector<KeyBits> rows;
  [[nodiscard]] KeyBits row(std::int64_t b, std::int64_t q) const { return rows[static_cast<std::size_t>(b * q_len + q)]; }
};

inline KeyBits key_range_bits(std::int64_t start, std::int64_t end) {
  KeyBits out = 0;
  for (std::int64_t k = start; k < end; ++k) out |= KeyBits{1} << k;
  return out;
}

// The mask a structure describes, element by element (MaskStructure::allows).
inline SmallMask small_mask_of(const MaskStructure& s) {
  SmallMask m{s.batch, s.q_len, s.k_len, {}};
  for (std::int64_t b = 0; b < s.batch; ++b)
    for (std::int64_t q = 0; q < s.q_len; ++q) {
      KeyBits bits = 0;
      for (std::int64_t k = 0; k < s.k_len; ++k)
        if (s.allows(b, q, k)) bits |= KeyBits{1} << k;
      m.rows.push_back(bits);
    }
  return m;
}

// The span table a scanner gives for the mask (one head, every batch stored).
inline SpanTable span_table_of(const SmallMask& m) {
  SpanTable t;
  t.batch = m.batch;
  t.heads = 1;
  t.q_len = m.q_len;
  t.k_len = m.k_len;
  t.distinct_batch = m.batch;
  t.distinct_heads = 1;
  for (KeyBits bits : m.rows) {
    RowSpan r;
    if (bits != 0) {
      r.first = std::countr_zero(bits);
      r.last = 63 - std::countl_zero(bits);
      r.count = std::popcount(bits);
    }
    t.rows.push_back(r);
  }
  return t;
}

// What the canonical rules compare, in order: numbers, kind, q_valid present, alignment
// (full has none: read as top_left).
struct DescriptionRank {
  std::int64_t cost = std::numeric_limits<std::int64_t>::max();
  StructureKind kind = StructureKind::arbitrary;
  bool q_valid = false;
  Alignment alignment = Alignment::top_left;
  friend bool operator==(const DescriptionRank&, const DescriptionRank&) = default;
  friend bool operator<(const DescriptionRank& a, const DescriptionRank& b) {
    return std::tie(a.cost, a.kind, a.q_valid, a.alignment) < std::tie(b.cost, b.kind, b.q_valid, b.alignment);
  }
};

inline DescriptionRank rank_of(const MaskStructure& s) {
  if (s.kind == StructureKind::arbitrary) return {};
  return {s.description_cost(), s.kind, s.has_q_valid(),
          s.kind == StructureKind::full ? Alignment::top_left : s.alignment};
}

// Every base structure over [1, 1, q_len, k_len] worth trying: full; per alignment (one
// when Q == K) causal, every window and chunk up to the last key position (or K), every
// prefix up to K, every set of disjoint
// blocks of two or more keys (a one-key block changes nothing). A prefix or first block
// holding every row's position is left out: that mask is full with kv_valid by rule.
inline std::vector<MaskStructure> small_bases(std::int64_t q_len, std::int64_t k_len) {
  std::vector<MaskStructure> out;
  out.push_back(make_structure(StructureKind::full, 1, q_len, k_len));
  std::vector<Alignment> alignments{Alignment::top_left};
  if (q_len != k_len) alignments.push_back(Alignment::bottom_right);
  // Every set of disjoint blocks of length >= 2 inside [0, K), by where each block starts.
  std::vector<std::vector<KeyRange>> block_sets;
  const auto extend = [&](auto&& self, std::vector<KeyRange>& blocks, std::int64_t from) -> void {
    if (!blocks.empty()) block_sets.push_back(blocks);
    for (std::int64_t s = from; s + 2 <= k_len; ++s)
      for (std::int64_t e = s + 2; e <= k_len; ++e) {
        blocks.push_back({s, e});
        self(self, blocks, e);
        blocks.pop_back();
      }
  };
  std::vector<KeyRange> scratch;
  extend(extend, scratch, 0);
  for (Alignment a : alignments) {
    MaskStructure base = make_structure(StructureKind::causal, 1, q_len, k_len, a);
    const std::int64_t min_p = base.key_position(0), max_p = base.key_position(q_len - 1);
    out.push_back(base);
    // A window or chunk past the last key position no longer binds: that is causal.
    for (std::int64_t v = 1; v <= std::max(k_len, max_p + 1); ++v) {
      MaskStructure w = make_structure(StructureKind::sliding_window, 1, q_len, k_len, a);
      w.window = v;
      out.push_back(w);
      MaskStructure c = make_structure(StructureKind::chunked, 1, q_len, k_len, a);
      c.chunk = v;
      out.push_back(c);
      if (v <= k_len && v - 1 < max_p) {
        MaskStructure p = make_structure(StructureKind::prefix_lm, 1, q_len, k_len, a);
        p.prefix = v;
        out.push_back(p);
      }
    }
    for (const std::vector<KeyRange>& blocks : block_sets) {
      if (min_p >= 0 && blocks.front().start <= min_p && blocks.front().end - 1 >= max_p) continue;
      MaskStructure b = make_structure(StructureKind::causal_blocks, 1, q_len, k_len, a);
      b.blocks = blocks;
      out.push_back(b);
    }
  }
  // Cheapest first, so that shortest_description() stops trying bases early.
  std::stable_sort(out.begin(), out.end(),
                   [](const MaskStructure& a, const MaskStructure& b) { return rank_of(a) < rank_of(b); });
  return out;
}

namespace detail_shortest {

constexpr std::int64_t kNever = std::numeric_limits<std::int64_t>::max() / 4;

// Which modifiers a description lists (each for every batch once listed).
struct Listed {
  bool q, kv, segments;
  [[nodiscard]] int index() const { return int{q} | int{kv} << 1 | int{segments} << 2; }
};

// The fewest segment offsets (0 and Q included) whose documents make `rows` (the base
// inside kv_valid) equal `want` on every row where `checked` says so; kNever when none
// do. Documents are independent, so the best split is a shortest path over the bounds.
inline std::int64_t fewest_offsets(const std::vector<KeyBits>& rows, const std::vector<KeyBits>& want,
                                   const std::vector<bool>& checked) {
  const auto n = static_cast<std::int64_t>(rows.size());
  std::vector<std::int64_t> best(static_cast<std::size_t>(n + 1), kNever);
  best[0] = 1;  // the offset 0
  for (std::int64_t e = 1; e <= n; ++e)
    for (std::int64_t s = 0; s < e; ++s) {
      if (best[static_cast<std::size_t>(s)] >= kNever) continue;
      const KeyBits doc = key_range_bits(s, e);  // Q == K: row q sits at key position q
      bool fits = true;
      for (std::int64_t q = s; q < e && fits; ++q) {
        const auto i = static_cast<std::size_t>(q);
        fits = !checked[i] || (rows[i] & doc) == want[i];
      }
      if (fits) best[static_cast<std::size_t>(e)] = std::min(best[static_cast<std::size_t>(e)], best[static_cast<std::size_t>(s)] + 1);
    }
  return best[static_cast<std::size_t>(n)];
}

// For one batch's rows and one base: per set of listed modifiers, the fewest segment
// offsets that batch then needs (0 without segments; kNever: no entries fit).
inline std::array<std::int64_t, 8> batch_costs(const std::vector<KeyBits>& base_rows, const SmallMask& m,
                                               std::int64_t b) {
  const std::int64_t Q = m.q_len, K = m.k_len;
  std::array<std::int64_t, 8> best;
  best.fill(kNever);
  std::vector<KeyBits> want;
  KeyBits attended = 0;
  for (std::int64_t q = 0; q < Q; ++q) {
    want.push_back(m.row(b, q));
    attended |= want.back();
    if ((want.back() & ~base_rows[static_cast<std::size_t>(q)]) != 0) return best;  // modifiers only take keys away
  }
  // The rows that attend, first to last: q_valid can only be these (rows outside attend
  // nothing either way, and a row inside that attends nothing must be so by the rules).
  std::int64_t first = Q, last = -1;
  for (std::int64_t q = 0; q < Q; ++q)
    if (want[static_cast<std::size_t>(q)] != 0) {
      first = std::min(first, q);
      last = q;
    }
  const std::vector<bool> every_row(static_cast<std::size_t>(Q), true);
  std::vector<bool> attending_rows(static_cast<std::size_t>(Q), false);
  for (std::int64_t q = first; q <= last; ++q) attending_rows[static_cast<std::size_t>(q)] = true;
  // kv entries holding every attended key: the whole range first (the entry of an
  // unpadded batch), one empty range standing for all.
  std::vector<KeyRange> kv_entries{{0, K}, {0, 0}};
  for (std::int64_t s = 0; s < K; ++s)
    for (std::int64_t e = s + 1; e <= K; ++e)
      if (!(s == 0 && e == K)) kv_entries.push_back({s, e});
  const bool docs_allowed = Q == K && Q > 1;
  for (std::size_t kv_i = 0; kv_i < kv_entries.size(); ++kv_i) {
    const KeyBits kv = key_range_bits(kv_entries[kv_i].start, kv_entries[kv_i].end);
    if ((attended & ~kv) != 0) continue;
    std::vector<KeyBits> rows;
    for (KeyBits r : base_rows) rows.push_back(r & kv);
    bool plain = true, with_q = true;
    for (std::int64_t q = 0; q < Q; ++q) {
      const auto i = static_cast<std::size_t>(q);
      plain = plain && rows[i] == want[i];
      with_q = with_q && (!attending_rows[i] || rows[i] == want[i]);
    }
    const std::int64_t docs_plain = docs_allowed ? fewest_offsets(rows, want, every_row) : kNever;
    const std::int64_t docs_with_q = docs_allowed ? fewest_offsets(rows, want, attending_rows) : kNever;
    for (int listed = 0; listed < 8; ++listed) {
      const Listed l{(listed & 1) != 0, (listed & 2) != 0, (listed & 4) != 0};
      if (!l.kv && kv_i != 0) continue;
      std::int64_t& cell = best[static_cast<std::size_t>(listed)];
      if (l.segments) cell = std::min(cell, l.q ? std::min(docs_plain, docs_with_q) : docs_plain);
      else if (plain || (l.q && with_q)) cell = 0;
    }
  }
  return best;
}

}  // namespace detail_shortest

// The canonical rank of the mask's shortest exact descriptions (cost max: none exists,
// the mask is arbitrary), and one description of that rank.
struct Shortest {
  DescriptionRank rank;
  std::optional<MaskStructure> example;
};

inline Shortest shortest_description(const SmallMask& m, const std::vector<MaskStructure>& bases) {
  using namespace detail_shortest;
  Shortest out;
  for (const MaskStructure& base : bases) {
    // Modifiers add numbers and q_valid: the base alone bounds its rank from below.
    MaskStructure bound = base;
    bound.batch = m.batch;
    if (!(rank_of(bound) < out.rank)) continue;
    std::vector<KeyBits> base_rows;
    for (std::int64_t q = 0; q < m.q_len; ++q) {
      KeyBits bits = 0;
      for (std::int64_t k = 0; k < m.k_len; ++k)
        if (base.allows(0, q, k)) bits |= KeyBits{1} << k;
      base_rows.push_back(bits);
    }
    std::array<std::int64_t, 8> total{};
    for (std::int64_t b = 0; b < m.batch; ++b) {
      const std::array<std::int64_t, 8> costs = batch_costs(base_rows, m, b);
      for (std::size_t i = 0; i < 8; ++i) total[i] = std::min(kNever, total[i] + costs[i]);
    }
    for (int listed = 0; listed < 8; ++listed) {
      if (total[static_cast<std::size_t>(listed)] >= kNever) continue;
      const bool q = (listed & 1) != 0, kv = (listed & 2) != 0;
      MaskStructure shaped = base;
      shaped.batch = m.batch;
      DescriptionRank r = rank_of(shaped);
      r.cost += total[static_cast<std::size_t>(listed)] + 2 * m.batch * (int{q} + int{kv});
      r.q_valid = q;
      if (r < out.rank) {
        out.rank = r;
        out.example = shaped;
      }
    }
  }
  return out;
}

}  // namespace masklens::testing

namespace masklens::testing {

// Every mask of batch 1 that some structure over [1, 1, q_len, k_len] describes: each
// base with every kv_valid, q_valid and segments entry (or none), rendered and deduplicated.
inline std::vector<SmallMask> every_small_mask(std::int64_t q_len, std::int64_t k_len,
                                               const std::vector<MaskStructure>& bases) {
  std::vector<std::optional<KeyRange>> kv{std::nullopt}, qv{std::nullopt};
  for (std::int64_t s = 0; s <= k_len; ++s)
    for (std::int64_t e = s; e <= k_len; ++e) kv.push_back(KeyRange{s, e});
  for (std::int64_t s = 0; s <= q_len; ++s)
    for (std::int64_t e = s; e <= q_len; ++e) qv.push_back(KeyRange{s, e});
  std::vector<std::vector<std::int64_t>> docs{{}};
  for (std::int64_t list = 0; q_len == k_len && q_len > 1 && list < (std::int64_t{1} << (q_len - 1)); ++list) {
    std::vector<std::int64_t> offsets{0};
    for (std::int64_t i = 1; i < q_len; ++i)
      if (list >> (i - 1) & 1) offsets.push_back(i);
    offsets.push_back(q_len);
    docs.push_back(offsets);
  }
  std::set<std::vector<KeyBits>> seen;  // ordered: the masks come out in a fixed order
  for (const MaskStructure& base : bases)
    for (const auto& k : kv)
      for (const auto& q : qv)
        for (const auto& d : docs) {
          MaskStructure s = base;
          if (k) s.kv_valid = {*k};
          if (q) s.q_valid = {*q};
          if (!d.empty()) s.segments = {d};
          seen.insert(small_mask_of(s).rows);
        }
  std::vector<SmallMask> out;
  for (const std::vector<KeyBits>& rows : seen) out.push_back({1, q_len, k_len, rows});
  return out;
}

// A structure of `batch` batches over a base drawn kind first (blocks would crowd out
// the rest), its modifiers listed per batch and drawn to meet: short query ranges
// (single rows, as decode chunks and cross-attention padding leave), keys padded on
// either side or not at all, documents cut often.
template <class Rng>
MaskStructure small_structure(Rng& rng, const std::vector<MaskStructure>& bases, std::int64_t batch) {
  const auto pick = [&](std::int64_t lo, std::int64_t hi) { return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng); };
  const auto coin = [&](double p) { return std::bernoulli_distribution(p)(rng); };
  const auto kind = static_cast<StructureKind>(pick(0, 5));
  std::vector<const MaskStructure*> of_kind;
  for (const MaskStructure& b : bases)
    if (b.kind == kind) of_kind.push_back(&b);
  MaskStructure s = of_kind.empty() ? bases[static_cast<std::size_t>(pick(0, static_cast<std::int64_t>(bases.size()) - 1))]
                                    : *of_kind[static_cast<std::size_t>(pick(0, static_cast<std::int64_t>(of_kind.size()) - 1))];
  s.batch = batch;
  const std::int64_t Q = s.q_len, K = s.k_len;
  const bool kv = coin(0.5), q = coin(0.5), docs = Q == K && Q > 1 && coin(0.4);
  for (std::int64_t b = 0; b < batch; ++b) {
    if (kv) {
      std::int64_t start = 0, end = K;
      switch (pick(0, 3)) {
        case 0: start = pick(0, K); break;
        case 1: end = pick(0, K); break;
        case 2: start = pick(0, K); end = pick(start, K); break;
        default: break;
      }
      s.kv_valid.push_back({start, end});
    }
    if (q) {
      const std::int64_t start = pick(0, Q);
      const std::int64_t end = coin(0.4) ? std::min(Q, start + 1) : coin(0.3) ? Q : pick(start, Q);
      s.q_valid.push_back({start, end});
    }
    if (docs) {
      std::vector<std::int64_t> offsets{0};
      for (std::int64_t i = 1; i < Q; ++i)
        if (coin(0.45)) offsets.push_back(i);
      offsets.push_back(Q);
      s.segments.push_back(offsets);
    }
  }
  return s;
}

}  // namespace masklens::testing
