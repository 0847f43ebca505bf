// TransformerEngine DotProductAttention: attn_mask_type + window_size; packed
// documents through qkv_format="thd" with cu_seqlens. TE's boolean masks use
// true = masked out (MaskEncoding::polarity = true_masks reads them).
#pragma once

#include <optional>

#include "backend.hpp"

namespace masklens::backends::transformer_engine {

inline constexpr std::string_view kDocs = "TransformerEngine docs, DotProductAttention attn_mask_type";

inline constexpr Rule kRules[] = {
    installed<&AttentionCall::transformer_engine>("te.installed", "transformer_engine version not given"),
    {"te.dtype", kDocs, is_fp32, "TransformerEngine's fused attention needs fp16 or bf16"},
    {"te.sm", kDocs, before_sm80, "TransformerEngine's fused attention needs sm80 or newer", got_sm},
};

inline bool native_args(const MaskStructure& s, Args* out = nullptr) {
  const char* causal = !square(s) && s.alignment == Alignment::bottom_right ? "causal_bottom_right" : "causal";
  if (s.has_kv_valid()) return false;
  if (s.has_segments()) {
    if (s.kind != StructureKind::causal && s.kind != StructureKind::full) return false;
    return emit(out, [&] {
      std::vector<std::int64_t> cu = cu_seqlens(s);
      return make_args("attn_mask", "drop",
                       "qkv_format", "thd",
                       "attn_mask_type", s.kind == StructureKind::causal ? "padding_causal" : "padding",
                       "cu_seqlens_q", cu,
                       "cu_seqlens_kv", std::move(cu));
    });
  }
  switch (s.kind) {
    case StructureKind::full: return emit(out, [] { return Args{{"attn_mask", "drop"}, {"attn_mask_type", "no_mask"}}; });
    case StructureKind::causal: return emit(out, [&] { return Args{{"attn_mask", "drop"}, {"attn_mask_type", causal}}; });
    case StructureKind::sliding_window:
      return emit(out, [&] {
        return make_args("attn_mask", "drop",
                         "attn_mask_type", causal,
                         "window_size", std::vector<std::int64_t>{window_left(s), 0});
      });
    default: return false;
  }
}

}  // namespace masklens::backends::transformer_engine
