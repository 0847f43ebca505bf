// The classifier is a proof: every verdict renders back to the mask element for
// element, and it is the shortest exact description (DESIGN's canonical rules).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include <masklens/classify_runs.hpp>

#include "support/calls.hpp"
#include "support/mask_gen.hpp"
#include "support/shortest_description.hpp"
#include "support/structure_fields.hpp"

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

// Both classifiers on one table: the span table's, and the runs' held to the run path
// (never expanded for density); the verdicts field for field alike.
MaskStructure classify_both(const SpanTable& t) {
  const Result<MaskStructure> table = classify(t);
  REQUIRE(table.ok());
  const Result<SpanRuns> runs = SpanRuns::encode(t);
  REQUIRE(runs.ok());
  const Result<MaskStructure> on_runs = detail::runs::classify_runs(*runs, {0, 64, 1 << 14}, nullptr);
  REQUIRE(on_runs.ok());
  CHECK(structure_fields(*on_runs) == structure_fields(*table));
  return *table;
}

// The verdict for a small mask is exact, and as short as the brute force's, with the
// same kind, q_valid or not, and alignment (docs/structures.md, Canonical form).
void check_shortest(const SmallMask& m, const std::vector<MaskStructure>& bases, const std::string& what) {
  const MaskStructure verdict = classify_both(span_table_of(m));
  const Shortest want = shortest_description(m, bases);
  INFO(what << "\n  verdict " << describe(verdict) << " (cost " << verdict.description_cost() << ")\n  shortest: cost "
            << want.rank.cost << ", " << to_string(want.rank.kind) << (want.rank.q_valid ? " with q_valid" : "") << ", "
            << to_string(want.rank.alignment));
  if (verdict.kind != StructureKind::arbitrary) REQUIRE(small_mask_of(verdict).rows == m.rows);  // sound
  REQUIRE(rank_of(verdict) == want.rank);
}

}  // namespace

