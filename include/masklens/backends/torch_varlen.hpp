// torch.nn.attention.varlen.varlen_attn: packed variable-length attention on torch's
// own flash kernel, with window_size=(left, right) — packed documents, chunks, sliding
// windows and padded keys without flash-attn installed. torch 2.10 shipped it with an
// is_causal flag instead; 2.11 takes window_size (causal is (-1, 0)), causal aligned
// bottom-right within each sequence, GQA through fewer key heads, autograd included.
#pragma once

#include "backend.hpp"

namespace masklens::backends::torch_varlen {

inline constexpr std::string_view kSource = "pytorch torch/nn/attention/varlen.py";

inline constexpr Rule kRules[] = {
    {"varlen.torch_2_11", kSource, [](const CallContext& c) { return c.env.torch < version(2, 11); },
     "varlen_attn with window_size needs torch >= 2.11", [](const CallContext& c) { return "got " + c.env.torch.to_string(); }},
    {"varlen.dtype", kSource, is_fp32, "varlen_attn needs fp16 or bf16", not_dtype},
    {"varlen.sm", kSource, before_sm80, "varlen_attn's flash kernels need sm80 or newer", got_sm},
    {"varlen.head_dim", kSource,
     [](const CallContext& c) {
       return c.call.head_dim > 256 || c.call.head_dim % 8 != 0 || c.call.value_head_dim() != c.call.head_dim;
     },
     "varlen_attn needs equal head dims, multiples of 8, <= 256 (its flash kernel pads nothing)", got_head_dim},
    {"varlen.dropout", kSource, [](const CallContext& c) { return c.call.dropout > 0; },
     "varlen_attn takes no dropout"},
};

// Documents, chunks and windows of a square structure; padded keys of a full one.
inline bool native(const MaskStructure& s, const CallContext&, Call* out) {
  return varlen_form(Backend::torch_varlen, s, out);
}

// varlen_attn(q, k, v, cu_seq_q, cu_seq_k, max_q, max_k, window_size=...).
inline CallArgs args(const Call& call, std::int64_t, std::int64_t, std::int64_t) {
  CallArgs out;
  const VarlenArgs* varlen = call.get<VarlenArgs>();
  if (!varlen) return out;
  add_varlen_lengths(out, *varlen, "cu_seq_q", "cu_seq_k", "max_q", "max_k");
  out.args.push_back({"window_size", IntPair{varlen->window_left, varlen->window_right}});
  return out;
}

inline std::string python(const PythonCall& p) {
  const VarlenArgs& varlen = *p.call.get<VarlenArgs>();
  return python_text::pack_code(varlen) + python_text::bind_tensors(p.args.args) +
         "out_packed = varlen_attn(q_packed, k_packed, v_packed, cu_seq_q, cu_seq_k, " +
         std::to_string(varlen.max_seqlen_q()) + ", " + std::to_string(varlen.max_seqlen_k()) +
         python_text::keywords({p.args.args.back()}) + ")\n" + python_text::kUnpack;
}

}  // namespace masklens::backends::torch_varlen
