// flash-attn 2 (flash_attn_func / flash_attn_varlen_func) and flash-attn 3
// (flash_attn_interface, Hopper). Causal is bottom-right aligned (flash-attn >= 2.1);
// window_size=(left, right) allows keys in [i + K - Q - left, i + K - Q + right].
#pragma once

#include <optional>

#include "backend.hpp"

namespace masklens::backends::flash_attn {

inline constexpr std::string_view kReadme = "github.com/Dao-AILab/flash-attention README";

inline constexpr Rule kFa2Rules[] = {
    {"fa2.installed", "AttentionCall::flash_attn", [](const AttentionCall& c) { return !c.flash_attn.known(); },
     [](const AttentionCall&) { return std::string("flash_attn version not given"); }},
    {"fa2.dtype", kReadme, [](const AttentionCall& c) { return c.dtype == DType::float32; },
     [](const AttentionCall&) { return std::string("flash-attn needs fp16 or bf16"); }},
    {"fa2.head_dim", kReadme, [](const AttentionCall& c) { return c.head_dim > 256 || c.value_head_dim() != c.head_dim; },
     [](const AttentionCall& c) { return "flash-attn needs equal head dims <= 256, got " + num(c.head_dim); }},
    {"fa2.sm", kReadme, [](const AttentionCall& c) { return c.sm < 80; },
     [](const AttentionCall& c) { return "flash-attn 2 needs sm80 or newer, got sm" + num(c.sm); }},
};

inline constexpr Rule kFa3Rules[] = {
    {"fa3.installed", "AttentionCall::flash_attn3", [](const AttentionCall& c) { return !c.flash_attn3.known(); },
     [](const AttentionCall&) { return std::string("flash_attn3 version not given"); }},
    {"fa3.dtype", "flash-attention hopper/README", [](const AttentionCall& c) { return c.dtype == DType::float32; },
     [](const AttentionCall&) { return std::string("flash-attn 3 needs fp16 or bf16 (or fp8)"); }},
    {"fa3.head_dim", "flash-attention hopper/README",
     [](const AttentionCall& c) { return c.head_dim > 256 || c.value_head_dim() > 256; },
     [](const AttentionCall& c) { return "flash-attn 3 needs head dims <= 256, got " + num(c.head_dim); }},
    {"fa3.sm90", "flash-attention hopper/README", [](const AttentionCall& c) { return c.sm < 90 || c.sm >= 100; },
     [](const AttentionCall& c) { return "flash-attn 3 runs on Hopper (sm90), got sm" + num(c.sm); }},
};

inline std::vector<Refusal> refusals(Backend b, const AttentionCall& c) {
  if (b == Backend::flash_attn || b == Backend::flash_attn_varlen) return check_rules(kFa2Rules, c);
  return check_rules(kFa3Rules, c);
}

// Bottom-right and top-left agree when Q == K.
inline bool bottom_right(const MaskStructure& s) { return square(s) || s.alignment == Alignment::bottom_right; }

// Document boundaries cut further at multiples of the chunk (chunked = documents of C).
inline MaskStructure as_documents(const MaskStructure& s) {
  MaskStructure d = s;
  d.kind = StructureKind::causal;
  d.segments.assign(static_cast<std::size_t>(s.batch), {});
  for (std::int64_t b = 0; b < s.batch; ++b) {
    std::vector<std::int64_t> cuts = s.has_segments() ? s.segments[static_cast<std::size_t>(b)]
                                                      : std::vector<std::int64_t>{0, s.q_len};
    for (std::int64_t m = s.chunk; m < s.q_len; m += s.chunk) cuts.push_back(m);
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    d.segments[static_cast<std::size_t>(b)] = std::move(cuts);
  }
  return d;
}

inline std::optional<Args> native_args(Backend b, const MaskStructure& s, const AttentionCall&) {
  const bool fa3 = b == Backend::flash_attn3 || b == Backend::flash_attn3_varlen;
  const bool varlen = b == Backend::flash_attn_varlen || b == Backend::flash_attn3_varlen;
  if (s.has_kv_valid()) {
    // Padded keys of a full (cross-)attention: gather each batch's valid keys.
    if (!varlen || s.kind != StructureKind::full || s.has_segments()) return std::nullopt;
    std::vector<std::int64_t> cu_q{0}, cu_k{0}, starts;
    for (std::int64_t i = 0; i < s.batch; ++i) {
      const KeyRange& kv = s.kv_valid[static_cast<std::size_t>(i)];
      cu_q.push_back(cu_q.back() + s.q_len);
      cu_k.push_back(cu_k.back() + (kv.end - kv.start));
      starts.push_back(kv.start);
    }
    return Args{{"attn_mask", std::string("drop")}, {"causal", false}, {"cu_seqlens_q", cu_q}, {"cu_seqlens_k", cu_k},
                {"max_seqlen_q", s.q_len}, {"max_seqlen_k", max_seqlen(cu_k)}, {"k_gather_starts", starts}};
  }
  if (s.has_segments() || (s.kind == StructureKind::chunked && varlen)) {
    if (!varlen || !square(s)) return std::nullopt;
    const MaskStructure docs = s.kind == StructureKind::chunked ? as_documents(s) : s;
    if (docs.kind != StructureKind::full && docs.kind != StructureKind::causal &&
        docs.kind != StructureKind::sliding_window)
      return std::nullopt;
    const std::vector<std::int64_t> cu = cu_seqlens(docs);
    Args a{{"attn_mask", std::string("drop")}, {"causal", docs.kind != StructureKind::full}, {"cu_seqlens_q", cu},
           {"cu_seqlens_k", cu}, {"max_seqlen_q", max_seqlen(cu)}, {"max_seqlen_k", max_seqlen(cu)}};
    if (docs.kind == StructureKind::sliding_window)
      a.push_back({"window_size", std::vector<std::int64_t>{window_left(docs), 0}});
    return a;
  }
  if (varlen) return std::nullopt;
  switch (s.kind) {
    case StructureKind::full: return Args{{"attn_mask", std::string("drop")}, {"causal", false}};
    case StructureKind::causal:
      if (!bottom_right(s)) return std::nullopt;
      return Args{{"attn_mask", std::string("drop")}, {"causal", true}};
    case StructureKind::sliding_window:
      if (!bottom_right(s)) return std::nullopt;
      return Args{{"attn_mask", std::string("drop")}, {"causal", true},
                  {"window_size", std::vector<std::int64_t>{window_left(s), 0}}};
    case StructureKind::chunked:
      if (!fa3 || !bottom_right(s)) return std::nullopt;
      return Args{{"attn_mask", std::string("drop")}, {"causal", true}, {"attention_chunk", s.chunk}};
    default: return std::nullopt;
  }
}

}  // namespace masklens::backends::flash_attn