TEST_SUITE("host") {

TEST_CASE("the shortest description where documents, padding or padded queries hide a chunk or cut a block") {
  struct Case {
    const char* name;
    MaskStructure spec;
    const char* verdict;  // describe() of the canonical form
  };
  std::vector<Case> cases;
  {  // the chunk boundary is one document offset per batch too: the chunk is cheaper
    MaskStructure s = make_structure(StructureKind::chunked, 2, 13, 13);
    s.chunk = 12;
    s.segments = {{0, 5, 6, 7, 11, 13}, {0, 4, 5, 8, 9, 13}};
    cases.push_back({"chunk past Q/2 among documents, B = 2 (13 numbers, not 14)", s,
                     "chunked top_left chunk 12, segments [[0,5,6,7,11,13],[0,4,5,8,9,13]]"});
  }
  {  // left padding empties the first chunk: 10 and 15 show chunk 5 only by their gap
    MaskStructure s = make_structure(StructureKind::chunked, 1, 16, 16);
    s.chunk = 5;
    s.kv_valid = {{6, 16}};
    s.segments = {{0, 8, 9, 16}};
    cases.push_back({"chunked with documents and padding, B = 1 (7 numbers, not 8)", s,
                     "chunked top_left chunk 5, kv_valid [[6,16]], segments [[0,8,9,16]], 6 empty rows"});
  }
  {  // one query row per batch: the batches' starts (6 and 8) show chunk 2 only together
    MaskStructure s = make_structure(StructureKind::chunked, 2, 8, 10, Alignment::bottom_right);
    s.chunk = 2;
    s.q_valid = {{4, 5}, {7, 8}};
    cases.push_back({"chunked with padded queries, B = 2 (5 numbers, not 8)", s,
                     "chunked bottom_right chunk 2, q_valid [[4,5],[7,8]], 14 empty rows"});
  }
  {  // padding cuts block [2, 6) into touching pieces [2, 4) and [4, 6)
    MaskStructure s = make_structure(StructureKind::causal_blocks, 2, 6, 6);
    s.blocks = {{0, 2}, {2, 6}};
    s.kv_valid = {{0, 4}, {5, 6}};
    s.q_valid = {{0, 4}, {4, 5}};
    cases.push_back({"blocks with padding and padded queries, B = 2 (12 numbers, not 14)", s,
                     "causal_blocks top_left blocks [[0,2],[2,6]], kv_valid [[0,4],[5,6]], q_valid [[0,4],[4,5]], 7 empty rows"});
  }
  {  // chunk 3 with q_valid [[0,2]] also takes 3 numbers: the tie goes to the one without q_valid
    MaskStructure s = make_structure(StructureKind::chunked, 1, 3, 6, Alignment::bottom_right);
    s.chunk = 5;
    s.kv_valid = {{3, 5}};
    cases.push_back({"a tie between kv_valid and q_valid", s, "chunked bottom_right chunk 5, kv_valid [[3,5]], 1 empty rows"});
  }
  for (const Case& c : cases) {
    INFO(c.name << ": " << describe(c.spec));
    // The library's rendering, read as a framework's [B, 1, Q, K] bool mask.
    Result<std::vector<std::uint8_t>> dense = render_dense(c.spec);
    REQUIRE(dense.ok());
    const std::int64_t shape[4] = {c.spec.batch, 1, c.spec.q_len, c.spec.k_len};
    auto view = MaskView::contiguous(dense->data(), ElementType::boolean, shape);
    REQUIRE(view.ok());
    Result<SpanTable> table = scan(*view);
    REQUIRE(table.ok());
    const MaskStructure verdict = classify_both(*table);
    CHECK(describe(verdict) == c.verdict);
    CHECK(verdict.description_cost() == c.spec.description_cost());
    CHECK(renders_equal(verdict, *view));
    auto inspected = inspect(*view);
    REQUIRE(inspected.ok());
    CHECK(structure_fields(*inspected) == structure_fields(verdict));
  }
}

TEST_CASE("the shortest exact description, by brute force: every small mask of one batch, and batches of 2-3") {
  // Every mask some structure describes over Q <= 5, K <= 6, B = 1 (about 5000).
  int masks = 0;
  for (std::int64_t q_len = 1; q_len <= 5; ++q_len)
    for (std::int64_t k_len = 1; k_len <= 6; ++k_len) {
      const std::vector<MaskStructure> bases = small_bases(q_len, k_len);
      for (const SmallMask& m : every_small_mask(q_len, k_len, bases)) {
        check_shortest(m, bases, "Q=" + std::to_string(q_len) + " K=" + std::to_string(k_len));
        ++masks;
      }
    }
  // Batches of 2 and 3 up to 7 x 8, modifiers drawn to meet (single query rows, documents).
  Rng rng(test_seed(20263001));
  std::vector<std::vector<MaskStructure>> bases_of(8 * 9);
  for (int i = 0; i < 2500; ++i) {
    const std::int64_t q_len = uniform(rng, 1, 7), k_len = coin(rng) ? q_len : uniform(rng, 1, 8);
    std::vector<MaskStructure>& bases = bases_of[static_cast<std::size_t>(q_len * 9 + k_len)];
    if (bases.empty()) bases = small_bases(q_len, k_len);
    const MaskStructure spec = small_structure(rng, bases, uniform(rng, 2, 3));
    check_shortest(small_mask_of(spec), bases, describe(spec));
    ++masks;
  }
  MESSAGE(masks << " small masks: every verdict the shortest exact description");
}


// Where the completeness gaps live, beyond the brute force's 5 x 6 of one batch: every
// verdict is exact and takes no more numbers than the structure that made the mask.
// `check` returns whether the verdict is as short as the spec.
namespace {
bool as_short_as(const MaskStructure& spec, const std::string& what) {
  REQUIRE(spec.validate().ok());
  const SmallMask m = small_mask_of(spec);
  const MaskStructure verdict = classify_both(span_table_of(m));
  INFO(what << ": " << describe(spec) << "\n  verdict " << describe(verdict));
  if (verdict.kind != StructureKind::arbitrary) REQUIRE(small_mask_of(verdict).rows == m.rows);  // sound
  return verdict.kind != StructureKind::arbitrary && verdict.description_cost() <= spec.description_cost();
}
}  // namespace

TEST_CASE("chunked with packed documents and left padding, 20-24 tokens: a document between two chunk boundaries") {
  // Batch 1, keys [p, L) valid, one or two document starts; the chunk boundaries left of
  // p are hidden, and a document starting between two visible ones puts its own fresh
  // row between them (chunk 4 over 22, p = 13, documents from 14 and 19). A structured
  // search: every chunk, padding and first document start, the second a few rows on.
  std::int64_t masks = 0, short_ones = 0;
  for (std::int64_t L = 20; L <= 24; ++L)
    for (std::int64_t chunk = 2; chunk <= L / 2; ++chunk)
      for (std::int64_t pad = 0; pad < L; pad += (L == 22 ? 1 : 3))
        for (std::int64_t d1 = std::max<std::int64_t>(1, pad); d1 < L; ++d1)
          for (std::int64_t gap = 0; gap <= 5; gap += (gap == 0 ? 2 : 3)) {  // none, 2 rows on, 5 rows on
            const std::int64_t d2 = gap == 0 ? L : d1 + gap;
            if (d2 > L) continue;
            MaskStructure s = make_structure(StructureKind::chunked, 1, L, L);
            s.chunk = chunk;
            if (pad > 0) s.kv_valid = {{pad, L}};
            s.segments = {d2 < L ? std::vector<std::int64_t>{0, d1, d2, L} : std::vector<std::int64_t>{0, d1, L}};
            ++masks;
            short_ones += as_short_as(s, "L=" + std::to_string(L));
          }
  CHECK(short_ones == masks);
  {
    MaskStructure s = make_structure(StructureKind::chunked, 1, 22, 22);
    s.chunk = 4;
    s.kv_valid = {{13, 22}};
    s.segments = {{0, 14, 19, 22}};
    const MaskStructure verdict = classify_both(span_table_of(small_mask_of(s)));
    CHECK(describe(verdict) == "chunked top_left chunk 4, kv_valid [[13,22]], segments [[0,14,19,22]], 13 empty rows");
  }
  MESSAGE(masks << " chunked masks with documents and left padding at 20-24 tokens");
}

TEST_CASE("causal blocks cut apart by padding: two batches at 6 x 6") {
  // A block, each batch's keys padded on the right and its queries on the left (or not):
  // one batch shows the block's first rows (its keys stop), another its last (its
  // queries start late), and the rows between show it in none, so the pieces lie apart
  // ([1, 3) and [4, 6) of block [1, 6)). Every single block at 6 x 6, every such padding
  // pair: as short as the spec; and a sample held to the brute force.
  const std::int64_t L = 6;
  std::vector<KeyRange> kv_ends, q_starts;
  for (std::int64_t e = 1; e <= L; ++e) kv_ends.push_back({0, e});
  for (std::int64_t s = 0; s < L; ++s) q_starts.push_back({s, L});
  std::int64_t masks = 0, short_ones = 0;
  for (std::int64_t bs = 0; bs + 2 <= L; ++bs)
    for (std::int64_t be = bs + 2; be <= L; ++be)
      for (const KeyRange& kv0 : kv_ends)
        for (const KeyRange& q0 : q_starts)
          for (const KeyRange& kv1 : kv_ends)
            for (const KeyRange& q1 : q_starts) {
              if (bs == 0 && be == L) continue;  // a block over every row: full by rule
              MaskStructure s = make_structure(StructureKind::causal_blocks, 2, L, L);
              s.blocks = {{bs, be}};
              s.kv_valid = {kv0, kv1};
              s.q_valid = {q0, q1};
              ++masks;
              short_ones += as_short_as(s, "blocks with padding, B = 2");
            }
  CHECK(short_ones == masks);
  {
    MaskStructure s = make_structure(StructureKind::causal_blocks, 2, L, L);
    s.blocks = {{1, 6}};
    s.kv_valid = {{0, 3}, {0, 6}};
    s.q_valid = {{0, 6}, {4, 6}};
    const MaskStructure verdict = classify_both(span_table_of(small_mask_of(s)));
    CHECK(describe(verdict) == "causal_blocks top_left blocks [[1,6]], kv_valid [[0,3],[0,6]], q_valid [[0,6],[4,6]], 4 empty rows");
  }
  // Two batches at 6 x 6 with blocks, padding and documents drawn together, each held to
  // the brute force's shortest description.
  const std::vector<MaskStructure> bases = small_bases(L, L);
  std::vector<MaskStructure> block_bases;
  for (const MaskStructure& b : bases)
    if (b.kind == StructureKind::causal_blocks) block_bases.push_back(b);
  Rng rng(test_seed(20264202));
  for (int i = 0; i < 300; ++i) {
    MaskStructure spec = small_structure(rng, block_bases, 2);
    check_shortest(small_mask_of(spec), bases, describe(spec));
  }
  MESSAGE(masks << " padded block masks, and 300 drawn, two batches at 6 x 6");
}

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
    if (verdict->description_cost() == spec.description_cost()) {
      CHECK(verdict->kind <= spec.kind);
      // Within a kind a tie goes to the description without q_valid.
      if (verdict->kind == spec.kind && !spec.has_q_valid()) CHECK_FALSE(verdict->has_q_valid());
    }
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

TEST_CASE("implied empty rows equal a row-by-row count, for every generated structure") {
  Rng rng(test_seed(11));
  int with_empty = 0;
  for (int i = 0; i < 20000; ++i) {
    const std::int64_t q_len = uniform(rng, 1, 40);
    const std::int64_t k_len = coin(rng) ? q_len : uniform(rng, 1, 40);
    MaskStructure s = random_structure(rng, uniform(rng, 1, 3), q_len, k_len);
    s.heads = uniform(rng, 1, 3);
    REQUIRE_MESSAGE(s.validate().ok(), describe(s) << ": " << s.validate().to_string());
    // Brute force over elements, through allows() (not row(), which the count uses).
    std::int64_t want = 0;
    for (std::int64_t b = 0; b < s.batch; ++b)
      for (std::int64_t q = 0; q < q_len; ++q) {
        bool any = false;
        for (std::int64_t k = 0; k < k_len && !any; ++k) any = s.allows(b, q, k);
        want += any ? 0 : s.heads;
      }
    INFO(describe(s) << " B=" << s.batch << " H=" << s.heads << " Q=" << q_len << " K=" << k_len);
    REQUIRE(s.implied_empty_rows() == want);
    with_empty += want > 0;
  }
  MESSAGE(with_empty << " of 20000 structures have empty rows");
  CHECK(with_empty > 2000);
}

TEST_CASE("implied empty rows cost O(pieces), not O(Q): lengths of 2^40") {
  constexpr std::int64_t L = std::int64_t{1} << 40;
  MaskStructure window = make_structure(StructureKind::sliding_window, 1, L, L);
  window.window = 64;
  window.kv_valid = {{100, L}};
  CHECK(window.implied_empty_rows() == 100);
  MaskStructure chunked = make_structure(StructureKind::chunked, 2, L, L);
  chunked.chunk = 1000;
  chunked.kv_valid = {{0, 5000}, {0, L}};  // batch 0: chunks starting at 5000 and later see no valid key
  CHECK(chunked.implied_empty_rows() == L - 5000);
  MaskStructure docs = make_structure(StructureKind::causal, 1, L, L);
  docs.segments = {{0, 10, L / 2, L}};
  docs.kv_valid = {{20, L}};  // the first document [0, 10) lies in padding
  CHECK(docs.implied_empty_rows() == 20);
  MaskStructure prefill = make_structure(StructureKind::causal, 1, L, 16, Alignment::top_left);
  CHECK(prefill.implied_empty_rows() == 0);
  MaskStructure past = make_structure(StructureKind::chunked, 1, L, 16, Alignment::bottom_right);
  past.chunk = 4;  // rows before key position 0 attend nothing
  CHECK(past.implied_empty_rows() == L - 16);
}

TEST_CASE("classify refuses a span table no scanner could produce") {
  const auto table = [](std::int64_t batch, std::int64_t distinct_batch) {
    SpanTable t;
    t.batch = batch;
    t.heads = 1;
    t.q_len = 2;
    t.k_len = 4;
    t.distinct_batch = distinct_batch;
    t.distinct_heads = 1;
    t.rows.assign(static_cast<std::size_t>(distinct_batch * 2), RowSpan::interval(0, 3));
    return t;
  };
  REQUIRE(classify(table(4, 4)).ok());
  REQUIRE(classify(table(4, 1)).ok());
  struct Bad {
    SpanTable t;
    ErrorCode code;
    const char* message;
  };
  std::vector<Bad> cases;
  cases.push_back({table(4, 2), ErrorCode::invalid_argument,
                   "span table distinct_batch must be 1 (broadcast) or batch (4), got 2"});
  SpanTable heads = table(1, 1);
  heads.heads = 2;
  heads.distinct_heads = 3;
  cases.push_back({heads, ErrorCode::invalid_argument, "span table distinct_heads must be 1 (broadcast) or heads (2), got 3"});
  SpanTable short_rows = table(2, 2);
  short_rows.rows.pop_back();
  cases.push_back({short_rows, ErrorCode::invalid_argument, "span table rows must hold distinct_batch * distinct_heads * q_len (4) spans, got 3"});
  SpanTable past_k = table(2, 2);
  past_k.rows[3] = RowSpan::interval(1, 4);
  cases.push_back({past_k, ErrorCode::invalid_argument, "span table row [1, 0, 1] is not a span of keys in [0, K)"});
  SpanTable overcount = table(2, 2);
  overcount.rows[2].count = 5;
  cases.push_back({overcount, ErrorCode::invalid_argument, "span table row [1, 0, 0] is not a span of keys"});
  SpanTable negative = table(2, 2);
  negative.rows[0] = RowSpan{};
  negative.rows[0].count = -1;
  cases.push_back({negative, ErrorCode::invalid_argument, "span table row [0, 0, 0]"});
  SpanTable flags = table(2, 2);
  flags.rows[1].flags = 1u << 7;
  cases.push_back({flags, ErrorCode::invalid_argument, "flags 128"});
  SpanTable empty = table(2, 2);
  empty.q_len = 0;
  cases.push_back({empty, ErrorCode::invalid_shape, "span table q_len must be >= 1, got 0"});
  SpanTable overflow = table(1, 1);
  overflow.batch = overflow.heads = std::int64_t{1} << 32;
  cases.push_back({overflow, ErrorCode::invalid_shape, "overflows 64 bits"});
  for (const Bad& c : cases) {
    auto r = classify(c.t);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == c.code);
    CHECK_MESSAGE(r.status().message().find(c.message) != std::string::npos, r.status().message());
  }
}

