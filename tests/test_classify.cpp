// The classifier is a proof: every verdict renders back to the mask element for
// element, and it is the shortest exact description (DESIGN's canonical rules).
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "support/mask_gen.hpp"

using namespace masklens;
using namespace masklens::testing;

namespace {

// A bool mask [1, 1, Q, K] from a predicate, with its verdict.
struct Built {
  std::vector<std::uint8_t> bytes;
  MaskStructure verdict;
};
template <class F>
Built classify_bool(std::int64_t q_len, std::int64_t k_len, F&& allowed) {
  Built out;
  out.bytes.resize(static_cast<std::size_t>(q_len * k_len));
  for (std::int64_t q = 0; q < q_len; ++q)
    for (std::int64_t k = 0; k < k_len; ++k) out.bytes[static_cast<std::size_t>(q * k_len + k)] = allowed(q, k);
  const std::int64_t shape[2] = {q_len, k_len};
  auto view = MaskView::contiguous(out.bytes.data(), ElementType::boolean, shape);
  REQUIRE(view.ok());
  auto verdict = inspect(*view);
  REQUIRE(verdict.ok());
  out.verdict = *verdict;
  if (out.verdict.kind != StructureKind::arbitrary) CHECK(renders_equal(out.verdict, *view));
  return out;
}

// The cost of the canonical form is at most the generated one's, except that a prefix
// or block holding every row's position is by definition full with kv_valid.
std::int64_t canonical_cost_bound(const MaskStructure& spec) {
  const std::int64_t max_p = spec.key_position(spec.q_len - 1);
  const std::int64_t min_p = spec.key_position(0);
  const bool degenerate =
      (spec.kind == StructureKind::prefix_lm && spec.prefix - 1 >= max_p) ||
      (spec.kind == StructureKind::causal_blocks && min_p >= 0 && spec.blocks.front().start <= min_p &&
       spec.blocks.front().end - 1 >= max_p);
  if (!degenerate) return spec.description_cost();
  MaskStructure as_full = spec;
  as_full.kind = StructureKind::full;
  as_full.blocks.clear();
  as_full.kv_valid.assign(static_cast<std::size_t>(spec.batch), KeyRange{0, spec.k_len});
  return as_full.description_cost();
}

}  // namespace

