// xformers.ops.memory_efficient_attention with its attn_bias classes.
#pragma once

#include <optional>

#include "backend.hpp"

namespace masklens::backends::xformers {

inline constexpr std::string_view kDocs = "xformers docs, xformers.ops.fmha.attn_bias";

inline constexpr Rule kRules[] = {
    {"xformers.installed", "AttentionCall::xformers", [](const AttentionCall& c) { return !c.xformers.known(); },
     [](const AttentionCall&) { return std::string("xformers version not given"); }},
    {"xformers.sm", kDocs, [](const AttentionCall& c) { return c.sm < 50; },
     [](const AttentionCall& c) { return "xformers needs sm50 or newer, got sm" + num(c.sm); }},
};

inline std::vector<Refusal> refusals(const AttentionCall& c) { return check_rules(kRules, c); }

inline std::vector<std::int64_t> seqlens(const std::vector<std::int64_t>& segments) {
  std::vector<std::int64_t> out;
  for (std::size_t i = 1; i < segments.size(); ++i) out.push_back(segments[i] - segments[i - 1]);
  return out;
}

inline std::optional<Args> native_args(const MaskStructure& s) {
  const bool br = square(s) || s.alignment == Alignment::bottom_right;
  if (s.has_segments() && !s.has_kv_valid() && (s.kind == StructureKind::causal || s.kind == StructureKind::full)) {
    std::vector<std::int64_t> lens;
    for (const auto& seg : s.segments) {
      const auto l = seqlens(seg);
      lens.insert(lens.end(), l.begin(), l.end());
    }
    return Args{{"attn_mask", std::string("replace")},
                {"attn_bias", std::string(s.kind == StructureKind::causal ? "BlockDiagonalCausalMask.from_seqlens"
                                                                           : "BlockDiagonalMask.from_seqlens")},
                {"seqlens", lens}};
  }
  if (!plain(s)) return std::nullopt;
  switch (s.kind) {
    case StructureKind::full: return Args{{"attn_mask", std::string("drop")}, {"attn_bias", std::string("None")}};
    case StructureKind::causal:
      return Args{{"attn_mask", std::string("replace")},
                  {"attn_bias", std::string(square(s) || s.alignment == Alignment::top_left
                                                ? "LowerTriangularMask"
                                                : "LowerTriangularFromBottomRightMask")}};
    case StructureKind::sliding_window:
      if (!br) return std::nullopt;
      return Args{{"attn_mask", std::string("replace")},
                  {"attn_bias", std::string("LocalAttentionFromBottomRightMask")},
                  {"window_left", window_left(s)}, {"window_right", std::int64_t{0}}};
    default: return std::nullopt;
  }
}

}  // namespace masklens::backends::xformers
