// Call: one attention call as typed values — which backend, what happens to the dense
// mask, and the backend family's own arguments. decide() returns these; they become
// JSON (json.hpp) or Python text (the CLI) only at the edges, so a binding drives the
// call from fields, never from source text.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string_view>
#include <variant>
#include <vector>

#include "element.hpp"
#include "structure.hpp"

namespace masklens {

enum class Backend : std::uint8_t {
  sdpa_flash,
  sdpa_efficient,
  sdpa_cudnn,
  sdpa_math,
  sdpa_causal_lower_right,
  torch_varlen,  // torch.nn.attention.varlen.varlen_attn
  flex_attention,
  flash_attn,
  flash_attn_varlen,
  flash_attn3,
  flash_attn3_varlen,
  xformers,
  transformer_engine,
  flashinfer,
  cudnn_frontend,
  jax_cudnn,  // jax.nn.dot_product_attention(implementation="cudnn")
  jax_xla,    // jax.nn.dot_product_attention(implementation="xla")
  // Each id is its row's index in the registry (backends/registry.hpp); a row a test
  // adds takes the next one (tests/fake_backend/hook.hpp). zeros is no row.
  zeros = 0xff,  // a plan step that writes zeros: rows that attend to nothing
};

// What the call does with the dense mask the framework passed.
enum class MaskUse : std::uint8_t {
  drop,     // not passed: the backend's own arguments express it exactly
  keep,     // passed (after mask_cast, in mask_form)
  replace,  // replaced by the backend's own mask object (CausalBias, an attn_bias class, a BlockMask)
};

// How a kept mask is handed over.
enum class MaskForm : std::uint8_t {
  as_given,     // as the framework holds it (after mask_cast)
  additive,     // a float bias of the query's dtype: 0 where attending, -inf where masked
  inverted,     // a bool mask with true = masked out (TransformerEngine)
  flattened,    // the bool mask flattened over each batch's [q_len, k_len] rows (FlashInfer custom_mask)
};

// torch SDPA's kernels, forced with sdpa_kernel([...]); `any` leaves the choice to
// torch (CausalBias dispatches to flash or efficient itself).
enum class SdpaKernel : std::uint8_t { flash, efficient, cudnn, math, any };

// F.scaled_dot_product_attention(q, k, v, attn_mask=..., is_causal=..., enable_gqa=...).
struct SdpaArgs {
  SdpaKernel kernel = SdpaKernel::math;
  bool is_causal = false;           // top-left causal
  bool causal_lower_right = false;  // attn_mask = causal_lower_right(q_len, k_len)
  bool enable_gqa = false;
  friend bool operator==(const SdpaArgs&, const SdpaArgs&) = default;
};

// A fixed-length kernel's own mask arguments (flash-attn, xformers, TransformerEngine,
// FlashInfer, cuDNN frontend): causal with its alignment, a band, a chunk.
struct KernelArgs {
  bool causal = false;
  Alignment alignment = Alignment::bottom_right;
  std::int64_t window_left = -1;   // keys p - window_left <= k; -1 = unbounded
  std::int64_t window_right = -1;  // keys k <= p + window_right; -1 = unbounded (0 with causal)
  std::int64_t chunk = 0;          // flash-attn 3 attention_chunk; 0 = none
  friend bool operator==(const KernelArgs&, const KernelArgs&) = default;
};

// Rows q_range of batch b attend keys k_range of batch b (as the sequence's own
// causal / window rule allows).
struct Sequence {
  std::int64_t batch = 0;
  KeyRange q, k;
  friend bool operator==(const Sequence&, const Sequence&) = default;
};

// Variable-length attention: sequences cut from the padded [B, H, L, D] tensors.
// `packed`: gathered in order into [total, heads, dim] with cu_seqlens (torch varlen_attn,
// flash-attn varlen, TransformerEngine thd, FlashInfer ragged, xformers block-diagonal,
// cuDNN ragged offsets). Not packed: the padded layout with per-batch lengths, every
// sequence starting at 0 (cuDNN frontend seq_len_q / seq_len_kv).
struct VarlenArgs {
  std::vector<Sequence> sequences;
  bool packed = true;
  bool causal = false;             // within each sequence, at `alignment`
  std::int64_t window_left = -1;   // as KernelArgs
  std::int64_t window_right = -1;
  // Where the causal diagonal and the window sit within a sequence: bottom-right (the
  // varlen kernels), or top-left (a padded layout whose sequences start at 0 and whose
  // rule counts from row 0 and key 0: JAX's is_causal with key_value_seq_lengths).
  Alignment alignment = Alignment::bottom_right;

