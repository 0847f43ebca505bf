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
  return emit(out, [] {
    Call c = dropping(Backend::cudnn_frontend, KernelArgs{}, MaskUse::keep);
    c.mask_form = MaskForm::additive;
    return c;
  });
}

}  // namespace masklens::backends::cudnn_frontend
