// A typed Call in its backend's own vocabulary: the keyword arguments the library
// takes, under their real names, and the object a replaced mask becomes. The edges
// (json.hpp, the CLI's Python text) render calls through this; decide() never does.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "backends/registry.hpp"

namespace masklens {

// A Python tuple of two integers, e.g. window_size=(left, right).
struct IntPair {
  std::int64_t first = 0, second = 0;
  friend bool operator==(const IntPair&, const IntPair&) = default;
};

// An int32 device tensor of offsets or lengths (cu_seqlens, indptr, seq_len).
struct IndexTensor {
  std::vector<std::int64_t> values;
  friend bool operator==(const IndexTensor&, const IndexTensor&) = default;
};

// A Python value: bool, int, a name or string constant, an int tuple, an index tensor.
struct Identifier {  // a Python name or attribute (cudnn.diagonal_alignment.BOTTOM_RIGHT)
  std::string_view text;
  friend bool operator==(const Identifier&, const Identifier&) = default;
};
using ArgValue = std::variant<bool, std::int64_t, std::string_view, Identifier, IntPair, IndexTensor>;

struct NamedArg {
  std::string_view name;
  ArgValue value;
};

struct CallArgs {
  std::vector<NamedArg> args;          // keyword arguments of the call (or of its plan(), for FlashInfer)
  std::string_view mask_object;        // MaskUse::replace: the class or function the mask becomes
  std::vector<NamedArg> mask_object_args;
};

// The value of argument `name` in `args`, or null.
inline const ArgValue* find_arg(const std::vector<NamedArg>& args, std::string_view name) noexcept {
  for (const NamedArg& a : args)
    if (a.name == name) return &a.value;
  return nullptr;
}

namespace detail {

inline IntPair window_pair(std::int64_t left, std::int64_t right) { return {left, right}; }

inline void add_varlen_lengths(CallArgs& out, const VarlenArgs& v, std::string_view cu_q, std::string_view cu_k,
                               std::string_view max_q, std::string_view max_k) {
  out.args.push_back({cu_q, IndexTensor{v.cu_seqlens_q()}});
  out.args.push_back({cu_k, IndexTensor{v.cu_seqlens_k()}});
  if (!max_q.empty()) out.args.push_back({max_q, v.max_seqlen_q()});
  if (!max_k.empty()) out.args.push_back({max_k, v.max_seqlen_k()});
}

// TransformerEngine's attn_mask_type for a causal flag, an alignment and padding.
inline std::string_view te_mask_type(bool causal, Alignment a, bool padding) {
  if (!causal) return padding ? "padding" : "no_mask";
  if (a == Alignment::bottom_right) return padding ? "padding_causal_bottom_right" : "causal_bottom_right";
  return padding ? "padding_causal" : "causal";
}

}  // namespace detail

// The call's arguments for a batch of `batch` sequences of q_len x k_len (the plan
// step's slice for a step).
inline CallArgs backend_args(const Call& call, std::int64_t batch, std::int64_t q_len, std::int64_t k_len) {
  CallArgs out;
  const auto* sdpa = call.get<SdpaArgs>();
  const auto* kernel = call.get<KernelArgs>();
  const auto* varlen = call.get<VarlenArgs>();
  const auto* flex = call.get<FlexArgs>();
  // A plan's summary call carries no arguments; a call whose arguments do not fit its
  // backend (built by hand) renders none rather than guessing.
  const bool fits = (sdpa && family(call.backend) == kFamilyTorch && call.backend != Backend::torch_varlen) ||
                    (varlen && (call.backend == Backend::torch_varlen || call.backend == Backend::flash_attn_varlen ||
                                call.backend == Backend::flash_attn3_varlen || call.backend == Backend::xformers ||
                                call.backend == Backend::transformer_engine || call.backend == Backend::flashinfer ||
                                call.backend == Backend::cudnn_frontend)) ||
                    (kernel && (call.backend == Backend::flash_attn || call.backend == Backend::flash_attn3 ||
                                call.backend == Backend::xformers || call.backend == Backend::transformer_engine ||
                                call.backend == Backend::cudnn_frontend)) ||
                    (flex && call.backend == Backend::flex_attention);
  if (!fits) return out;
  switch (call.backend) {
    case Backend::sdpa_flash:
    case Backend::sdpa_efficient:
    case Backend::sdpa_cudnn:
    case Backend::sdpa_math:
      out.args.push_back({"is_causal", sdpa->is_causal});
      if (sdpa->enable_gqa) out.args.push_back({"enable_gqa", true});
      break;
    case Backend::sdpa_causal_lower_right:
      out.mask_object = "causal_lower_right";
      out.mask_object_args = {{"seq_len_q", q_len}, {"seq_len_kv", k_len}};
      if (sdpa->enable_gqa) out.args.push_back({"enable_gqa", true});
      break;
    case Backend::torch_varlen:
      detail::add_varlen_lengths(out, *varlen, "cu_seq_q", "cu_seq_k", "max_q", "max_k");
      out.args.push_back({"window_size", detail::window_pair(varlen->window_left, varlen->window_right)});
      break;
    case Backend::flex_attention:
      out.mask_object = "create_block_mask";
      // A kept mask may differ per head: the block mask then spans the mask's heads.
      out.mask_object_args = {{"B", batch}, {"H", Identifier{flex->mask_mod_reads_mask ? "mask.shape[1]" : "None"}},
                              {"Q_LEN", q_len}, {"KV_LEN", k_len},
                              {"BLOCK_SIZE", IntPair{flex->block_q, flex->block_k}}};
      break;
    case Backend::flash_attn:
    case Backend::flash_attn3:
      out.args.push_back({"causal", kernel->causal});
      if (kernel->window_left >= 0) out.args.push_back({"window_size", detail::window_pair(kernel->window_left, 0)});
      if (kernel->chunk > 0) out.args.push_back({"attention_chunk", kernel->chunk});
      break;
    case Backend::flash_attn_varlen:
    case Backend::flash_attn3_varlen:
      detail::add_varlen_lengths(out, *varlen, "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k");
      out.args.push_back({"causal", varlen->causal});
      if (varlen->window_left >= 0) out.args.push_back({"window_size", detail::window_pair(varlen->window_left, 0)});
      break;
    case Backend::xformers:
      if (call.mask != MaskUse::replace) break;
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
        out.mask_object = kernel->alignment == Alignment::bottom_right ? "LowerTriangularFromBottomRightMask"
                                                                       : "LowerTriangularMask";
      }
      break;
    case Backend::transformer_engine:
      if (varlen) {
        out.args.push_back({"qkv_format", std::string_view("thd")});
        // Top-left and bottom-right agree on sequences of equal q and k lengths.
        const bool square = std::all_of(varlen->sequences.begin(), varlen->sequences.end(), [](const Sequence& s) {
          return s.q.end - s.q.start == s.k.end - s.k.start;
        });
        out.args.push_back({"attn_mask_type", detail::te_mask_type(varlen->causal, square ? Alignment::top_left
                                                                                         : Alignment::bottom_right, true)});
        detail::add_varlen_lengths(out, *varlen, "cu_seqlens_q", "cu_seqlens_kv", "max_seqlen_q", "max_seqlen_kv");
      } else if (call.mask == MaskUse::keep) {
        out.args.push_back({"attn_mask_type", std::string_view("arbitrary")});
      } else {
        out.args.push_back({"attn_mask_type", detail::te_mask_type(kernel->causal, kernel->alignment, false)});
        if (kernel->window_left >= 0) out.args.push_back({"window_size", detail::window_pair(kernel->window_left, 0)});
      }
      break;
    case Backend::flashinfer:
      detail::add_varlen_lengths(out, *varlen, "qo_indptr", "kv_indptr", "", "");
      if (call.mask == MaskUse::keep) break;
      out.args.push_back({"causal", varlen->causal});
      if (varlen->window_left >= 0) out.args.push_back({"window_left", varlen->window_left});
      break;
    case Backend::cudnn_frontend:
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
      } else if (call.mask == MaskUse::drop && kernel->causal) {
        out.args.push_back({"diagonal_alignment", Identifier{kernel->alignment == Alignment::bottom_right
                                                                 ? "cudnn.diagonal_alignment.BOTTOM_RIGHT"
                                                                 : "cudnn.diagonal_alignment.TOP_LEFT"}});
        out.args.push_back({"diagonal_band_right_bound", std::int64_t{0}});
        // cuDNN's left bound counts the diagonal: W keys.
        if (kernel->window_left >= 0) out.args.push_back({"diagonal_band_left_bound", kernel->window_left + 1});
      }
      break;
    case Backend::zeros: break;
  }
  return out;
}

}  // namespace masklens
