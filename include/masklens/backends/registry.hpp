// The backend registry: one row per backend — its name (the JSON contract's), family,
// capability rules, native and dense-mask forms, cost rates and work model, and its
// renderers (arguments under the library's names, the Python the CLI prints). decide(),
// the JSON writer, the CLI, the binding and the support matrix read this table and
// nothing else about a backend: a new backend is one header and one row here
// (docs/backends.md, "Adding a backend").
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <optional>
#include <span>
#include <string_view>

#include "../cost.hpp"
#include "backend.hpp"
#include "cudnn_frontend.hpp"
#include "flash_attn.hpp"
#include "flashinfer.hpp"
#include "flex_attention.hpp"
#include "jax.hpp"
#include "torch_sdpa.hpp"
#include "torch_varlen.hpp"
#include "transformer_engine.hpp"
#include "xformers.hpp"

namespace masklens {

// Whether the backend runs a structure this way; its call into `out` when given.
using Form = bool (*)(const MaskStructure&, const CallContext&, Call* out);

struct BackendInfo {
  Backend id;  // the row's index in kRegistry
  std::string_view name;
  BackendFamily family;
  std::span<const Rule> rules;  // checked in order; kept_mask rules only when the mask is kept
  Form native = nullptr;        // the mask dropped or replaced by the backend's own arguments
  Form dense = nullptr;         // the dense mask kept; null: takes none
  // Refusals other than "any call-scope rule refuses" (CausalBias: refused only when
  // both of its kernels are); null for the plain check.
  Refusals (*refusals)(const CallContext&) = nullptr;
  CostRates rates{};                       // cost.hpp
  WorkModel work = WorkModel::attended;    // what the rates multiply
  ArgsRenderer args = nullptr;             // the call's arguments under the library's names
  PythonRenderer python = nullptr;         // the call as Python (the CLI prints it)
  // A torch kernel a plan's unmasked steps may use: its place in the order ties are
  // broken in (1 first); 0: never a plan step.
  int plan_rank = 0;
};

}  // namespace masklens

// A test program's backend header (tests/fake_backend/hook.hpp names it).
#ifdef MASKLENS_EXTRA_BACKEND_HEADER
#include MASKLENS_EXTRA_BACKEND_HEADER
#endif

