// The vocabulary every backend header shares: backend names (the JSON contract's),
// arguments as plain values, and capability rules — one small named constraint with
// its source, run in order, every refusal collected (after PyTorch's sdp_utils
// check_* functions, but reporting all reasons instead of stopping at the first).
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "../call.hpp"
#include "../structure.hpp"

namespace masklens {

enum class Backend : std::uint8_t {
  sdpa_flash,
  sdpa_efficient,
  sdpa_cudnn,
  sdpa_math,
  sdpa_causal_lower_right,
  flex_attention,
  flash_attn,
  flash_attn_varlen,
  flash_attn3,
  flash_attn3_varlen,
  xformers,
  transformer_engine,
  flashinfer,
  cudnn_frontend,
  zeros,  // a plan step that writes zeros: rows that attend to nothing
};
inline constexpr Backend kAllBackends[] = {
    Backend::sdpa_flash,        Backend::sdpa_efficient,     Backend::sdpa_cudnn,   Backend::sdpa_math,
    Backend::sdpa_causal_lower_right, Backend::flex_attention, Backend::flash_attn, Backend::flash_attn_varlen,
    Backend::flash_attn3,       Backend::flash_attn3_varlen, Backend::xformers,     Backend::transformer_engine,
    Backend::flashinfer,        Backend::cudnn_frontend};

constexpr std::string_view to_string(Backend b) noexcept {
  switch (b) {
    case Backend::sdpa_flash: return "torch.sdpa.flash";
    case Backend::sdpa_efficient: return "torch.sdpa.efficient";
    case Backend::sdpa_cudnn: return "torch.sdpa.cudnn";
    case Backend::sdpa_math: return "torch.sdpa.math";
    case Backend::sdpa_causal_lower_right: return "torch.sdpa.causal_lower_right";
    case Backend::flex_attention: return "torch.flex_attention";
    case Backend::flash_attn: return "flash_attn";
    case Backend::flash_attn_varlen: return "flash_attn.varlen";
    case Backend::flash_attn3: return "flash_attn3";
    case Backend::flash_attn3_varlen: return "flash_attn3.varlen";
    case Backend::xformers: return "xformers";
    case Backend::transformer_engine: return "transformer_engine";
    case Backend::flashinfer: return "flashinfer";
    case Backend::cudnn_frontend: return "cudnn_frontend";
    case Backend::zeros: return "zeros";
  }
  return "unknown";
}

constexpr BackendFamily family(Backend b) noexcept {
  switch (b) {
    case Backend::flex_attention: return kFamilyFlex;
    case Backend::flash_attn:
    case Backend::flash_attn_varlen: return kFamilyFlashAttn;
    case Backend::flash_attn3:
    case Backend::flash_attn3_varlen: return kFamilyFlashAttn3;
    case Backend::xformers: return kFamilyXformers;
    case Backend::transformer_engine: return kFamilyTransformerEngine;
    case Backend::flashinfer: return kFamilyFlashInfer;
    case Backend::cudnn_frontend: return kFamilyCudnnFrontend;
    default: return kFamilyTorch;
  }
}

// Relative cost when the mask is expressed natively (lower is faster), from this
// project's H200 measurements (BACKGROUND.md: fwd+bwd at 69632 tokens, is_causal:
// cuDNN 78 ms < flash 130 ms < efficient 631 ms) and the backends' own reports.
// docs/backends.md prints this table.
constexpr int cost_rank(Backend b) noexcept {
  switch (b) {
    case Backend::flash_attn3:
    case Backend::flash_attn3_varlen: return 1;
    case Backend::sdpa_cudnn:
    case Backend::cudnn_frontend: return 2;
    case Backend::flash_attn:
    case Backend::flash_attn_varlen:
    case Backend::transformer_engine:
    case Backend::flashinfer: return 3;
    case Backend::sdpa_flash: return 4;
    case Backend::sdpa_causal_lower_right:
    case Backend::xformers: return 5;
    case Backend::flex_attention: return 6;
    case Backend::sdpa_efficient: return 8;
    case Backend::sdpa_math: return 20;
    case Backend::zeros: return 0;
  }
  return 99;
}

using ArgValue = std::variant<bool, std::int64_t, std::string, std::vector<std::int64_t>>;
struct Arg {
  std::string_view name;  // always a literal: the backend's own argument name
  ArgValue value;
};
using Args = std::vector<Arg>;

// Appends one argument; vectors passed as rvalues move in (an initializer list of Args
// would copy them once more).
inline void add(Args& args, std::string_view name, ArgValue value) { args.push_back({name, std::move(value)}); }

inline void add_pairs(Args&) {}
template <class Value, class... Rest>
void add_pairs(Args& args, std::string_view name, Value&& value, Rest&&... rest) {
  add(args, name, ArgValue(std::forward<Value>(value)));
  add_pairs(args, std::forward<Rest>(rest)...);
}

// Arguments from name, value, name, value...: one allocation for the list, and vectors
// passed as rvalues move in.
template <class... Items>
Args make_args(Items&&... items) {
  static_assert(sizeof...(Items) % 2 == 0, "make_args takes name, value pairs");
  Args args;
  args.reserve(sizeof...(Items) / 2);
  add_pairs(args, std::forward<Items>(items)...);
  return args;
}

// The value of argument `name`, or null.
inline const ArgValue* find_arg(const Args& args, std::string_view name) noexcept {
  for (const Arg& a : args)
    if (a.name == name) return &a.value;
  return nullptr;
}

// One capability constraint: a name, where it comes from, the test, and the reason:
// fixed text, then ", " and what `detail` formats from the call (null: nothing).
struct Rule {
  std::string_view name;
  std::string_view source;
  bool (*refuses)(const AttentionCall&);
  std::string_view text;
  std::string (*detail)(const AttentionCall&) = nullptr;
};

// The rule every optional library starts with: its version must be given
// (AttentionCall's default Version means "not installed").
template <Version AttentionCall::*kVersion>
constexpr Rule installed(std::string_view name, std::string_view text) {
  return {name, "AttentionCall (library versions)", [](const AttentionCall& c) { return !(c.*kVersion).known(); },
          text};
}

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
  [[nodiscard]] std::string text(const AttentionCall& call) const {
    std::string out;
    for_each([&](const Rule& r) {
      if (!out.empty()) out += "; ";
      out += r.text;
      if (r.detail) out += ", " + r.detail(call);
    });
    return out;
  }
};