TEST_CASE("a row flagged NaN or +inf is invalid_value naming the row, whichever scanner flagged it") {
  SUBCASE("a span table built by hand") {
    SpanTable t;
    t.batch = 2;
    t.heads = 2;
    t.q_len = 3;
    t.k_len = 3;
    t.distinct_batch = 2;
    t.distinct_heads = 2;
    for (std::int64_t q = 0; q < 12; ++q) t.rows.push_back(RowSpan::interval(0, q % 3));  // causal everywhere
    REQUIRE(classify(t).ok());
    CHECK(classify(t)->kind == StructureKind::causal);
    t.rows[static_cast<std::size_t>(t.slice_index(1, 0) * 3 + 2)].flags |= kRowInvalid;
    auto r = classify(t);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == ErrorCode::invalid_value);
    CHECK(r.status().message().find("mask row [1, 0, 2] holds NaN or +inf") == 0);
  }
  SUBCASE("rows from the host row scanner, as a two-phase scan hands them over") {
    // fp32 causal [2, 1, 4, 4] with NaN at [1, 0, 2, 3] (a masked position).
    std::vector<float> mask(2 * 4 * 4);
    for (std::int64_t b = 0; b < 2; ++b)
      for (std::int64_t q = 0; q < 4; ++q)
        for (std::int64_t k = 0; k < 4; ++k)
          mask[static_cast<std::size_t>((b * 4 + q) * 4 + k)] = k <= q ? 0.0f : -std::numeric_limits<float>::infinity();
    mask[(1 * 4 + 2) * 4 + 3] = std::numeric_limits<float>::quiet_NaN();
    const std::int64_t shape[4] = {2, 1, 4, 4};
    auto view = MaskView::contiguous(mask.data(), ElementType::float32, shape);
    REQUIRE(view.ok());
    auto table = SpanTable::for_view(*view);
    REQUIRE(table.ok());
    const AdditiveBits bits = additive_bits(view->dtype(), view->encoding().masked_threshold);
    for (std::int64_t b = 0; b < 2; ++b)
      for (std::int64_t q = 0; q < 4; ++q)
        table->rows[static_cast<std::size_t>(table->slice_index(b, 0) * 4 + q)] = detail::scan_row(*view, bits, b, 0, q);
    CHECK((table->rows[static_cast<std::size_t>(table->slice_index(1, 0) * 4 + 2)].flags & kRowInvalid) != 0);
    auto r = classify(*table);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == ErrorCode::invalid_value);
    CHECK(r.status().message().find("mask row [1, 0, 2] holds NaN or +inf") == 0);
    // The one-call path names the element.
    auto whole = inspect(*view);
    REQUIRE_FALSE(whole.ok());
    CHECK(whole.status().code() == ErrorCode::invalid_value);
    CHECK(whole.status().message().find("mask element [1, 0, 2, 3]") == 0);
  }
}

