// flash-attn 2 (flash_attn_func / flash_attn_varlen_func) and flash-attn 3
// (flash_attn_interface, Hopper). Causal is bottom-right aligned (flash-attn >= 2.1);
// window_size=(left, right) allows keys in [i + K - Q - left, i + K - Q + right].
#pragma once

#include <optional>

#include "backend.hpp"

namespace masklens::backends::flash_attn {

inline constexpr std::string_view kReadme = "github.com/Dao-AILab/flash-attention README";

inline constexpr std::string_view kHopperReadme = "flash-attention hopper/README";

inline constexpr Rule kFa2Rules[] = {
    installed<&AttentionCall::flash_attn>("fa2.installed", "flash_attn version not given"),
    {"fa2.dtype", kReadme, is_fp32,
     "flash-attn needs fp16 or bf16"},
    {"fa2.head_dim", kReadme, [](const AttentionCall& c) { return c.head_dim > 256 || c.value_head_dim() != c.head_dim; },
     "flash-attn needs equal head dims <= 256", got_head_dim},
    {"fa2.sm", kReadme, before_sm80, "flash-attn 2 needs sm80 or newer",
     got_sm},
};

inline constexpr Rule kFa3Rules[] = {
    installed<&AttentionCall::flash_attn3>("fa3.installed", "flash_attn3 version not given"),
    {"fa3.dtype", kHopperReadme, is_fp32,
     "flash-attn 3 needs fp16 or bf16 (or fp8)"},
    {"fa3.head_dim", kHopperReadme, [](const AttentionCall& c) { return c.head_dim > 256 || c.value_head_dim() > 256; },
     "flash-attn 3 needs head dims <= 256", got_head_dim},
    {"fa3.sm90", kHopperReadme, [](const AttentionCall& c) { return c.sm < 90 || c.sm >= 100; },
     "flash-attn 3 runs on Hopper (sm90)", got_sm},
};

inline std::span<const Rule> rules(Backend b) noexcept {
  return b == Backend::flash_attn || b == Backend::flash_attn_varlen ? std::span<const Rule>(kFa2Rules) : kFa3Rules;
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

inline bool native_args(Backend b, const MaskStructure& s, Args* out = nullptr) {
  const bool fa3 = b == Backend::flash_attn3 || b == Backend::flash_attn3_varlen;
  const bool varlen = b == Backend::flash_attn_varlen || b == Backend::flash_attn3_varlen;
  if (s.has_kv_valid()) {
    // Padded keys of a full (cross-)attention: gather each batch's valid keys.
    if (!varlen || s.kind != StructureKind::full || s.has_segments()) return false;
    return emit(out, [&] {
      std::vector<std::int64_t> cu_q, cu_k, starts;
      cu_q.reserve(static_cast<std::size_t>(s.batch) + 1);
      cu_k.reserve(static_cast<std::size_t>(s.batch) + 1);
      starts.reserve(static_cast<std::size_t>(s.batch));
      cu_q.push_back(0);
      cu_k.push_back(0);
      for (std::int64_t i = 0; i < s.batch; ++i) {
        const KeyRange& kv = s.kv_valid[static_cast<std::size_t>(i)];
        cu_q.push_back(cu_q.back() + s.q_len);
        cu_k.push_back(cu_k.back() + (kv.end - kv.start));
        starts.push_back(kv.start);
      }
      const std::int64_t longest_k = max_seqlen(cu_k);
      return make_args("attn_mask", "drop",
                       "causal", false,
                       "cu_seqlens_q", std::move(cu_q),
                       "cu_seqlens_k", std::move(cu_k),
                       "max_seqlen_q", s.q_len,
                       "max_seqlen_k", longest_k,
                       "k_gather_starts", std::move(starts));
    });
  }
  if (s.has_segments() || (s.kind == StructureKind::chunked && varlen)) {
    // Chunks are documents of C; windows and causal apply within each document.
    if (!varlen || !square(s)) return false;
    const StructureKind within = s.kind == StructureKind::chunked ? StructureKind::causal : s.kind;
    if (within != StructureKind::full && within != StructureKind::causal && within != StructureKind::sliding_window)
      return false;
    return emit(out, [&] {
      std::optional<MaskStructure> chunks;  // chunked: documents cut at every chunk
      const MaskStructure& docs = s.kind == StructureKind::chunked ? chunks.emplace(as_documents(s)) : s;
      std::vector<std::int64_t> cu = cu_seqlens(docs);
      const std::int64_t longest = max_seqlen(cu);
      Args a = make_args("attn_mask", "drop",
                         "causal", within != StructureKind::full,
                         "cu_seqlens_q", cu,
                         "cu_seqlens_k", std::move(cu),
                         "max_seqlen_q", longest,
                         "max_seqlen_k", longest);
      if (within == StructureKind::sliding_window)
        add(a, "window_size", std::vector<std::int64_t>{window_left(docs), 0});
      return a;
    });
  }
  if (varlen) return false;
  switch (s.kind) {
    case StructureKind::full: return emit(out, [] { return Args{{"attn_mask", "drop"}, {"causal", false}}; });
    case StructureKind::causal:
      if (!bottom_right(s)) return false;
      return emit(out, [] { return Args{{"attn_mask", "drop"}, {"causal", true}}; });
    case StructureKind::sliding_window:
      if (!bottom_right(s)) return false;
      return emit(out, [&] {
        return make_args("attn_mask", "drop",
                         "causal", true,
                         "window_size", std::vector<std::int64_t>{window_left(s), 0});
      });
    case StructureKind::chunked:
      if (!fa3 || !bottom_right(s)) return false;
      return emit(out, [&] { return Args{{"attn_mask", "drop"}, {"causal", true}, {"attention_chunk", s.chunk}}; });
    default: return false;
  }
}

}  // namespace masklens::backends::flash_attn
