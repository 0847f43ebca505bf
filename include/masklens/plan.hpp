// Plans: an exact structure as several calls that each need no mask. The rows of a
// batch are cut into runs that one unmasked call computes: rows that attend to
// nothing (zeros), rows that attend to the same keys (a full call on a key range),
// and rows whose last key advances with the row (a bottom-right causal call, which
// is plain is_causal when the slice is square).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "structure.hpp"

namespace masklens {

enum class RunKind : std::uint8_t { zeros, full, causal };

struct RowRun {
  std::int64_t batch = 0;
  RunKind kind = RunKind::full;
  KeyRange q_range;  // query rows [start, end)
  KeyRange k_range;  // key slice [start, end) the call reads
};

// Runs covering every row of every batch, or nothing when more than `max_runs` would be
// needed. Identical batches are not merged: a plan step names its batch.
inline std::optional<std::vector<RowRun>> decompose_rows(const MaskStructure& s, std::int64_t max_runs) {
  std::vector<RowRun> runs;
  if (s.kind == StructureKind::arbitrary) return std::nullopt;
  for (std::int64_t b = 0; b < s.batch; ++b) {
    std::int64_t q = 0;
    while (q < s.q_len) {
      if (static_cast<std::int64_t>(runs.size()) >= max_runs) return std::nullopt;
      const RowSpan first = s.row(b, q);
      RowRun run{b, RunKind::zeros, {q, q + 1}, {0, 0}};
      std::int64_t end = q + 1;
      if (first.empty()) {
        while (end < s.q_len && s.row(b, end).empty()) ++end;
      } else {
        run.kind = RunKind::full;
        run.k_range = {first.first, first.last + 1};
        if (end < s.q_len) {
          const RowSpan next = s.row(b, end);
          if (!next.empty() && next.first == first.first && next.last == first.last + 1) run.kind = RunKind::causal;
        }
        std::int64_t last = first.last;
        while (end < s.q_len) {
          const RowSpan next = s.row(b, end);
          const std::int64_t want_last = run.kind == RunKind::causal ? last + 1 : last;
          if (next.empty() || next.first != first.first || next.last != want_last) break;
          last = want_last;
          ++end;
        }
        run.k_range.end = last + 1;
      }
      run.q_range.end = end;
      runs.push_back(run);
      q = end;
    }
  }
  return runs;
}

}  // namespace masklens