// A rule table fits Refusals' bit set.
inline constexpr std::size_t kMaxRules = 64;

// Every refusal of `rules` for `call` (tables hold at most kMaxRules: policy.hpp checks).
inline Refusals check_rules(std::span<const Rule> rules, const AttentionCall& call) noexcept {
  Refusals r{rules};
  for (std::size_t i = 0; i < rules.size(); ++i)
    if (rules[i].refuses(call)) r.refused |= std::uint64_t{1} << i;
  return r;
}

// Native forms answer two questions with one body, so the two cannot drift apart:
// whether a backend expresses a structure (out == nullptr: what decide() asks of every
// backend, allocation-free) and with which arguments (asked once, for the one chosen).
template <class Build>
bool emit(Args* out, Build&& build) {
  if (out) *out = std::forward<Build>(build)();
  return true;
}

inline std::string num(std::int64_t v) { return std::to_string(v); }

// Tests several backends' rules share.
inline bool is_fp32(const AttentionCall& c) { return c.dtype == DType::float32; }
inline bool before_sm80(const AttentionCall& c) { return c.sm < 80; }

// What a refused call had, after a rule's reason: "flash needs sm80 or newer, got sm75".
inline std::string got_head_dim(const AttentionCall& c) { return "got " + num(c.head_dim); }
inline std::string got_sm(const AttentionCall& c) { return "got sm" + num(c.sm); }
inline std::string not_dtype(const AttentionCall& c) { return "not " + std::string(to_string(c.dtype)); }

// Structure facts every backend header asks.
inline bool plain(const MaskStructure& s) noexcept { return !s.has_kv_valid() && !s.has_segments() && !s.has_q_valid(); }
inline bool square(const MaskStructure& s) noexcept { return s.q_len == s.k_len; }

// flash-attn's window_size=(left, right) for HF sliding_window W: left = W - 1.
inline std::int64_t window_left(const MaskStructure& s) noexcept { return s.window - 1; }

// Token offsets of packed documents flattened over the batch: cu_seqlens.
inline std::vector<std::int64_t> cu_seqlens(const MaskStructure& s) {
  std::size_t n = 1;
  for (std::int64_t b = 0; b < s.batch; ++b)
    n += s.has_segments() ? s.segments[static_cast<std::size_t>(b)].size() - 1 : 1;
  std::vector<std::int64_t> cu;
  cu.reserve(n);
  cu.push_back(0);
  for (std::int64_t b = 0; b < s.batch; ++b) {
    if (!s.has_segments()) {
      cu.push_back((b + 1) * s.q_len);
      continue;
    }
    const auto& seg = s.segments[static_cast<std::size_t>(b)];
    for (std::size_t i = 1; i < seg.size(); ++i) cu.push_back(b * s.q_len + seg[i]);
  }
  return cu;
}

inline std::int64_t max_seqlen(const std::vector<std::int64_t>& cu) {
  std::int64_t m = 0;
  for (std::size_t i = 1; i < cu.size(); ++i) m = std::max(m, cu[i] - cu[i - 1]);
  return m;
}

}  // namespace masklens
