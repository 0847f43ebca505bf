// torch.nn.functional.scaled_dot_product_attention: the flash, memory-efficient,
// cuDNN and math kernels, and CausalBias lower-right. Rules hold for torch 2.5-2.11
// (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp; docs/backends.md).
#pragma once

#include <array>
#include <optional>

#include "backend.hpp"

namespace masklens::backends::torch_sdpa {

inline constexpr std::string_view kSdpUtils = "pytorch aten/src/ATen/native/transformers/cuda/sdp_utils.cpp";
inline constexpr std::string_view kValidateInput =
    "pytorch aten/src/ATen/native/transformers/attention.cpp validate_sdpa_input";

inline bool half_or_bf16(const CallContext& c) {
  return c.call.dtype == DType::float16 || c.call.dtype == DType::bfloat16;
}
inline bool integer_mask(const CallContext& c) {
  return c.call.mask_dtype == ElementType::uint8 || c.call.mask_dtype == ElementType::int8;
}
inline bool float_mask_of_other_dtype(const CallContext& c) {
  return c.call.mask_dtype && is_additive(*c.call.mask_dtype) && *c.call.mask_dtype != c.call.query_element();
}

// Every kernel: validate_sdpa_input accepts a bool mask, an fp32 mask or one of the
// query's dtype, and raises on anything else.
inline constexpr Rule kMaskIntegerRule = {
    "sdpa.mask_integer", kValidateInput, integer_mask,
    "SDPA takes bool or float masks: an integer mask is cast to bool (non-zero attends)", nullptr,
    RuleScope::kept_mask, MaskFix::cast_to_bool};
inline constexpr Rule kMaskFloatRule = {
    "sdpa.mask_float_dtype", kValidateInput,
    [](const CallContext& c) { return float_mask_of_other_dtype(c) && c.call.mask_dtype != ElementType::float32; },
    "SDPA takes a float mask of fp32 or the query's dtype: it is cast to the query's dtype", nullptr,
    RuleScope::kept_mask, MaskFix::cast_to_query_dtype};

inline constexpr Rule kFlashRules[] = {
    {"flash.dtype", kSdpUtils, [](const CallContext& c) { return !half_or_bf16(c); }, "flash needs fp16 or bf16",
     not_dtype},
    {"flash.head_dim", kSdpUtils, [](const CallContext& c) { return c.call.head_dim > 256; },
     "flash needs head_dim <= 256", got_head_dim},
    {"flash.head_dim_v", kSdpUtils, [](const CallContext& c) { return c.call.value_head_dim() != c.call.head_dim; },
     "flash needs equal q/k and v head dims"},
    {"flash.sm", kSdpUtils, before_sm80, "flash needs sm80 or newer", got_sm},
    {"flash.sm86_89_training_d192_224", kSdpUtils,
     [](const CallContext& c) {
       return c.env.sm >= 86 && c.env.sm <= 89 && c.call.training && c.call.head_dim > 192 && c.call.head_dim <= 224;
     },
     "flash backward with head_dim in (192, 224] is refused on sm86-89"},
};

inline constexpr Rule kEfficientRules[] = {
    {"efficient.bf16_sm80", kSdpUtils,
     [](const CallContext& c) { return c.call.dtype == DType::bfloat16 && c.env.sm < 80; },
     "efficient needs sm80 or newer for bf16", got_sm},
    // check_head_dim_size_mem_efficient: alignment 4 for fp32, 8 for fp16/bf16 (agrees with
    // can_use_efficient_attention on torch 2.11, H200: tests/torch/check_torch.py).
    {"efficient.head_dim_alignment", kSdpUtils,
     [](const CallContext& c) {
       const std::int64_t alignment = c.call.dtype == DType::float32 ? 4 : 8;
       return c.call.head_dim % alignment != 0 || c.call.value_head_dim() % alignment != 0;
     },
     "efficient needs head dims divisible by 8 (4 for fp32)", got_head_dim},
    {"efficient.sm", kSdpUtils, [](const CallContext& c) { return c.env.sm < 50; }, "efficient needs sm50 or newer",
     got_sm},
    kMaskIntegerRule,
    kMaskFloatRule,
    // The kernel raises "invalid dtype for bias - should match query's dtype" on an fp32
    // mask with half inputs (measured on torch 2.11, H200; pytorch#191612).
    {"efficient.mask_dtype", "pytorch aten/src/ATen/native/transformers/cuda/attention.cu; pytorch#191612",
     float_mask_of_other_dtype, "efficient needs a float mask of the query's dtype: it is cast", nullptr,
     RuleScope::kept_mask, MaskFix::cast_to_query_dtype},
};

inline constexpr Rule kCudnnRules[] = {
    {"cudnn.dtype", kSdpUtils, [](const CallContext& c) { return !half_or_bf16(c); }, "cuDNN needs fp16 or bf16",
     not_dtype},
    {"cudnn.head_dim_multiple_8", kSdpUtils, [](const CallContext& c) { return c.call.head_dim % 8 != 0; },
     "cuDNN needs head_dim divisible by 8", got_head_dim},
    {"cudnn.head_dim",
     "sdp_utils.cpp check_cudnn_head_dim; torch 2.11 / cuDNN 9.19 accepted 256 on an H200 (docs/backends.md, "
     "Measurements)",
     [](const CallContext& c) {
       const bool big_ok = c.env.sm == 90 || c.env.sm == 100 || c.env.sm == 103;
       return c.call.head_dim > (big_ok ? 256 : 128) || c.call.value_head_dim() > (big_ok ? 256 : 128);
     },
     "cuDNN needs head_dim <= 128 (256 on sm90/sm10x)",
     [](const CallContext& c) { return got_head_dim(c) + " on sm" + num(c.env.sm); }},
    {"cudnn.sm", kSdpUtils, before_sm80, "cuDNN attention needs sm80 or newer", got_sm},
    {"cudnn.batch_heads_65535", kSdpUtils,
     [](const CallContext& c) { return c.call.batch > 65535 || c.call.heads > 65535; },
     "cuDNN needs batch and heads <= 65535"},
    {"cudnn.kv_length_1", kSdpUtils, [](const CallContext& c) { return c.call.k_len == 1; },
     "cuDNN refuses a key length of 1"},
    {"cudnn.deterministic", kSdpUtils, [](const CallContext& c) { return c.call.deterministic; },
     "cuDNN attention is refused in deterministic mode"},
    {"cudnn.dropout_9_11_to_9_13", kSdpUtils,
     [](const CallContext& c) {
       return c.call.dropout > 0 && c.env.cudnn >= version(9, 11) && c.env.cudnn < version(9, 14);
     },
     "cuDNN refuses dropout in 9.11-9.13", [](const CallContext& c) { return "got " + c.env.cudnn.to_string(); }},
    kMaskIntegerRule,
    kMaskFloatRule,
    // An fp32 mask with half inputs is reinterpreted without an error (pytorch#191612).
    {"cudnn.mask_dtype", "pytorch#191612 (reproduced on torch 2.11 / cuDNN 9.19)", float_mask_of_other_dtype,
     "cuDNN misreads a float mask of another dtype than the query's: it is cast", nullptr, RuleScope::kept_mask,
     MaskFix::cast_to_query_dtype},
};

inline constexpr Rule kMathRules[] = {kMaskIntegerRule, kMaskFloatRule};

// CausalBias lower-right runs on flash or efficient (custom_mask_type 2): refused only
// when both are, with both tables' reasons.
inline constexpr auto kCausalLowerRightRules = [] {
  std::array<Rule, std::size(kFlashRules) + 3> all{};
  std::size_t i = 0;
  for (const Rule& r : kFlashRules) all[i++] = r;
  for (const Rule& r : kEfficientRules)
    if (r.scope == RuleScope::call) all[i++] = r;
  return all;
}();

inline Refusals causal_lower_right_refusals(const CallContext& c) noexcept {
  Refusals r = check_rules(kCausalLowerRightRules, c);
  constexpr std::uint64_t flash_bits = (std::uint64_t{1} << std::size(kFlashRules)) - 1;
  if ((r.refused & flash_bits) == 0 || (r.refused & ~flash_bits) == 0) r.refused = 0;
  return r;
}

// GQA without expanding K/V: enable_gqa (torch >= 2.5) on flash, cuDNN and math; the
// efficient kernel lacks it until pytorch#191085.
inline bool native_gqa(SdpaKernel k, const CallContext& c) {
  return c.env.torch >= version(2, 5) && (k == SdpaKernel::flash || k == SdpaKernel::cudnn || k == SdpaKernel::math);
}

inline SdpaArgs sdpa(SdpaKernel k, const CallContext& c, bool is_causal = false) {
  SdpaArgs a;
  a.kernel = k;
  a.is_causal = is_causal;
  a.enable_gqa = c.call.gqa() && native_gqa(k, c);
  return a;
}

// F.scaled_dot_product_attention with the mask dropped: full, or causal top-left
// (flash takes is_causal only for equal lengths: sdp_utils check_flash_causal_non_square_seqlens).
template <SdpaKernel kKernel>
bool native(const MaskStructure& s, const CallContext& c, Call* out) {
  constexpr Backend b = kKernel == SdpaKernel::flash       ? Backend::sdpa_flash
                        : kKernel == SdpaKernel::efficient ? Backend::sdpa_efficient
                        : kKernel == SdpaKernel::cudnn     ? Backend::sdpa_cudnn
                                                           : Backend::sdpa_math;
  if (!plain(s)) return false;
  if (s.kind == StructureKind::full) return emit(out, [&] { return dropping(b, sdpa(kKernel, c)); });
  if (s.kind != StructureKind::causal || !(s.alignment == Alignment::top_left || square(s))) return false;
  if (kKernel == SdpaKernel::flash && !square(s)) return false;
  return emit(out, [&] { return dropping(b, sdpa(kKernel, c, true)); });
}

// The dense mask as attn_mask (flash takes none).
template <SdpaKernel kKernel>
bool dense(const MaskStructure&, const CallContext& c, Call* out) {
  constexpr Backend b = kKernel == SdpaKernel::efficient ? Backend::sdpa_efficient
                        : kKernel == SdpaKernel::cudnn   ? Backend::sdpa_cudnn
                                                         : Backend::sdpa_math;
  return emit(out, [&] { return dropping(b, sdpa(kKernel, c), MaskUse::keep); });
}

// Bottom-right causal with Q != K: attn_mask = causal_lower_right(Q, K). CausalBias
// dispatches to flash, else efficient, passing enable_gqa on (torch/nn/attention/bias.py).
inline bool causal_lower_right_native(const MaskStructure& s, const CallContext& c, Call* out) {
  if (!plain(s) || s.kind != StructureKind::causal || s.alignment != Alignment::bottom_right || square(s)) return false;
  return emit(out, [&] {
    SdpaArgs a;
    a.kernel = SdpaKernel::any;
    a.causal_lower_right = true;
    a.enable_gqa = c.call.gqa() && c.env.torch >= version(2, 5);
    return dropping(Backend::sdpa_causal_lower_right, a, MaskUse::replace);
  });
}

// F.scaled_dot_product_attention's keywords (the kernel is forced around the call).
inline CallArgs args(const Call& call, std::int64_t, std::int64_t, std::int64_t) {
  CallArgs out;
  const SdpaArgs* sdpa = call.get<SdpaArgs>();
  if (!sdpa) return out;
  out.args.push_back({"is_causal", sdpa->is_causal});
  if (sdpa->enable_gqa) out.args.push_back({"enable_gqa", true});
  return out;
}

inline std::string python(const PythonCall& p) {
  return "with sdpa_kernel([SDPBackend." + std::string(to_string(p.call.get<SdpaArgs>()->kernel)) +
         "]):\n    out = F.scaled_dot_product_attention(q, k, v" + p.attn_mask_keyword() +
         python_text::keywords(p.args.args) + ")";
}

// attn_mask = causal_lower_right(seq_len_q, seq_len_kv), a CausalBias.
inline CallArgs causal_lower_right_args(const Call& call, std::int64_t, std::int64_t q_len, std::int64_t k_len) {
  CallArgs out;
  const SdpaArgs* sdpa = call.get<SdpaArgs>();
  if (!sdpa) return out;
  out.mask_object = "causal_lower_right";
  out.mask_object_args = {{"seq_len_q", q_len}, {"seq_len_kv", k_len}};
  if (sdpa->enable_gqa) out.args.push_back({"enable_gqa", true});
  return out;
}

inline std::string causal_lower_right_python(const PythonCall& p) {
  return "out = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(" + std::to_string(p.q_len) +
         ", " + std::to_string(p.k_len) + ")" + python_text::keywords(p.args.args) + ")";
}

}  // namespace masklens::backends::torch_sdpa
