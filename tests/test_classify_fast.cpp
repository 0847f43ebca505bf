// classify()'s fast path (a cost-free description: full, or causal at either alignment,
// found in one pass) must give exactly the verdict of the full search, on every table:
// generated structures, the ties the canonical rules break, tables one row away from a
// cost-free one, and malformed or NaN-flagged tables (same error, same message).
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "support/mask_gen.hpp"
#include "support/structure_fields.hpp"
#include "support/structure_tables.hpp"

using namespace masklens;
using namespace masklens::testing;

namespace {

struct Agreement {
  int tables = 0, fast = 0;
};

// Both paths on one table: same status, or the same structure field for field; a
// structured verdict renders every stored row back.
void check_agree(const SpanTable& t, Agreement& seen, const std::string& what) {
  const Result<MaskStructure> fast = detail::classify_table(t, true);
  const Result<MaskStructure> general = detail::classify_table(t, false);
  INFO(what);
  ++seen.tables;
  REQUIRE(fast.ok() == general.ok());
  if (!fast.ok()) {
    CHECK(fast.status().to_string() == general.status().to_string());
    return;
  }
  CHECK(structure_fields(*fast) == structure_fields(*general));
  if (detail::cost_free_match(t)) ++seen.fast;
  if (fast->kind == StructureKind::arbitrary) return;
  for (std::int64_t b = 0; b < t.distinct_batch; ++b)
    for (std::int64_t h = 0; h < t.distinct_heads; ++h)
      for (std::int64_t q = 0; q < t.q_len; ++q)
        REQUIRE(fast->row(b, q).same_keys(t.slice(b, h)[static_cast<std::size_t>(q)]));
}

}  // namespace

TEST_SUITE("host") {

TEST_CASE("fast path and full search agree on generated structures") {
  Rng rng(test_seed(20261203));
  const std::int64_t sizes[] = {1, 2, 3, 7, 8, 64, 100, 1023, 1024, 1025, 2500};
  Agreement seen;
  for (int i = 0; i < 3000; ++i) {
    const GeneratedTable g = generated_table(rng, sizes, 8, 0.5);
    check_agree(g.table, seen, g.text);
  }
  MESSAGE(seen.tables << " tables, " << seen.fast << " decided by the fast path");
  // Both ways must be exercised for the comparison to mean anything.
  CHECK(seen.fast > 500);
  CHECK(seen.tables - seen.fast > 1000);
}

TEST_CASE("one row away from a cost-free table: the fast path declines and the search decides") {
  Rng rng(test_seed(20261204));
  Agreement seen;
  int declined = 0;
  for (int i = 0; i < 4000; ++i) {
    const std::int64_t q_len = uniform(rng, 1, 40), k_len = coin(rng) ? q_len : uniform(rng, 1, 40);
    const std::int64_t batch = uniform(rng, 1, 2), heads = uniform(rng, 1, 2);
    const bool broadcast = coin(rng, 0.3);
    const Alignment align = q_len != k_len && coin(rng) ? Alignment::bottom_right : Alignment::top_left;
    const MaskStructure spec =
        make_structure(coin(rng, 0.3) ? StructureKind::full : StructureKind::causal, batch, q_len, k_len, align);
    SpanTable t = table_of(spec, heads, broadcast, rng, 0.0);
    // One row of one stored slice changed: ends moved, emptied, filled, or holed (not an interval).
    RowSpan& r = t.rows[static_cast<std::size_t>(uniform(rng, 0, static_cast<std::int64_t>(t.rows.size()) - 1))];
    const RowSpan old = r;
    switch (uniform(rng, 0, 4)) {
      case 0: r = RowSpan::interval(uniform(rng, 0, k_len - 1), uniform(rng, 0, k_len - 1)); break;
      case 1: r = RowSpan{}; break;
      case 2: r = RowSpan{0, -1, 0, 0, 0}; break;  // empty, written with first 0 (validate accepts it)
      case 3: r = RowSpan::interval(0, k_len - 1); break;
      default:
        if (!r.empty() && r.last > r.first) --r.count;  // a hole inside the row
        break;
    }
    const bool changed = !r.same_keys(old);
    check_agree(t, seen, "changed row of " + describe(spec) + " H=" + std::to_string(heads));
    if (changed && !detail::cost_free_match(t)) ++declined;
  }
  MESSAGE(seen.tables << " tables, " << declined << " changed ones declined by the fast path");
  CHECK(declined > 2000);
}

TEST_CASE("fast path and full search refuse the same malformed or NaN-flagged tables alike") {
  Rng rng(test_seed(20261205));
  Agreement seen;
  for (int i = 0; i < 400; ++i) {
    const std::int64_t q_len = uniform(rng, 1, 30), k_len = uniform(rng, 1, 30);
    const MaskStructure spec = make_structure(coin(rng) ? StructureKind::full : StructureKind::causal, 1, q_len, k_len);
    SpanTable t = table_of(spec, 1, false, rng, 0.1);
    RowSpan& r = t.rows[static_cast<std::size_t>(uniform(rng, 0, q_len - 1))];
    switch (uniform(rng, 0, 3)) {
      case 0: r.flags |= kRowInvalid; break;
      case 1: r.flags |= 1u << 7; break;  // an unknown flag
      case 2: r.last = k_len; break;       // a key past K
      default: r.count = -1; break;
    }
    check_agree(t, seen, "broken row of " + describe(spec));
    CHECK_FALSE(classify(t).ok());
  }
}

}  // TEST_SUITE
