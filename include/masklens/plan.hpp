// Plans: an exact structure as several calls that each need no mask. The rows of a
// batch are cut into runs that one unmasked call computes: rows that attend to
// nothing (zeros), rows that attend to the same keys (a full call on a key range),
// and rows whose last key advances with the row (a bottom-right causal call, which
// is plain is_causal when the slice is square).
//
// The runs come from the structure's parameters, not from its rows one by one: a
// row's first and last key are maxima and minima of affine functions of its key
// position p (slope 0 or 1), which change form only where p meets a parameter (a
// window, prefix, block or document bound, a chunk multiple, a kv_valid bound, the
// key length). Between two such breaks, three rows (the first two and the last) fix
// every row of the piece; a piece whose last row disagrees is walked row by row.
#pragma once

#include <algorithm>
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

namespace detail {

// Query rows of one batch where a row's formula may change: a superset (each
// parameter x adds x - 1, x and x + 1, so no off-by-one can hide a break), in key
// positions, with chunk multiples generated on demand.
class RowBreaks {
 public:
  RowBreaks(const MaskStructure& s, std::int64_t b) : offset_(s.key_position(0)), chunk_(0) {
    const std::int64_t K = s.k_len, W = s.window;
    // At most: 3 edges, 2 kind parameters or 2 per block, 5 kv_valid bounds, 2 q_valid
    // bounds, 2 per document offset; 3 points each.
    const std::size_t offsets = s.has_segments() ? s.segments_of(b).size() : 0;
    points_.reserve(3 * (3 + std::max<std::size_t>(2, 2 * s.blocks.size()) + 5 + 2 + 2 * offsets));
    // Parameters are at most 2^62 (MaskStructure::validate), so sums of two stay in range;
    // points are clamped so that x + 1 cannot overflow either (no row lies that far).
    constexpr std::int64_t kFar = INT64_MAX / 4;
    auto add = [&](std::int64_t x) {
      x = std::clamp<std::int64_t>(x, -kFar, kFar);
      points_.insert(points_.end(), {x - 1, x, x + 1});
    };
    add(0);
    add(K - 1);
    add(K);
    switch (s.kind) {
      case StructureKind::sliding_window: add(W - 1), add(K - 1 + W); break;
      case StructureKind::chunked: chunk_ = s.chunk; break;
      case StructureKind::prefix_lm: add(s.prefix - 1), add(s.prefix); break;
      case StructureKind::causal_blocks:
        for (const KeyRange& r : s.blocks) add(r.start), add(r.end);
        break;
      default: break;
    }
    const bool window = s.kind == StructureKind::sliding_window;
    if (s.has_kv_valid()) {
      const KeyRange& kv = s.kv_valid_of(b);
      add(kv.start), add(kv.end - 1), add(kv.end);
      if (window) add(kv.start + W - 1), add(kv.end + W - 1);
    }
    if (s.has_q_valid()) {
      const KeyRange& rows = s.q_valid_of(b);
      add(rows.start + offset_), add(rows.end + offset_);  // rows outside attend nothing: zeros
    }
    if (s.has_segments())
      for (std::int64_t o : s.segments_of(b)) {
        add(o);
        if (window) add(o + W - 1);
      }
    std::sort(points_.begin(), points_.end());
  }

  // The first break after row q (may lie past the last row).
  [[nodiscard]] std::int64_t next(std::int64_t q) const noexcept {
    const std::int64_t p = q + offset_;
    auto it = std::upper_bound(points_.begin(), points_.end(), p);
    std::int64_t next_p = it == points_.end() ? INT64_MAX : *it;
    if (chunk_ > 0)
      for (std::int64_t t : {-1, 0, 1}) {
        // The smallest k * chunk + t above p (floor division: p may be negative).
        const std::int64_t v = p - t, k = (v >= 0 ? v / chunk_ : -((-v + chunk_ - 1) / chunk_)) + 1;
        // k * chunk_ past INT64_MAX means no further multiple exists in range.
        if (k > 0 && k > (INT64_MAX - 1) / chunk_) continue;
        next_p = std::min(next_p, k * chunk_ + t);
      }
    return next_p == INT64_MAX ? INT64_MAX : next_p - offset_;
  }

