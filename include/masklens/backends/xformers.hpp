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
  return additive_bias(Backend::xformers, out);
}

// The attn_bias class a replaced mask becomes, with its arguments.
inline CallArgs args(const Call& call, std::int64_t, std::int64_t, std::int64_t) {
  CallArgs out;
  const VarlenArgs* varlen = call.get<VarlenArgs>();
  const KernelArgs* kernel = call.get<KernelArgs>();
  if ((!varlen && !kernel) || call.mask != MaskUse::replace) return out;
  if (varlen) {
    out.mask_object = varlen->causal ? "BlockDiagonalCausalMask.from_seqlens" : "BlockDiagonalMask.from_seqlens";
    std::vector<std::int64_t> lens;
    lens.reserve(varlen->sequences.size());
    for (const Sequence& s : varlen->sequences) lens.push_back(s.q.end - s.q.start);
    out.mask_object_args = {{"q_seqlen", IndexTensor{std::move(lens)}}};
  } else if (kernel->window_left >= 0) {
    out.mask_object = "LocalAttentionFromBottomRightMask";
    out.mask_object_args = {{"window_left", kernel->window_left}, {"window_right", std::int64_t{0}}};
  } else {
    out.mask_object =
        kernel->alignment == Alignment::bottom_right ? "LowerTriangularFromBottomRightMask" : "LowerTriangularMask";
  }
  return out;
}

inline std::string python(const PythonCall& p) {
  const CallArgs& a = p.args;
  if (const VarlenArgs* varlen = p.call.get<VarlenArgs>())
    return python_text::pack_code(*varlen) + python_text::bind_tensors(a.mask_object_args) +
           "out_packed = xformers.ops.memory_efficient_attention(q_packed.unsqueeze(0), k_packed.unsqueeze(0), "
           "v_packed.unsqueeze(0), attn_bias=" +
           std::string(a.mask_object) + "(q_seqlen=q_seqlen.tolist()))[0]\n" + python_text::kUnpack;
  std::string bias = p.call.mask == MaskUse::keep ? p.mask : a.mask_object.empty() ? "None" : std::string(a.mask_object);
  if (!a.mask_object.empty())
    bias += "(" + python_text::keywords(a.mask_object_args).substr(a.mask_object_args.empty() ? 0 : 2) + ")";
  return "out = xformers.ops.memory_efficient_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), "
         "attn_bias=" +
         bias + ").transpose(1, 2)";
}

}  // namespace masklens::backends::xformers
