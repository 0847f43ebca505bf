// FlashInfer prefill (inference only): MaskMode causal (bottom-right) or custom
// (bit-packed little-endian), window_left, ragged batches through qo/kv indptr.
#pragma once

#include <optional>

#include "backend.hpp"

namespace masklens::backends::flashinfer {

inline constexpr std::string_view kDocs = "flashinfer docs, BatchPrefillWithRaggedKVCacheWrapper";

inline constexpr Rule kRules[] = {
    installed<&AttentionCall::flashinfer>("flashinfer.installed", "flashinfer version not given"),
    {"flashinfer.inference", kDocs, [](const AttentionCall& c) { return c.training; }, "FlashInfer has no backward pass"},
    {"flashinfer.dtype", kDocs, is_fp32,
     "FlashInfer needs fp16 or bf16"},
    {"flashinfer.sm", kDocs, before_sm80, "FlashInfer needs sm80 or newer here",
     got_sm},
};

inline bool native_args(const MaskStructure& s, Args* out = nullptr) {
  const bool br = square(s) || s.alignment == Alignment::bottom_right;
  if (s.has_kv_valid()) {
    if (s.kind != StructureKind::full || s.has_segments()) return false;
    return emit(out, [&] {
      std::vector<std::int64_t> qo, kv, starts;
      qo.reserve(s.kv_valid.size() + 1);
      kv.reserve(s.kv_valid.size() + 1);
      starts.reserve(s.kv_valid.size());
      qo.push_back(0);
      kv.push_back(0);
      for (const KeyRange& r : s.kv_valid) {
        qo.push_back(qo.back() + s.q_len);
        kv.push_back(kv.back() + r.end - r.start);
        starts.push_back(r.start);
      }
      return make_args("attn_mask", "drop",
                       "causal", false,
                       "qo_indptr", std::move(qo),
                       "kv_indptr", std::move(kv),
                       "k_gather_starts", std::move(starts));
    });
  }
  if (s.has_segments()) {
    if (s.kind != StructureKind::causal && s.kind != StructureKind::full) return false;
    return emit(out, [&] {
      std::vector<std::int64_t> cu = cu_seqlens(s);
      return make_args("attn_mask", "drop",
                       "causal", s.kind == StructureKind::causal,
                       "qo_indptr", cu,
                       "kv_indptr", std::move(cu));
    });
  }
  switch (s.kind) {
    case StructureKind::full: return emit(out, [] { return Args{{"attn_mask", "drop"}, {"causal", false}}; });
    case StructureKind::causal:
      if (!br) return false;
      return emit(out, [] { return Args{{"attn_mask", "drop"}, {"causal", true}}; });
    case StructureKind::sliding_window:
      if (!br) return false;
      return emit(out, [&] { return Args{{"attn_mask", "drop"}, {"causal", true}, {"window_left", window_left(s)}}; });
    default: return false;
  }
}

}  // namespace masklens::backends::flashinfer
