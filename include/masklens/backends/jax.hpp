// JAX's jax.nn.dot_product_attention(query, key, value, bias, mask, *, scale, is_causal,
// query_seq_lengths, key_value_seq_lengths, local_window_size, implementation), arrays in
// [B, T, N, H]: implementation="cudnn" (cuDNN's fused flash attention through XLA's custom
// call) and "xla" (einsum, softmax, einsum). Rules read from jax's source at jax-v0.11.0
// (the same lines in 0.10.2): jax/_src/nn/functions.py and
// jax/_src/cudnn/fused_attention_stablehlo.py.
//
// What JAX's arguments mean (functions.py):
//   is_causal               keys k <= q: jnp.tril over [T, S], top-left (L886-888)
//   local_window_size=(l,r) keys q - l <= k <= q + r, top-left (L890-896)
//   key_value_seq_lengths   keys k < L_b of batch b: right padding only (L898-908)
//   query_seq_lengths       rows q >= T_b zeroed after the softmax (L991-994), where a
//                           dense mask's empty row averages every value: never passed here
// and every one of them, on "xla", is a bool mask ANDed with the dense one before the
// same jnp.where(mask, logits, -0.7 * finfo.max) (_apply_masks, L915-941): dropping the
// dense mask for them computes the same logits, empty rows (mean of V) included. GQA:
// N query heads over K key heads, grouped N // K (L1003-1049 "xla"; cuDNN takes the
// grouped heads as they are): no expansion. The cuDNN path (L1230-1269) maps is_causal
// to CAUSAL, lengths to PADDING(_CAUSAL), (l, 0) to a sliding window of l + 1 keys, and
// a dense bool mask to an additive bias (fused_attention_stablehlo.py
// combine_bias_and_mask, L1826-1845). A row with no key does not average V there (measured:
// defects.hpp jax_cudnn_empty_rows), so cuDNN's native forms are taken only where every row
// attends some key, and its kept-mask call only without empty rows.
#pragma once

#include <climits>

#include "backend.hpp"

