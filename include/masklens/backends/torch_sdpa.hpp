// torch.nn.functional.scaled_dot_product_attention: the flash, memory-efficient,
// cuDNN and math kernels, and CausalBias lower-right. Rules hold for torch 2.5-2.11
// (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp; BACKGROUND.md).
#pragma once

#include <optional>

#include "backend.hpp"

namespace masklens::backends::torch_sdpa {

inline constexpr std::string_view kSdpUtils = "pytorch aten/src/ATen/native/transformers/cuda/sdp_utils.cpp";

inline bool half_or_bf16(const AttentionCall& c) { return c.dtype == DType::float16 || c.dtype == DType::bfloat16; }

inline constexpr Rule kFlashRules[] = {
    {"flash.dtype", kSdpUtils, [](const AttentionCall& c) { return !half_or_bf16(c); },
     [](const AttentionCall& c) { return "flash needs fp16 or bf16, not " + std::string(to_string(c.dtype)); }},
    {"flash.head_dim", kSdpUtils, [](const AttentionCall& c) { return c.head_dim > 256; },
     [](const AttentionCall& c) { return "flash needs head_dim <= 256, got " + num(c.head_dim); }},
    {"flash.head_dim_v", kSdpUtils, [](const AttentionCall& c) { return c.value_head_dim() != c.head_dim; },
     [](const AttentionCall&) { return std::string("flash needs equal q/k and v head dims"); }},
    {"flash.sm", kSdpUtils, [](const AttentionCall& c) { return c.sm < 80; },
     [](const AttentionCall& c) { return "flash needs sm80 or newer, got sm" + num(c.sm); }},
    {"flash.sm86_89_training_d192_224", kSdpUtils,
     [](const AttentionCall& c) { return c.sm >= 86 && c.sm <= 89 && c.training && c.head_dim > 192 && c.head_dim <= 224; },
     [](const AttentionCall&) { return std::string("flash backward with head_dim in (192, 224] is refused on sm86-89"); }},
};

inline constexpr Rule kEfficientRules[] = {
    {"efficient.bf16_sm80", kSdpUtils, [](const AttentionCall& c) { return c.dtype == DType::bfloat16 && c.sm < 80; },
     [](const AttentionCall& c) { return "efficient needs sm80 or newer for bf16, got sm" + num(c.sm); }},
    {"efficient.head_dim_multiple_8", kSdpUtils,
     [](const AttentionCall& c) { return c.head_dim % 8 != 0 || c.value_head_dim() % 8 != 0; },
     [](const AttentionCall& c) { return "efficient needs head dims divisible by 8, got " + num(c.head_dim); }},
    {"efficient.sm", kSdpUtils, [](const AttentionCall& c) { return c.sm < 50; },
     [](const AttentionCall& c) { return "efficient needs sm50 or newer, got sm" + num(c.sm); }},
};

inline constexpr Rule kCudnnRules[] = {
    {"cudnn.dtype", kSdpUtils, [](const AttentionCall& c) { return !half_or_bf16(c); },
     [](const AttentionCall& c) { return "cuDNN needs fp16 or bf16, not " + std::string(to_string(c.dtype)); }},
    {"cudnn.head_dim_multiple_8", kSdpUtils, [](const AttentionCall& c) { return c.head_dim % 8 != 0; },
     [](const AttentionCall& c) { return "cuDNN needs head_dim divisible by 8, got " + num(c.head_dim); }},
    {"cudnn.head_dim", "sdp_utils.cpp check_cudnn_head_dim; H200 torch 2.11 / cuDNN 9.19 accepted 256 (BACKGROUND.md)",
     [](const AttentionCall& c) {
       const bool big_ok = c.sm == 90 || c.sm == 100 || c.sm == 103;
       return c.head_dim > (big_ok ? 256 : 128) || c.value_head_dim() > (big_ok ? 256 : 128);
     },
     [](const AttentionCall& c) {
       return "cuDNN needs head_dim <= 128 (256 on sm90/sm10x), got " + num(c.head_dim) + " on sm" + num(c.sm);
     }},
    {"cudnn.sm", kSdpUtils, [](const AttentionCall& c) { return c.sm < 80; },
     [](const AttentionCall& c) { return "cuDNN attention needs sm80 or newer, got sm" + num(c.sm); }},
    {"cudnn.batch_heads_65535", kSdpUtils, [](const AttentionCall& c) { return c.batch > 65535 || c.heads > 65535; },
     [](const AttentionCall&) { return std::string("cuDNN needs batch and heads <= 65535"); }},
    {"cudnn.kv_length_1", kSdpUtils, [](const AttentionCall& c) { return c.k_len == 1; },
     [](const AttentionCall&) { return std::string("cuDNN refuses a key length of 1"); }},
    {"cudnn.deterministic", kSdpUtils, [](const AttentionCall& c) { return c.deterministic; },
     [](const AttentionCall&) { return std::string("cuDNN attention is refused in deterministic mode"); }},
    {"cudnn.dropout_9_11_to_9_13", kSdpUtils,
     [](const AttentionCall& c) { return c.dropout > 0 && c.cudnn >= version(9, 11) && c.cudnn < version(9, 14); },
     [](const AttentionCall& c) { return "cuDNN " + c.cudnn.to_string() + " refuses dropout (9.11-9.13)"; }},
};

inline constexpr Rule kMathRules[] = {
    {"math.never_refuses", kSdpUtils, [](const AttentionCall&) { return false; },
     [](const AttentionCall&) { return std::string(); }},
};

inline std::vector<Refusal> refusals(Backend b, const AttentionCall& c) {
  switch (b) {
    case Backend::sdpa_flash: return check_rules(kFlashRules, c);
    case Backend::sdpa_efficient: return check_rules(kEfficientRules, c);
    case Backend::sdpa_cudnn: return check_rules(kCudnnRules, c);
    case Backend::sdpa_math: return check_rules(kMathRules, c);
    case Backend::sdpa_causal_lower_right: {
      // CausalBias runs on flash or efficient (custom_mask_type 2).
      auto flash = check_rules(kFlashRules, c), efficient = check_rules(kEfficientRules, c);
      if (flash.empty() || efficient.empty()) return {};
      flash.insert(flash.end(), efficient.begin(), efficient.end());
      return flash;
    }
    default: return {};
  }
}

// GQA without expanding K/V: enable_gqa (torch >= 2.5) on flash, cuDNN and math; the
// efficient kernel lacks it until pytorch#191085.
inline bool native_gqa(Backend b, const AttentionCall& c) {
  return c.torch >= version(2, 5) && (b == Backend::sdpa_flash || b == Backend::sdpa_cudnn || b == Backend::sdpa_math);
}

inline bool accepts_dense_mask(Backend b) {
  return b == Backend::sdpa_efficient || b == Backend::sdpa_cudnn || b == Backend::sdpa_math;
}

// The call that computes `s` with the mask dropped, if the backend has one.
inline std::optional<Args> native_args(Backend b, const MaskStructure& s, const AttentionCall&) {
  if (!plain(s)) return std::nullopt;
  const bool sdpa = b == Backend::sdpa_flash || b == Backend::sdpa_efficient || b == Backend::sdpa_cudnn ||
                    b == Backend::sdpa_math;
  if (s.kind == StructureKind::full && sdpa) return Args{{"attn_mask", "drop"}, {"is_causal", false}};
  if (s.kind != StructureKind::causal) return std::nullopt;
  if (s.alignment == Alignment::top_left || square(s)) {
    // sdp_utils: flash takes is_causal only for equal lengths.
    if (!sdpa || (b == Backend::sdpa_flash && !square(s))) return std::nullopt;
    return Args{{"attn_mask", "drop"}, {"is_causal", true}};
  }
  if (b == Backend::sdpa_causal_lower_right)
    return Args{{"attn_mask", "replace"},
                {"attn_mask_object", "torch.nn.attention.bias.causal_lower_right(" + num(s.q_len) + ", " + num(s.k_len) + ")"},
                {"is_causal", false}};
  return std::nullopt;
}

}  // namespace masklens::backends::torch_sdpa
