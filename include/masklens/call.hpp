// AttentionCall and Environment: everything that decides which backend is correct and
// fastest besides the mask — the call (dtypes, head dims, lengths, GQA, training) and
// where it runs (the GPU's architecture, the library versions installed).
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>

#include "element.hpp"
#include "status.hpp"

// A test program's extra families and backends (tests/fake_backend/hook.hpp): a header
// of macros that kFamilies (families.hpp) and the backend registry expand. Never set by a
// real build.
#ifdef MASKLENS_EXTRA_BACKENDS
#include MASKLENS_EXTRA_BACKENDS
#endif

namespace masklens {

enum class DType : std::uint8_t { float16, bfloat16, float32 };

constexpr std::string_view to_string(DType d) noexcept {
  return d == DType::float16 ? "fp16" : d == DType::bfloat16 ? "bf16" : "fp32";
}

// major.minor.patch; a default Version is "unknown / not installed".
struct Version {
  int major = -1, minor = 0, patch = 0;

  [[nodiscard]] constexpr bool known() const noexcept { return major >= 0; }
  friend constexpr auto operator<=>(const Version&, const Version&) = default;

  [[nodiscard]] std::string to_string() const {
    return known() ? std::to_string(major) + "." + std::to_string(minor) + (patch ? "." + std::to_string(patch) : "")
                   : std::string("unknown");
  }
  // "2.11", "9.19.0", "2.14.0.dev20260612" (suffixes after the third number are ignored).
  static Result<Version> parse(std::string_view text) {
    Version v{0, 0, 0};
    int* parts[3] = {&v.major, &v.minor, &v.patch};
    std::size_t i = 0;
    for (int part = 0; part < 3; ++part) {
      if (i >= text.size() || text[i] < '0' || text[i] > '9') {
        if (part == 0) return error(ErrorCode::parse_error, "version '" + std::string(text) + "' does not start with a number");
        break;
      }
      int value = 0;
      for (; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i) {
        if (value > 100000) return error(ErrorCode::parse_error, "version '" + std::string(text) + "' has a huge part");
        value = value * 10 + (text[i] - '0');
      }
      *parts[part] = value;
      if (i < text.size() && text[i] == '.') ++i;
      else break;
    }
    return v;
  }
};

constexpr Version version(int major, int minor, int patch = 0) noexcept { return Version{major, minor, patch}; }

// Backend families a user may have installed: a bit each in Environment::available.
// Their names, versions and defaults are kFamilies' rows (families.hpp).
enum BackendFamily : std::uint32_t {
  kFamilyTorch = 1u << 0,
  kFamilyFlashAttn = 1u << 1,
  kFamilyFlashAttn3 = 1u << 2,
  kFamilyFlex = 1u << 3,
  kFamilyXformers = 1u << 4,
  kFamilyTransformerEngine = 1u << 5,
  kFamilyFlashInfer = 1u << 6,
  kFamilyCudnnFrontend = 1u << 7,
  kFamilyJax = 1u << 8,
};

// A double as a user writes it (1, 0.5, nan), not std::to_string's 1.000000.
inline std::string short_number(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", v);
  return text;
}

// The largest count or length a call takes: the bound of a structure's dims (2^62).
inline constexpr std::int64_t kMaxCallExtent = std::int64_t{1} << 62;

// The attention call at hand: what the model asks for. Where it runs (GPU, library
// versions) is the Environment; decide() takes both.
struct AttentionCall {
  DType dtype = DType::bfloat16;  // q/k/v
  std::int64_t head_dim = 128;    // q/k head dim
  std::int64_t head_dim_v = 0;    // 0 = head_dim
  std::int64_t batch = 1;
  std::int64_t heads = 16;
  std::int64_t kv_heads = 0;      // 0 = heads; fewer = GQA / MQA
  std::int64_t q_len = 0;         // 0 = the structure's
  std::int64_t k_len = 0;         // 0 = the structure's
  bool training = false;          // a backward pass follows
  double dropout = 0.0;
  bool deterministic = false;     // torch.use_deterministic_algorithms
  // The dense mask's element type, when one would be passed as attn_mask: torch's
  // kernels treat mask dtypes differently (docs/backends.md, "Mask dtypes").
  std::optional<ElementType> mask_dtype;

