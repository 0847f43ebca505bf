// FlashInfer prefill (inference only): causal (bottom-right) or a custom mask
// (bool, true = attend), window_left, ragged batches through qo/kv indptr.
#pragma once

#include "backend.hpp"

namespace masklens::backends::flashinfer {

inline constexpr std::string_view kDocs = "flashinfer docs, BatchPrefillWithRaggedKVCacheWrapper";

inline constexpr Rule kRules[] = {
    installed<&Environment::flashinfer>("flashinfer.installed", "flashinfer version not given"),
    {"flashinfer.inference", kDocs, [](const CallContext& c) { return c.call.training; },
     "FlashInfer has no backward pass"},
    {"flashinfer.dtype", kDocs, is_fp32, "FlashInfer needs fp16 or bf16"},
    {"flashinfer.sm", kDocs, before_sm80, "FlashInfer needs sm80 or newer here", got_sm},
};

// Ragged batches (documents, padded keys) and causal / windowed single sequences.
inline bool native(const MaskStructure& s, const CallContext&, Call* out) {
  if (!offsets_fit_int32(s)) return false;  // qo/kv indptr are int32
  if (s.has_kv_valid() || s.has_q_valid()) {
    if (s.kind != StructureKind::full || s.has_segments() || !padded_rows_have_keys(s)) return false;
    return emit(out, [&] { return dropping(Backend::flashinfer, padded_varlen(s)); });
  }
  if (s.has_segments()) {
    if (!causal_documents(s)) return false;
    return emit(out, [&] { return dropping(Backend::flashinfer, document_varlen(s)); });
  }
  if (s.kind != StructureKind::full && s.kind != StructureKind::causal && s.kind != StructureKind::sliding_window)
    return false;
  if (s.kind != StructureKind::full && !bottom_right(s)) return false;
  return emit(out, [&] {
    VarlenArgs a = padded_varlen(s);
    a.causal = s.kind != StructureKind::full;
    if (a.causal) a.window_right = 0;
    if (s.kind == StructureKind::sliding_window) a.window_left = window_left(s);
    return dropping(Backend::flashinfer, std::move(a));
  });
}

// custom_mask: the bool mask flattened (plan() packs it; a pre-packed mask is misread for
// batches of several requests, flashinfer-ai/flashinfer#2201).
inline bool dense(const MaskStructure& s, const CallContext&, Call* out) {
  // A bool mask carries no bias or finite masked values; the flattened custom mask is
  // one head's (the form reads mask[:, 0]).
  if (s.bias || s.finite_masked_rows > 0 || s.heads > 1 || !offsets_fit_int32(s)) return false;
  return emit(out, [&] {
    VarlenArgs a;  // one request per batch: every query row against every key
    a.sequences.reserve(static_cast<std::size_t>(s.batch));
    for (std::int64_t b = 0; b < s.batch; ++b) a.sequences.push_back({b, {0, s.q_len}, {0, s.k_len}});
    Call c = dropping(Backend::flashinfer, std::move(a), MaskUse::keep);
    c.mask_form = MaskForm::flattened;
    return c;
  });
}

// The wrapper's plan() keywords: indptr, and causal / window_left unless a mask is kept.
inline CallArgs args(const Call& call, std::int64_t, std::int64_t, std::int64_t) {
  CallArgs out;
  const VarlenArgs* varlen = call.get<VarlenArgs>();
  if (!varlen) return out;
  add_varlen_lengths(out, *varlen, "qo_indptr", "kv_indptr", "", "");
  if (call.mask == MaskUse::keep) return out;
  out.args.push_back({"causal", varlen->causal});
  if (varlen->window_left >= 0) out.args.push_back({"window_left", varlen->window_left});
  return out;
}

inline std::string python(const PythonCall& p) {
  std::vector<NamedArg> rest;  // the index tensors are positional
  for (const NamedArg& x : p.args.args)
    if (!std::holds_alternative<IndexTensor>(x.value)) rest.push_back(x);
  return python_text::pack_code(*p.call.get<VarlenArgs>()) + python_text::bind_tensors(p.args.args) +
         "wrapper = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(torch.empty(128 << 20, dtype=torch.uint8, "
         "device=q.device))\nwrapper.plan(qo_indptr, kv_indptr, q.shape[1], k.shape[1], q.shape[3]" +
         p.attn_mask_keyword("custom_mask") + python_text::keywords(rest) +
         ", q_data_type=q.dtype)\nout_packed = wrapper.run(q_packed, k_packed, v_packed)\n" + python_text::kUnpack;
}

}  // namespace masklens::backends::flashinfer
