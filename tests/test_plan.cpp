// decompose_rows derives runs from a structure's parameters; the reference here walks
// every row (the definition of a run). Both must agree run for run, including where
// max_runs cuts them off.
#include <doctest/doctest.h>

#include <masklens/masklens.hpp>

#include "support/mask_gen.hpp"

using namespace masklens;

namespace {

bool same_run(const RowRun& a, const RowRun& b) {
  return a.batch == b.batch && a.kind == b.kind && a.q_range == b.q_range && a.k_range == b.k_range;
}

// A run is rows that one unmasked call computes: all empty, the same keys, or the
// same first key with the last advancing by one per row. Row by row, by definition.
std::optional<std::vector<RowRun>> runs_by_row(const MaskStructure& s, std::int64_t max_runs) {
  std::vector<RowRun> runs;
  if (s.kind == StructureKind::arbitrary) return std::nullopt;
  for (std::int64_t b = 0; b < s.batch; ++b) {
    std::int64_t q = 0;
    while (q < s.q_len) {
      if (static_cast<std::int64_t>(runs.size()) >= max_runs) return std::nullopt;
      const RowSpan first = s.row(b, q);
      RowRun run{b, RunKind::zeros, {q, q + 1}, {0, 0}};
      std::int64_t end = q + 1;
      if (first.empty()) {
        while (end < s.q_len && s.row(b, end).empty()) ++end;
      } else {
        run.kind = RunKind::full;
        if (end < s.q_len) {
          const RowSpan next = s.row(b, end);
          if (!next.empty() && next.first == first.first && next.last == first.last + 1) run.kind = RunKind::causal;
        }
        std::int64_t last = first.last;
        while (end < s.q_len) {
          const RowSpan next = s.row(b, end);
          const std::int64_t want_last = run.kind == RunKind::causal ? last + 1 : last;
          if (next.empty() || next.first != first.first || next.last != want_last) break;
          last = want_last;
          ++end;
        }
        run.k_range = {first.first, last + 1};
      }
      run.q_range.end = end;
      runs.push_back(run);
      q = end;
    }
  }
  return runs;
}

void check_same_runs(const MaskStructure& s, std::int64_t max_runs) {
  INFO(describe(s), " max_runs ", max_runs);
  const auto want = runs_by_row(s, max_runs);
  const auto got = decompose_rows(s, max_runs);
  REQUIRE(got.has_value() == want.has_value());
  if (!want) return;
  REQUIRE(got->size() == want->size());
  for (std::size_t i = 0; i < want->size(); ++i) {
    INFO("run ", i);
    CHECK(same_run((*got)[i], (*want)[i]));
  }
}

}  // namespace

TEST_CASE("runs from parameters equal runs row by row, for every generated structure") {
  testing::Rng rng(testing::test_seed(2027));
  int compared = 0;
  for (int i = 0; i < 6000; ++i) {
    const std::int64_t q = testing::uniform(rng, 1, i % 3 == 0 ? 300 : 40);
    const std::int64_t k = testing::coin(rng) ? q : testing::uniform(rng, 1, i % 3 == 0 ? 300 : 40);
    const MaskStructure s = testing::random_structure(rng, testing::uniform(rng, 1, 3), q, k);
    check_same_runs(s, testing::coin(rng, 0.8) ? 1'000'000 : testing::uniform(rng, 1, 12));
    ++compared;
  }
  MESSAGE(compared, " structures compared");
}

TEST_CASE("runs at 69632 tokens equal runs row by row") {
  constexpr std::int64_t L = 69632;
  MaskStructure causal = make_structure(StructureKind::causal, 2, L, L);
  causal.kv_valid = {{0, L}, {0, 50000}};
  check_same_runs(causal, 64);
  const auto runs = decompose_rows(causal, 64);
  REQUIRE(runs);
  REQUIRE(runs->size() == 3);  // batch 0: one causal call; batch 1: causal, then full rows over the 50000 keys
  CHECK(same_run((*runs)[0], RowRun{0, RunKind::causal, {0, L}, {0, L}}));
  CHECK(same_run((*runs)[1], RowRun{1, RunKind::causal, {0, 50000}, {0, 50000}}));
  CHECK(same_run((*runs)[2], RowRun{1, RunKind::full, {50000, L}, {0, 50000}}));

  MaskStructure left = causal;
  left.kv_valid = {{1234, L}, {0, L}};
  check_same_runs(left, 64);
  MaskStructure docs = make_structure(StructureKind::causal, 1, L, L);
  docs.segments = {{0, 1, 1000, 30000, 69631, L}};
  check_same_runs(docs, 64);
  MaskStructure window = make_structure(StructureKind::sliding_window, 1, L, L);
  window.window = 4096;
  check_same_runs(window, 64);
  check_same_runs(window, 1'000'000);
  MaskStructure chunked = make_structure(StructureKind::chunked, 1, L, L);
  chunked.chunk = 8192;
  check_same_runs(chunked, 64);
  chunked.kv_valid = {{5000, 60000}};
  check_same_runs(chunked, 64);
  MaskStructure blocks = make_structure(StructureKind::causal_blocks, 1, L, L);
  blocks.blocks = {{100, 356}, {5000, 5256}, {L - 10, L}};
  check_same_runs(blocks, 64);
  MaskStructure prefix = make_structure(StructureKind::prefix_lm, 1, L, L);
  prefix.prefix = 777;
  check_same_runs(prefix, 64);
  MaskStructure decode = make_structure(StructureKind::causal, 3, 7, L, Alignment::bottom_right);
  decode.kv_valid = {{0, L}, {100, L}, {0, L - 3}};
  check_same_runs(decode, 64);
}