  [[nodiscard]] std::vector<std::int64_t> cu_seqlens_q() const { return offsets(&Sequence::q); }
  [[nodiscard]] std::vector<std::int64_t> cu_seqlens_k() const { return offsets(&Sequence::k); }
  [[nodiscard]] std::int64_t max_seqlen_q() const noexcept { return longest(&Sequence::q); }
  [[nodiscard]] std::int64_t max_seqlen_k() const noexcept { return longest(&Sequence::k); }
  friend bool operator==(const VarlenArgs&, const VarlenArgs&) = default;

 private:
  [[nodiscard]] std::vector<std::int64_t> offsets(KeyRange Sequence::*side) const {
    std::vector<std::int64_t> cu;
    cu.reserve(sequences.size() + 1);
    cu.push_back(0);
    for (const Sequence& s : sequences) cu.push_back(cu.back() + (s.*side).end - (s.*side).start);
    return cu;
  }
  [[nodiscard]] std::int64_t longest(KeyRange Sequence::*side) const noexcept {
    std::int64_t m = 0;
    for (const Sequence& s : sequences) m = std::max(m, (s.*side).end - (s.*side).start);
    return m;
  }
};

// torch.nn.attention.flex_attention with a BlockMask of block_q x block_k tiles. The
// mask_mod is the structure's rule (from its fields) or, for a kept mask, a lookup
// into the dense mask.
struct FlexArgs {
  std::int64_t block_q = 128, block_k = 128;
  bool mask_mod_reads_mask = false;
  friend bool operator==(const FlexArgs&, const FlexArgs&) = default;
};

struct Call {
  Backend backend = Backend::sdpa_math;
  MaskUse mask = MaskUse::drop;
  std::optional<ElementType> mask_cast;  // keep: cast the mask to this type first (mask.to(...))
  MaskForm mask_form = MaskForm::as_given;
  // monostate: a zeros step (no arguments).
  std::variant<std::monostate, SdpaArgs, KernelArgs, VarlenArgs, FlexArgs> args;

  template <class T>
  [[nodiscard]] const T* get() const noexcept { return std::get_if<T>(&args); }
  friend bool operator==(const Call&, const Call&) = default;
};

constexpr std::string_view to_string(MaskUse m) noexcept {
  return m == MaskUse::drop ? "drop" : m == MaskUse::keep ? "keep" : "replace";
}
constexpr std::string_view to_string(MaskForm f) noexcept {
  switch (f) {
    case MaskForm::as_given: return "as_given";
    case MaskForm::additive: return "additive";
    case MaskForm::inverted: return "inverted";
    case MaskForm::flattened: return "flattened";
  }
  return "unknown";
}
constexpr std::string_view to_string(SdpaKernel k) noexcept {
  switch (k) {
    case SdpaKernel::flash: return "FLASH_ATTENTION";
    case SdpaKernel::efficient: return "EFFICIENT_ATTENTION";
    case SdpaKernel::cudnn: return "CUDNN_ATTENTION";
    case SdpaKernel::math: return "MATH";
    case SdpaKernel::any: return "any";
  }
  return "unknown";
}

}  // namespace masklens
