// cuDNN frontend SDPA graph: causal with diagonal_alignment TOP_LEFT / BOTTOM_RIGHT,
// sliding left_bound, padding through seq_len_q / seq_len_kv, packed documents
// through ragged offsets, additive bias tensors.
#pragma once

#include <optional>

#include "backend.hpp"

namespace masklens::backends::cudnn_frontend {

inline constexpr std::string_view kDocs = "cudnn-frontend docs, SDPA operation (attributes)";

inline constexpr Rule kRules[] = {
    {"cudnn_frontend.installed", "AttentionCall::cudnn_frontend",
     [](const AttentionCall& c) { return !c.cudnn_frontend.known(); },
     [](const AttentionCall&) { return std::string("cudnn_frontend version not given"); }},
    {"cudnn_frontend.dtype", kDocs, [](const AttentionCall& c) { return c.dtype == DType::float32; },
     [](const AttentionCall&) { return std::string("cuDNN SDPA needs fp16 or bf16"); }},
    {"cudnn_frontend.sm", kDocs, [](const AttentionCall& c) { return c.sm < 80; },
     [](const AttentionCall& c) { return "cuDNN SDPA needs sm80 or newer, got sm" + num(c.sm); }},
    {"cudnn_frontend.head_dim", kDocs, [](const AttentionCall& c) { return c.head_dim % 8 != 0 || c.head_dim > 256; },
     [](const AttentionCall& c) { return "cuDNN SDPA needs head_dim divisible by 8 and <= 256, got " + num(c.head_dim); }},
};

inline std::vector<Refusal> refusals(const AttentionCall& c) { return check_rules(kRules, c); }

inline std::optional<Args> native_args(const MaskStructure& s) {
  const std::string align = !square(s) && s.alignment == Alignment::bottom_right ? "BOTTOM_RIGHT" : "TOP_LEFT";
  if (s.has_kv_valid()) {
    // Right padding of keys with a full base: seq_len_kv per batch.
    if (s.kind != StructureKind::full || s.has_segments()) return std::nullopt;
    std::vector<std::int64_t> lens;
    for (const KeyRange& r : s.kv_valid) {
      if (r.start != 0) return std::nullopt;
      lens.push_back(r.end);
    }
    return Args{{"attn_mask", std::string("drop")}, {"padding_mask", true}, {"seq_len_kv", lens},
                {"seq_len_q", std::vector<std::int64_t>(static_cast<std::size_t>(s.batch), s.q_len)}};
  }
  if (s.has_segments()) {
    if (s.kind != StructureKind::causal && s.kind != StructureKind::full) return std::nullopt;
    return Args{{"attn_mask", std::string("drop")}, {"causal_mask", s.kind == StructureKind::causal},
                {"ragged_offsets", cu_seqlens(s)}};
  }
  switch (s.kind) {
    case StructureKind::full: return Args{{"attn_mask", std::string("drop")}};
    case StructureKind::causal:
      return Args{{"attn_mask", std::string("drop")}, {"diagonal_alignment", align}, {"right_bound", std::int64_t{0}}};
    case StructureKind::sliding_window:
      return Args{{"attn_mask", std::string("drop")}, {"diagonal_alignment", align}, {"right_bound", std::int64_t{0}},
                  {"left_bound", s.window}};
    default: return std::nullopt;
  }
}

}  // namespace masklens::backends::cudnn_frontend
