// cuDNN frontend SDPA graph: causal with diagonal_alignment TOP_LEFT / BOTTOM_RIGHT,
// sliding left_bound, padding through seq_len_q / seq_len_kv, packed documents
// through ragged offsets, additive bias tensors.
#pragma once

#include <optional>

#include "backend.hpp"

namespace masklens::backends::cudnn_frontend {

inline constexpr std::string_view kDocs = "cudnn-frontend docs, SDPA operation (attributes)";

inline constexpr Rule kRules[] = {
    installed<&AttentionCall::cudnn_frontend>("cudnn_frontend.installed", "cudnn_frontend version not given"),
    {"cudnn_frontend.dtype", kDocs, is_fp32,
     "cuDNN SDPA needs fp16 or bf16"},
    {"cudnn_frontend.sm", kDocs, before_sm80, "cuDNN SDPA needs sm80 or newer",
     got_sm},
    {"cudnn_frontend.head_dim", kDocs, [](const AttentionCall& c) { return c.head_dim % 8 != 0 || c.head_dim > 256; },
     "cuDNN SDPA needs head_dim divisible by 8 and <= 256", got_head_dim},
};

inline bool native_args(const MaskStructure& s, Args* out = nullptr) {
  const char* align = !square(s) && s.alignment == Alignment::bottom_right ? "BOTTOM_RIGHT" : "TOP_LEFT";
  if (s.has_kv_valid()) {
    // Right padding of keys with a full base: seq_len_kv per batch.
    if (s.kind != StructureKind::full || s.has_segments()) return false;
    for (const KeyRange& r : s.kv_valid)
      if (r.start != 0) return false;
    return emit(out, [&] {
      std::vector<std::int64_t> lens;
      lens.reserve(s.kv_valid.size());
      for (const KeyRange& r : s.kv_valid) lens.push_back(r.end);
      return make_args("attn_mask", "drop",
                       "padding_mask", true,
                       "seq_len_kv", std::move(lens),
                       "seq_len_q", std::vector<std::int64_t>(static_cast<std::size_t>(s.batch), s.q_len));
    });
  }
  if (s.has_segments()) {
    if (s.kind != StructureKind::causal && s.kind != StructureKind::full) return false;
    return emit(out, [&] {
      return make_args("attn_mask", "drop",
                       "causal_mask", s.kind == StructureKind::causal,
                       "ragged_offsets", cu_seqlens(s));
    });
  }
  switch (s.kind) {
    case StructureKind::full: return emit(out, [] { return Args{{"attn_mask", "drop"}}; });
    case StructureKind::causal:
      return emit(out, [&] {
        return Args{{"attn_mask", "drop"}, {"diagonal_alignment", align}, {"right_bound", std::int64_t{0}}};
      });
    case StructureKind::sliding_window:
      return emit(out, [&] {
        return Args{{"attn_mask", "drop"}, {"diagonal_alignment", align}, {"right_bound", std::int64_t{0}},
                    {"left_bound", s.window}};
      });
    default: return false;
  }
}

}  // namespace masklens::backends::cudnn_frontend
