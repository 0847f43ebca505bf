// describe: one human-readable line for a MaskStructure, e.g.
// "causal top_left, kv_valid [[0,7]], q_valid [[0,5]], segments [[0,3,10]], 2 empty rows";
// an arbitrary mask with its tile shares: "arbitrary, tiles 128x128 10.0% partial 20.0% full".
#pragma once

#include <string>

#include "structure.hpp"

namespace masklens {

inline std::string describe(const MaskStructure& s) {
  std::string out(to_string(s.kind));
  if (s.kind != StructureKind::full && s.kind != StructureKind::arbitrary) {
    out += ' ';
    out += to_string(s.alignment);
  }
  // Appends in place (operator+ chains on temporaries trip GCC 12's -Wrestrict at -O3).
  const auto range = [](const KeyRange& r) {
    std::string text(1, '[');
    text.append(std::to_string(r.start)).append(1, ',').append(std::to_string(r.end)).append(1, ']');
    return text;
  };
  switch (s.kind) {
    case StructureKind::sliding_window: out += " window " + std::to_string(s.window); break;
    case StructureKind::chunked: out += " chunk " + std::to_string(s.chunk); break;
    case StructureKind::prefix_lm: out += " prefix " + std::to_string(s.prefix); break;
    case StructureKind::causal_blocks:
      out += " blocks [";
      for (std::size_t i = 0; i < s.blocks.size(); ++i) out.append(i ? "," : "").append(range(s.blocks[i]));
      out += "]";
      break;
    default: break;
  }
  if (s.has_kv_valid()) {
    out += ", kv_valid [";
    for (std::size_t i = 0; i < s.kv_valid.size(); ++i) out.append(i ? "," : "").append(range(s.kv_valid[i]));
    out += "]";
  }
  if (s.has_q_valid()) {
    out += ", q_valid [";
    for (std::size_t i = 0; i < s.q_valid.size(); ++i) out.append(i ? "," : "").append(range(s.q_valid[i]));
    out += "]";
  }
  if (s.has_segments()) {
    out += ", segments [";
    for (std::size_t b = 0; b < s.segments.size(); ++b) {
      out += b ? ",[" : "[";
      for (std::size_t i = 0; i < s.segments[b].size(); ++i) out.append(i ? "," : "").append(std::to_string(s.segments[b][i]));
      out += "]";
    }
    out += "]";
  }
  if (s.empty_rows) out += ", " + std::to_string(s.empty_rows) + " empty rows";
  if (s.finite_masked_rows) out += " (" + std::to_string(s.finite_masked_rows) + " masked by finite values)";
  if (s.bias) out += ", bias";
  if (s.tile_fractions) {
    // Shares as whole tenths of a percent, without <cstdio> or locale-dependent formatting.
    const auto percent = [](double share) {
      const auto tenths = static_cast<long long>(share * 1000 + 0.5);
      return std::to_string(tenths / 10) + "." + std::to_string(tenths % 10) + "%";
    };
    out += ", tiles " + std::to_string(s.tile_fractions->block_q) + "x" + std::to_string(s.tile_fractions->block_k) +
           " " + percent(s.tile_fractions->partial) + " partial " + percent(s.tile_fractions->full) + " full";
  }
  return out;
}

}  // namespace masklens
