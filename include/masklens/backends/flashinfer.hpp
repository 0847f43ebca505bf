// FlashInfer prefill (inference only): MaskMode causal (bottom-right) or custom
// (bit-packed little-endian), window_left, ragged batches through qo/kv indptr.
#pragma once

#include <optional>

#include "backend.hpp"

namespace masklens::backends::flashinfer {

inline constexpr std::string_view kDocs = "flashinfer docs, BatchPrefillWithRaggedKVCacheWrapper";

inline constexpr Rule kRules[] = {
    {"flashinfer.installed", "AttentionCall::flashinfer", [](const AttentionCall& c) { return !c.flashinfer.known(); },
     [](const AttentionCall&) { return std::string("flashinfer version not given"); }},
    {"flashinfer.inference", kDocs, [](const AttentionCall& c) { return c.training; },
     [](const AttentionCall&) { return std::string("FlashInfer has no backward pass"); }},
    {"flashinfer.dtype", kDocs, [](const AttentionCall& c) { return c.dtype == DType::float32; },
     [](const AttentionCall&) { return std::string("FlashInfer needs fp16 or bf16"); }},
    {"flashinfer.sm", kDocs, [](const AttentionCall& c) { return c.sm < 80; },
     [](const AttentionCall& c) { return "FlashInfer needs sm80 or newer here, got sm" + num(c.sm); }},
};

inline std::vector<Refusal> refusals(const AttentionCall& c) { return check_rules(kRules, c); }

inline std::optional<Args> native_args(const MaskStructure& s) {
  const bool br = square(s) || s.alignment == Alignment::bottom_right;
  if (s.has_kv_valid()) {
    if (s.kind != StructureKind::full || s.has_segments()) return std::nullopt;
    std::vector<std::int64_t> qo{0}, kv{0}, starts;
    for (const KeyRange& r : s.kv_valid) {
      qo.push_back(qo.back() + s.q_len);
      kv.push_back(kv.back() + r.end - r.start);
      starts.push_back(r.start);
    }
    return Args{{"attn_mask", std::string("drop")}, {"causal", false}, {"qo_indptr", qo}, {"kv_indptr", kv},
                {"k_gather_starts", starts}};
  }
  if (s.has_segments()) {
    if (s.kind != StructureKind::causal && s.kind != StructureKind::full) return std::nullopt;
    const auto cu = cu_seqlens(s);
    return Args{{"attn_mask", std::string("drop")}, {"causal", s.kind == StructureKind::causal}, {"qo_indptr", cu},
                {"kv_indptr", cu}};
  }
  switch (s.kind) {
    case StructureKind::full: return Args{{"attn_mask", std::string("drop")}, {"causal", false}};
    case StructureKind::causal:
      if (!br) return std::nullopt;
      return Args{{"attn_mask", std::string("drop")}, {"causal", true}};
    case StructureKind::sliding_window:
      if (!br) return std::nullopt;
      return Args{{"attn_mask", std::string("drop")}, {"causal", true}, {"window_left", window_left(s)}};
    default: return std::nullopt;
  }
}

}  // namespace masklens::backends::flashinfer