TEST_CASE("decide and render refuse a malformed structure with the field and the rule") {
  struct Bad {
    const char* what;
    MaskStructure s;
    ErrorCode code;
    const char* message;
  };
  std::vector<Bad> cases;
  MaskStructure chunk0 = make_structure(StructureKind::chunked, 1, 64, 64);
  cases.push_back({"chunk 0 (divides by zero in base_row)", chunk0, ErrorCode::invalid_argument,
                   "structure.chunk must be in [1, 2^62] for chunked, got 0"});
  MaskStructure short_segments = make_structure(StructureKind::causal, 4, 16, 16);
  short_segments.segments = {{0, 8, 16}, {0, 16}};
  cases.push_back({"segments shorter than batch (read past the heap)", short_segments, ErrorCode::invalid_argument,
                   "structure.segments must list one entry per batch (4) or a single one for all batches, got 2"});
  MaskStructure short_kv = make_structure(StructureKind::full, 3, 1, 16);
  short_kv.kv_valid = {{0, 16}, {0, 8}};
  cases.push_back({"kv_valid shorter than batch", short_kv, ErrorCode::invalid_argument,
                   "structure.kv_valid must list one entry per batch (3)"});
  MaskStructure window = make_structure(StructureKind::sliding_window, 1, 16, 16);
  window.window = std::numeric_limits<std::int64_t>::max();
  cases.push_back({"a window that overflows key arithmetic", window, ErrorCode::invalid_argument, "structure.window"});
  MaskStructure blocks = make_structure(StructureKind::causal_blocks, 1, 16, 16);
  blocks.blocks = {{4, 8}, {6, 10}};
  cases.push_back({"overlapping blocks", blocks, ErrorCode::invalid_argument, "structure.blocks[1] [6, 10]"});
  MaskStructure rising = make_structure(StructureKind::causal, 1, 16, 16);
  rising.segments = {{0, 9, 3, 16}};
  cases.push_back({"segments not rising", rising, ErrorCode::invalid_argument, "structure.segments[0] must rise strictly"});
  MaskStructure empty_shape = make_structure(StructureKind::causal, 1, 0, 16);
  cases.push_back({"Q = 0", empty_shape, ErrorCode::invalid_shape, "structure q_len must be in [1, 2^62], got 0"});
  MaskStructure kind = make_structure(static_cast<StructureKind>(42), 1, 16, 16);
  cases.push_back({"a kind out of range", kind, ErrorCode::invalid_argument, "structure.kind 42 is not a kind"});
  MaskStructure count = make_structure(StructureKind::causal, 1, 16, 16);
  count.empty_rows = 5;
  cases.push_back({"an empty-row count the structure does not imply", count, ErrorCode::invalid_argument,
                   "structure.empty_rows is 5 but the structure implies 0"});
  MaskStructure finite = make_structure(StructureKind::arbitrary, 1, 16, 16);
  finite.empty_rows = 2;
  finite.finite_masked_rows = 3;
  cases.push_back({"more finite-masked rows than empty rows", finite, ErrorCode::invalid_argument,
                   "structure.finite_masked_rows (3) must be <= empty_rows (2)"});
  for (const Bad& c : cases) {
    INFO(c.what);
    auto p = decide(c.s, AttentionCall{});
    REQUIRE_FALSE(p.ok());
    CHECK(p.status().code() == c.code);
    CHECK_MESSAGE(p.status().message().find(c.message) != std::string::npos, p.status().message());
    if (c.s.kind == StructureKind::arbitrary) continue;  // render refuses arbitrary for its own reason
    auto dense = render_dense(c.s);
    REQUIRE_FALSE(dense.ok());
    CHECK(dense.status().message() == p.status().message());
  }
}