 private:
  std::int64_t offset_;  // key position of row 0
  std::int64_t chunk_;
  std::vector<std::int64_t> points_;
};

// Builds runs from rows fed in order into `runs` (empty at the start); refuses past
// `max_runs`. The open run is runs.back(): its k_range holds its first key and its
// latest row's last key + 1.
class RunBuilder {
 public:
  RunBuilder(std::vector<RowRun>& runs, std::int64_t max_runs) : runs_(runs), max_runs_(max_runs) {}

  // Row q of batch b attends `r`. False once more than max_runs runs would be needed.
  bool push(std::int64_t b, std::int64_t q, const RowSpan& r) {
    if (!runs_.empty() && extends(b, q, r)) {
      RowRun& run = runs_.back();
      if (!decided_) run.kind = r.last == run.k_range.end - 1 ? RunKind::full : RunKind::causal;
      decided_ = true;
      run.q_range.end = q + 1;
      if (!r.empty()) run.k_range.end = r.last + 1;
      return true;
    }
    if (static_cast<std::int64_t>(runs_.size()) >= max_runs_) return false;
    RowRun run{b, r.empty() ? RunKind::zeros : RunKind::full, {q, q + 1}, {0, 0}};
    if (!r.empty()) run.k_range = {r.first, r.last + 1};
    runs_.push_back(run);
    decided_ = r.empty();
    return true;
  }

  // Whether the open run holds rows q and q + 1 of batch b and knows its kind, so rows
  // that repeat the step between them extend it.
  [[nodiscard]] bool holds_pair(std::int64_t b, std::int64_t q) const {
    if (runs_.empty() || !decided_) return false;
    const RowRun& run = runs_.back();
    return run.batch == b && run.q_range.start <= q && run.q_range.end == q + 2;
  }

  // n more rows, each one step past the last (holds_pair was true).
  void repeat_step(std::int64_t n) {
    RowRun& run = runs_.back();
    run.q_range.end += n;
    if (run.kind == RunKind::causal) run.k_range.end += n;
  }

 private:
  bool extends(std::int64_t b, std::int64_t q, const RowSpan& r) const {
    const RowRun& run = runs_.back();
    if (run.batch != b || run.q_range.end != q) return false;
    if (run.kind == RunKind::zeros) return r.empty();
    if (r.empty() || r.first != run.k_range.start) return false;
    const std::int64_t last = run.k_range.end - 1;
    if (!decided_) return r.last == last || r.last == last + 1;
    return r.last == last + (run.kind == RunKind::causal ? 1 : 0);
  }

  std::vector<RowRun>& runs_;
  std::int64_t max_runs_;
  bool decided_ = false;  // the open run is zeros, or a second row fixed full vs causal
};

}  // namespace detail

// Runs covering every row of every batch, or nothing when more than `max_runs` would be
// needed. Identical batches are not merged: a plan step names its batch.
inline std::optional<std::vector<RowRun>> decompose_rows(const MaskStructure& s, std::int64_t max_runs) {
  if (s.kind == StructureKind::arbitrary) return std::nullopt;
  std::vector<RowRun> runs;
  runs.reserve(static_cast<std::size_t>(std::clamp<std::int64_t>(max_runs, 0, 4 * s.batch)));
  detail::RunBuilder builder(runs, max_runs);
  for (std::int64_t b = 0; b < s.batch; ++b) {
    const detail::RowBreaks breaks(s, b);
    std::int64_t q = 0;
    while (q < s.q_len) {
      const std::int64_t end = std::min(breaks.next(q), s.q_len);  // the piece [q, end)
      const RowSpan r0 = s.row(b, q);
      if (!builder.push(b, q, r0)) return std::nullopt;
      if (end - q >= 2) {
        const RowSpan r1 = s.row(b, q + 1), rn = s.row(b, end - 1);
        if (!builder.push(b, q + 1, r1)) return std::nullopt;
        // The step r0 -> r1, repeated to the piece's last row, must land on rn.
        const std::int64_t n = end - 1 - (q + 1);
        const bool affine = r0.empty() == r1.empty() && rn.empty() == r1.empty() &&
                            (r1.empty() || (rn.first == r1.first + n * (r1.first - r0.first) &&
                                            rn.last == r1.last + n * (r1.last - r0.last)));
        if (affine && builder.holds_pair(b, q)) {
          builder.repeat_step(n);
        } else {
          for (std::int64_t r = q + 2; r < end; ++r)
            if (!builder.push(b, r, s.row(b, r))) return std::nullopt;
        }
      }
      q = end;
    }
  }
  return runs;
}

}  // namespace masklens
