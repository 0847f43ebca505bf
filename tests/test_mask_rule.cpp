// The structure's rule, written once (mask_rule.hpp):
//   * every kind and modifier is the terms its documentation names, in order;
//   * allows() (the rule at one element) equals row() (the interval form) on generated
//     structures of every kind, alignment and modifier, Q > K bottom-right included, where
//     a chunk's p is negative (floor division, as Python's //);
//   * the Python the CLI prints spells each term as documented (the Python tests run both
//     spellings against row()).
#include <doctest/doctest.h>

#include <masklens/backends/flex_attention.hpp>
#include <masklens/mask_rule.hpp>

#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <vector>

using namespace masklens;

namespace {

std::vector<RuleTerm> terms(const RuleTerms& g) { return {g.begin(), g.end()}; }

MaskStructure structure(StructureKind kind, std::int64_t q_len, std::int64_t k_len, Alignment a = Alignment::top_left) {
  MaskStructure s;
  s.kind = kind, s.q_len = q_len, s.k_len = k_len, s.alignment = a;
  return s;
}

std::string printed(const MaskStructure& s) {
  return backends::flex_attention::python_mask_mod(s, Call{}, std::nullopt);
}

}  // namespace

TEST_CASE("mask_rule: each kind and modifier is its documented terms") {
  using T = RuleTerm;
  const MaskRule causal = mask_rule(StructureKind::causal, false, false, false);
  CHECK(causal.groups == 1);
  CHECK(terms(causal.any_of[0]) == std::vector<T>{T::key_not_after_row});
  CHECK(causal.modifiers.n == 0);
  const MaskRule chunked = mask_rule(StructureKind::chunked, true, true, true);
  CHECK(terms(chunked.any_of[0]) == std::vector<T>{T::key_not_after_row, T::row_in_keys, T::same_chunk});
  CHECK(terms(chunked.modifiers) == std::vector<T>{T::same_document, T::key_in_kv_valid, T::row_in_q_valid});
  const MaskRule blocks = mask_rule(StructureKind::causal_blocks, false, false, false);
  CHECK(blocks.groups == 2);
  CHECK(terms(blocks.any_of[1]) == std::vector<T>{T::same_block});
  CHECK(terms(mask_rule(StructureKind::prefix_lm, false, false, false).any_of[1]) == std::vector<T>{T::key_in_prefix});
  CHECK(terms(mask_rule(StructureKind::arbitrary, false, false, false).any_of[0]) == std::vector<T>{T::no_key});
}

TEST_CASE("mask_rule: a rule's terms are visited in order, and what it reads follows them") {
  using T = RuleTerm;
  const MaskRule chunked = mask_rule(StructureKind::chunked, true, false, true);
  std::vector<T> seen;
  for_each_term(chunked, [&seen](T t) { seen.push_back(t); });
  CHECK(seen == std::vector<T>{T::key_not_after_row, T::row_in_keys, T::same_chunk, T::same_document, T::row_in_q_valid});
  CHECK(has_term(mask_rule(StructureKind::prefix_lm, false, false, false), T::key_in_prefix));
  CHECK_FALSE(has_term(mask_rule(StructureKind::causal_blocks, true, true, true), T::key_in_prefix));
  CHECK_FALSE(has_term(chunked, T::key_in_kv_valid));
  MaskStructure s = structure(StructureKind::causal_blocks, 8, 12, Alignment::bottom_right);
  s.kv_valid = {{0, 12}};
  CHECK(python_tables(s) == std::vector<std::string_view>{"block_id", "kv_start", "kv_end"});
  CHECK(block_table_length(s) == 12);  // p = q + 4 stays below K
  s.alignment = Alignment::top_left, s.q_len = 20;
  CHECK(block_table_length(s) == 20);  // rows past the keys still read their own position
}