TEST_CASE("chunk evidence from every distinct batch: padded chunked masks of 3 or more batches, with padded queries") {
  // The smallest case found: bottom-right chunk 2 over [3, 1, 3, 4]; only the third
  // batch shows where a chunk starts.
  MaskStructure spec = make_structure(StructureKind::chunked, 3, 3, 4, Alignment::bottom_right);
  spec.chunk = 2;
  spec.kv_valid = {{3, 4}, {0, 0}, {0, 2}};
  Rng rng(test_seed(17));
  DenseMask dense = render(spec, 1, ElementType::boolean, Polarity::true_attends, Layout::contiguous, rng);
  auto verdict = inspect(dense.view);
  REQUIRE(verdict.ok());
  INFO(describe(*verdict));
  CHECK(verdict->kind == StructureKind::chunked);
  CHECK(verdict->chunk == 2);
  CHECK(renders_equal(*verdict, dense.view));
  CHECK(verdict->description_cost() <= spec.description_cost());

  // The family: chunked masks with padding per batch, 3 to 5 batches; a third with
  // padded query rows too (single rows often: the evidence of a batch is then one row).
  int cases = 0;
  for (int i = 0; i < 20000; ++i) {
    const std::int64_t batch = uniform(rng, 3, 5), q_len = uniform(rng, 1, 12);
    const std::int64_t k_len = coin(rng) ? q_len : uniform(rng, 1, 12);
    MaskStructure s = make_structure(StructureKind::chunked, batch, q_len, k_len,
                                     coin(rng) ? Alignment::bottom_right : Alignment::top_left);
    s.chunk = uniform(rng, 1, k_len + 1);
    for (std::int64_t b = 0; b < batch; ++b) {
      const std::int64_t start = uniform(rng, 0, k_len);
      s.kv_valid.push_back({start, uniform(rng, start, k_len)});
    }
    if (coin(rng, 0.3))
      for (std::int64_t b = 0; b < batch; ++b) {
        const std::int64_t start = uniform(rng, 0, q_len);
        s.q_valid.push_back({start, coin(rng, 0.5) ? std::min(q_len, start + 1) : uniform(rng, start, q_len)});
      }
    DenseMask m = render(s, 1, ElementType::boolean, Polarity::true_attends, Layout::contiguous, rng);
    auto v = inspect(m.view);
    REQUIRE(v.ok());
    INFO(m.describe << "\n  spec    " << describe(s) << "\n  verdict " << describe(*v));
    REQUIRE(v->kind != StructureKind::arbitrary);
    REQUIRE(renders_equal(*v, m.view));
    REQUIRE(v->description_cost() <= canonical_cost_bound(s));
    ++cases;
  }
  MESSAGE(cases << " padded chunked masks classified exactly");
}