namespace masklens::backends::jax {

inline constexpr std::string_view kFunctions = "jax jax/_src/nn/functions.py";
inline constexpr std::string_view kChecks = "jax jax/_src/nn/functions.py L1194-1218 at jax-v0.11.0 (dot_product_attention's checks)";
inline constexpr std::string_view kCudnnLayout =
    "jax jax/_src/cudnn/fused_attention_stablehlo.py L277-352 at jax-v0.11.0 (check_layout)";
inline constexpr std::string_view kCudnnFlash =
    "jax jax/_src/cudnn/fused_attention_stablehlo.py L354-402 at jax-v0.11.0 (check_is_flash_attention)";

// The JAX release whose dot_product_attention has every argument the forms use
// (query_seq_lengths in 0.4.33, local_window_size in 0.4.34).
inline constexpr Version kMinJax = version(0, 4, 34);

inline bool before_min_jax(const CallContext& c) { return c.env.jax.known() && c.env.jax < kMinJax; }
inline std::string got_jax(const CallContext& c) { return "got " + c.env.jax.to_string(); }
inline bool head_dims_differ(const CallContext& c) { return c.call.value_head_dim() != c.call.head_dim; }
inline bool has_dropout(const CallContext& c) { return c.call.dropout > 0.0; }
inline bool mask_integer(const CallContext& c) {
  return c.call.mask_dtype && *c.call.mask_dtype != ElementType::boolean && !is_additive(*c.call.mask_dtype);
}
inline bool mask_additive(const CallContext& c) { return c.call.mask_dtype && is_additive(*c.call.mask_dtype); }

// What both implementations share: the function's own checks.
#define MASKLENS_JAX_COMMON_RULES                                                                                   \
  installed<&Environment::jax>("jax.installed", "jax version not given"),                                          \
      Rule{"jax.version", "jax jax/_src/nn/functions.py (query_seq_lengths since jax-v0.4.33, local_window_size " \
                          "since jax-v0.4.34)",                                                                     \
           before_min_jax, "jax.nn.dot_product_attention needs jax >= 0.4.34 for these arguments", got_jax},       \
      Rule{"jax.head_dim_v", kChecks, head_dims_differ,                                                             \
           "jax.nn.dot_product_attention needs value of the key's shape (equal head dims)"},                      \
      Rule{"jax.dropout", "jax jax/_src/nn/functions.py L1086-1100 at jax-v0.11.0 (the signature)", has_dropout,                  \
           "jax.nn.dot_product_attention takes no dropout"},                                                        \
      Rule{"jax.mask_integer", kChecks, mask_integer,                                                               \
           "jax takes a boolean mask: an integer mask is cast to bool (non-zero attends)", nullptr,                \
           RuleScope::kept_mask, MaskFix::cast_to_bool},                                                            \
      Rule{"jax.mask_additive", kChecks, mask_additive,                                                             \
           "jax takes a boolean mask (an additive one is its bias argument)", nullptr, RuleScope::kept_mask}

inline constexpr Rule kXlaRules[] = {MASKLENS_JAX_COMMON_RULES};

inline constexpr Rule kCudnnRules[] = {
    MASKLENS_JAX_COMMON_RULES,
    {"jax_cudnn.cudnn", "jax jax/_src/cudnn/fused_attention_stablehlo.py L404-408 at jax-v0.11.0 (check_cudnn_version)",
     [](const CallContext& c) { return !c.env.cudnn.known(); }, "jax finds no cuDNN (\"cuDNN is not detected\")"},
    {"jax_cudnn.dtype", kCudnnLayout, is_fp32, "jax's cuDNN attention needs fp16 or bf16", not_dtype},
    {"jax_cudnn.sm", "cudnn-frontend docs, SDPA operation (attributes)", before_sm80,
     "jax's cuDNN attention needs sm80 or newer", got_sm},
    {"jax_cudnn.head_dim", kCudnnFlash,
     [](const CallContext& c) { return c.call.head_dim % 8 != 0 || c.call.head_dim > (c.env.sm >= 90 ? 256 : 128); },
     "jax's cuDNN attention needs head_dim a multiple of 8, <= 128 (256 on sm90 or newer)", got_head_dim},
    {"jax_cudnn.sm103_cudnn_9_11", kCudnnFlash,
     [](const CallContext& c) { return c.env.sm == 103 && c.env.cudnn < version(9, 11); },
     "jax's cuDNN attention on sm103 needs cuDNN >= 9.11"},
    {"jax_cudnn.bias_training_even", kCudnnFlash,
     [](const CallContext& c) { return c.call.training && (c.call.q_len % 2 != 0 || c.call.k_len % 2 != 0); },
     "jax's cuDNN attention with a mask (a bias) in training needs even query and key lengths",
     [](const CallContext& c) { return "got " + num(c.call.q_len) + " x " + num(c.call.k_len); },
     RuleScope::kept_mask},
};
#undef MASKLENS_JAX_COMMON_RULES

// Every batch's valid keys start at 0 (key_value_seq_lengths pads on the right only).
inline bool right_padded(const MaskStructure& s) noexcept {
  if (s.k_len > INT32_MAX) return false;  // the lengths are int32
  for (const KeyRange& r : s.kv_valid)
    if (r.start != 0) return false;
  return true;
}

// Where row 0's diagonal sits: 0 top-left, K - Q bottom-right.
inline std::int64_t diagonal(const MaskStructure& s) noexcept {
  return s.alignment == Alignment::bottom_right ? s.k_len - s.q_len : 0;
}

// The forms both implementations share; `cudnn` narrows them to what cuDNN's kernel is
// known to compute as JAX's XLA path does: square causal and windows, lengths on a full
// base or square causal, and no row without a key.
inline bool forms(const MaskStructure& s, bool cudnn, Backend b, Call* out) {
  if (s.has_q_valid() || s.has_segments()) return false;
  if (s.kind != StructureKind::full && s.kind != StructureKind::causal && s.kind != StructureKind::sliding_window)
    return false;
  const bool based = s.kind != StructureKind::full;  // causal or a window
  const std::int64_t d = based ? diagonal(s) : 0;
  if (cudnn) {
    if (based && !square(s)) return false;
    if (s.kind == StructureKind::sliding_window && s.has_kv_valid()) return false;
    if (s.implied_empty_rows() > 0) return false;
  }
  if (s.has_kv_valid()) {
    // Lengths with the rule counted from row 0 and key 0.
    if (!right_padded(s) || d != 0) return false;
    return emit(out, [&] {
      VarlenArgs a;
      a.packed = false;
      a.alignment = Alignment::top_left;
      a.causal = based;
      if (based) a.window_right = 0;
      if (s.kind == StructureKind::sliding_window) a.window_left = window_left(s);
      a.sequences.reserve(static_cast<std::size_t>(s.batch));
      for (std::int64_t i = 0; i < s.batch; ++i) a.sequences.push_back({i, {0, s.q_len}, {0, s.kv_valid_of(i).end}});
      return dropping(b, std::move(a));
    });
  }
  // Bottom-right with Q != K: a window (left, right) = (l - d, d) on "xla", inside
  // jax's documented non-negative sizes: K >= Q, and a window no narrower than K - Q + 1.
  if (d < 0) return false;
  if (d > 0 && s.kind == StructureKind::sliding_window && window_left(s) < d) return false;
  return emit(out, [&] {
    KernelArgs a = kernel_args(s);
    a.alignment = d == 0 ? Alignment::top_left : Alignment::bottom_right;
    return dropping(b, a);
  });
}

inline bool cudnn_native(const MaskStructure& s, const CallContext&, Call* out) {
  return forms(s, true, Backend::jax_cudnn, out);
}
inline bool xla_native(const MaskStructure& s, const CallContext&, Call* out) {
  return forms(s, false, Backend::jax_xla, out);
}

// The dense bool mask as `mask` (jax's own call); a bias or finite-masked rows are not a
// bool mask's.
template <Backend kBackend>
inline bool dense(const MaskStructure& s, const CallContext&, Call* out) {
  if (s.bias || s.finite_masked_rows > 0) return false;
  return emit(out, [] { return dropping(kBackend, KernelArgs{}, MaskUse::keep); });
}

// JAX's keywords: is_causal, local_window_size (top-left, (left, right)),
// key_value_seq_lengths, and implementation.
template <Backend kBackend>
inline CallArgs args(const Call& call, std::int64_t, std::int64_t q_len, std::int64_t k_len) {
  CallArgs out;
  const auto implementation = [&] {
    out.args.push_back({"implementation", std::string_view(kBackend == Backend::jax_cudnn ? "cudnn" : "xla")});
  };
  if (const VarlenArgs* v = call.get<VarlenArgs>()) {
    if (v->causal) out.args.push_back({"is_causal", true});
    if (v->window_left >= 0) out.args.push_back({"local_window_size", IntPair{v->window_left, 0}});
    std::vector<std::int64_t> lengths;
    lengths.reserve(v->sequences.size());
    for (const Sequence& s : v->sequences) lengths.push_back(s.k.end - s.k.start);
    out.args.push_back({"key_value_seq_lengths", IndexTensor{std::move(lengths)}});
  } else if (const KernelArgs* k = call.get<KernelArgs>(); k && call.mask == MaskUse::drop && k->causal) {
    const std::int64_t d = k->alignment == Alignment::bottom_right ? k_len - q_len : 0;
    if (d == 0) {
      out.args.push_back({"is_causal", true});
      if (k->window_left >= 0) out.args.push_back({"local_window_size", IntPair{k->window_left, 0}});
    } else {
      // Keys q + d - left <= k <= q + d: (left - d, d); without a window every key back.
      out.args.push_back({"local_window_size", IntPair{k->window_left >= 0 ? k->window_left - d : k_len, d}});
    }
  }
  implementation();
  return out;
}

// The call on q, k, v of SDPA's [B, H, L, D] layout, as jax arrays (swapped to [B, L, H, D]).
inline std::string python(const PythonCall& p) {
  std::string bind, keywords;
  for (const NamedArg& a : p.args.args) {
    const std::string name(a.name);
    if (const auto* t = std::get_if<IndexTensor>(&a.value)) {
      bind += t->values.size() > python_text::kMaxListed
                  ? name + " = jnp.array(masklens_json[\"" + name + "\"], dtype=jnp.int32)  # " +
                        std::to_string(t->values.size()) + " values: see --json\n"
                  : name + " = jnp.array(" + python_text::python_list(t->values) + ", dtype=jnp.int32)\n";
      keywords += ", " + name + "=" + name;
    } else {
      keywords += ", " + name + "=" + python_text::python_value(a.value);
    }
  }
  const std::string mask = p.call.mask_cast == ElementType::boolean ? "mask.astype(bool)" : "mask";
  return bind +
         "out = jnp.swapaxes(jax.nn.dot_product_attention(jnp.swapaxes(q, 1, 2), jnp.swapaxes(k, 1, 2), "
         "jnp.swapaxes(v, 1, 2)" +
         (p.call.mask == MaskUse::keep ? ", mask=" + mask : std::string()) + keywords + "), 1, 2)";
}

}  // namespace masklens::backends::jax
