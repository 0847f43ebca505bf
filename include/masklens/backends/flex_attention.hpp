// torch.nn.attention.flex_attention: any structure as a BlockMask built from a
// mask_mod (create_block_mask, BLOCK_SIZE 128). Emitted as Python source for the
// mask_mod plus the tensors it reads; an arbitrary mask is read through its dense
// tensor (mask_mod indexing it), which keeps flex correct for it.
#pragma once

#include <optional>

#include "backend.hpp"

namespace masklens::backends::flex_attention {

inline constexpr std::string_view kDocs = "pytorch docs torch.nn.attention.flex_attention";

inline constexpr Rule kRules[] = {
    {"flex.torch_2_5", kDocs, [](const AttentionCall& c) { return c.torch < version(2, 5); },
     "flex_attention needs torch >= 2.5", [](const AttentionCall& c) { return "got " + c.torch.to_string(); }},
    {"flex.sm", kDocs, before_sm80,
     "flex_attention's Triton kernels need sm80 or newer here", got_sm},
    {"flex.head_dim", kDocs, [](const AttentionCall& c) { return c.head_dim < 16; },
     "flex_attention needs head_dim >= 16", got_head_dim},
};

// Python source of the mask_mod for a structure (q_idx, kv_idx, b are flex's names).
inline std::string mask_mod_source(const MaskStructure& s) {
  const std::int64_t d = s.alignment == Alignment::bottom_right ? s.k_len - s.q_len : 0;
  const std::string p = d ? "(q_idx + " + num(d) + ")" : std::string("q_idx");
  std::string rule;
  switch (s.kind) {
    case StructureKind::full: rule = "True"; break;
    case StructureKind::causal: rule = "(kv_idx <= " + p + ")"; break;
    case StructureKind::sliding_window:
      rule = "(kv_idx <= " + p + ") & (" + p + " - kv_idx < " + num(s.window) + ")";
      break;
    case StructureKind::chunked:
      rule = "(kv_idx <= " + p + ") & (kv_idx // " + num(s.chunk) + " == " + p + " // " + num(s.chunk) + ")";
      break;
    case StructureKind::prefix_lm: rule = "(kv_idx <= " + p + ") | (kv_idx < " + num(s.prefix) + ")"; break;
    case StructureKind::causal_blocks:
      rule = "(kv_idx <= " + p + ") | ((block_id[kv_idx] >= 0) & (block_id[kv_idx] == block_id[" + p + "]))";
      break;
    case StructureKind::arbitrary: return "mask[b, h, q_idx, kv_idx]";
  }
  if (s.has_segments()) rule = "(" + rule + ") & (document_id[b, q_idx] == document_id[b, kv_idx])";
  if (s.has_kv_valid()) rule = "(" + rule + ") & (kv_idx >= kv_start[b]) & (kv_idx < kv_end[b])";
  return rule;
}

inline Args args(const MaskStructure& s) {
  Args a{{"attn_mask", std::string(s.kind == StructureKind::arbitrary ? "keep" : "replace")},
         {"block_mask", "create_block_mask(mask_mod, B=" + num(s.batch) + ", H=None, Q_LEN=" + num(s.q_len) +
                            ", KV_LEN=" + num(s.k_len) + ", BLOCK_SIZE=128)"},
         {"mask_mod", "lambda b, h, q_idx, kv_idx: " + mask_mod_source(s)}};
  if (s.kind == StructureKind::causal_blocks) {
    std::vector<std::int64_t> flat;
    for (const KeyRange& r : s.blocks) flat.insert(flat.end(), {r.start, r.end});
    a.push_back({"blocks", flat});
  }
  if (s.has_segments()) {
    std::vector<std::int64_t> flat;
    for (const auto& seg : s.segments) flat.insert(flat.end(), seg.begin(), seg.end());
    a.push_back({"segments", flat});
  }
  if (s.has_kv_valid()) {
    std::vector<std::int64_t> starts, ends;
    for (const KeyRange& r : s.kv_valid) starts.push_back(r.start), ends.push_back(r.end);
    a.push_back({"kv_start", starts});
    a.push_back({"kv_end", ends});
  }
  return a;
}

}  // namespace masklens::backends::flex_attention
