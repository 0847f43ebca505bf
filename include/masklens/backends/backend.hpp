// The vocabulary every backend header shares: capability rules — one small named
// constraint with its source, run in order, every refusal collected (after PyTorch's
// sdp_utils check_* functions, but reporting all reasons instead of stopping at the
// first) — the structure facts the native forms ask, and what the renderers build
// (arguments.hpp, python_text.hpp).
#pragma once

#include <algorithm>
#include <bit>
#include <climits>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../backend_call.hpp"
#include "../call.hpp"
#include "../structure.hpp"
#include "arguments.hpp"
#include "python_text.hpp"

namespace masklens {

// The call and where it runs: what every rule, native form and defect reads.
struct CallContext {
  AttentionCall call;
  Environment env;
};

// What a rule is about: the call in general, or the dense mask a kept-mask call passes.
enum class RuleScope : std::uint8_t { call, kept_mask };

// How a kept-mask rule is satisfied without refusing the backend: the caller casts the
// mask first (Call::mask_cast).
enum class MaskFix : std::uint8_t { none, cast_to_query_dtype, cast_to_bool };

// One capability constraint: a name, where it comes from, the test, and the reason:
// fixed text, then ", " and what `detail` formats from the context (null: nothing).
struct Rule {
  std::string_view name;
  std::string_view source;
  bool (*refuses)(const CallContext&);
  std::string_view text;
  std::string (*detail)(const CallContext&) = nullptr;
  RuleScope scope = RuleScope::call;
  MaskFix fix = MaskFix::none;  // kept_mask rules only
};

// The rule every optional library starts with: its version must be given
// (Environment's default Version means "not installed").
template <Version Environment::*kVersion>
constexpr Rule installed(std::string_view name, std::string_view text) {
  return {name, "Environment (library versions)", [](const CallContext& c) { return !(c.env.*kVersion).known(); },
          text};
}

// A rule table fits Refusals' bit set.
inline constexpr std::size_t kMaxRules = 64;

// Which rules of a backend's table refuse a call: a bit per rule, no text until asked,
// so checking every backend allocates nothing.
struct Refusals {
  std::span<const Rule> rules;
  std::uint64_t refused = 0;

