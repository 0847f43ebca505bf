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
  VarlenArgs a;
  if (s.has_kv_valid()) {
    if (s.kind != StructureKind::full || s.has_segments()) return false;
    return emit(out, [&] {
      a.sequences = padded_sequences(s);
      return dropping(Backend::torch_varlen, std::move(a));
    });
  }
  if (!square(s)) return false;
  const bool chunked = s.kind == StructureKind::chunked;
  if (s.kind != StructureKind::full && s.kind != StructureKind::causal && s.kind != StructureKind::sliding_window &&
      !chunked)
    return false;
  return emit(out, [&] {
    a.sequences = document_sequences(s, chunked ? s.chunk : 0);
    a.causal = s.kind != StructureKind::full;
    if (a.causal) a.window_right = 0;
    if (s.kind == StructureKind::sliding_window) a.window_left = window_left(s);
    return dropping(Backend::torch_varlen, std::move(a));
  });
}

}  // namespace masklens::backends::torch_varlen
