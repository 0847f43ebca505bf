// flash-attn 2 (flash_attn_func / flash_attn_varlen_func) and flash-attn 3
// (flash_attn_interface, Hopper). Causal is bottom-right aligned (flash-attn >= 2.1);
// window_size=(left, right) allows keys in [i + K - Q - left, i + K - Q + right].
#pragma once

#include "backend.hpp"

namespace masklens::backends::flash_attn {

inline constexpr std::string_view kReadme = "github.com/Dao-AILab/flash-attention README";
inline constexpr std::string_view kHopperReadme = "github.com/Dao-AILab/flash-attention hopper/README";

inline constexpr Rule kFa2Rules[] = {
    installed<&Environment::flash_attn>("fa2.installed", "flash_attn version not given"),
    {"fa2.dtype", kReadme, is_fp32, "flash-attn needs fp16 or bf16"},
    {"fa2.head_dim", kReadme,
     [](const CallContext& c) { return c.call.head_dim > 256 || c.call.value_head_dim() != c.call.head_dim; },
     "flash-attn needs equal head dims <= 256", got_head_dim},
    {"fa2.sm", kReadme, before_sm80, "flash-attn 2 needs sm80 or newer", got_sm},
};

inline constexpr Rule kFa3Rules[] = {
    installed<&Environment::flash_attn3>("fa3.installed", "flash_attn3 version not given"),
    {"fa3.dtype", kHopperReadme, is_fp32, "flash-attn 3 needs fp16 or bf16 (or fp8)"},
    {"fa3.head_dim", kHopperReadme,
     [](const CallContext& c) { return c.call.head_dim > 256 || c.call.value_head_dim() > 256; },
     "flash-attn 3 needs head dims <= 256", got_head_dim},
    {"fa3.sm90", kHopperReadme, [](const CallContext& c) { return c.env.sm < 90 || c.env.sm >= 100; },
     "flash-attn 3 runs on Hopper (sm90)", got_sm},
};

// flash_attn_func: full, causal, windows (bottom-right); chunks on flash-attn 3.
template <Backend kBackend>
bool native(const MaskStructure& s, const CallContext&, Call* out) {
  if (!plain(s)) return false;
  switch (s.kind) {
    case StructureKind::full: break;
    case StructureKind::causal:
    case StructureKind::sliding_window:
      if (!bottom_right(s)) return false;
      break;
    case StructureKind::chunked:
      if (kBackend != Backend::flash_attn3 || !bottom_right(s)) return false;
      break;
    default: return false;
  }
  return emit(out, [&] { return dropping(kBackend, kernel_args(s)); });
}

// flash_attn_varlen_func: packed documents and chunks (causal or windowed within each),
// and the padded keys of a full (cross-)attention, gathered per batch. A plain
// structure is the dense kernel's: the varlen form adds only packing.
template <Backend kBackend>
bool varlen_native(const MaskStructure& s, const CallContext&, Call* out) {
  if (plain(s) && s.kind != StructureKind::chunked) return false;
  return varlen_form(kBackend, s, out);
}

// flash_attn_func's keywords (flash-attn 2, and flash_attn_interface's for 3).
inline CallArgs args(const Call& call, std::int64_t, std::int64_t, std::int64_t) {
  CallArgs out;
  const KernelArgs* kernel = call.get<KernelArgs>();
  if (!kernel) return out;
  out.args.push_back({"causal", kernel->causal});
  if (kernel->window_left >= 0) out.args.push_back({"window_size", IntPair{kernel->window_left, 0}});
  if (kernel->chunk > 0) out.args.push_back({"attention_chunk", kernel->chunk});
  return out;
}

inline std::string python(const PythonCall& p) {
  return "out = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)" +
         python_text::keywords(p.args.args) + ").transpose(1, 2)";
}

// flash_attn_varlen_func's keywords.
inline CallArgs varlen_args(const Call& call, std::int64_t, std::int64_t, std::int64_t) {
  CallArgs out;
  const VarlenArgs* varlen = call.get<VarlenArgs>();
  if (!varlen) return out;
  add_varlen_lengths(out, *varlen, "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k");
  out.args.push_back({"causal", varlen->causal});
  if (varlen->window_left >= 0) out.args.push_back({"window_size", IntPair{varlen->window_left, 0}});
  return out;
}

inline std::string varlen_python(const PythonCall& p) {
  const VarlenArgs& varlen = *p.call.get<VarlenArgs>();
  std::vector<NamedArg> rest;  // the lengths are positional
  for (const NamedArg& x : p.args.args)
    if (x.name == "causal" || x.name == "window_size") rest.push_back(x);
  return python_text::pack_code(varlen) + python_text::bind_tensors(p.args.args) +
         "out_packed = flash_attn_varlen_func(q_packed, k_packed, v_packed, cu_seqlens_q, cu_seqlens_k, " +
         std::to_string(varlen.max_seqlen_q()) + ", " + std::to_string(varlen.max_seqlen_k()) +
         python_text::keywords(rest) + ")\n" + python_text::kUnpack;
}

}  // namespace masklens::backends::flash_attn