TEST_CASE("a stride-0 batch costs O(1): B = 2^40 over a 16-byte buffer") {
  constexpr std::int64_t B = std::int64_t{1} << 40;
  const std::int64_t shape[] = {B, 1, 4, 4}, strides[] = {0, 0, 4, 1};
  SUBCASE("full") {
    const std::vector<std::uint8_t> ones(16, 1);
    auto view = MaskView::make(ones.data(), ElementType::boolean, shape, strides);
    REQUIRE(view.ok());
    auto verdict = inspect(*view);
    REQUIRE(verdict.ok());
    CHECK(verdict->kind == StructureKind::full);
    CHECK(verdict->batch == B);
    CHECK_FALSE(verdict->has_kv_valid());
    CHECK(verdict->empty_rows == 0);
    auto p = decide(*verdict, AttentionCall{});
    REQUIRE(p.ok());
    CHECK(p->plan.empty());
    CHECK(p->call.mask == MaskUse::drop);
  }
  SUBCASE("causal with key 0 padded: one kv_valid entry for every batch") {
    std::vector<std::uint8_t> m(16);
    for (int q = 0; q < 4; ++q)
      for (int k = 0; k < 4; ++k) m[static_cast<std::size_t>(q * 4 + k)] = k <= q && k >= 1;
    auto view = MaskView::make(m.data(), ElementType::boolean, shape, strides);
    REQUIRE(view.ok());
    auto verdict = inspect(*view);
    REQUIRE(verdict.ok());
    CHECK(verdict->kind == StructureKind::causal);
    REQUIRE(verdict->kv_valid.size() == 1);
    CHECK(verdict->kv_valid[0] == KeyRange{1, 4});
    CHECK(verdict->empty_rows == B);  // row 0 of every batch
    CHECK(verdict->implied_empty_rows() == B);
    CHECK(verdict->validate().ok());
    CHECK(verdict->description_cost() == 2 * B);  // what it costs written out: the verdict does not depend on the layout
    CHECK(verdict->row(B - 1, 0).empty());
    CHECK(verdict->row(B - 1, 3).same_keys(RowSpan::interval(1, 3)));
    // decide() writes modifiers out per batch; not 2^40 of them.
    auto p = decide(*verdict, AttentionCall{});
    REQUIRE_FALSE(p.ok());
    CHECK(p.status().code() == ErrorCode::out_of_memory);
  }
}

