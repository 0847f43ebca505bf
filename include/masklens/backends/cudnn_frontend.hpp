// cuDNN frontend SDPA graph: causal with diagonal_alignment TOP_LEFT / BOTTOM_RIGHT,
// a sliding left bound, right padding through seq_len_q / seq_len_kv, additive bias
// tensors.
#pragma once

#include "backend.hpp"

namespace masklens::backends::cudnn_frontend {

inline constexpr std::string_view kDocs = "cudnn-frontend docs, SDPA operation (attributes)";

inline constexpr Rule kRules[] = {
    installed<&Environment::cudnn_frontend>("cudnn_frontend.installed", "cudnn_frontend version not given"),
    {"cudnn_frontend.dtype", kDocs, is_fp32, "cuDNN SDPA needs fp16 or bf16"},
    {"cudnn_frontend.sm", kDocs, before_sm80, "cuDNN SDPA needs sm80 or newer", got_sm},
    {"cudnn_frontend.head_dim", kDocs,
     [](const CallContext& c) { return c.call.head_dim % 8 != 0 || c.call.head_dim > 256; },
     "cuDNN SDPA needs head_dim divisible by 8 and <= 256", got_head_dim},
};

inline bool native(const MaskStructure& s, const CallContext&, Call* out) {
  if (s.has_q_valid()) return false;
  if (s.has_kv_valid()) {
    // Right padding of keys with a full base: seq_len_kv per batch, padded layout.
    if (s.kind != StructureKind::full || s.has_segments() || !offsets_fit_int32(s) || !padded_rows_have_keys(s))
      return false;
    for (const KeyRange& r : s.kv_valid)
      if (r.start != 0) return false;
    return emit(out, [&] {
      VarlenArgs a = padded_varlen(s);
      a.packed = false;
      return dropping(Backend::cudnn_frontend, std::move(a));
    });
  }
  // Packed documents need ragged offsets on q, k, v and o, which the typed call does
  // not carry yet: the dense form (an additive bias) runs them.
  if (s.has_segments()) return false;
  if (s.kind != StructureKind::full && s.kind != StructureKind::causal && s.kind != StructureKind::sliding_window)
    return false;
  return emit(out, [&] {
    KernelArgs a = kernel_args(s);
    a.alignment = square(s) ? Alignment::top_left : s.alignment;
    return dropping(Backend::cudnn_frontend, a);
  });
}

// The mask as an additive bias tensor.
inline bool dense(const MaskStructure&, const CallContext&, Call* out) {
  return additive_bias(Backend::cudnn_frontend, out);
}

// graph.sdpa's keywords: padding through seq_len_q / seq_len_kv, the causal diagonal
// and its band.
inline CallArgs args(const Call& call, std::int64_t, std::int64_t, std::int64_t) {
  CallArgs out;
  const VarlenArgs* varlen = call.get<VarlenArgs>();
  const KernelArgs* kernel = call.get<KernelArgs>();
  if (varlen) {
    out.args.push_back({"use_padding_mask", true});
    std::vector<std::int64_t> q_lens, k_lens;
    for (const Sequence& s : varlen->sequences) {
      q_lens.push_back(s.q.end - s.q.start);
      k_lens.push_back(s.k.end - s.k.start);
    }
    out.args.push_back({"seq_len_q", IndexTensor{std::move(q_lens)}});
    out.args.push_back({"seq_len_kv", IndexTensor{std::move(k_lens)}});
    if (varlen->causal) {
      out.args.push_back({"diagonal_alignment", Identifier{"cudnn.diagonal_alignment.BOTTOM_RIGHT"}});
      out.args.push_back({"diagonal_band_right_bound", std::int64_t{0}});
    }
  } else if (kernel && call.mask == MaskUse::drop && kernel->causal) {
    out.args.push_back({"diagonal_alignment", Identifier{kernel->alignment == Alignment::bottom_right
                                                             ? "cudnn.diagonal_alignment.BOTTOM_RIGHT"
                                                             : "cudnn.diagonal_alignment.TOP_LEFT"}});
    out.args.push_back({"diagonal_band_right_bound", std::int64_t{0}});
    // cuDNN's left bound counts the diagonal: W keys.
    if (kernel->window_left >= 0) out.args.push_back({"diagonal_band_left_bound", kernel->window_left + 1});
  }
  return out;
}

inline std::string python(const PythonCall& p) {
  std::vector<NamedArg> rest;  // the index tensors are bound by name first
  for (const NamedArg& x : p.args.args)
    if (!std::holds_alternative<IndexTensor>(x.value)) rest.push_back(x);
  const std::string seq = p.call.get<VarlenArgs>() ? ", seq_len_q=graph.tensor_like(seq_len_q.view(-1, 1, 1, 1)), "
                                                     "seq_len_kv=graph.tensor_like(seq_len_kv.view(-1, 1, 1, 1))"
                                                   : "";
  return python_text::bind_tensors(p.args.args) +
         "graph = cudnn.pygraph(io_data_type=cudnn.data_type.BFLOAT16, intermediate_data_type=cudnn.data_type.FLOAT, "
         "compute_data_type=cudnn.data_type.FLOAT)\n"
         "o, stats = graph.sdpa(graph.tensor_like(q), graph.tensor_like(k), graph.tensor_like(v), "
         "generate_stats=False, attn_scale=q.shape[3] ** -0.5" +
         (p.call.mask == MaskUse::keep ? ", bias=graph.tensor_like(" + p.mask + ")" : std::string()) +
         python_text::keywords(rest) + seq + ")";
}

}  // namespace masklens::backends::cudnn_frontend
