// TransformerEngine DotProductAttention: attn_mask_type + window_size; packed
// documents through qkv_format="thd" with cu_seqlens. TE's boolean masks use
// true = masked out.
#pragma once

#include "backend.hpp"

namespace masklens::backends::transformer_engine {

inline constexpr std::string_view kDocs = "TransformerEngine docs, DotProductAttention attn_mask_type";

inline constexpr Rule kRules[] = {
    installed<&Environment::transformer_engine>("te.installed", "transformer_engine version not given"),
    {"te.dtype", kDocs, is_fp32, "TransformerEngine's fused attention needs fp16 or bf16"},
    {"te.sm", kDocs, before_sm80, "TransformerEngine's fused attention needs sm80 or newer", got_sm},
};

inline bool native(const MaskStructure& s, const CallContext&, Call* out) {
  if (s.has_kv_valid() || s.has_q_valid()) return false;
  if (s.has_segments()) {
    if (!causal_documents(s)) return false;
    return emit(out, [&] { return dropping(Backend::transformer_engine, document_varlen(s)); });
  }
  if (s.kind != StructureKind::full && s.kind != StructureKind::causal && s.kind != StructureKind::sliding_window)
    return false;
  return emit(out, [&] {
    KernelArgs a = kernel_args(s);
    a.alignment = square(s) ? Alignment::top_left : s.alignment;
    return dropping(Backend::transformer_engine, a);
  });
}

// attn_mask_type="arbitrary" with the bool mask inverted (true = masked out).
inline bool dense(const MaskStructure& s, const CallContext&, Call* out) {
  if (s.bias || s.finite_masked_rows > 0) return false;  // a bool mask carries neither
  return emit(out, [] {
    Call c = dropping(Backend::transformer_engine, KernelArgs{}, MaskUse::keep);
    c.mask_form = MaskForm::inverted;
    return c;
  });
}

}  // namespace masklens::backends::transformer_engine
