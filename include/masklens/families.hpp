// The backend families: one row each (name, bit, its library's Environment version
// field, CLI option and default, the Python module that finds it installed, the Python
// host that decides for it), read by Environment::validate(), with_every_family(), the
// CLI's --available and version options, and the binding (_core.families()). A new
// family is one row here (and, where its library has a version of its own, an
// Environment field to hold it). call.hpp includes this header at its end.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "call.hpp"

namespace masklens {

// One backend family: the name --available and the Python package use, its bit, and
// the library version its rules read where it has one of its own (torch and flex read
// Environment::torch, which is given whether or not they are available).
struct FamilyInfo {
  std::string_view name;
  BackendFamily bit;
  Version Environment::*version = nullptr;  // null: none of its own
  std::string_view version_field{};         // that field's name (the binding's property)
  std::string_view version_option{};        // the CLI's option for it
  std::string_view library{};               // the library, as the option's help names it
  Version default_version{};                // the CLI's default and with_every_family()'s
  // Where Python finds it installed (masklens._env): the module that must import, and the
  // distributions whose metadata carry its version, comma-separated, the first installed
  // wins. Empty for torch and flex, which come with torch.
  std::string_view python_module{};
  std::string_view distributions{};
  // The Python package that decides for it: "torch" (masklens.torch's drop-in and
  // masklens.inspect) or "jax" (masklens.jax). A family of the torch host without a
  // python_module comes with torch, so the drop-in may choose its backends wherever torch
  // runs: each of them needs a runner (masklens._run.RUNNERS).
  std::string_view host = "torch";
};

inline constexpr FamilyInfo kFamilies[] = {
    {.name = "torch", .bit = kFamilyTorch},
    {.name = "flash_attn", .bit = kFamilyFlashAttn, .version = &Environment::flash_attn,
     .version_field = "flash_attn", .version_option = "--flash-attn-version",
     .library = "flash_attn", .default_version = version(2, 8, 3), .python_module = "flash_attn",
     .distributions = "flash-attn,flash_attn"},
    {.name = "flash_attn3", .bit = kFamilyFlashAttn3, .version = &Environment::flash_attn3,
     .version_field = "flash_attn3", .version_option = "--flash-attn3-version",
     .library = "flash_attn3", .default_version = version(3, 0), .python_module = "flash_attn_interface",
     .distributions = "flash-attn-3,flash_attn_3,flashattn-hopper"},
    {.name = "flex", .bit = kFamilyFlex},
    {.name = "xformers", .bit = kFamilyXformers, .version = &Environment::xformers,
     .version_field = "xformers", .version_option = "--xformers-version",
     .library = "xformers", .default_version = version(0, 0, 33), .python_module = "xformers",
     .distributions = "xformers"},
    {.name = "te", .bit = kFamilyTransformerEngine, .version = &Environment::transformer_engine,
     .version_field = "transformer_engine", .version_option = "--te-version",
     .library = "TransformerEngine", .default_version = version(2, 8),
     .python_module = "transformer_engine",
     .distributions = "transformer-engine,transformer_engine,transformer-engine-torch"},
    {.name = "flashinfer", .bit = kFamilyFlashInfer, .version = &Environment::flashinfer,
     .version_field = "flashinfer", .version_option = "--flashinfer-version",
     .library = "FlashInfer", .default_version = version(0, 5), .python_module = "flashinfer",
     .distributions = "flashinfer-python,flashinfer"},
    {.name = "cudnn_frontend", .bit = kFamilyCudnnFrontend, .version = &Environment::cudnn_frontend,
     .version_field = "cudnn_frontend", .version_option = "--cudnn-frontend-version",
     .library = "cudnn_frontend", .default_version = version(1, 16), .python_module = "cudnn",
     .distributions = "nvidia-cudnn-frontend,cudnn-frontend"},
    // A host of its own: masklens.jax decides for it alone, so no python_module (torch's
    // environment never finds it installed beside torch's kernels).
    {.name = "jax", .bit = kFamilyJax, .version = &Environment::jax, .version_field = "jax",
     .version_option = "--jax-version", .library = "jax", .default_version = version(0, 11), .host = "jax"},
#ifdef MASKLENS_EXTRA_FAMILY_ROWS
    MASKLENS_EXTRA_FAMILY_ROWS  // a test's families (tests/fake_backend/hook.hpp)
#endif
};

inline constexpr std::uint32_t kEveryFamily = [] {
  std::uint32_t bits = 0;
  for (const FamilyInfo& f : kFamilies) bits |= f.bit;
  return bits;
}();

// The family named `name`, or null.
constexpr const FamilyInfo* family_named(std::string_view name) noexcept {
  for (const FamilyInfo& f : kFamilies)
    if (f.name == name) return &f;
  return nullptr;
}

// "torch, flash_attn, ...": the names of the families in `bits` (every family's by
// default, for help and error texts), joined by `separator`.
inline std::string family_names(std::uint32_t bits = kEveryFamily, std::string_view separator = ", ") {
  std::string out;
  for (const FamilyInfo& f : kFamilies)
    if ((bits & f.bit) != 0) out += (out.empty() ? "" : std::string(separator)) + std::string(f.name);
  return out;
}

inline Status Environment::validate() const {
  if (sm < kMinSm || sm > kMaxSm)
    return Status(ErrorCode::invalid_argument,
                  "environment.sm must be a compute capability major*10+minor from 10 to 129 (80 = A100, 90 = H100), got " +
                      std::to_string(sm));
  if ((available & ~kEveryFamily) != 0)
    return Status(ErrorCode::invalid_argument, "environment.available has unknown family bits");
  return {};
}

// `e` with every backend family installed, at the versions docs/backends.md names (the
// CLI's defaults): what the support matrix and the tests ask "can it" of.
inline Environment with_every_family(Environment e = {}) {
  e.available = kEveryFamily;
  for (const FamilyInfo& f : kFamilies)
    if (f.version) e.*f.version = f.default_version;
  return e;
}

}  // namespace masklens
