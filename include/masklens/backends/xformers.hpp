// xformers.ops.memory_efficient_attention with its attn_bias classes.
#pragma once

#include <numeric>
#include <optional>

#include "backend.hpp"

namespace masklens::backends::xformers {

inline constexpr std::string_view kDocs = "xformers docs, xformers.ops.fmha.attn_bias";

inline constexpr Rule kRules[] = {
    installed<&AttentionCall::xformers>("xformers.installed", "xformers version not given"),
    {"xformers.sm", kDocs, [](const AttentionCall& c) { return c.sm < 50; }, "xformers needs sm50 or newer", got_sm},
};

inline bool native_args(const MaskStructure& s, Args* out = nullptr) {
  const bool br = square(s) || s.alignment == Alignment::bottom_right;
  if (s.has_segments() && !s.has_kv_valid() && (s.kind == StructureKind::causal || s.kind == StructureKind::full)) {
    return emit(out, [&] {
      // Document lengths over the flattened batch: the differences of cu_seqlens.
      std::vector<std::int64_t> lens = cu_seqlens(s);
      std::adjacent_difference(lens.begin(), lens.end(), lens.begin());
      lens.erase(lens.begin());
      return make_args("attn_mask", "replace",
                       "attn_bias", s.kind == StructureKind::causal ? "BlockDiagonalCausalMask.from_seqlens"
                                                          : "BlockDiagonalMask.from_seqlens",
                       "seqlens", std::move(lens));
    });
  }
  if (!plain(s)) return false;
  switch (s.kind) {
    case StructureKind::full: return emit(out, [] { return Args{{"attn_mask", "drop"}, {"attn_bias", "None"}}; });
    case StructureKind::causal:
      return emit(out, [&] {
        return Args{{"attn_mask", "replace"},
                    {"attn_bias", square(s) || s.alignment == Alignment::top_left ? "LowerTriangularMask"
                                                                                  : "LowerTriangularFromBottomRightMask"}};
      });
    case StructureKind::sliding_window:
      if (!br) return false;
      return emit(out, [&] {
        return Args{{"attn_mask", "replace"},
                    {"attn_bias", "LocalAttentionFromBottomRightMask"},
                    {"window_left", window_left(s)},
                    {"window_right", std::int64_t{0}}};
      });
    default: return false;
  }
}

}  // namespace masklens::backends::xformers