namespace masklens::backends {

namespace ts = torch_sdpa;
namespace fa = flash_attn;

inline constexpr BackendInfo kRegistry[] = {
    {.id = Backend::sdpa_flash, .name = "torch.sdpa.flash", .family = kFamilyTorch, .rules = ts::kFlashRules,
     .native = ts::native<SdpaKernel::flash>, .rates = {6.8, 0, true}, .args = ts::args, .python = ts::python,
     .plan_rank = 2},
    {.id = Backend::sdpa_efficient, .name = "torch.sdpa.efficient", .family = kFamilyTorch,
     .rules = ts::kEfficientRules, .native = ts::native<SdpaKernel::efficient>,
     .dense = ts::dense<SdpaKernel::efficient>, .rates = {15.2, 15.4, true}, .args = ts::args, .python = ts::python,
     .plan_rank = 4},
    {.id = Backend::sdpa_cudnn, .name = "torch.sdpa.cudnn", .family = kFamilyTorch, .rules = ts::kCudnnRules,
     .native = ts::native<SdpaKernel::cudnn>, .dense = ts::dense<SdpaKernel::cudnn>, .rates = {3.6, 6.4, true},
     .args = ts::args, .python = ts::python, .plan_rank = 1},
    // The math kernel computes every pair whatever the mask.
    {.id = Backend::sdpa_math, .name = "torch.sdpa.math", .family = kFamilyTorch, .rules = ts::kMathRules,
     .native = ts::native<SdpaKernel::math>, .dense = ts::dense<SdpaKernel::math>, .rates = {51.7, 51.6, true},
     .work = WorkModel::every_pair, .args = ts::args, .python = ts::python, .plan_rank = 5},
    // Flash inside (efficient where flash refuses).
    {.id = Backend::sdpa_causal_lower_right, .name = "torch.sdpa.causal_lower_right", .family = kFamilyTorch,
     .rules = ts::kCausalLowerRightRules, .native = ts::causal_lower_right_native,
     .refusals = ts::causal_lower_right_refusals, .rates = {6.8, 0, true}, .args = ts::causal_lower_right_args,
     .python = ts::causal_lower_right_python, .plan_rank = 3},
    {.id = Backend::torch_varlen, .name = "torch.varlen_attn", .family = kFamilyTorch, .rules = torch_varlen::kRules,
     .native = torch_varlen::native, .rates = {6.6, 0, true}, .args = torch_varlen::args,
     .python = torch_varlen::python},
    // Compiled flex computes whole tiles of its BlockMask: both rates are per pair of the
    // tiles it computes (flex_pairs), native with the structure's mask_mod (the
    // 69632-token 4096 window: 5.53 ms for 16368 full and 1056 partial tiles), dense with
    // a mask_mod that reads the mask (the 16384 causal mask: 3.04 ms for 8128 full and 128
    // partial tiles), partial tiles weighted as flex_pairs weighs them.
    {.id = Backend::flex_attention, .name = "torch.flex_attention", .family = kFamilyFlex,
     .rules = flex_attention::kRules, .native = flex_attention::native, .dense = flex_attention::dense,
     .rates = {4.84, 5.6, true}, .work = WorkModel::flex_tiles, .args = flex_attention::args,
     .python = flex_attention::python},
    // flash-attn 2: as torch's flash kernel.
    {.id = Backend::flash_attn, .name = "flash_attn", .family = kFamilyFlashAttn, .rules = fa::kFa2Rules,
     .native = fa::native<Backend::flash_attn>, .rates = {6.8, 0, false}, .args = fa::args, .python = fa::python},
    {.id = Backend::flash_attn_varlen, .name = "flash_attn.varlen", .family = kFamilyFlashAttn, .rules = fa::kFa2Rules,
     .native = fa::varlen_native<Backend::flash_attn_varlen>, .rates = {6.8, 0, false}, .args = fa::varlen_args,
     .python = fa::varlen_python},
    {.id = Backend::flash_attn3, .name = "flash_attn3", .family = kFamilyFlashAttn3, .rules = fa::kFa3Rules,
     .native = fa::native<Backend::flash_attn3>, .rates = {3.3, 0, false}, .args = fa::args, .python = fa::python},
    {.id = Backend::flash_attn3_varlen, .name = "flash_attn3.varlen", .family = kFamilyFlashAttn3,
     .rules = fa::kFa3Rules, .native = fa::varlen_native<Backend::flash_attn3_varlen>, .rates = {3.3, 0, false},
     .args = fa::varlen_args, .python = fa::varlen_python},
    {.id = Backend::xformers, .name = "xformers", .family = kFamilyXformers, .rules = xformers::kRules,
     .native = xformers::native, .dense = xformers::dense, .rates = {6.8, 15.4, false}, .args = xformers::args,
     .python = xformers::python},
    // TransformerEngine and the cuDNN frontend: cuDNN's fused attention inside.
    {.id = Backend::transformer_engine, .name = "transformer_engine", .family = kFamilyTransformerEngine,
     .rules = transformer_engine::kRules, .native = transformer_engine::native, .dense = transformer_engine::dense,
     .rates = {3.6, 6.4, false}, .args = transformer_engine::args, .python = transformer_engine::python},
    {.id = Backend::flashinfer, .name = "flashinfer", .family = kFamilyFlashInfer, .rules = flashinfer::kRules,
     .native = flashinfer::native, .dense = flashinfer::dense, .rates = {6.8, 6.8, false}, .args = flashinfer::args,
     .python = flashinfer::python},
    {.id = Backend::cudnn_frontend, .name = "cudnn_frontend", .family = kFamilyCudnnFrontend,
     .rules = cudnn_frontend::kRules, .native = cudnn_frontend::native, .dense = cudnn_frontend::dense,
     .rates = {3.6, 6.4, false}, .args = cudnn_frontend::args, .python = cudnn_frontend::python},
    // JAX (masklens.jax): cuDNN's fused attention as JAX reaches it, and XLA's einsum /
    // softmax / einsum, which computes every pair whatever the mask (as torch's math kernel).
    // jax.cudnn's rates: bench/jax_cudnn_forms.py on an H100, jax 0.11.2, 2026-12-06 (causal
    // and the dense mask at 1 x 16384 x 8 x 128, bf16; bench/README.md).
    {.id = Backend::jax_cudnn, .name = "jax.cudnn", .family = kFamilyJax, .rules = jax::kCudnnRules,
     .native = jax::cudnn_native, .dense = jax::dense<Backend::jax_cudnn>, .rates = {3.5, 6.3, true},
     .args = jax::args<Backend::jax_cudnn>, .python = jax::python},
    {.id = Backend::jax_xla, .name = "jax.xla", .family = kFamilyJax, .rules = jax::kXlaRules,
     .native = jax::xla_native, .dense = jax::dense<Backend::jax_xla>, .rates = {51.7, 51.6, false},
     .work = WorkModel::every_pair, .args = jax::args<Backend::jax_xla>, .python = jax::python},
#ifdef MASKLENS_EXTRA_BACKEND_ROWS
    MASKLENS_EXTRA_BACKEND_ROWS  // a test's backends (tests/fake_backend/hook.hpp)
#endif
};

// The table is indexed by Backend, leaves Backend::zeros (a plan step, no backend)
// free, every row has a name, its family is one kFamilies lists and its rule table fits
// the Refusals bit set. (That every row has a native form and renderers is a host test:
// GCC's sanitizers make a function pointer's comparison with null no constant.)
inline constexpr bool registry_well_formed() {
  for (std::size_t i = 0; i < std::size(kRegistry); ++i) {
    const BackendInfo& b = kRegistry[i];
    if (static_cast<std::size_t>(b.id) != i || b.id == Backend::zeros || b.rules.size() > kMaxRules) return false;
    if (b.name.empty()) return false;
    if (std::popcount(static_cast<std::uint32_t>(b.family)) != 1 || (b.family & ~kEveryFamily) != 0) return false;
  }
  return true;
}
static_assert(registry_well_formed(),
              "kRegistry: row i has id i (not zeros), a name, one known family and at most kMaxRules rules");

}  // namespace masklens::backends

