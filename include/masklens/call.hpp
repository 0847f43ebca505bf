// AttentionCall and Environment: everything that decides which backend is correct and
// fastest besides the mask — the call (dtypes, head dims, lengths, GQA, training) and
// where it runs (the GPU's architecture, the library versions installed).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "element.hpp"
#include "status.hpp"

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

// Backend families a user may have installed (the CLI's --available list).
enum BackendFamily : std::uint32_t {
  kFamilyTorch = 1u << 0,
  kFamilyFlashAttn = 1u << 1,
  kFamilyFlashAttn3 = 1u << 2,
  kFamilyFlex = 1u << 3,
  kFamilyXformers = 1u << 4,
  kFamilyTransformerEngine = 1u << 5,
  kFamilyFlashInfer = 1u << 6,
  kFamilyCudnnFrontend = 1u << 7,
};
inline constexpr std::uint32_t kEveryFamily = 0xffu;

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

  // Every field inside its domain; the first violation, named.
  [[nodiscard]] Status validate() const {
    const auto bad = [](std::string what) { return Status(ErrorCode::invalid_argument, std::move(what)); };
    if (head_dim < 1) return bad("call.head_dim must be >= 1, got " + std::to_string(head_dim));
    if (head_dim_v < 0) return bad("call.head_dim_v must be >= 1 (or 0 for head_dim), got " + std::to_string(head_dim_v));
    if (batch < 1) return bad("call.batch must be >= 1, got " + std::to_string(batch));
    if (heads < 1) return bad("call.heads must be >= 1, got " + std::to_string(heads));
    if (kv_heads < 0) return bad("call.kv_heads must be >= 1 (or 0 for heads), got " + std::to_string(kv_heads));
    if (heads % key_heads() != 0)
      return bad("call.heads (" + std::to_string(heads) + ") must be a multiple of call.kv_heads (" +
                 std::to_string(key_heads()) + ")");
    if (q_len < 0 || k_len < 0) return bad("call.q_len and call.k_len must be >= 0 (0 = the structure's)");
    if (!(dropout >= 0.0 && dropout < 1.0)) return bad("call.dropout must be in [0, 1)");
    return {};
  }
};

// Where the call runs: the GPU and what is installed. The defaults describe an H200
// with torch 2.11 (cuDNN 9.19) and nothing else.
struct Environment {
  int sm = 90;  // compute capability, major * 10 + minor
  Version torch = version(2, 11);
  Version cudnn = version(9, 19);
  Version flash_attn{}, flash_attn3{}, xformers{}, transformer_engine{}, flashinfer{}, cudnn_frontend{};
  std::uint32_t available = kFamilyTorch;

  [[nodiscard]] bool has(BackendFamily f) const noexcept { return (available & f) != 0; }

  [[nodiscard]] Status validate() const {
    if (sm < 10 || sm > 1000)
      return Status(ErrorCode::invalid_argument,
                    "environment.sm must be a compute capability major*10+minor (e.g. 80, 90), got " + std::to_string(sm));
    if ((available & ~kEveryFamily) != 0)
      return Status(ErrorCode::invalid_argument, "environment.available has unknown family bits");
    return {};
  }
};

// `e` with every backend family installed, at the versions docs/backends.md names (the
// CLI's defaults): what the support matrix and the tests ask "can it" of.
inline Environment with_every_family(Environment e = {}) {
  e.available = kEveryFamily;
  e.flash_attn = version(2, 8, 3);
  e.flash_attn3 = version(3, 0);
  e.xformers = version(0, 0, 33);
  e.transformer_engine = version(2, 8);
  e.flashinfer = version(0, 5);
  e.cudnn_frontend = version(1, 16);
  return e;
}

}  // namespace masklens
