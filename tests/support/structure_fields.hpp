// Test support: every field of a structure as one line, so that two verdicts compare in
// full (describe() leaves out the parameters of other kinds and the counts).
#pragma once

#include <sstream>
#include <string>

#include <masklens/structure.hpp>

namespace masklens::testing {

inline std::string structure_fields(const MaskStructure& s) {
  std::ostringstream o;
  o << s.batch << ' ' << s.heads << ' ' << s.q_len << ' ' << s.k_len << ' ' << static_cast<int>(s.kind) << ' '
    << static_cast<int>(s.alignment) << " w" << s.window << " c" << s.chunk << " p" << s.prefix << " blocks";
  for (const KeyRange& r : s.blocks) o << ' ' << r.start << ',' << r.end;
  o << " kv";
  for (const KeyRange& r : s.kv_valid) o << ' ' << r.start << ',' << r.end;
  o << " q";
  for (const KeyRange& r : s.q_valid) o << ' ' << r.start << ',' << r.end;
  o << " seg";
  for (const auto& offsets : s.segments) {
    o << " [";
    for (std::int64_t x : offsets) o << x << ' ';
    o << ']';
  }
  o << " empty " << s.empty_rows << " finite " << s.finite_masked_rows << " bias " << s.bias;
  return o.str();
}

}  // namespace masklens::testing
