// xformers.ops.memory_efficient_attention with its attn_bias classes
// (xformers.ops.fmha.attn_bias): LowerTriangularMask[FromBottomRight],
// LocalAttentionFromBottomRightMask, BlockDiagonal[Causal]Mask.from_seqlens.
#pragma once

#include "backend.hpp"

namespace masklens::backends::xformers {

inline constexpr std::string_view kDocs = "xformers docs, xformers.ops.fmha.attn_bias";

inline constexpr Rule kRules[] = {
    installed<&Environment::xformers>("xformers.installed", "xformers version not given"),
    {"xformers.sm", kDocs, [](const CallContext& c) { return c.env.sm < 50; }, "xformers needs sm50 or newer", got_sm},
};

inline bool native(const MaskStructure& s, const CallContext&, Call* out) {
  if (causal_documents(s))
    return emit(out, [&] { return dropping(Backend::xformers, document_varlen(s), MaskUse::replace); });
  if (!plain(s)) return false;
  if (s.kind == StructureKind::sliding_window && !bottom_right(s)) return false;
  if (s.kind != StructureKind::full && s.kind != StructureKind::causal && s.kind != StructureKind::sliding_window)
    return false;
  return emit(out, [&] {
    KernelArgs a = kernel_args(s);
    a.alignment = square(s) ? Alignment::top_left : s.alignment;
    return dropping(Backend::xformers, a, s.kind == StructureKind::full ? MaskUse::drop : MaskUse::replace);
  });
}

// attn_bias as a tensor: an additive bias of the query's dtype.
inline bool dense(const MaskStructure&, const CallContext&, Call* out) {
  return emit(out, [] {
    Call c = dropping(Backend::xformers, KernelArgs{}, MaskUse::keep);
    c.mask_form = MaskForm::additive;
    return c;
  });
}

}  // namespace masklens::backends::xformers