TEST_SUITE("host") {

TEST_CASE("canonical forms named in the design") {
  SUBCASE("plain causal") {
    auto m = classify_bool(9, 9, [](auto q, auto k) { return k <= q; });
    CHECK(m.verdict.kind == StructureKind::causal);
    CHECK(m.verdict.alignment == Alignment::top_left);
    CHECK_FALSE(m.verdict.has_kv_valid());
    CHECK_FALSE(m.verdict.has_segments());
  }
  SUBCASE("a window at least the longest row is causal") {
    auto m = classify_bool(16, 16, [](auto q, auto k) { return k <= q && q - 16 < k; });
    CHECK(m.verdict.kind == StructureKind::causal);
  }
  SUBCASE("sliding window, HF convention") {
    auto m = classify_bool(16, 16, [](auto q, auto k) { return k <= q && q - 4 < k; });
    CHECK(m.verdict.kind == StructureKind::sliding_window);
    CHECK(m.verdict.window == 4);
  }
  SUBCASE("Q = 1 bottom-right causal is full") {
    auto m = classify_bool(1, 33, [](auto, auto) { return true; });
    CHECK(m.verdict.kind == StructureKind::full);
  }
  SUBCASE("bottom-right causal for chunked prefill") {
    auto m = classify_bool(4, 10, [](auto q, auto k) { return k <= q + 6; });
    CHECK(m.verdict.kind == StructureKind::causal);
    CHECK(m.verdict.alignment == Alignment::bottom_right);
  }
  SUBCASE("equal documents of length C are chunked C") {
    auto m = classify_bool(12, 12, [](auto q, auto k) { return k <= q && k / 4 == q / 4; });
    CHECK(m.verdict.kind == StructureKind::chunked);
    CHECK(m.verdict.chunk == 4);
    CHECK_FALSE(m.verdict.has_segments());
  }
  SUBCASE("causal with (K-1, 0) masked is a window of K-1") {
    auto m = classify_bool(8, 8, [](auto q, auto k) { return k <= q && !(q == 7 && k == 0); });
    CHECK(m.verdict.kind == StructureKind::sliding_window);
    CHECK(m.verdict.window == 7);
  }
  SUBCASE("causal with the last diagonal element masked is causal with kv_valid [0, K-1)") {
    auto m = classify_bool(8, 8, [](auto q, auto k) { return k <= q && !(q == 7 && k == 7); });
    CHECK(m.verdict.kind == StructureKind::causal);
    REQUIRE(m.verdict.has_kv_valid());
    CHECK(m.verdict.kv_valid[0] == KeyRange{0, 7});
  }
  SUBCASE("one allowed key above the diagonal is a bidirectional block") {
    auto m = classify_bool(8, 8, [](auto q, auto k) { return k <= q || (q == 3 && k == 4); });
    CHECK(m.verdict.kind == StructureKind::causal_blocks);
    REQUIRE(m.verdict.blocks.size() == 1);
    CHECK(m.verdict.blocks[0] == KeyRange{3, 5});
  }
  SUBCASE("prefix-LM") {
    auto m = classify_bool(10, 10, [](auto q, auto k) { return k <= q || k < 4; });
    CHECK(m.verdict.kind == StructureKind::prefix_lm);
    CHECK(m.verdict.prefix == 4);
  }
  SUBCASE("packed documents") {
    auto m = classify_bool(10, 10, [](auto q, auto k) {
      const auto doc = [](auto x) { return x < 3 ? 0 : x < 7 ? 1 : 2; };
      return k <= q && doc(k) == doc(q);
    });
    CHECK(m.verdict.kind == StructureKind::causal);
    REQUIRE(m.verdict.has_segments());
    CHECK(m.verdict.segments[0] == std::vector<std::int64_t>{0, 3, 7, 10});
  }
  SUBCASE("left padding on causal leaves empty rows") {
    auto m = classify_bool(6, 6, [](auto q, auto k) { return k <= q && k >= 2; });
    CHECK(m.verdict.kind == StructureKind::causal);
    REQUIRE(m.verdict.has_kv_valid());
    CHECK(m.verdict.kv_valid[0] == KeyRange{2, 6});
    CHECK(m.verdict.empty_rows == 2);
  }
  SUBCASE("cross-attention with padding") {
    auto m = classify_bool(5, 11, [](auto, auto k) { return k < 8; });
    CHECK(m.verdict.kind == StructureKind::full);
    REQUIRE(m.verdict.has_kv_valid());
    CHECK(m.verdict.kv_valid[0] == KeyRange{0, 8});
  }
  SUBCASE("a hole makes it arbitrary") {
    auto m = classify_bool(8, 8, [](auto q, auto k) { return k <= q && !(q == 5 && k == 2); });
    CHECK(m.verdict.kind == StructureKind::arbitrary);
  }
  SUBCASE("the seed's guard m[-1, 0] proves nothing: one future key") {
    auto m = classify_bool(8, 8, [](auto q, auto k) { return k <= q || (q == 1 && k == 6); });
    CHECK(m.verdict.kind == StructureKind::arbitrary);
  }
}

TEST_CASE("heads that differ are arbitrary") {
  std::vector<std::uint8_t> bytes(2 * 6 * 6);
  for (int h = 0; h < 2; ++h)
    for (int q = 0; q < 6; ++q)
      for (int k = 0; k < 6; ++k) bytes[static_cast<std::size_t>((h * 6 + q) * 6 + k)] = h == 0 ? k <= q : 1;
  const std::int64_t shape[4] = {1, 2, 6, 6};
  auto view = MaskView::contiguous(bytes.data(), ElementType::boolean, shape);
  REQUIRE(view.ok());
  auto verdict = inspect(*view);
  REQUIRE(verdict.ok());
  CHECK(verdict->kind == StructureKind::arbitrary);
}

TEST_CASE("round trip: generated structures in every type, layout and shape") {
  Rng rng(test_seed(20261202));
  const std::int64_t sizes[] = {1, 2, 7, 8, 9, 16, 33, 65, 100};
  const ElementType types[] = {ElementType::boolean, ElementType::uint8, ElementType::int8,
                               ElementType::float16, ElementType::bfloat16, ElementType::float32};
  const Layout layouts[] = {Layout::contiguous, Layout::fortran, Layout::expand, Layout::sliced};
  int cases = 0, structured = 0;
  for (int i = 0; i < 3000; ++i) {
    const std::int64_t q_len = coin(rng, 0.7) ? sizes[uniform(rng, 0, 8)] : uniform(rng, 1, 130);
    const std::int64_t k_len = coin(rng, 0.5) ? q_len : (coin(rng) ? sizes[uniform(rng, 0, 8)] : uniform(rng, 1, 130));
    const Layout layout = layouts[uniform(rng, 0, 3)];
    const std::int64_t batch = uniform(rng, 1, 3), heads = uniform(rng, 1, 2);
    const ElementType dtype = types[uniform(rng, 0, 5)];
    const Polarity pol = coin(rng, 0.2) ? Polarity::true_masks : Polarity::true_attends;
    MaskStructure spec = layout == Layout::expand ? repeat_batches(random_structure(rng, 1, q_len, k_len), batch)
                                                  : random_structure(rng, batch, q_len, k_len);
    DenseMask dense = render(spec, heads, dtype, pol, layout, rng, coin(rng, 0.2) ? 0.3 : 0.0);
    auto verdict = inspect(dense.view);
    REQUIRE_MESSAGE(verdict.ok(), dense.describe << ": " << verdict.status().to_string());
    ++cases;
    INFO(dense.describe << "\n  spec    " << describe(spec) << " (cost " << spec.description_cost()
                        << ")\n  verdict " << describe(*verdict) << " (cost " << verdict->description_cost() << ")");
    REQUIRE(verdict->kind != StructureKind::arbitrary);
    ++structured;
    CHECK(renders_equal(*verdict, dense.view));
    // Canonical: never longer than the generated description, and on a tie never a later kind.
    CHECK(verdict->description_cost() <= canonical_cost_bound(spec));
    if (verdict->description_cost() == spec.description_cost()) CHECK(verdict->kind <= spec.kind);
    CHECK(verdict->empty_rows == count_empty_rows(spec, heads));
    CHECK(verdict->bias == dense.wrote_bias);
    CHECK(verdict->batch == batch);
    CHECK(verdict->heads == heads);
    // The whole pipeline: the policy for the verdict is a call or an exact plan.
    DecideOptions wide;
    wide.max_plan_calls = 512;
    auto policy = decide(*verdict, AttentionCall{}, Environment{}, wide);
    REQUIRE(policy.ok());
    if (!policy->plan.empty()) CHECK(plan_is_exact(*verdict, *policy));
  }
  MESSAGE("round-tripped " << structured << " of " << cases << " generated masks");
}

TEST_CASE("larger shapes round-trip, including 4097") {
  Rng rng(test_seed(7));
  for (auto [q_len, k_len] : {std::pair<std::int64_t, std::int64_t>{4097, 4097}, {65, 4097}, {4097, 1}, {1, 4097}}) {
    for (int rep = 0; rep < 3; ++rep) {
      MaskStructure spec = random_structure(rng, 1, q_len, k_len);
      DenseMask dense = render(spec, 1, ElementType::boolean, Polarity::true_attends, Layout::contiguous, rng);
      auto verdict = inspect(dense.view);
      REQUIRE(verdict.ok());
      INFO(dense.describe << "\n  spec    " << describe(spec) << "\n  verdict " << describe(*verdict));
      REQUIRE(verdict->kind != StructureKind::arbitrary);
      CHECK(verdict->description_cost() <= canonical_cost_bound(spec));
      for (std::int64_t q = 0; q < q_len; ++q) REQUIRE(verdict->row(0, q).same_keys(spec.row(0, q)));
    }
  }
}

}  // TEST_SUITE
