// The chosen call as Python a user can paste: valid syntax (tests/cli parses every
// snippet), only parameters the libraries have (docs/backends.md names the versions),
// q / k / v in SDPA's [B, H, L, D] layout and the mask as `mask`.
#pragma once

#include <string>
#include <vector>

#include <masklens/call_args.hpp>
#include <masklens/masklens.hpp>

namespace masklens::cli {

// Lists longer than this print as `...` with a pointer to --json.
inline constexpr std::size_t kMaxListed = 16;

inline std::string python_list(const std::vector<std::int64_t>& v) {
  if (v.size() > kMaxListed) return "...  # " + std::to_string(v.size()) + " values: see --json";
  std::string out = "[";
  for (std::size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out + "]";
}

inline std::string python_value(const ArgValue& v) {
  return std::visit(
      [](const auto& x) -> std::string {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, bool>) return x ? "True" : "False";
        else if constexpr (std::is_same_v<T, std::int64_t>) return std::to_string(x);
        else if constexpr (std::is_same_v<T, std::string_view>) return "\"" + std::string(x) + "\"";
        else if constexpr (std::is_same_v<T, Identifier>) return std::string(x.text);
        else if constexpr (std::is_same_v<T, IntPair>) return "(" + std::to_string(x.first) + ", " + std::to_string(x.second) + ")";
        else return "torch.tensor(" + python_list(x.values) + ", dtype=torch.int32, device=q.device)";
      },
      v);
}

// ", name=value" for every argument; index tensors by the names bound before the call.
inline std::string keywords(const std::vector<NamedArg>& args) {
  std::string out;
  for (const NamedArg& a : args)
    out += ", " + std::string(a.name) + "=" +
           (std::holds_alternative<IndexTensor>(a.value) ? std::string(a.name) : python_value(a.value));
  return out;
}

// Binds every index-tensor argument to its own name, one line each.
inline std::string bind_tensors(const std::vector<NamedArg>& args) {
  std::string out;
  for (const NamedArg& a : args)
    if (const auto* t = std::get_if<IndexTensor>(&a.value)) {
      if (t->values.size() > kMaxListed)
        out += std::string(a.name) + " = torch.tensor(masklens_json[\"" + std::string(a.name) +
               "\"], dtype=torch.int32, device=q.device)  # " + std::to_string(t->values.size()) + " values: see --json\n";
      else
        out += std::string(a.name) + " = " + python_value(a.value) + "\n";
    }
  return out;
}

// The mask as the call passes it.
inline std::string mask_expression(const Call& c, std::optional<ElementType> mask_dtype) {
  std::string m = "mask";
  if (c.mask_cast) {
    const ElementType t = *c.mask_cast;
    m += t == ElementType::boolean    ? ".to(torch.bool)"
         : t == ElementType::float16  ? ".to(torch.float16)"
         : t == ElementType::bfloat16 ? ".to(torch.bfloat16)"
                                      : ".to(torch.float32)";
  }
  const bool is_bool = !mask_dtype || !is_additive(*mask_dtype) || c.mask_cast == ElementType::boolean;
  switch (c.mask_form) {
    case MaskForm::as_given: return m;
    case MaskForm::additive:
      return is_bool ? "torch.zeros(" + m + ".shape, dtype=q.dtype, device=q.device).masked_fill_(~" + m +
                           ", float(\"-inf\"))"
                     : m + ".to(q.dtype)";
    case MaskForm::inverted: return is_bool ? "~" + m : "(" + m + " != 0)";
    case MaskForm::flattened: return (is_bool ? m : "(" + m + " == 0)") + "[:, 0].flatten()";
  }
  return m;
}

// Packs the sequences into [total, heads, dim] tensors q_packed, k_packed, v_packed.
inline std::string pack_code(const VarlenArgs& v) {
  std::vector<std::int64_t> qp, kp;
  for (const Sequence& s : v.sequences) {
    qp.insert(qp.end(), {s.batch, s.q.start, s.q.end});
    kp.insert(kp.end(), {s.batch, s.k.start, s.k.end});
  }
  const auto pieces = [](const std::vector<std::int64_t>& p) {
    if (p.size() > 3 * kMaxListed) return std::string("masklens_json[\"pieces\"]  # see --json (call.sequences)");
    std::string out = "[";
    for (std::size_t i = 0; i < p.size(); i += 3)
      out += (i ? ", (" : "(") + std::to_string(p[i]) + ", " + std::to_string(p[i + 1]) + ", " +
             std::to_string(p[i + 2]) + ")";
    return out + "]";
  };
  return "q_pieces = " + pieces(qp) + "  # (batch, start, end) of each sequence\n" + "k_pieces = " + pieces(kp) +
         "\n"
         "q_packed = torch.cat([q[b, :, s:e].transpose(0, 1) for b, s, e in q_pieces])  # [total, heads, dim]\n"
         "k_packed = torch.cat([k[b, :, s:e].transpose(0, 1) for b, s, e in k_pieces])\n"
         "v_packed = torch.cat([v[b, :, s:e].transpose(0, 1) for b, s, e in k_pieces])\n";
}

inline const char* kUnpack =
    "out = torch.zeros_like(q)\n"
    "for (b, s, e), piece in zip(q_pieces, out_packed.split([e - s for _, s, e in q_pieces])):\n"
    "    out[b, :, s:e] = piece.transpose(0, 1)";

// `def mask_mod(...)` for flex_attention: the structure's rule from its fields, with
// the tensors it reads bound first; a kept mask is read through `mask`. `s` must be
// spelled out (one modifier entry per batch). create_block_mask evaluates whole tiles,
// past Q and K when they are not multiples of the block: lookups use clamped indices.
inline std::string python_mask_mod(const MaskStructure& s, const Call& c, std::optional<ElementType> mask_dtype) {
  const std::string q_last = std::to_string(s.q_len - 1), k_last = std::to_string(s.k_len - 1);
  if (c.get<FlexArgs>() && c.get<FlexArgs>()->mask_mod_reads_mask) {
    const bool is_bool = !mask_dtype || !is_additive(*mask_dtype);
    return "def mask_mod(b, h, q_idx, kv_idx):\n    m = mask[b if mask.shape[0] > 1 else 0, h if mask.shape[1] > 1 else 0, "
           "q_idx.clamp(max=" + q_last + "), kv_idx.clamp(max=" + k_last + ")]\n    return " +
           (is_bool ? "m" : "m == 0") + "\n";
  }
  std::string setup;
  const std::int64_t d = s.alignment == Alignment::bottom_right ? s.k_len - s.q_len : 0;
  const std::string p = d ? "(q_idx + " + std::to_string(d) + ")" : std::string("q_idx");
  std::string rule;
  switch (s.kind) {
    case StructureKind::full: rule = "kv_idx >= 0"; break;
    case StructureKind::causal: rule = "kv_idx <= " + p; break;
    case StructureKind::sliding_window:
      rule = "(kv_idx <= " + p + ") & (" + p + " - kv_idx < " + std::to_string(s.window) + ")";
      break;
    case StructureKind::chunked:
      rule = "(kv_idx <= " + p + ") & (" + p + " >= 0) & (kv_idx // " + std::to_string(s.chunk) + " == " + p +
             " // " + std::to_string(s.chunk) + ")";
      break;
    case StructureKind::prefix_lm: rule = "(kv_idx <= " + p + ") | (kv_idx < " + std::to_string(s.prefix) + ")"; break;
    case StructureKind::causal_blocks: {
      const std::int64_t n = std::max(s.k_len, s.q_len + d);
      setup += "block_id = torch.full((" + std::to_string(n) + ",), -1, dtype=torch.int32, device=q.device)\n";
      for (std::size_t i = 0; i < s.blocks.size(); ++i)
        setup += "block_id[" + std::to_string(s.blocks[i].start) + ":" + std::to_string(s.blocks[i].end) +
                 "] = " + std::to_string(i) + "\n";
      // p < 0 (bottom-right, Q > K) lies in no block: guarded, not wrapped around.
      rule = "(kv_idx <= " + p + ") | ((block_id[kv_idx.clamp(max=" + k_last + ")] >= 0) & (block_id[kv_idx.clamp(max=" +
             k_last + ")] == block_id[" + p + ".clamp(min=0, max=" + std::to_string(n - 1) + ")]) & (" + p + " >= 0))";
      break;
    }
    case StructureKind::arbitrary: rule = "kv_idx < 0"; break;
  }
  if (s.has_segments()) {
    setup += "document_id = torch.zeros(" + std::to_string(s.batch) + ", " + std::to_string(s.q_len) +
             ", dtype=torch.int32, device=q.device)\n";
    for (std::int64_t b = 0; b < s.batch; ++b) {
      const auto& seg = s.segments_of(b);
      for (std::size_t i = 1; i + 1 < seg.size(); ++i)
        setup += "document_id[" + std::to_string(b) + ", " + std::to_string(seg[i]) + ":] += 1\n";
    }
    rule = "(" + rule + ") & (document_id[b, q_idx.clamp(max=" + q_last + ")] == document_id[b, kv_idx.clamp(max=" +
           k_last + ")])";
  }
  if (s.has_kv_valid()) {
    std::vector<std::int64_t> starts, ends;
    for (std::int64_t b = 0; b < s.batch; ++b) starts.push_back(s.kv_valid_of(b).start), ends.push_back(s.kv_valid_of(b).end);
    setup += "kv_start = torch.tensor(" + python_list(starts) + ", device=q.device)\nkv_end = torch.tensor(" +
             python_list(ends) + ", device=q.device)\n";
    rule = "(" + rule + ") & (kv_idx >= kv_start[b]) & (kv_idx < kv_end[b])";
  }
  return setup + "def mask_mod(b, h, q_idx, kv_idx):\n    return " + rule + "\n";
}

// Python for one call on q, k, v (each [B, H, L, D]) into `out`.
inline std::string python_call(const Call& c, std::int64_t batch, std::int64_t q_len, std::int64_t k_len,
                               std::optional<ElementType> mask_dtype) {
  const CallArgs a = backend_args(c, batch, q_len, k_len);
  const std::string mask = mask_expression(c, mask_dtype);
  const std::string mask_kw = c.mask == MaskUse::keep ? ", attn_mask=" + mask : "";
  const auto* varlen = c.get<VarlenArgs>();
  switch (c.backend) {
    case Backend::sdpa_flash:
    case Backend::sdpa_efficient:
    case Backend::sdpa_cudnn:
    case Backend::sdpa_math:
      return "with sdpa_kernel([SDPBackend." + std::string(to_string(c.get<SdpaArgs>()->kernel)) +
             "]):\n    out = F.scaled_dot_product_attention(q, k, v" + mask_kw + keywords(a.args) + ")";
    case Backend::sdpa_causal_lower_right:
      return "out = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(" + std::to_string(q_len) +
             ", " + std::to_string(k_len) + ")" + keywords(a.args) + ")";
    case Backend::torch_varlen:
      return pack_code(*varlen) + bind_tensors(a.args) +
             "out_packed = varlen_attn(q_packed, k_packed, v_packed, cu_seq_q, cu_seq_k, " +
             std::to_string(varlen->max_seqlen_q()) + ", " + std::to_string(varlen->max_seqlen_k()) +
             keywords({a.args.back()}) + ")\n" + kUnpack;
    case Backend::flex_attention: {
      // A mask_mod that reads the mask: create_block_mask evaluates it on index grids of
      // the mask's size (out of memory past about 2^31 elements, pytorch#134756), where
      // masklens builds the same BlockMask from one read of the mask.
      const auto* flex = c.get<FlexArgs>();
      const std::string one_read =
          flex && flex->mask_mod_reads_mask
              ? "# the same BlockMask from one read of the mask: block_mask = masklens.torch.block_mask(mask, (" +
                    std::to_string(flex->block_q) + ", " + std::to_string(flex->block_k) + "))\n"
              : "";
      return one_read + "block_mask = create_block_mask(mask_mod" + keywords(a.mask_object_args) +
             ")\nout = flex_attention(q, k, v, block_mask=block_mask)";
    }
    case Backend::flash_attn:
    case Backend::flash_attn3:
      return "out = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)" + keywords(a.args) +
             ").transpose(1, 2)";
    case Backend::flash_attn_varlen:
    case Backend::flash_attn3_varlen: {
      std::vector<NamedArg> rest;
      for (const NamedArg& x : a.args)
        if (x.name == "causal" || x.name == "window_size") rest.push_back(x);
      return pack_code(*varlen) + bind_tensors(a.args) +
             "out_packed = flash_attn_varlen_func(q_packed, k_packed, v_packed, cu_seqlens_q, cu_seqlens_k, " +
             std::to_string(varlen->max_seqlen_q()) + ", " + std::to_string(varlen->max_seqlen_k()) + keywords(rest) +
             ")\n" + kUnpack;
    }
    case Backend::xformers: {
      std::string bias = c.mask == MaskUse::keep ? mask : a.mask_object.empty() ? "None" : std::string(a.mask_object);
      if (!a.mask_object.empty()) bias += "(" + keywords(a.mask_object_args).substr(a.mask_object_args.empty() ? 0 : 2) + ")";
      if (varlen)
        return pack_code(*varlen) + bind_tensors(a.mask_object_args) +
               "out_packed = xformers.ops.memory_efficient_attention(q_packed.unsqueeze(0), k_packed.unsqueeze(0), "
               "v_packed.unsqueeze(0), attn_bias=" +
               std::string(a.mask_object) + "(q_seqlen=q_seqlen.tolist()))[0]\n" + kUnpack;
      return "out = xformers.ops.memory_efficient_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), "
             "attn_bias=" +
             bias + ").transpose(1, 2)";
    }
    case Backend::transformer_engine: {
      const std::string module =
          "attention = DotProductAttention(num_attention_heads=q.shape[1], kv_channels=q.shape[3], "
          "num_gqa_groups=k.shape[1]" +
          keywords(a.args) + ")\n";
      if (varlen)
        return pack_code(*varlen) + bind_tensors(a.args) +
               "attention = DotProductAttention(num_attention_heads=q.shape[1], kv_channels=q.shape[3], "
               "num_gqa_groups=k.shape[1], qkv_format=\"thd\", attn_mask_type=" +
               python_value(*find_arg(a.args, "attn_mask_type")) +
               ")\nout_packed = attention(q_packed, k_packed, v_packed, cu_seqlens_q=cu_seqlens_q, "
               "cu_seqlens_kv=cu_seqlens_kv, max_seqlen_q=" +
               std::to_string(varlen->max_seqlen_q()) + ", max_seqlen_kv=" + std::to_string(varlen->max_seqlen_k()) +
               ").view(-1, q.shape[1], q.shape[3])\n" + kUnpack;
      return module +
             "out = attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), qkv_format=\"bshd\"" +
             (c.mask == MaskUse::keep ? ", attention_mask=" + mask : std::string()) +
             ").view(q.shape[0], q.shape[2], q.shape[1], -1).transpose(1, 2)";
    }
    case Backend::flashinfer: {
      std::vector<NamedArg> rest;
      for (const NamedArg& x : a.args)
        if (!std::holds_alternative<IndexTensor>(x.value)) rest.push_back(x);
      return pack_code(*varlen) + bind_tensors(a.args) +
             "wrapper = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(torch.empty(128 << 20, dtype=torch.uint8, "
             "device=q.device))\nwrapper.plan(qo_indptr, kv_indptr, q.shape[1], k.shape[1], q.shape[3]" +
             (c.mask == MaskUse::keep ? ", custom_mask=" + mask : std::string()) + keywords(rest) +
             ", q_data_type=q.dtype)\nout_packed = wrapper.run(q_packed, k_packed, v_packed)\n" + kUnpack;
    }
    case Backend::cudnn_frontend: {
      std::string tensors = bind_tensors(a.args);
      std::vector<NamedArg> rest;
      for (const NamedArg& x : a.args)
        if (!std::holds_alternative<IndexTensor>(x.value)) rest.push_back(x);
      std::string seq;
      if (varlen)
        seq = ", seq_len_q=graph.tensor_like(seq_len_q.view(-1, 1, 1, 1)), seq_len_kv=graph.tensor_like(seq_len_kv.view(-1, 1, 1, 1))";
      return tensors +
             "graph = cudnn.pygraph(io_data_type=cudnn.data_type.BFLOAT16, intermediate_data_type=cudnn.data_type.FLOAT, "
             "compute_data_type=cudnn.data_type.FLOAT)\n"
             "o, stats = graph.sdpa(graph.tensor_like(q), graph.tensor_like(k), graph.tensor_like(v), "
             "generate_stats=False, attn_scale=q.shape[3] ** -0.5" +
             (c.mask == MaskUse::keep ? ", bias=graph.tensor_like(" + mask + ")" : std::string()) + keywords(rest) + seq +
             ")";
    }
    case Backend::zeros: return "out.zero_()";
  }
  return "pass";
}

}  // namespace masklens::cli