  [[nodiscard]] bool any() const noexcept { return refused != 0; }
  // f(rule) for every refusing rule, in table order.
  template <class F>
  void for_each(F&& f) const {
    for (std::uint64_t m = refused; m != 0; m &= m - 1) f(rules[static_cast<std::size_t>(std::countr_zero(m))]);
  }
  // The first refusing rule's source.
  [[nodiscard]] std::string_view source() const noexcept {
    return refused ? rules[static_cast<std::size_t>(std::countr_zero(refused))].source : std::string_view{};
  }
  // Every refusing rule's reason, "; "-separated, in table order.
  [[nodiscard]] std::string text(const CallContext& context) const {
    std::string out;
    for_each([&](const Rule& r) {
      if (!out.empty()) out += "; ";
      out += r.text;
      if (r.detail) out += ", " + r.detail(context);
    });
    return out;
  }
};

// Every refusal of `rules` in `scope` (tables hold at most kMaxRules: the registry checks).
inline Refusals check_rules(std::span<const Rule> rules, const CallContext& context,
                            RuleScope scope = RuleScope::call) noexcept {
  Refusals r{rules};
  for (std::size_t i = 0; i < rules.size(); ++i)
    if (rules[i].scope == scope && rules[i].refuses(context)) r.refused |= std::uint64_t{1} << i;
  return r;
}

// Native forms answer two questions with one body, so the two cannot drift apart:
// whether a backend expresses a structure (out == nullptr: what decide() asks of every
// backend, allocation-free) and with which call (asked once, for the one chosen).
template <class Build>
bool emit(Call* out, Build&& build) {
  if (out) *out = std::forward<Build>(build)();
  return true;
}

// A call that drops the mask for `args`.
template <class A>
Call dropping(Backend b, A&& args, MaskUse use = MaskUse::drop) {
  Call c;
  c.backend = b;
  c.mask = use;
  c.args = std::forward<A>(args);
  return c;
}

inline std::string num(std::int64_t v) { return std::to_string(v); }

// Tests several backends' rules share.
inline bool is_fp32(const CallContext& c) { return c.call.dtype == DType::float32; }
inline bool before_sm80(const CallContext& c) { return c.env.sm < 80; }

// What a refused call had, after a rule's reason: "flash needs sm80 or newer, got sm75".
inline std::string got_head_dim(const CallContext& c) { return "got " + num(c.call.head_dim); }
inline std::string got_sm(const CallContext& c) { return "got sm" + num(c.env.sm); }
inline std::string not_dtype(const CallContext& c) { return "not " + std::string(to_string(c.call.dtype)); }

// Structure facts every backend header asks.
inline bool plain(const MaskStructure& s) noexcept { return !s.has_kv_valid() && !s.has_segments() && !s.has_q_valid(); }
inline bool square(const MaskStructure& s) noexcept { return s.q_len == s.k_len; }
// Bottom-right and top-left agree when Q == K.
inline bool bottom_right(const MaskStructure& s) noexcept {
  return square(s) || s.alignment == Alignment::bottom_right;
}

// flash-attn's window_size=(left, right) for HF sliding_window W: left = W - 1.
inline std::int64_t window_left(const MaskStructure& s) noexcept { return s.window - 1; }

// The structure's causal / window rule as a kernel's arguments (bottom-right).
inline KernelArgs kernel_args(const MaskStructure& s) {
  KernelArgs a;
  a.causal = s.kind != StructureKind::full;
  a.alignment = bottom_right(s) ? Alignment::bottom_right : Alignment::top_left;
  if (a.causal) a.window_right = 0;
  if (s.kind == StructureKind::sliding_window) a.window_left = window_left(s);
  if (s.kind == StructureKind::chunked) a.chunk = s.chunk;
  return a;
}

// Calls f(start, end) for each document of batch b, cut further at multiples of
// `chunk` (0: none) — chunked masks are documents of C — without a temporary list.
template <class F>
void for_each_document(const MaskStructure& s, std::int64_t b, std::int64_t chunk, F&& f) {
  const std::vector<std::int64_t>* offsets = s.has_segments() ? &s.segments_of(b) : nullptr;
  std::size_t next_offset = 1;  // offsets->front() == 0
  std::int64_t start = 0;
  while (start < s.q_len) {
    std::int64_t end = s.q_len;
    if (offsets) {
      while (next_offset < offsets->size() && (*offsets)[next_offset] <= start) ++next_offset;
      if (next_offset < offsets->size()) end = std::min(end, (*offsets)[next_offset]);
    }
    if (chunk > 0) end = std::min(end, (start / chunk + 1) * chunk);
    f(start, end);
    start = end;
  }
}

// The sequences of a square structure's documents (chunks, with `chunk`), over the batch.
inline std::vector<Sequence> document_sequences(const MaskStructure& s, std::int64_t chunk = 0) {
  std::size_t n = 0;
  for (std::int64_t b = 0; b < s.batch; ++b) for_each_document(s, b, chunk, [&](std::int64_t, std::int64_t) { ++n; });
  std::vector<Sequence> out;
  out.reserve(n);
  for (std::int64_t b = 0; b < s.batch; ++b)
    for_each_document(s, b, chunk, [&](std::int64_t start, std::int64_t end) { out.push_back({b, {start, end}, {start, end}}); });
  return out;
}

// One sequence per batch: the batch's valid query rows (q_valid) against its valid keys
// (kv_valid); a batch with no valid query row has no sequence (its rows stay zeros).
inline std::vector<Sequence> padded_sequences(const MaskStructure& s) {
  std::vector<Sequence> out;
  out.reserve(static_cast<std::size_t>(s.batch));
  for (std::int64_t b = 0; b < s.batch; ++b) {
    const KeyRange q = s.query_rows(b);
    if (q.end > q.start) out.push_back({b, q, s.has_kv_valid() ? s.kv_valid_of(b) : KeyRange{0, s.k_len}});
  }
  return out;
}

// Whether every query row a padded form covers has a key: a sequence with rows but no
// keys is left to a plan's zeros step (kernels differ on empty key sets).
inline bool padded_rows_have_keys(const MaskStructure& s) noexcept {
  if (!s.has_kv_valid()) return true;
  for (std::int64_t b = 0; b < s.batch; ++b) {
    const KeyRange q = s.query_rows(b);
    const KeyRange& k = s.kv_valid_of(b);
    if (q.end > q.start && k.end <= k.start) return false;
  }
  return true;
}

// Varlen kernels take their offsets (cu_seqlens, indptr, seq_len) as int32 tensors:
// every token of the batch, packed, must be addressable by one.
inline bool offsets_fit_int32(const MaskStructure& s) noexcept {
  const std::int64_t longest = std::max(s.q_len, s.k_len);
  return s.batch <= INT32_MAX / longest;
}

// Packed documents (or chunks, with `chunk`) of a square structure: one sequence per
// document, the structure's causal / window rule inside each.
inline VarlenArgs document_varlen(const MaskStructure& s, std::int64_t chunk = 0) {
  VarlenArgs a;
  a.sequences = document_sequences(s, chunk);
  a.causal = s.kind != StructureKind::full;
  if (a.causal) a.window_right = 0;
  if (s.kind == StructureKind::sliding_window) a.window_left = window_left(s);
  return a;
}

// Padded keys of a full (cross-)attention: each batch's valid keys, gathered.
inline VarlenArgs padded_varlen(const MaskStructure& s) {
  VarlenArgs a;
  a.sequences = padded_sequences(s);
  return a;
}

// The dense form of a kernel that takes the kept mask as an additive bias of the query's
// dtype (xformers' attn_bias tensor, the cuDNN frontend's bias).
inline bool additive_bias(Backend b, Call* out) {
  return emit(out, [b] {
    Call c = dropping(b, KernelArgs{}, MaskUse::keep);
    c.mask_form = MaskForm::additive;
    return c;
  });
}

// The varlen kernels' common forms (torch varlen_attn, flash-attn varlen): padded keys
// of a full structure, and the documents or chunks of a square causal, windowed or full
// one.
inline bool varlen_form(Backend b, const MaskStructure& s, Call* out) {
  if (!offsets_fit_int32(s)) return false;
  if (s.has_kv_valid() || s.has_q_valid()) {
    // Padded keys and query rows of a full (cross-)attention: the valid block per batch.
    if (s.kind != StructureKind::full || s.has_segments() || !padded_rows_have_keys(s)) return false;
    return emit(out, [&] { return dropping(b, padded_varlen(s)); });
  }
  if (!square(s)) return false;
  const bool chunked = s.kind == StructureKind::chunked;
  if (s.kind != StructureKind::full && s.kind != StructureKind::causal && s.kind != StructureKind::sliding_window &&
      !chunked)
    return false;
  return emit(out, [&] { return dropping(b, document_varlen(s, chunked ? s.chunk : 0)); });
}

// Packed causal or full documents (the block-diagonal forms of xformers, TE thd,
// FlashInfer and cuDNN ragged offsets).
inline bool causal_documents(const MaskStructure& s) noexcept {
  return s.has_segments() && !s.has_kv_valid() && !s.has_q_valid() && (s.kind == StructureKind::causal || s.kind == StructureKind::full) &&
         offsets_fit_int32(s);
}

}  // namespace masklens