TEST_CASE("a broadcast batch gets one modifier entry and decides as the batch written out") {
  Rng rng(test_seed(23));
  for (int i = 0; i < 300; ++i) {
    const std::int64_t q_len = uniform(rng, 1, 24), k_len = coin(rng) ? q_len : uniform(rng, 1, 24);
    const std::int64_t batch = uniform(rng, 2, 6);
    const MaskStructure one = random_structure(rng, 1, q_len, k_len);
    DenseMask dense = render(repeat_batches(one, batch), 1, ElementType::boolean, Polarity::true_attends,
                             Layout::expand, rng);
    auto verdict = inspect(dense.view);
    REQUIRE(verdict.ok());
    INFO(dense.describe << "\n  spec    " << describe(one) << "\n  verdict " << describe(*verdict));
    REQUIRE(verdict->kind != StructureKind::arbitrary);
    CHECK(verdict->kv_valid.size() <= 1);
    CHECK(verdict->segments.size() <= 1);
    CHECK(renders_equal(*verdict, dense.view));
    // The same mask materialised per batch: the same verdict, written out.
    DenseMask copied = render(repeat_batches(one, batch), 1, ElementType::boolean, Polarity::true_attends,
                              Layout::contiguous, rng);
    auto written = inspect(copied.view);
    REQUIRE(written.ok());
    CHECK(written->kind == verdict->kind);
    CHECK(written->description_cost() == verdict->description_cost());
    CHECK(written->empty_rows == verdict->empty_rows);
    auto spelled = spell_out(*verdict);
    REQUIRE(spelled.ok());
    CHECK(describe(*spelled) == describe(*written));
    auto p = decide(*verdict, AttentionCall{}), q = decide(*written, AttentionCall{});
    REQUIRE(p.ok());
    REQUIRE(q.ok());
    CHECK(p->backend() == q->backend());
    CHECK(p->call == q->call);
    CHECK(p->plan.size() == q->plan.size());
  }
}

