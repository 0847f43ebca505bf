// fake_attn: a backend that exists only in tests, the one header a backend needs. It
// runs full and causal (top-left) masks natively on sm80 or newer, faster than any real
// backend, so decide() picks it wherever its family is available.
#pragma once

#include <masklens/backends/backend.hpp>

namespace masklens::backends::fake_attn {

// The next id after the last built-in row (registry.hpp checks that ids are row indexes).
inline constexpr Backend kId = static_cast<Backend>(static_cast<int>(Backend::jax_xla) + 1);
inline constexpr BackendFamily kFamily = family_named("fake_attn")->bit;

inline constexpr Rule kRules[] = {
    {"fake_attn.sm", "tests/fake_backend/fake_attn.hpp", before_sm80, "fake_attn needs sm80 or newer", got_sm},
};

inline bool native(const MaskStructure& s, const CallContext&, Call* out) {
  if (!plain(s) || (s.kind != StructureKind::full && s.kind != StructureKind::causal)) return false;
  if (s.kind == StructureKind::causal && !square(s) && s.alignment != Alignment::top_left) return false;
  return emit(out, [&] { return dropping(kId, kernel_args(s)); });
}

inline CallArgs args(const Call& call, std::int64_t, std::int64_t, std::int64_t) {
  CallArgs out;
  if (const KernelArgs* kernel = call.get<KernelArgs>()) out.args.push_back({"causal", kernel->causal});
  return out;
}

inline std::string python(const PythonCall& p) {
  return "out = fake_attn.attention(q, k, v" + python_text::keywords(p.args.args) + ")";
}

}  // namespace masklens::backends::fake_attn
