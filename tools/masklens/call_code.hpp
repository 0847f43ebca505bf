// The chosen call as Python a user can paste.
#pragma once

#include <string>

#include <masklens/masklens.hpp>

namespace masklens::cli {

inline std::string python_value(const ArgValue& v) {
  return std::visit(
      [](const auto& x) -> std::string {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, bool>) return x ? "True" : "False";
        else if constexpr (std::is_same_v<T, std::int64_t>) return std::to_string(x);
        else if constexpr (std::is_same_v<T, std::string>) return x;
        else {
          std::string out = "[";
          for (std::size_t i = 0; i < x.size() && i < 12; ++i) out += (i ? ", " : "") + std::to_string(x[i]);
          if (x.size() > 12) out += ", ...";
          return out + "]";
        }
      },
      v);
}


// Keyword arguments except masklens' own bookkeeping.
inline std::string kwargs(const Args& args, std::initializer_list<std::string_view> skip) {
  std::string out;
  for (const Arg& a : args) {
    if (a.name == "attn_mask" || std::find(skip.begin(), skip.end(), a.name) != skip.end()) continue;
    out += ", " + std::string(a.name) + "=" + python_value(a.value);
  }
  return out;
}

inline std::string python_call(Backend b, const Args& args) {
  const ArgValue* mask = find_arg(args, "attn_mask");
  const bool keep = mask && *mask == ArgValue(std::string("keep"));
  switch (b) {
    case Backend::sdpa_flash:
    case Backend::sdpa_efficient:
    case Backend::sdpa_cudnn:
    case Backend::sdpa_math: {
      const char* kernel = b == Backend::sdpa_flash ? "FLASH_ATTENTION"
                           : b == Backend::sdpa_efficient ? "EFFICIENT_ATTENTION"
                           : b == Backend::sdpa_cudnn ? "CUDNN_ATTENTION" : "MATH";
      return std::string("with sdpa_kernel(SDPBackend.") + kernel + "): out = F.scaled_dot_product_attention(q, k, v" +
             (keep ? ", attn_mask=mask" : "") + kwargs(args, {}) + ")";
    }
    case Backend::sdpa_causal_lower_right:
      return "out = F.scaled_dot_product_attention(q, k, v, attn_mask=" + python_value(*find_arg(args, "attn_mask_object")) + ")";
    case Backend::flex_attention:
      return std::string("mask_mod = ") + python_value(*find_arg(args, "mask_mod")) +
             "\nout = flex_attention(q, k, v, block_mask=" + python_value(*find_arg(args, "block_mask")) + ")";
    case Backend::flash_attn:
    case Backend::flash_attn3: return "out = flash_attn_func(q, k, v" + kwargs(args, {}) + ")";
    case Backend::flash_attn_varlen:
    case Backend::flash_attn3_varlen: return "out = flash_attn_varlen_func(q, k, v" + kwargs(args, {}) + ")";
    case Backend::xformers:
      return "out = xformers.ops.memory_efficient_attention(q, k, v, attn_bias=" +
             (keep ? std::string("mask") : python_value(*find_arg(args, "attn_bias"))) + kwargs(args, {"attn_bias"}) + ")";
    case Backend::transformer_engine: return "out = DotProductAttention(...)(q, k, v" + kwargs(args, {}) + ")";
    case Backend::flashinfer: return "out = flashinfer prefill wrapper.run(q, k, v)  # plan with" + kwargs(args, {});
    case Backend::cudnn_frontend: return "graph.sdpa(q, k, v" + kwargs(args, {}) + ")";
    case Backend::zeros: return "out.zero_()";
  }
  return "?";
}

}  // namespace masklens::cli
