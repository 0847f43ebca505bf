// The chosen call as Python a user can paste: what each backend's registry row prints
// (its `python` renderer, the CLI's text) is built from these pieces. Valid syntax
// (tests/cli parses every snippet), only parameters the libraries have
// (docs/backends.md names the versions), q / k / v in SDPA's [B, H, L, D] layout and
// the mask as `mask`.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

#include "../backend_call.hpp"
#include "../element.hpp"
#include "../structure.hpp"
#include "arguments.hpp"

namespace masklens {

// What a backend's Python renderer is given: the call, its rendered arguments, the
// slice it runs on, the mask as the call passes it, and, for a single call (not a plan
// step), the structure (FlexAttention's mask_mod is written from its fields).
struct PythonCall {
  const Call& call;
  const CallArgs& args;
  std::int64_t batch = 0, q_len = 0, k_len = 0;
  std::string mask;                       // the mask expression (python_text::mask_expression)
  std::optional<ElementType> mask_dtype;  // the dense mask's element type, when known
  const MaskStructure* structure = nullptr;

  // ", attn_mask=<mask>" when the call keeps the mask, else nothing.
  [[nodiscard]] std::string attn_mask_keyword(std::string_view keyword = "attn_mask") const {
    return call.mask == MaskUse::keep ? ", " + std::string(keyword) + "=" + mask : std::string();
  }
};
using PythonRenderer = std::string (*)(const PythonCall&);

namespace python_text {

// Lists longer than this print as `...` with a pointer to --json.
inline constexpr std::size_t kMaxListed = 16;

inline std::string python_list(const std::vector<std::int64_t>& v) {
  if (v.size() > kMaxListed) return "...  # " + std::to_string(v.size()) + " values: see --json";
  std::string out = "[";
  for (std::size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out + "]";
}

inline std::string python_value(const ArgValue& v) {
  return std::visit(
      [](const auto& x) -> std::string {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, bool>) return x ? "True" : "False";
        else if constexpr (std::is_same_v<T, std::int64_t>) return std::to_string(x);
        else if constexpr (std::is_same_v<T, std::string_view>) return "\"" + std::string(x) + "\"";
        else if constexpr (std::is_same_v<T, Identifier>) return std::string(x.text);
        else if constexpr (std::is_same_v<T, IntPair>) return "(" + std::to_string(x.first) + ", " + std::to_string(x.second) + ")";
        else return "torch.tensor(" + python_list(x.values) + ", dtype=torch.int32, device=q.device)";
      },
      v);
}

// ", name=value" for every argument; index tensors by the names bound before the call.
inline std::string keywords(const std::vector<NamedArg>& args) {
  std::string out;
  for (const NamedArg& a : args)
    out += ", " + std::string(a.name) + "=" +
           (std::holds_alternative<IndexTensor>(a.value) ? std::string(a.name) : python_value(a.value));
  return out;
}

// Binds every index-tensor argument to its own name, one line each.
inline std::string bind_tensors(const std::vector<NamedArg>& args) {
  std::string out;
  for (const NamedArg& a : args)
    if (const auto* t = std::get_if<IndexTensor>(&a.value)) {
      if (t->values.size() > kMaxListed)
        out += std::string(a.name) + " = torch.tensor(masklens_json[\"" + std::string(a.name) +
               "\"], dtype=torch.int32, device=q.device)  # " + std::to_string(t->values.size()) + " values: see --json\n";
      else
        out += std::string(a.name) + " = " + python_value(a.value) + "\n";
    }
  return out;
}

// The mask as the call passes it.
inline std::string mask_expression(const Call& c, std::optional<ElementType> mask_dtype) {
  std::string m = "mask";
  if (c.mask_cast) {
    const ElementType t = *c.mask_cast;
    m += t == ElementType::boolean    ? ".to(torch.bool)"
         : t == ElementType::float16  ? ".to(torch.float16)"
         : t == ElementType::bfloat16 ? ".to(torch.bfloat16)"
                                      : ".to(torch.float32)";
  }
  const bool is_bool = !mask_dtype || !is_additive(*mask_dtype) || c.mask_cast == ElementType::boolean;
  switch (c.mask_form) {
    case MaskForm::as_given: return m;
    case MaskForm::additive:
      return is_bool ? "torch.zeros(" + m + ".shape, dtype=q.dtype, device=q.device).masked_fill_(~" + m +
                           ", float(\"-inf\"))"
                     : m + ".to(q.dtype)";
    case MaskForm::inverted: return is_bool ? "~" + m : "(" + m + " != 0)";
    case MaskForm::flattened: return (is_bool ? m : "(" + m + " == 0)") + "[:, 0].flatten()";
  }
  return m;
}

// Packs the sequences into [total, heads, dim] tensors q_packed, k_packed, v_packed.
inline std::string pack_code(const VarlenArgs& v) {
  std::vector<std::int64_t> qp, kp;
  for (const Sequence& s : v.sequences) {
    qp.insert(qp.end(), {s.batch, s.q.start, s.q.end});
    kp.insert(kp.end(), {s.batch, s.k.start, s.k.end});
  }
  const auto pieces = [](const std::vector<std::int64_t>& p) {
    if (p.size() > 3 * kMaxListed) return std::string("masklens_json[\"pieces\"]  # see --json (call.sequences)");
    std::string out = "[";
    for (std::size_t i = 0; i < p.size(); i += 3)
      out += (i ? ", (" : "(") + std::to_string(p[i]) + ", " + std::to_string(p[i + 1]) + ", " +
             std::to_string(p[i + 2]) + ")";
    return out + "]";
  };
  return "q_pieces = " + pieces(qp) + "  # (batch, start, end) of each sequence\n" + "k_pieces = " + pieces(kp) +
         "\n"
         "q_packed = torch.cat([q[b, :, s:e].transpose(0, 1) for b, s, e in q_pieces])  # [total, heads, dim]\n"
         "k_packed = torch.cat([k[b, :, s:e].transpose(0, 1) for b, s, e in k_pieces])\n"
         "v_packed = torch.cat([v[b, :, s:e].transpose(0, 1) for b, s, e in k_pieces])\n";
}

inline constexpr const char kUnpack[] =
    "out = torch.zeros_like(q)\n"
    "for (b, s, e), piece in zip(q_pieces, out_packed.split([e - s for _, s, e in q_pieces])):\n"
    "    out[b, :, s:e] = piece.transpose(0, 1)";

}  // namespace python_text
}  // namespace masklens
