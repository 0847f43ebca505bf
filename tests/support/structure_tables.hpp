// Test support: span tables of generated structures, as a scanner would produce them,
// and the cost-free candidates whose ties the canonical rules break. Shared by the
// fast-path and the run-path agreement tests.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <utility>

#include <masklens/describe.hpp>
#include <masklens/span_table.hpp>
#include <masklens/structure.hpp>

#include "mask_gen.hpp"

namespace masklens::testing {

// The table a scanner would produce for `spec` over `heads` heads; with `broadcast` the
// batch is stored once (spec's modifiers must then be the same for every batch). Rows
// carry random flags at `flag_rate` (none drawn at 0): finite masking anywhere, bias on
// attending rows.
inline SpanTable table_of(const MaskStructure& spec, std::int64_t heads, bool broadcast, Rng& rng, double flag_rate) {
  SpanTable t;
  t.batch = spec.batch;
  t.heads = heads;
  t.q_len = spec.q_len;
  t.k_len = spec.k_len;
  t.distinct_batch = broadcast ? 1 : spec.batch;
  t.distinct_heads = heads;
  for (std::int64_t b = 0; b < t.distinct_batch; ++b)
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t q = 0; q < t.q_len; ++q) {
        RowSpan r = spec.row(b, q);
        if (flag_rate > 0 && coin(rng, flag_rate)) r.flags |= kRowFiniteMasked;
        if (flag_rate > 0 && !r.empty() && coin(rng, flag_rate / 4)) r.flags |= kRowBias;
        t.rows.push_back(r);
      }
  return t;
}

// A structure of `kind` with no modifiers; a window, prefix or block that may or may
// not bind (when it does not, the canonical form is full or causal: the ties).
inline MaskStructure cost_free_candidate(Rng& rng, std::int64_t batch, std::int64_t q_len, std::int64_t k_len) {
  const StructureKind kinds[] = {StructureKind::full, StructureKind::causal, StructureKind::causal,
                                 StructureKind::sliding_window, StructureKind::prefix_lm, StructureKind::chunked};
  const Alignment align = q_len != k_len && coin(rng) ? Alignment::bottom_right : Alignment::top_left;
  MaskStructure s = make_structure(kinds[uniform(rng, 0, 5)], batch, q_len, k_len, align);
  s.window = uniform(rng, std::max<std::int64_t>(1, k_len - 2), k_len + 2);
  s.prefix = uniform(rng, 1, 2);
  s.chunk = uniform(rng, std::max<std::int64_t>(1, k_len - 1), k_len + 2);
  return s;
}

// A generated structure's table and what it was, for the classifier agreement tests:
// lengths drawn from `sizes` (the query length mostly from its first `common` + 1, the
// key length equal to it or from those), 1-3 batches (broadcast at 30 %), 1-2 heads, a
// cost-free candidate at `p_candidate` else a random structure, padded query rows
// (q_valid) added to 15 % of those without, flags at 20 % on 30 % of the tables.
struct GeneratedTable {
  SpanTable table;
  std::string text;
};
inline GeneratedTable generated_table(Rng& rng, std::span<const std::int64_t> sizes, std::int64_t common,
                                      double p_candidate) {
  const auto last = static_cast<std::int64_t>(sizes.size()) - 1;
  const auto size = [&](std::int64_t i) { return sizes[static_cast<std::size_t>(i)]; };
  const std::int64_t q_len = size(uniform(rng, 0, coin(rng, 0.9) ? common : last));
  const std::int64_t k_len = coin(rng, 0.5) ? q_len : size(uniform(rng, 0, common));
  const std::int64_t batch = uniform(rng, 1, 3), heads = uniform(rng, 1, 2);
  const bool broadcast = coin(rng, 0.3);
  MaskStructure spec = coin(rng, p_candidate) ? cost_free_candidate(rng, 1, q_len, k_len)
                                              : random_structure(rng, broadcast ? 1 : batch, q_len, k_len);
  spec = broadcast || spec.batch != batch ? repeat_batches(spec, batch) : spec;
  if (!spec.has_q_valid() && coin(rng, 0.15)) {
    // Padded query rows on any structure (a cost-free one then is not): short ranges,
    // single rows often, one entry for every batch of a broadcast table.
    const auto rows = [&] {
      const std::int64_t start = uniform(rng, 0, q_len);
      return KeyRange{start, coin(rng, 0.4) ? std::min(q_len, start + 1) : uniform(rng, start, q_len)};
    };
    const KeyRange shared = rows();
    for (std::int64_t b = 0; b < batch; ++b) spec.q_valid.push_back(broadcast ? shared : rows());
  }
  SpanTable t = table_of(spec, heads, broadcast, rng, coin(rng, 0.3) ? 0.2 : 0.0);
  return {std::move(t), describe(spec) + " B=" + std::to_string(batch) + " H=" + std::to_string(heads) +
                            " Q=" + std::to_string(q_len) + " K=" + std::to_string(k_len) +
                            (broadcast ? " broadcast" : "")};
}

}  // namespace masklens::testing
