// The structure's rule, written once: which terms decide whether row q of batch b
// attends key k, each term's meaning in C++ and its spelling in Python side by side.
// MaskStructure::allows() evaluates it; FlexAttention's mask_mod (masklens.torch's,
// compiled from mask_mod_source()) and the mask_mod the CLI prints both spell it.
// row() and base_bounds() are its interval form (structure.hpp), tested equal to it.
//
// A rule is an OR of groups of terms ANDed (the base kind), ANDed with the modifiers'
// terms: causal is {k <= p}; prefix_lm is {k <= p} | {k < prefix}; packed documents add
// "same document". p is the row's key position (structure.hpp).
//
// structure.hpp includes this header at its end: allows() is MaskStructure's member.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "structure.hpp"

namespace masklens {

enum class RuleTerm : std::uint8_t {
  any_key,          // every key
  no_key,           // none (arbitrary: a structure with no rule)
  key_not_after_row,  // k <= p
  key_in_window,    // p - window < k
  row_in_keys,      // p >= 0 (a bottom-right row above the keys has no chunk or block)
  same_chunk,       // floor(k / chunk) == floor(p / chunk)
  key_in_prefix,    // k < prefix
  same_block,       // p and k in one of the VLM blocks
  same_document,    // p and k in one packed document
  key_in_kv_valid,  // k inside batch b's kv_valid
  row_in_q_valid,   // q inside batch b's q_valid
};

// A few terms ANDed; n of them used.
struct RuleTerms {
  std::array<RuleTerm, 3> terms{};
  std::uint8_t n = 0;
  [[nodiscard]] const RuleTerm* begin() const noexcept { return terms.data(); }
  [[nodiscard]] const RuleTerm* end() const noexcept { return terms.data() + n; }
};

struct MaskRule {
  std::array<RuleTerms, 2> any_of{};  // the base kind: groups ORed
  std::uint8_t groups = 0;
  RuleTerms modifiers;  // ANDed with the base, in this order: documents, kv_valid, q_valid
};

// The one place a kind and its modifiers become terms.
[[nodiscard]] constexpr MaskRule mask_rule(StructureKind kind, bool segments, bool kv_valid, bool q_valid) noexcept {
  using T = RuleTerm;
  MaskRule r;
  const auto group = [&r](std::initializer_list<T> terms) {
    RuleTerms& g = r.any_of[r.groups++];
    for (T t : terms) g.terms[g.n++] = t;
  };
  switch (kind) {
    case StructureKind::full: group({T::any_key}); break;
    case StructureKind::causal: group({T::key_not_after_row}); break;
    case StructureKind::sliding_window: group({T::key_not_after_row, T::key_in_window}); break;
    case StructureKind::chunked: group({T::key_not_after_row, T::row_in_keys, T::same_chunk}); break;
    case StructureKind::prefix_lm: group({T::key_not_after_row}), group({T::key_in_prefix}); break;
    case StructureKind::causal_blocks: group({T::key_not_after_row}), group({T::same_block}); break;
    case StructureKind::arbitrary: group({T::no_key}); break;
  }
  if (segments) r.modifiers.terms[r.modifiers.n++] = T::same_document;
  if (kv_valid) r.modifiers.terms[r.modifiers.n++] = T::key_in_kv_valid;
  if (q_valid) r.modifiers.terms[r.modifiers.n++] = T::row_in_q_valid;
  return r;
}

[[nodiscard]] inline MaskRule mask_rule(const MaskStructure& s) noexcept {
  return mask_rule(s.kind, s.has_segments(), s.has_kv_valid(), s.has_q_valid());
}

// Every term of a rule, its groups' then its modifiers', each once per place it holds.
template <class Visit>
constexpr void for_each_term(const MaskRule& r, Visit&& visit) {
  for (std::uint8_t i = 0; i < r.groups; ++i)
    for (RuleTerm t : r.any_of[i]) visit(t);
  for (RuleTerm t : r.modifiers) visit(t);
}

// Whether term t is one of the rule's (what reads a value beside the indices: a prefix, a table).
[[nodiscard]] constexpr bool has_term(const MaskRule& r, RuleTerm t) noexcept {
  bool found = false;
  for_each_term(r, [&](RuleTerm u) { found = found || u == t; });
  return found;
}

namespace rule_detail {
// Python's //: the rule's meaning does not hang on the sign of p.
[[nodiscard]] constexpr std::int64_t floor_div(std::int64_t a, std::int64_t b) noexcept {
  const std::int64_t q = a / b;
  return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q;
}
}  // namespace rule_detail

// Term t at row q (key position p) and key k of batch b.
[[nodiscard]] inline bool holds(RuleTerm t, const MaskStructure& s, std::int64_t b, std::int64_t q,
                                std::int64_t k) noexcept {
  const std::int64_t p = s.key_position(q);
  switch (t) {
    case RuleTerm::any_key: return true;
    case RuleTerm::no_key: return false;
    case RuleTerm::key_not_after_row: return k <= p;
    case RuleTerm::key_in_window: return p - s.window < k;
    case RuleTerm::row_in_keys: return p >= 0;
    case RuleTerm::same_chunk: return rule_detail::floor_div(k, s.chunk) == rule_detail::floor_div(p, s.chunk);
    case RuleTerm::key_in_prefix: return k < s.prefix;
    case RuleTerm::same_block:
      for (const KeyRange& r : s.blocks)
        if (r.start <= p && p < r.end) return r.start <= k && k < r.end;
      return false;
    case RuleTerm::same_document: {
      const KeyRange doc = s.document(b, p);
      return doc.start <= k && k < doc.end;
    }
    case RuleTerm::key_in_kv_valid: return s.kv_valid_of(b).start <= k && k < s.kv_valid_of(b).end;
    case RuleTerm::row_in_q_valid: return s.q_valid_of(b).start <= q && q < s.q_valid_of(b).end;
  }
  return false;
}

// The rule at one element. Precondition: 0 <= b < batch, 0 <= q < q_len, 0 <= k < k_len.
[[nodiscard]] inline bool rule_allows(const MaskStructure& s, std::int64_t b, std::int64_t q, std::int64_t k) noexcept {
  const MaskRule r = mask_rule(s);
  const auto all = [&](const RuleTerms& g) {
    for (RuleTerm t : g)
      if (!holds(t, s, b, q, k)) return false;
    return true;
  };
  bool base = false;
  for (std::uint8_t i = 0; i < r.groups && !base; ++i) base = all(r.any_of[i]);
  return base && all(r.modifiers);
}

inline bool MaskStructure::allows(std::int64_t b, std::int64_t q, std::int64_t k) const noexcept {
  return rule_allows(*this, b, q, k);
}

// How Python names what a term reads: the row's key position, prefix_lm's prefix, the tables' clamp bounds
// (a BlockMask is built over whole tiles, so indices reach past Q and K: lookups clamp,
// comparisons do not) and each per-batch table's batch index ("b", or "0" for a table
// of one entry that holds for every batch). The tables are block_id [n], document_id
// [B, Q], kv_start / kv_end [B] and q_start / q_end [B].
struct PythonOperands {
  std::string p = "q_idx";
  std::string prefix;         // prefix_lm's prefix (its number where empty)
  std::string key_last;       // kv_idx's clamp into block_id
  std::string block_last;     // p's clamp into block_id
  std::string document_last;  // q_idx's and kv_idx's clamp into document_id (Q == K)
  std::string document_batch = "b", kv_batch = "b", q_batch = "b";
};

// Term t in Python over b, q_idx and kv_idx (tensors). A compound term is an AND of
// parenthesised comparisons, which an AND it joins needs not parenthesise again.
struct PythonTerm {
  std::string text;
  bool compound = false;
};

[[nodiscard]] inline PythonTerm python_term(RuleTerm t, const MaskStructure& s, const PythonOperands& o) {
  const std::string& p = o.p;
  switch (t) {
    case RuleTerm::any_key: return {"kv_idx >= 0"};
    case RuleTerm::no_key: return {"kv_idx < 0"};
    case RuleTerm::key_not_after_row: return {"kv_idx <= " + p};
    case RuleTerm::key_in_window: return {p + " - kv_idx < " + std::to_string(s.window)};
    case RuleTerm::row_in_keys: return {p + " >= 0"};
    case RuleTerm::same_chunk: {
      const std::string c = std::to_string(s.chunk);
      return {"kv_idx // " + c + " == " + p + " // " + c};
    }
    case RuleTerm::key_in_prefix: return {"kv_idx < " + (o.prefix.empty() ? std::to_string(s.prefix) : o.prefix)};
    case RuleTerm::same_block: {
      // block_id holds -1 off every block; p < 0 (bottom-right, Q > K) lies in no block:
      // guarded, not wrapped around.
      const std::string key_block = "block_id[kv_idx.clamp(max=" + o.key_last + ")]";
      return {"(" + key_block + " >= 0) & (" + key_block + " == block_id[" + p + ".clamp(min=0, max=" + o.block_last +
                  ")]) & (" + p + " >= 0)",
              true};
    }
    case RuleTerm::same_document: {
      const std::string& db = o.document_batch;
      return {"document_id[" + db + ", q_idx.clamp(max=" + o.document_last + ")] == document_id[" + db +
              ", kv_idx.clamp(max=" + o.document_last + ")]"};
    }
    case RuleTerm::key_in_kv_valid:
      return {"(kv_idx >= kv_start[" + o.kv_batch + "]) & (kv_idx < kv_end[" + o.kv_batch + "])", true};
    case RuleTerm::row_in_q_valid:
      return {"(q_idx >= q_start[" + o.q_batch + "]) & (q_idx < q_end[" + o.q_batch + "])", true};
  }
  return {"kv_idx < 0"};
}

// The rule as one Python expression, with as few parentheses as stay unambiguous.
[[nodiscard]] inline std::string python_rule(const MaskStructure& s, const PythonOperands& o) {
  const MaskRule r = mask_rule(s);
  const auto wrap = [](const std::string& text) { return "(" + text + ")"; };
  const auto group_text = [&](const RuleTerms& g) {
    if (g.n == 1) return python_term(g.terms[0], s, o).text;
    std::string out;
    for (RuleTerm t : g) out += (out.empty() ? "" : " & ") + wrap(python_term(t, s, o).text);
    return out;
  };
  std::string rule;
  if (r.groups == 1) {
    rule = group_text(r.any_of[0]);
  } else {
    for (std::uint8_t i = 0; i < r.groups; ++i) rule += (i ? " | " : "") + wrap(group_text(r.any_of[i]));
  }
  for (RuleTerm t : r.modifiers) {
    const PythonTerm term = python_term(t, s, o);
    rule = wrap(rule) + " & " + (term.compound ? term.text : wrap(term.text));
  }
  return rule;
}

// The tables a rule's Python reads, by the names python_term gives them.
[[nodiscard]] inline std::vector<std::string_view> python_tables(const MaskStructure& s) {
  std::vector<std::string_view> out;
  for_each_term(mask_rule(s), [&out](RuleTerm t) {
    switch (t) {
      case RuleTerm::same_block: out.push_back("block_id"); break;
      case RuleTerm::same_document: out.push_back("document_id"); break;
      case RuleTerm::key_in_kv_valid: out.insert(out.end(), {"kv_start", "kv_end"}); break;
      case RuleTerm::row_in_q_valid: out.insert(out.end(), {"q_start", "q_end"}); break;
      default: break;
    }
  });
  return out;
}

// The bottom-right offset K - Q a rule's p adds (0: p is q_idx).
[[nodiscard]] inline std::int64_t rule_offset(const MaskStructure& s) noexcept {
  return s.alignment == Alignment::bottom_right && s.kind != StructureKind::full &&
                 s.kind != StructureKind::arbitrary
             ? s.k_len - s.q_len
             : 0;
}

// The length of block_id: every key, and every row's key position.
[[nodiscard]] inline std::int64_t block_table_length(const MaskStructure& s) noexcept {
  return std::max(s.k_len, s.q_len + rule_offset(s));
}

}  // namespace masklens