namespace masklens {

// Every backend decide() judges, in registry order.
inline constexpr auto kAllBackends = [] {
  std::array<Backend, std::size(backends::kRegistry)> all{};
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = backends::kRegistry[i].id;
  return all;
}();

inline constexpr const BackendInfo& info(Backend b) noexcept { return backends::kRegistry[static_cast<std::size_t>(b)]; }

// Whether `b` names a registry row (Backend::zeros and values past the table do not).
constexpr bool in_registry(Backend b) noexcept { return static_cast<std::size_t>(b) < std::size(backends::kRegistry); }

constexpr std::string_view to_string(Backend b) noexcept { return b == Backend::zeros ? "zeros" : info(b).name; }
constexpr BackendFamily family(Backend b) noexcept { return b == Backend::zeros ? kFamilyTorch : info(b).family; }

// The family `b` belongs to, as kFamilies lists it (zeros: torch's).
constexpr const FamilyInfo& family_info(Backend b) noexcept {
  for (const FamilyInfo& f : kFamilies)
    if (f.bit == family(b)) return f;
  return kFamilies[0];  // unreachable: registry_well_formed() checks every row's family
}

// The backend named `name` (the JSON contract's spelling), if any.
constexpr std::optional<Backend> backend_named(std::string_view name) noexcept {
  for (const BackendInfo& b : backends::kRegistry)
    if (b.name == name) return b.id;
  if (name == "zeros") return Backend::zeros;
  return std::nullopt;
}

// The rates of `b` on architecture `sm` (cost.hpp says where they come from; every
// architecture has the sm90 ones until measured there). A zeros step costs only its call.
constexpr CostRates cost_rates(Backend b, int /*sm*/) noexcept {
  return b == Backend::zeros ? CostRates{0, 0, true} : info(b).rates;
}

// The call-scope rules of `b` that refuse this call.
inline Refusals refusals(Backend b, const CallContext& c) noexcept {
  const BackendInfo& i = info(b);
  return i.refusals ? i.refusals(c) : check_rules(i.rules, c);
}

// The torch kernels a plan step may use, in the order ties are broken (plan_rank).
inline constexpr auto kPlanKernels = [] {
  constexpr std::size_t n = [] {
    std::size_t count = 0;
    for (const BackendInfo& b : backends::kRegistry) count += b.plan_rank > 0;
    return count;
  }();
  std::array<Backend, n> kernels{};
  for (const BackendInfo& b : backends::kRegistry)
    if (b.plan_rank > 0) kernels[static_cast<std::size_t>(b.plan_rank - 1)] = b.id;
  return kernels;
}();
static_assert([] {
  for (std::size_t i = 0; i < kPlanKernels.size(); ++i)
    if (info(kPlanKernels[i]).plan_rank != static_cast<int>(i) + 1) return false;
  return true;
}(), "plan_rank: the plan kernels are ranked 1, 2, ... without a gap or a repeat");

}  // namespace masklens