  [[nodiscard]] std::int64_t value_head_dim() const noexcept { return head_dim_v ? head_dim_v : head_dim; }
  [[nodiscard]] std::int64_t key_heads() const noexcept { return kv_heads ? kv_heads : heads; }
  [[nodiscard]] bool gqa() const noexcept { return key_heads() != heads; }

  // The element type of q/k/v, in the mask's vocabulary (what a float mask is cast to).
  [[nodiscard]] ElementType query_element() const noexcept {
    return dtype == DType::float16 ? ElementType::float16
           : dtype == DType::bfloat16 ? ElementType::bfloat16 : ElementType::float32;
  }

  // Every field inside its domain; the first violation, named. The one check of a call
  // for every entry point: the C++ API (decide()), the CLI (which names its options for
  // the fields) and the Python package. Counts and lengths stop at 2^62 as a structure's
  // do (kMaxCallExtent); the cost model takes its sums and products of them in double
  // (work_units), where two such counts would overflow 64 bits.
  [[nodiscard]] Status validate() const {
    const auto bad = [](std::string what) { return Status(ErrorCode::invalid_argument, std::move(what)); };
    const auto text = [](std::int64_t v) { return std::to_string(v); };
    const auto at_least_one = [&](const char* name, std::int64_t v, const char* zero_means) -> Status {
      if (v == 0 && zero_means) return {};
      if (v < 1 || v > kMaxCallExtent)
        return bad(std::string("call.") + name + " must be >= 1 and at most 2^62" +
                   (zero_means ? std::string(" (or 0 for ") + zero_means + ")" : std::string()) + ", got " + text(v));
      return {};
    };
    const std::tuple<const char*, std::int64_t, const char*> fields[] = {
        {"head_dim", head_dim, nullptr}, {"head_dim_v", head_dim_v, "head_dim"}, {"batch", batch, nullptr},
        {"heads", heads, nullptr},       {"kv_heads", kv_heads, "heads"},        {"q_len", q_len, "the structure's"},
        {"k_len", k_len, "the structure's"}};
    for (const auto& [name, v, zero_means] : fields)
      if (Status s = at_least_one(name, v, zero_means); !s.ok()) return s;
    if (heads % key_heads() != 0)
      return bad("call.heads (" + text(heads) + ") must be a multiple of call.kv_heads (" + text(key_heads()) + ")");
    if (!(dropout >= 0.0 && dropout < 1.0))  // written so that NaN fails too
      return bad("call.dropout must be in [0, 1), got " + short_number(dropout));
    if (mask_dtype && *mask_dtype > ElementType::float32)
      return bad("call.mask_dtype " + text(static_cast<int>(*mask_dtype)) + " is not a mask element type");
    return {};
  }
};

// Where the call runs: the GPU and what is installed. The defaults describe an H200
// with torch 2.11 (cuDNN 9.19) and nothing else.
struct Environment {
  static constexpr int kMinSm = 10, kMaxSm = 129;
  int sm = 90;  // compute capability, major * 10 + minor
  Version torch = version(2, 11);
  Version cudnn = version(9, 19);
  Version flash_attn{}, flash_attn3{}, xformers{}, transformer_engine{}, flashinfer{}, cudnn_frontend{};
  Version jax{};  // the JAX host (masklens.jax); cudnn is then the cuDNN jax sees
  std::uint32_t available = kFamilyTorch;

  [[nodiscard]] bool has(BackendFamily f) const noexcept { return (available & f) != 0; }

  // The one check of an environment (see AttentionCall::validate). Compute
  // capabilities run from 1.0 to 12.x: 10 is also what the Python package gives a CPU,
  // below every GPU kernel's minimum; a value past 129 is a typo, not a GPU the rules
  // could judge. Defined in families.hpp (included at the end), beside kFamilies, whose
  // bits it checks.
  [[nodiscard]] Status validate() const;
};

}  // namespace masklens

// The family table: read by Environment::validate() and with_every_family().
#include "families.hpp"
