// A typed Call in its backend's own vocabulary: the keyword arguments the library takes,
// under their real names, and the object a replaced mask becomes. Each backend header
// renders its calls into these (its registry row's `args`); the edges (json.hpp, the
// CLI's Python text, the binding) read them; decide() never does.
#pragma once

#include <cstdint>
#include <string_view>
#include <variant>
#include <vector>

#include "../backend_call.hpp"

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

// A backend's renderer: the call's arguments for a batch of `batch` sequences of
// q_len x k_len (a plan step's slice for a step). A call whose typed arguments are not
// the backend's (a plan's summary call, one built by hand) renders none rather than
// guessing.
using ArgsRenderer = CallArgs (*)(const Call&, std::int64_t batch, std::int64_t q_len, std::int64_t k_len);

// The value of argument `name` in `args`, or null.
inline const ArgValue* find_arg(const std::vector<NamedArg>& args, std::string_view name) noexcept {
  for (const NamedArg& a : args)
    if (a.name == name) return &a.value;
  return nullptr;
}

// The lengths of a varlen call under the library's names (an empty name: not passed).
inline void add_varlen_lengths(CallArgs& out, const VarlenArgs& v, std::string_view cu_q, std::string_view cu_k,
                               std::string_view max_q, std::string_view max_k) {
  out.args.push_back({cu_q, IndexTensor{v.cu_seqlens_q()}});
  out.args.push_back({cu_k, IndexTensor{v.cu_seqlens_k()}});
  if (!max_q.empty()) out.args.push_back({max_q, v.max_seqlen_q()});
  if (!max_k.empty()) out.args.push_back({max_k, v.max_seqlen_k()});
}

}  // namespace masklens