TEST_CASE("padded query rows: q_valid, and decide() never drops the mask as if they attended (a varlen call packs the valid rows)") {
  // Cross-attention [2, 1, 6, 10]: the outer product of valid query rows and valid keys.
  const std::int64_t B = 2, Q = 6, K = 10;
  const KeyRange rows[] = {{0, 4}, {0, 6}}, keys[] = {{0, 7}, {0, 10}};
  std::vector<std::uint8_t> m(static_cast<std::size_t>(B * Q * K));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t q = 0; q < Q; ++q)
      for (std::int64_t k = 0; k < K; ++k)
        m[static_cast<std::size_t>((b * Q + q) * K + k)] =
            rows[b].start <= q && q < rows[b].end && keys[b].start <= k && k < keys[b].end;
  const std::int64_t shape[] = {B, 1, Q, K};
  auto view = MaskView::contiguous(m.data(), ElementType::boolean, shape);
  REQUIRE(view.ok());
  auto verdict = inspect(*view);
  REQUIRE(verdict.ok());
  INFO(describe(*verdict));
  CHECK(verdict->kind == StructureKind::full);
  CHECK(verdict->q_valid == std::vector<KeyRange>{{0, 4}, {0, 6}});
  CHECK(verdict->kv_valid == std::vector<KeyRange>{{0, 7}, {0, 10}});
  CHECK(verdict->empty_rows == 2);
  CHECK(verdict->implied_empty_rows() == 2);
  CHECK(renders_equal(*verdict, *view));
  for (const Environment& env : {Environment{}, with_every_family()}) {
    auto p = decide(*verdict, seed_call(), env);
    REQUIRE(p.ok());
    const bool kept = p->call.mask == MaskUse::keep;
    const bool exact_plan = !p->plan.empty() && plan_is_exact(*verdict, *p);
    // A varlen call packs each batch's valid rows against its valid keys (cu_seqlens_q).
    const bool exact_call = p->plan.empty() && !kept && masklens::testing::call_is_exact(*verdict, p->call);
    CHECK((kept || exact_plan || exact_call));
  }
  // The same with Q == K (keys padded on both sides): q_valid and kv_valid, 4 numbers,
  // beat segments and kv_valid.
  std::vector<std::uint8_t> square(64);
  for (int q = 0; q < 8; ++q)
    for (int k = 0; k < 8; ++k) square[static_cast<std::size_t>(q * 8 + k)] = q < 5 && k >= 2 && k < 6;
  const std::int64_t square_shape[] = {8, 8};
  auto square_view = MaskView::contiguous(square.data(), ElementType::boolean, square_shape);
  REQUIRE(square_view.ok());
  auto v = inspect(*square_view);
  REQUIRE(v.ok());
  INFO(describe(*v));
  CHECK(v->kind == StructureKind::full);
  CHECK(v->q_valid == std::vector<KeyRange>{{0, 5}});
  CHECK(v->kv_valid == std::vector<KeyRange>{{2, 6}});
  CHECK_FALSE(v->has_segments());
}

}  // TEST_SUITE