TEST_CASE("mask_rule: allows() equals row() on generated structures") {
  std::mt19937_64 rng(41);
  const auto pick = [&](std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
  };
  const StructureKind kinds[] = {StructureKind::full,      StructureKind::causal,    StructureKind::sliding_window,
                                 StructureKind::chunked,   StructureKind::prefix_lm, StructureKind::causal_blocks};
  int checked = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    MaskStructure s = structure(kinds[pick(0, 5)], pick(1, 20), pick(1, 20),
                                pick(0, 1) ? Alignment::bottom_right : Alignment::top_left);
    s.batch = pick(1, 3);
    s.window = s.kind == StructureKind::sliding_window ? pick(1, s.k_len + 2) : 0;
    s.chunk = s.kind == StructureKind::chunked ? pick(1, s.k_len + 2) : 0;
    s.prefix = s.kind == StructureKind::prefix_lm ? pick(1, s.k_len) : 0;
    if (s.kind == StructureKind::causal_blocks) {
      const std::int64_t start = pick(0, s.k_len - 1);
      s.blocks = {{start, pick(start + 1, s.k_len)}};
    }
    if (s.q_len == s.k_len && pick(0, 2) == 0) s.segments = {{0, pick(1, s.q_len), s.q_len}};
    if (!s.segments.empty() && s.segments[0][1] == s.q_len) s.segments[0].erase(s.segments[0].begin() + 1);
    if (pick(0, 2) == 0) {  // one range for every batch, or one a batch
      for (std::int64_t b = pick(0, 1) ? s.batch : 1; b > 0; --b) {
        const std::int64_t start = pick(0, s.k_len - 1);
        s.kv_valid.push_back({start, pick(start + 1, s.k_len)});
      }
    }
    if (pick(0, 3) == 0) {
      const std::int64_t start = pick(0, s.q_len - 1);
      s.q_valid = {{start, pick(start + 1, s.q_len)}};
    }
    if (!s.validate().ok()) continue;
    ++checked;
    for (std::int64_t b = 0; b < s.batch; ++b)
      for (std::int64_t q = 0; q < s.q_len; ++q) {
        const RowSpan r = s.row(b, q);
        for (std::int64_t k = 0; k < s.k_len; ++k)
          REQUIRE_MESSAGE(s.allows(b, q, k) == (!r.empty() && r.first <= k && k <= r.last),
                          "kind ", to_string(s.kind), " b ", b, " q ", q, " k ", k);
      }
  }
  CHECK(checked > 2000);
}

TEST_CASE("mask_rule: a bottom-right chunk above the keys attends nothing (floor division)") {
  // Q 6 > K 3: rows 0..2 sit at p = -3..-1; with truncating division -1 / 4 == 0 == k / 4.
  MaskStructure s = structure(StructureKind::chunked, 6, 3, Alignment::bottom_right);
  s.chunk = 4;
  for (std::int64_t k = 0; k < 3; ++k) CHECK_FALSE(holds(RuleTerm::same_chunk, s, 0, 2, k));
  CHECK(holds(RuleTerm::same_chunk, s, 0, 3, 0));
}

TEST_CASE("mask_rule: the printed mask_mod spells each term") {
  MaskStructure s = structure(StructureKind::sliding_window, 4, 6, Alignment::bottom_right);
  s.window = 3;
  CHECK(printed(s) == "def mask_mod(b, h, q_idx, kv_idx):\n    return (kv_idx <= (q_idx + 2)) & ((q_idx + 2) - kv_idx < 3)\n");
  s = structure(StructureKind::prefix_lm, 5, 5);
  s.prefix = 2, s.kv_valid = {{1, 5}};
  CHECK(printed(s) ==
        "kv_start = torch.tensor([1], device=q.device)\nkv_end = torch.tensor([5], device=q.device)\n"
        "def mask_mod(b, h, q_idx, kv_idx):\n    return ((kv_idx <= q_idx) | (kv_idx < 2)) & (kv_idx >= kv_start[b]) & "
        "(kv_idx < kv_end[b])\n");
  s = structure(StructureKind::causal_blocks, 4, 4);
  s.blocks = {{1, 3}}, s.segments = {{0, 2, 4}};
  CHECK(printed(s) ==
        "block_id = torch.full((4,), -1, dtype=torch.int32, device=q.device)\nblock_id[1:3] = 0\n"
        "document_id = torch.zeros(1, 4, dtype=torch.int32, device=q.device)\ndocument_id[0, 2:] += 1\n"
        "def mask_mod(b, h, q_idx, kv_idx):\n    return ((kv_idx <= q_idx) | ((block_id[kv_idx.clamp(max=3)] >= 0) & "
        "(block_id[kv_idx.clamp(max=3)] == block_id[q_idx.clamp(min=0, max=3)]) & (q_idx >= 0))) & "
        "(document_id[b, q_idx.clamp(max=3)] == document_id[b, kv_idx.clamp(max=3)])\n");
  s = structure(StructureKind::causal, 3, 3);
  s.q_valid = {{0, 2}};
  CHECK(printed(s) ==
        "q_start = torch.tensor([0], device=q.device)\nq_end = torch.tensor([2], device=q.device)\n"
        "def mask_mod(b, h, q_idx, kv_idx):\n    return (kv_idx <= q_idx) & (q_idx >= q_start[b]) & (q_idx < q_end[b])\n");
}
