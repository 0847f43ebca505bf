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

// TransformerEngine's attn_mask_type for a causal flag, an alignment and padding.
inline std::string_view mask_type(bool causal, Alignment a, bool padding) {
  if (!causal) return padding ? "padding" : "no_mask";
  if (a == Alignment::bottom_right) return padding ? "padding_causal_bottom_right" : "causal_bottom_right";
  return padding ? "padding_causal" : "causal";
}

// DotProductAttention's keywords: attn_mask_type and window_size, or thd packing.
inline CallArgs args(const Call& call, std::int64_t, std::int64_t, std::int64_t) {
  CallArgs out;
  const VarlenArgs* varlen = call.get<VarlenArgs>();
  const KernelArgs* kernel = call.get<KernelArgs>();
  if (!varlen && !kernel) return out;
  if (varlen) {
    out.args.push_back({"qkv_format", std::string_view("thd")});
    // Top-left and bottom-right agree on sequences of equal q and k lengths.
    const bool square = std::all_of(varlen->sequences.begin(), varlen->sequences.end(), [](const Sequence& s) {
      return s.q.end - s.q.start == s.k.end - s.k.start;
    });
    out.args.push_back(
        {"attn_mask_type", mask_type(varlen->causal, square ? Alignment::top_left : Alignment::bottom_right, true)});
    add_varlen_lengths(out, *varlen, "cu_seqlens_q", "cu_seqlens_kv", "max_seqlen_q", "max_seqlen_kv");
  } else if (call.mask == MaskUse::keep) {
    out.args.push_back({"attn_mask_type", std::string_view("arbitrary")});
  } else {
    out.args.push_back({"attn_mask_type", mask_type(kernel->causal, kernel->alignment, false)});
    if (kernel->window_left >= 0) out.args.push_back({"window_size", IntPair{kernel->window_left, 0}});
  }
  return out;
}

inline std::string python(const PythonCall& p) {
  const CallArgs& a = p.args;
  if (const VarlenArgs* varlen = p.call.get<VarlenArgs>())
    return python_text::pack_code(*varlen) + python_text::bind_tensors(a.args) +
           "attention = DotProductAttention(num_attention_heads=q.shape[1], kv_channels=q.shape[3], "
           "num_gqa_groups=k.shape[1], qkv_format=\"thd\", attn_mask_type=" +
           python_text::python_value(*find_arg(a.args, "attn_mask_type")) +
           ")\nout_packed = attention(q_packed, k_packed, v_packed, cu_seqlens_q=cu_seqlens_q, "
           "cu_seqlens_kv=cu_seqlens_kv, max_seqlen_q=" +
           std::to_string(varlen->max_seqlen_q()) + ", max_seqlen_kv=" + std::to_string(varlen->max_seqlen_k()) +
           ").view(-1, q.shape[1], q.shape[3])\n" + python_text::kUnpack;
  return "attention = DotProductAttention(num_attention_heads=q.shape[1], kv_channels=q.shape[3], "
         "num_gqa_groups=k.shape[1]" +
         python_text::keywords(a.args) + ")\n" +
         "out = attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), qkv_format=\"bshd\"" +
         p.attn_mask_keyword("attention_mask") + ").view(q.shape[0], q.shape[2], q.shape[1], -1).transpose(1, 2)";
}

}  // namespace masklens::backends::transformer_engine
