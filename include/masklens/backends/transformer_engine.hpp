// TransformerEngine DotProductAttention: attn_mask_type + window_size; packed
// documents through qkv_format="thd" with cu_seqlens. TE's boolean masks use
// true = masked out (MaskEncoding::polarity = true_masks reads them).
#pragma once

#include <optional>

#include "backend.hpp"

namespace masklens::backends::transformer_engine {

inline constexpr std::string_view kDocs = "TransformerEngine docs, DotProductAttention attn_mask_type";

inline constexpr Rule kRules[] = {
    {"te.installed", "AttentionCall::transformer_engine",
     [](const AttentionCall& c) { return !c.transformer_engine.known(); },
     [](const AttentionCall&) { return std::string("transformer_engine version not given"); }},
    {"te.dtype", kDocs, [](const AttentionCall& c) { return c.dtype == DType::float32; },
     [](const AttentionCall&) { return std::string("TransformerEngine's fused attention needs fp16 or bf16"); }},
    {"te.sm", kDocs, [](const AttentionCall& c) { return c.sm < 80; },
     [](const AttentionCall& c) { return "TransformerEngine's fused attention needs sm80 or newer, got sm" + num(c.sm); }},
};

inline std::vector<Refusal> refusals(const AttentionCall& c) { return check_rules(kRules, c); }

inline std::optional<Args> native_args(const MaskStructure& s) {
  const bool br = !square(s) && s.alignment == Alignment::bottom_right;
  if (s.has_kv_valid()) return std::nullopt;
  if (s.has_segments()) {
    if (s.kind != StructureKind::causal && s.kind != StructureKind::full) return std::nullopt;
    const auto cu = cu_seqlens(s);
    return Args{{"attn_mask", std::string("drop")}, {"qkv_format", std::string("thd")},
                {"attn_mask_type", std::string(s.kind == StructureKind::causal ? "padding_causal" : "padding")},
                {"cu_seqlens_q", cu}, {"cu_seqlens_kv", cu}};
  }
  switch (s.kind) {
    case StructureKind::full: return Args{{"attn_mask", std::string("drop")}, {"attn_mask_type", std::string("no_mask")}};
    case StructureKind::causal:
      return Args{{"attn_mask", std::string("drop")},
                  {"attn_mask_type", std::string(br ? "causal_bottom_right" : "causal")}};
    case StructureKind::sliding_window:
      return Args{{"attn_mask", std::string("drop")},
                  {"attn_mask_type", std::string(br ? "causal_bottom_right" : "causal")},
                  {"window_size", std::vector<std::int64_t>{window_left(s), 0}}};
    default: return std::nullopt;
  }
}

}  // namespace masklens::backends::transformer_engine
