// The known-defect table: conditions under which a backend is wrong or fails, each
// with its source. Versions are data: a defect applies to every version unless a
// release is known to carry the fix (unknown versions count as affected).
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "backend_call.hpp"
#include "call.hpp"
#include "structure.hpp"

namespace masklens {

// How the backend would be used for this call.
enum class Usage : std::uint8_t { native, dense_mask, plan_step };

enum class Effect : std::uint8_t {
  silently_wrong,  // finite, plausible, wrong output or gradients
  fails,           // an error or corrupted state the user will see
};

struct DefectContext {
  Backend backend;
  Usage usage;
  const AttentionCall& call;
  const Environment& env;
  const MaskStructure& structure;
  std::optional<ElementType> mask_dtype;  // dense_mask: the type the kept mask is passed as (after mask_cast)
};

struct Defect {
  std::string_view id;
  Backend backend;
  Effect effect;
  std::string_view condition;  // when it strikes, in words
  std::string_view source;
  bool (*applies)(const DefectContext&);
};

namespace detail {
constexpr std::int64_t kTwo32 = std::int64_t{1} << 32;
constexpr std::int64_t round_up(std::int64_t v, std::int64_t m) { return v > INT64_MAX - m ? INT64_MAX : (v + m - 1) / m * m; }
// a * b >= bound for non-negative a, b, without overflowing.
constexpr bool product_at_least(std::int64_t a, std::int64_t b, std::int64_t bound) {
  return a > 0 && b >= (bound + a - 1) / a;
}
// A kept mask of a type whose lowest values (bf16's and fp32's finfo.min, what transformers
// fills with) leave float range once a fused kernel scales them, with a row masked only by
// finite values: the values come from the mask as given (a cast to q's dtype keeps fp16's
// range), and an unknown type may be either.
constexpr bool lowest_finite_masked_rows(const DefectContext& c) {
  const std::optional<ElementType> given = c.call.mask_dtype;
  return c.usage == Usage::dense_mask && c.structure.finite_masked_rows > 0 &&
         (!given || *given == ElementType::bfloat16 || *given == ElementType::float32);
}
}  // namespace detail

inline constexpr Defect kDefects[] = {
    {"efficient_mask_offset_32bit", Backend::sdpa_efficient, Effect::silently_wrong,
     "attn_mask given and Lq * round_up(Lk, 16) >= 2^32: query_start * bias_strideM overflows 32 bits, rows past "
     "2^32 / stride read the wrong mask row (wrong forward and gradients)",
     "pytorch#162588, #187227; fix PRs #186075, #187225 (no release verified to carry it); measured on 2.11 (rel err "
     "0.76 at 69632)",
     [](const DefectContext& c) {
       return c.usage == Usage::dense_mask &&
              detail::product_at_least(c.call.q_len, detail::round_up(c.call.k_len, 16), detail::kTwo32);
     }},
    {"efficient_dropout_offset_32bit", Backend::sdpa_efficient, Effect::silently_wrong,
     "dropout_p > 0 and Lq * Lk > 2^32: the dropout RNG offset overflows, forward and backward masks diverge",
     "pytorch#187227 (no release verified to carry the fix)",
     [](const DefectContext& c) {
       return c.call.dropout > 0 && detail::product_at_least(c.call.q_len, c.call.k_len, detail::kTwo32 + 1);
     }},
    {"efficient_backward_mask_46344", Backend::sdpa_efficient, Effect::fails,
     "backward with attn_mask and a length above 46344 raises",
     "pytorch#147585 (open; did not reproduce on 2.11 in this project's runs)",
     [](const DefectContext& c) {
       return c.usage == Usage::dense_mask && c.call.training && std::max(c.call.q_len, c.call.k_len) > 46344;
     }},
    {"efficient_finite_masked_rows_zero", Backend::sdpa_efficient, Effect::silently_wrong,
     "a bf16 or fp32 attn_mask with a row masked only by finite values (transformers' fill, finfo.min): the row "
     "returns 0 where the dense softmax attends uniformly (math's mean of V); a value that low leaves float range "
     "once the kernel scales it",
     "measured on an H100, torch 2.11, 2026-12-06 (tests/python/test_dropin_property.py, CUDA seed 36: a bf16 "
     "finfo.min mask, 9 of 10 rows masked)",
     detail::lowest_finite_masked_rows},
    {"cudnn_finite_masked_rows", Backend::sdpa_cudnn, Effect::silently_wrong,
     "a bf16 or fp32 attn_mask with a row masked only by finite values (finfo.min): the row is not math's uniform "
     "mean of V",
     "measured on an H100, torch 2.11 / cuDNN 9.19, 2026-12-06 (tests/python/test_dropin_property.py, CUDA seed "
     "75: bottom-right causal 17 x 16, its first row masked by bf16 finfo.min)",
     detail::lowest_finite_masked_rows},
    {"cudnn_empty_rows_mean_of_v", Backend::sdpa_cudnn, Effect::silently_wrong,
     "attn_mask with fully masked query rows: bool masks are filled with -65504, so those rows return the mean of V "
     "instead of 0",
     "measured on an H200, torch 2.11 / cuDNN 9.19, 2026-12 (docs/backends.md, Measurements)",
     [](const DefectContext& c) {
       return c.usage == Usage::dense_mask && c.structure.empty_rows > c.structure.finite_masked_rows;
     }},
    {"jax_cudnn_empty_rows", Backend::jax_cudnn, Effect::silently_wrong,
     "a dense mask with a query row that attends no key: the row's output is not the mean of V that JAX's XLA "
     "call gives, and grad_q holds NaN",
     "measured on an H100, jax 0.11.2, 2026-12-06 (tests/python/test_jax.py test_gpu_cudnn_equals_dense, "
     "'a batch without keys')",
     [](const DefectContext& c) { return c.usage == Usage::dense_mask && c.structure.empty_rows > 0; }},
    {"cudnn_fp32_mask_reinterpreted", Backend::sdpa_cudnn, Effect::silently_wrong,
     "an fp32 attn_mask with fp16/bf16 q/k/v is reinterpreted without an error",
     "pytorch#191612, reproduced on 2.11",
     [](const DefectContext& c) {
       return c.usage == Usage::dense_mask && c.mask_dtype == ElementType::float32 && c.call.dtype != DType::float32;
     }},
    {"cudnn_q_not_multiple_of_128", Backend::sdpa_cudnn, Effect::fails,
     "cuDNN <= 9.15.0 and a query length not a multiple of 128: memory errors with CUDA graphs / side streams",
     "pytorch#169849 (torch moves cuDNN first only when cuDNN > 9.15.0)",
     [](const DefectContext& c) { return c.env.cudnn <= version(9, 15, 0) && c.call.q_len % 128 != 0; }},
    {"cudnn_b200_few_kv_heads", Backend::sdpa_cudnn, Effect::silently_wrong,
     "B200 (sm100) with kv_heads < 8: corrupt output in long generation",
     "pytorch#193893 (open; still on 2.13 / cuDNN 9.20)",
     [](const DefectContext& c) { return c.env.sm >= 100 && c.env.sm < 110 && c.call.key_heads() < 8; }},
    {"cudnn_mask_nan_grad_q", Backend::sdpa_cudnn, Effect::silently_wrong,
     "training with an explicit attn_mask (even all-True) and a length % 128 == 64: NaN in grad_q when a row's "
     "logsumexp is below about -88.7",
     "pytorch#196678 / #196861 (cuDNN-side fix said to ship in 9.26, not verified); reproduced on 2.11 / cuDNN 9.19",
     [](const DefectContext& c) {
       return c.usage == Usage::dense_mask && c.call.training &&
              (c.call.q_len % 128 == 64 || c.call.k_len % 128 == 64);
     }},
};

// The first defect that strikes this use of a backend, or null (no allocation).
inline const Defect* first_defect(const DefectContext& c) noexcept {
  for (const Defect& d : kDefects)
    if (d.backend == c.backend && d.applies(c)) return &d;
  return nullptr;
}

// The defects that strike this use of a backend.
inline std::vector<const Defect*> defects_for(const DefectContext& c) {
  std::vector<const Defect*> out;
  for (const Defect& d : kDefects)
    if (d.backend == c.backend && d.applies(c)) out.push_back(&d);
  return out;
}

}  // namespace masklens
