// torch.nn.functional.scaled_dot_product_attention: the flash, memory-efficient,
// cuDNN and math kernels, and CausalBias lower-right. Rules hold for torch 2.5-2.11
// (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp; BACKGROUND.md).
#pragma once

#include <array>
#include <optional>

#include "backend.hpp"

namespace masklens::backends::torch_sdpa {

inline constexpr std::string_view kSdpUtils = "pytorch aten/src/ATen/native/transformers/cuda/sdp_utils.cpp";

inline bool half_or_bf16(const AttentionCall& c) { return c.dtype == DType::float16 || c.dtype == DType::bfloat16; }

inline constexpr Rule kFlashRules[] = {
    {"flash.dtype", kSdpUtils, [](const AttentionCall& c) { return !half_or_bf16(c); }, "flash needs fp16 or bf16",
     not_dtype},
    {"flash.head_dim", kSdpUtils, [](const AttentionCall& c) { return c.head_dim > 256; },
     "flash needs head_dim <= 256", got_head_dim},
    {"flash.head_dim_v", kSdpUtils, [](const AttentionCall& c) { return c.value_head_dim() != c.head_dim; },
     "flash needs equal q/k and v head dims"},
    {"flash.sm", kSdpUtils, before_sm80, "flash needs sm80 or newer", got_sm},
    {"flash.sm86_89_training_d192_224", kSdpUtils,
     [](const AttentionCall& c) { return c.sm >= 86 && c.sm <= 89 && c.training && c.head_dim > 192 && c.head_dim <= 224; },
     "flash backward with head_dim in (192, 224] is refused on sm86-89"},
};

inline constexpr Rule kEfficientRules[] = {
    {"efficient.bf16_sm80", kSdpUtils, [](const AttentionCall& c) { return c.dtype == DType::bfloat16 && c.sm < 80; },
     "efficient needs sm80 or newer for bf16", got_sm},
    // check_head_dim_size_mem_efficient: alignment 4 for fp32, 8 for fp16/bf16 (agrees with
    // can_use_efficient_attention on torch 2.11, H200: tests/torch/check_torch.py).
    {"efficient.head_dim_alignment", kSdpUtils,
     [](const AttentionCall& c) {
       const std::int64_t alignment = c.dtype == DType::float32 ? 4 : 8;
       return c.head_dim % alignment != 0 || c.value_head_dim() % alignment != 0;
     },
     "efficient needs head dims divisible by 8 (4 for fp32)", got_head_dim},
    {"efficient.sm", kSdpUtils, [](const AttentionCall& c) { return c.sm < 50; }, "efficient needs sm50 or newer",
     got_sm},
};

inline constexpr Rule kCudnnRules[] = {
    {"cudnn.dtype", kSdpUtils, [](const AttentionCall& c) { return !half_or_bf16(c); }, "cuDNN needs fp16 or bf16",
     not_dtype},
    {"cudnn.head_dim_multiple_8", kSdpUtils, [](const AttentionCall& c) { return c.head_dim % 8 != 0; },
     "cuDNN needs head_dim divisible by 8", got_head_dim},
    {"cudnn.head_dim", "sdp_utils.cpp check_cudnn_head_dim; H200 torch 2.11 / cuDNN 9.19 accepted 256 (BACKGROUND.md)",
     [](const AttentionCall& c) {
       const bool big_ok = c.sm == 90 || c.sm == 100 || c.sm == 103;
       return c.head_dim > (big_ok ? 256 : 128) || c.value_head_dim() > (big_ok ? 256 : 128);
     },
     "cuDNN needs head_dim <= 128 (256 on sm90/sm10x)",
     [](const AttentionCall& c) { return got_head_dim(c) + " on sm" + num(c.sm); }},
    {"cudnn.sm", kSdpUtils, before_sm80,
     "cuDNN attention needs sm80 or newer", got_sm},
    {"cudnn.batch_heads_65535", kSdpUtils, [](const AttentionCall& c) { return c.batch > 65535 || c.heads > 65535; },
     "cuDNN needs batch and heads <= 65535"},
    {"cudnn.kv_length_1", kSdpUtils, [](const AttentionCall& c) { return c.k_len == 1; }, "cuDNN refuses a key length of 1"},
    {"cudnn.deterministic", kSdpUtils, [](const AttentionCall& c) { return c.deterministic; },
     "cuDNN attention is refused in deterministic mode"},
    {"cudnn.dropout_9_11_to_9_13", kSdpUtils,
     [](const AttentionCall& c) { return c.dropout > 0 && c.cudnn >= version(9, 11) && c.cudnn < version(9, 14); },
     "cuDNN refuses dropout in 9.11-9.13", [](const AttentionCall& c) { return "got " + c.cudnn.to_string(); }},
};

// CausalBias lower-right runs on flash or efficient (custom_mask_type 2): refused only
// when both are, with both tables' reasons.
inline constexpr auto kCausalLowerRightRules = [] {
  std::array<Rule, std::size(kFlashRules) + std::size(kEfficientRules)> all{};
  std::size_t i = 0;
  for (const Rule& r : kFlashRules) all[i++] = r;
  for (const Rule& r : kEfficientRules) all[i++] = r;
  return all;
}();

// Each kernel's rules (the math kernel refuses nothing).
inline std::span<const Rule> rules(Backend b) noexcept {
  switch (b) {
    case Backend::sdpa_flash: return kFlashRules;
    case Backend::sdpa_efficient: return kEfficientRules;
    case Backend::sdpa_cudnn: return kCudnnRules;
    case Backend::sdpa_causal_lower_right: return kCausalLowerRightRules;
    default: return {};
  }
}

inline Refusals refusals(Backend b, const AttentionCall& c) noexcept {
  Refusals r = check_rules(rules(b), c);
  if (b == Backend::sdpa_causal_lower_right) {
    constexpr std::uint64_t flash_bits = (std::uint64_t{1} << std::size(kFlashRules)) - 1;
    if ((r.refused & flash_bits) == 0 || (r.refused & ~flash_bits) == 0) r.refused = 0;
  }
  return r;
}

// GQA without expanding K/V: enable_gqa (torch >= 2.5) on flash, cuDNN and math; the
// efficient kernel lacks it until pytorch#191085.
inline bool native_gqa(Backend b, const AttentionCall& c) {
  return c.torch >= version(2, 5) && (b == Backend::sdpa_flash || b == Backend::sdpa_cudnn || b == Backend::sdpa_math);
}

inline bool accepts_dense_mask(Backend b) {
  return b == Backend::sdpa_efficient || b == Backend::sdpa_cudnn || b == Backend::sdpa_math;
}

// Whether the backend computes `s` with the mask dropped; its arguments into `out`.
inline bool native_args(Backend b, const MaskStructure& s, Args* out = nullptr) {
  if (!plain(s)) return false;
  const bool sdpa = b == Backend::sdpa_flash || b == Backend::sdpa_efficient || b == Backend::sdpa_cudnn ||
                    b == Backend::sdpa_math;
  if (s.kind == StructureKind::full && sdpa)
    return emit(out, [] { return Args{{"attn_mask", "drop"}, {"is_causal", false}}; });
  if (s.kind != StructureKind::causal) return false;
  if (s.alignment == Alignment::top_left || square(s)) {
    // sdp_utils: flash takes is_causal only for equal lengths.
    if (!sdpa || (b == Backend::sdpa_flash && !square(s))) return false;
    return emit(out, [] { return Args{{"attn_mask", "drop"}, {"is_causal", true}}; });
  }
  if (b != Backend::sdpa_causal_lower_right) return false;
  return emit(out, [&] {
    return Args{{"attn_mask", "replace"},
                {"attn_mask_object",
                 "torch.nn.attention.bias.causal_lower_right(" + num(s.q_len) + ", " + num(s.k_len) + ")"},
                {"is_causal", false}};
  });
}

}  // namespace masklens::backends::torch_sdpa
