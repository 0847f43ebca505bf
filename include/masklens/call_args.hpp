// A typed Call in its backend's own vocabulary, for the edges (json.hpp, the CLI, the
// binding; decide() never uses it): the keyword arguments the library takes, under their
// real names, and the object a replaced mask becomes (arguments.hpp); and the call as
// Python a user can paste. Each backend's registry row renders its own calls.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "backends/registry.hpp"

namespace masklens {

// The call's arguments for a batch of `batch` sequences of q_len x k_len (the plan
// step's slice for a step); none for a zeros step or a call of no registry row.
inline CallArgs backend_args(const Call& call, std::int64_t batch, std::int64_t q_len, std::int64_t k_len) {
  if (!in_registry(call.backend)) return {};
  return info(call.backend).args(call, batch, q_len, k_len);
}

// Python for one call on q, k, v (each [B, H, L, D]) into `out`. `structure`: the whole
// structure of a single call (FlexAttention writes its mask_mod from it); null for a
// plan step.
inline std::string python_call(const Call& c, std::int64_t batch, std::int64_t q_len, std::int64_t k_len,
                               std::optional<ElementType> mask_dtype, const MaskStructure* structure = nullptr) {
  if (c.backend == Backend::zeros) return "out.zero_()";
  if (!in_registry(c.backend)) return "pass";
  const CallArgs args = backend_args(c, batch, q_len, k_len);
  const PythonCall p{c, args, batch, q_len, k_len, python_text::mask_expression(c, mask_dtype), mask_dtype, structure};
  return info(c.backend).python(p);
}

}  // namespace masklens
