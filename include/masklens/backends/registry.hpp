// The backend registry: one row per backend — its name (the JSON contract's), family,
// capability rules, native and dense-mask forms. decide(), the JSON writer, the CLI and
// the support matrix read this table; a new backend is one row and one header.
#pragma once

#include <array>
#include <span>
#include <string_view>

#include "../cost.hpp"
#include "backend.hpp"
#include "cudnn_frontend.hpp"
#include "flash_attn.hpp"
#include "flashinfer.hpp"
#include "flex_attention.hpp"
#include "torch_sdpa.hpp"
#include "torch_varlen.hpp"
#include "transformer_engine.hpp"
#include "xformers.hpp"

namespace masklens {

// Whether the backend runs a structure this way; its call into `out` when given.
using Form = bool (*)(const MaskStructure&, const CallContext&, Call* out);

struct BackendInfo {
  Backend id;
  std::string_view name;
  BackendFamily family;
  std::span<const Rule> rules;  // checked in order; kept_mask rules only when the mask is kept
  Form native = nullptr;        // the mask dropped or replaced by the backend's own arguments
  Form dense = nullptr;         // the dense mask kept; null: takes none
  // Refusals other than "any call-scope rule refuses" (CausalBias: refused only when
  // both of its kernels are); null for the plain check.
  Refusals (*refusals)(const CallContext&) = nullptr;
};

namespace backends {

namespace ts = torch_sdpa;
namespace fa = flash_attn;

inline constexpr BackendInfo kRegistry[] = {
    {Backend::sdpa_flash, "torch.sdpa.flash", kFamilyTorch, ts::kFlashRules, ts::native<SdpaKernel::flash>},
    {Backend::sdpa_efficient, "torch.sdpa.efficient", kFamilyTorch, ts::kEfficientRules,
     ts::native<SdpaKernel::efficient>, ts::dense<SdpaKernel::efficient>},
    {Backend::sdpa_cudnn, "torch.sdpa.cudnn", kFamilyTorch, ts::kCudnnRules, ts::native<SdpaKernel::cudnn>,
     ts::dense<SdpaKernel::cudnn>},
    {Backend::sdpa_math, "torch.sdpa.math", kFamilyTorch, ts::kMathRules, ts::native<SdpaKernel::math>,
     ts::dense<SdpaKernel::math>},
    {Backend::sdpa_causal_lower_right, "torch.sdpa.causal_lower_right", kFamilyTorch, ts::kCausalLowerRightRules,
     ts::causal_lower_right_native, nullptr, ts::causal_lower_right_refusals},
    {Backend::torch_varlen, "torch.varlen_attn", kFamilyTorch, torch_varlen::kRules, torch_varlen::native},
    {Backend::flex_attention, "torch.flex_attention", kFamilyFlex, flex_attention::kRules, flex_attention::native,
     flex_attention::dense},
    {Backend::flash_attn, "flash_attn", kFamilyFlashAttn, fa::kFa2Rules, fa::native<Backend::flash_attn>},
    {Backend::flash_attn_varlen, "flash_attn.varlen", kFamilyFlashAttn, fa::kFa2Rules,
     fa::varlen_native<Backend::flash_attn_varlen>},
    {Backend::flash_attn3, "flash_attn3", kFamilyFlashAttn3, fa::kFa3Rules, fa::native<Backend::flash_attn3>},
    {Backend::flash_attn3_varlen, "flash_attn3.varlen", kFamilyFlashAttn3, fa::kFa3Rules,
     fa::varlen_native<Backend::flash_attn3_varlen>},
    {Backend::xformers, "xformers", kFamilyXformers, xformers::kRules, xformers::native, xformers::dense},
    {Backend::transformer_engine, "transformer_engine", kFamilyTransformerEngine, transformer_engine::kRules,
     transformer_engine::native, transformer_engine::dense},
    {Backend::flashinfer, "flashinfer", kFamilyFlashInfer, flashinfer::kRules, flashinfer::native, flashinfer::dense},
    {Backend::cudnn_frontend, "cudnn_frontend", kFamilyCudnnFrontend, cudnn_frontend::kRules, cudnn_frontend::native,
     cudnn_frontend::dense},
};

// The table is indexed by Backend and every rule table fits the Refusals bit set.
inline constexpr bool registry_well_formed() {
  for (std::size_t i = 0; i < std::size(kRegistry); ++i)
    if (static_cast<std::size_t>(kRegistry[i].id) != i || kRegistry[i].rules.size() > kMaxRules) return false;
  return std::size(kRegistry) == static_cast<std::size_t>(Backend::zeros);
}
static_assert(registry_well_formed(), "kRegistry lists every Backend but zeros, in enum order");

}  // namespace backends

// Every backend decide() judges, in registry order.
inline constexpr auto kAllBackends = [] {
  std::array<Backend, std::size(backends::kRegistry)> all{};
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = backends::kRegistry[i].id;
  return all;
}();

inline constexpr const BackendInfo& info(Backend b) noexcept { return backends::kRegistry[static_cast<std::size_t>(b)]; }

constexpr std::string_view to_string(Backend b) noexcept { return b == Backend::zeros ? "zeros" : info(b).name; }
constexpr BackendFamily family(Backend b) noexcept { return b == Backend::zeros ? kFamilyTorch : info(b).family; }

// The backend named `name` (the JSON contract's spelling), if any.
constexpr std::optional<Backend> backend_named(std::string_view name) noexcept {
  for (const BackendInfo& b : backends::kRegistry)
    if (b.name == name) return b.id;
  if (name == "zeros") return Backend::zeros;
  return std::nullopt;
}

// The call-scope rules of `b` that refuse this call.
inline Refusals refusals(Backend b, const CallContext& c) noexcept {
  const BackendInfo& i = info(b);
  return i.refusals ? i.refusals(c) : check_rules(i.rules, c);
}

}  // namespace masklens
