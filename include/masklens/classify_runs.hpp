// classify(SpanRuns): the verdict classify(SpanTable) gives for the expanded table,
// field for field and error for error, in O(runs) instead of O(rows) for the masks
// frameworks pass (full, causal at either alignment, sliding windows, packed documents,
// padded keys or queries, prefix-LM; chunks and blocks too, in O(runs + chunks or blocks)).
//
// It is the same search as classify.hpp, step for step — the same fast path, evidence,
// candidates, fits, tie-breaks — with every row-by-row loop done piece by piece:
//   * rows are read as key segments (KeySeg: a stretch of rows whose first and last key
//     are affine in the row, or which attend nothing), in the one canonical form the
//     greedy rule of span_runs.hpp gives when flags are set aside. Two row sequences are
//     equal iff their canonical segments are, so comparing rows is comparing segments.
//   * a candidate structure's rows are produced as segments too (structure_pieces):
//     between the rows where a rule changes form (a document, a block, the prefix, a
//     chunk, q_valid) every bound is a maximum or minimum of terms of slope 0 or 1, so a
//     piece splits at most where the maximum, the minimum and emptiness switch.
//   * evidence and document bounds come from each segment in closed form (a condition
//     affine in the row holds on one interval of it); runs of consecutive bounds (one-row
//     documents) are kept as intervals (DocSet), never listed one by one.
// Whatever would not stay small — a table with about as many runs as rows, or a search
// that spends more than its work budget (tiny chunks, thousands of candidates, bound
// sets that must be written out) — is expanded and handed to classify(SpanTable): the
// same answer, at the old cost. So is every table that classify(SpanTable) refuses
// (malformed rows, NaN flags), so its message names the row exactly as it would.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

#include "classify.hpp"
#include "row_span.hpp"
#include "span_runs.hpp"
#include "span_table.hpp"
#include "status.hpp"
#include "structure.hpp"

namespace masklens {

// How classify(SpanRuns) went: for tests and benchmarks.
struct RunsClassifyStats {
  bool expanded = false;   // the runs were expanded and classify(SpanTable) decided
  std::int64_t work = 0;   // pieces, segments and candidate steps the run search spent
};

namespace detail::runs {

// ---------------------------------------------------------------------------------
// Key segments

// Rows [q, q + n) of one slice: every row empty, or row r attends
// [first + d_first (r - q), last + d_last (r - q)]. Canonical (the greedy rule): empty
// segments hold zeros, a one-row segment steps 0.
struct KeySeg {
  std::int64_t q = 0, n = 0;
  bool empty = true;
  std::int64_t first = 0, d_first = 0, last = 0, d_last = 0;

  [[nodiscard]] std::int64_t end() const noexcept { return q + n; }
  [[nodiscard]] std::int64_t first_at(std::int64_t r) const noexcept { return first + d_first * (r - q); }
  [[nodiscard]] std::int64_t last_at(std::int64_t r) const noexcept { return last + d_last * (r - q); }
  friend bool operator==(const KeySeg&, const KeySeg&) = default;
};
using KeyRows = std::vector<KeySeg>;

// The work a run search may spend before it hands the table to classify(SpanTable).
struct Work {
  std::int64_t used = 0, limit = 0;
  bool spend(std::int64_t n) noexcept {
    used += n;
    return used <= limit;
  }
  [[nodiscard]] bool exhausted() const noexcept { return used > limit; }
};

// Builds canonical segments from segments pushed in row order, each affine, in any
// cutting: a pushed segment's first row joins the current run when it is the next term
// (or the run has one row), the rest of it when its step is the run's. `sink(seg)`
// receives each closed segment and returns false to stop (a comparison that failed).
template <class Sink>
class KeyRowsBuilder {
 public:
  explicit KeyRowsBuilder(Sink& sink) : sink_(sink) {}

  // Precondition: seg.n >= 1 and seg.q == the end of what was pushed before.
  bool push(KeySeg seg) {
    if (stopped_) return false;
    if (seg.empty) seg.first = seg.d_first = seg.last = seg.d_last = 0;
    if (seg.n == 1) seg.d_first = seg.d_last = 0;
    if (!has_) {
      cur_ = seg;
      has_ = true;
      return true;
    }
    if (cur_.empty != seg.empty) return close_and_start(seg);
    if (seg.empty) {
      cur_.n += seg.n;
      return true;
    }
    if (cur_.n == 1) {
      cur_.d_first = seg.first - cur_.first;
      cur_.d_last = seg.last - cur_.last;
    } else if (seg.first != cur_.first_at(cur_.end()) || seg.last != cur_.last_at(cur_.end())) {
      return close_and_start(seg);
    }
    ++cur_.n;
    if (seg.n == 1) return true;
    if (seg.d_first == cur_.d_first && seg.d_last == cur_.d_last) {
      cur_.n += seg.n - 1;
      return true;
    }
    KeySeg rest = seg;
    rest.q = seg.q + 1;
    rest.n = seg.n - 1;
    rest.first = seg.first + seg.d_first;
    rest.last = seg.last + seg.d_last;
    if (rest.n == 1) rest.d_first = rest.d_last = 0;
    return close_and_start(rest);
  }
  // Closes the last segment; false if the sink stopped.
  bool finish() {
    if (stopped_) return false;
    if (has_ && !sink_(cur_)) stopped_ = true;
    has_ = false;
    return !stopped_;
  }

 private:
  bool close_and_start(const KeySeg& seg) {
    if (!sink_(cur_)) {
      stopped_ = true;
      return false;
    }
    cur_ = seg;
    return true;
  }
  Sink& sink_;
  KeySeg cur_;
  bool has_ = false, stopped_ = false;
};

// ---------------------------------------------------------------------------------
// Document bounds as runs of consecutive values

// Sorted document bounds held as maximal runs of consecutive values [start, end): a run
// of consecutive bounds is a run of one-row documents.
struct DocSet {
  std::vector<KeyRange> spans;  // sorted, disjoint, not touching

  [[nodiscard]] std::int64_t count() const noexcept {
    std::int64_t n = 0;
    for (const KeyRange& r : spans) n += r.end - r.start;
    return n;
  }
  // From value ranges in any order, overlapping or not.
  static DocSet from(std::vector<KeyRange> ranges) {
    std::sort(ranges.begin(), ranges.end(), [](const KeyRange& a, const KeyRange& b) { return a.start < b.start; });
    DocSet d;
    for (const KeyRange& r : ranges) {
      if (r.start >= r.end) continue;
      if (!d.spans.empty() && r.start <= d.spans.back().end) d.spans.back().end = std::max(d.spans.back().end, r.end);
      else d.spans.push_back(r);
    }
    return d;
  }
  [[nodiscard]] bool contains(std::int64_t v) const noexcept {
    auto it = std::upper_bound(spans.begin(), spans.end(), v, [](std::int64_t x, const KeyRange& r) { return x < r.start; });
    return it != spans.begin() && v < std::prev(it)->end;
  }
  // Precondition: contains(v).
  void erase(std::int64_t v) {
    auto it = std::prev(std::upper_bound(spans.begin(), spans.end(), v,
                                         [](std::int64_t x, const KeyRange& r) { return x < r.start; }));
    const KeyRange r = *it;
    if (r.start == v && r.end == v + 1) spans.erase(it);
    else if (r.start == v) it->start = v + 1;
    else if (r.end == v + 1) it->end = v;
    else {
      it->end = v;
      spans.insert(std::next(it), KeyRange{v + 1, r.end});
    }
  }
  // The values in both sets.
  [[nodiscard]] DocSet meet(const DocSet& other) const {
    DocSet out;
    for (std::size_t i = 0, j = 0; i < spans.size() && j < other.spans.size();) {
      const KeyRange& a = spans[i];
      const KeyRange& b = other.spans[j];
      const KeyRange both{std::max(a.start, b.start), std::min(a.end, b.end)};
      if (both.start < both.end) out.spans.push_back(both);
      if (a.end < b.end) ++i;
      else ++j;
    }
    return out;
  }
  [[nodiscard]] std::vector<std::int64_t> values() const {
    std::vector<std::int64_t> v;
    v.reserve(static_cast<std::size_t>(count()));
    for (const KeyRange& r : spans)
      for (std::int64_t x = r.start; x < r.end; ++x) v.push_back(x);
    return v;
  }
};

// ---------------------------------------------------------------------------------
// Integer helpers (all operands stay within +-2^62: kMaxRunExtent below)

inline std::int64_t floor_div(std::int64_t a, std::int64_t b) noexcept {  // b > 0
  const std::int64_t q = a / b;
  return (a % b != 0 && a < 0) ? q - 1 : q;
}

// {j in [lo, hi) : a + b j > 0}, an interval (empty: start >= end).
inline KeyRange positive_range(std::int64_t a, std::int64_t b, std::int64_t lo, std::int64_t hi) noexcept {
  if (lo >= hi) return {lo, lo};
  if (b == 0) return a > 0 ? KeyRange{lo, hi} : KeyRange{lo, lo};
  if (b > 0) return {std::clamp(floor_div(-a, b) + 1, lo, hi), hi};
  return {lo, std::clamp(floor_div(a - 1, -b) + 1, lo, hi)};
}
inline KeyRange intersect(KeyRange a, KeyRange b) noexcept {
  const KeyRange r{std::max(a.start, b.start), std::min(a.end, b.end)};
  return r.start < r.end ? r : KeyRange{r.start, r.start};
}
inline bool none(const KeyRange& r) noexcept { return r.start >= r.end; }

// The rows t of `at` where a segment's bound meets the diagonal: where the bound minus t,
// a0 + slope * (t - q), is 0 (every row when it always is, at most one otherwise).
inline KeyRange on_diagonal(KeyRange at, std::int64_t q, std::int64_t a0, std::int64_t slope) noexcept {
  if (slope == 0) return a0 == 0 ? at : KeyRange{at.start, at.start};
  if (a0 % slope != 0) return {at.start, at.start};
  const std::int64_t t = q - a0 / slope;
  return intersect(at, {t, t + 1});
}

// The run path keeps every length and parameter at or below this, so sums of three of
// them never overflow; larger shapes are expanded.
inline constexpr std::int64_t kMaxRunExtent = std::int64_t{1} << 60;

// ---------------------------------------------------------------------------------
// A structure's rows as segments

// On a stretch of rows where no rule changes form, lo(q) = max(lo_c, p + lo_s) and
// hi(q) = min(hi_c, p + hi_s), p = q + d (a term absent: has_* false).
struct BoundForm {
  std::int64_t lo_c = 0, lo_s = 0, hi_c = 0, hi_s = 0;
  bool has_lo_s = false, has_hi_s = false;
  [[nodiscard]] std::int64_t lo(std::int64_t p) const noexcept { return has_lo_s ? std::max(lo_c, p + lo_s) : lo_c; }
  [[nodiscard]] std::int64_t hi(std::int64_t p) const noexcept { return has_hi_s ? std::min(hi_c, p + hi_s) : hi_c; }
  void raise_lo_slope(std::int64_t s) noexcept {
    lo_s = has_lo_s ? std::max(lo_s, s) : s;
    has_lo_s = true;
  }
  void lower_hi_slope(std::int64_t s) noexcept {
    hi_s = has_hi_s ? std::min(hi_s, s) : s;
    has_hi_s = true;
  }
};

// Emits rows [qa, qb) of one form, cut where its maximum, minimum or emptiness switch.
template <class Emit>
bool emit_form(const BoundForm& f, std::int64_t d, std::int64_t qa, std::int64_t qb, Emit& emit) {
  std::int64_t cuts[4] = {qa, qb, qb, qb};
  int n = 1;
  // lo takes its slope term from p + lo_s >= lo_c; hi its constant from p + hi_s >= hi_c.
  if (f.has_lo_s && f.lo_c - f.lo_s - d > qa && f.lo_c - f.lo_s - d < qb) cuts[n++] = f.lo_c - f.lo_s - d;
  if (f.has_hi_s && f.hi_c - f.hi_s - d > qa && f.hi_c - f.hi_s - d < qb) cuts[n++] = f.hi_c - f.hi_s - d;
  std::sort(cuts, cuts + n);
  cuts[n] = qb;
  for (int i = 0; i < n; ++i) {
    const std::int64_t a = cuts[i], b = cuts[i + 1];
    if (a >= b) continue;
    const std::int64_t lo_a = f.lo(a + d), hi_a = f.hi(a + d), lo_b = f.lo(b - 1 + d), hi_b = f.hi(b - 1 + d);
    const std::int64_t len = b - 1 - a;
    const std::int64_t s_lo = len > 0 ? (lo_b - lo_a) / len : 0, s_hi = len > 0 ? (hi_b - hi_a) / len : 0;
    const auto piece = [&](std::int64_t x, std::int64_t y, bool empty) {
      KeySeg s;
      s.q = x;
      s.n = y - x;
      s.empty = empty;
      if (!empty) {
        s.first = lo_a + s_lo * (x - a);
        s.last = hi_a + s_hi * (x - a);
        s.d_first = s_lo;
        s.d_last = s_hi;
      }
      return emit(s);
    };
    const std::int64_t ga = lo_a - hi_a, gb = lo_b - hi_b;  // > 0: the row attends nothing
    if ((ga > 0) == (gb > 0)) {
      if (!piece(a, b, ga > 0)) return false;
      continue;
    }
    // The gap is affine with slope s_lo - s_hi, which is -1 or 1 here.
    const std::int64_t turn = ga > 0 ? a + ga : a + 1 - ga;  // the first row of the other kind
    if (!piece(a, turn, ga > 0) || !piece(turn, b, gb > 0)) return false;
  }
  return true;
}

// The rows of `s` (batch 1; kv_valid and q_valid with at most one entry; s.segments
// unused) inside the documents `docs` (none: one document), as segments in row order,
// each pushed to `emit` (false stops). False if stopped or out of work.
template <class Emit>
bool structure_pieces(const MaskStructure& s, const DocSet* docs, Work& work, Emit&& emit) {
  const std::int64_t Q = s.q_len, K = s.k_len, d = s.key_position(0);
  const KeyRange qv = s.has_q_valid() ? s.q_valid[0] : KeyRange{0, Q};
  const KeyRange kv = s.has_kv_valid() ? s.kv_valid[0] : KeyRange{0, K};
  constexpr std::int64_t kNever = INT64_MAX;
  for (std::int64_t q = 0; q < Q;) {
    if (!work.spend(1)) return false;
    if (q < qv.start || q >= qv.end) {  // padded query rows attend nothing
      const std::int64_t end = q < qv.start ? std::min(qv.start, Q) : Q;
      KeySeg e;
      e.q = q;
      e.n = end - q;
      if (!emit(e)) return false;
      q = end;
      continue;
    }
    const std::int64_t p = q + d;
    std::int64_t next_p = kNever;  // where the form changes, in key positions
    BoundForm f;
    f.hi_c = K - 1;
    switch (s.kind) {
      case StructureKind::full: break;
      case StructureKind::causal: f.lower_hi_slope(0); break;
      case StructureKind::sliding_window:
        f.raise_lo_slope(1 - s.window);
        f.lower_hi_slope(0);
        break;
      case StructureKind::chunked:
        if (p >= 0) {
          f.lo_c = p / s.chunk * s.chunk;
          next_p = f.lo_c + s.chunk;
        } else {
          f.lo_c = K;  // hi = p < 0: nothing
          next_p = 0;
        }
        f.lower_hi_slope(0);
        break;
      case StructureKind::prefix_lm:
        if (p < s.prefix - 1) {
          f.hi_c = std::min(f.hi_c, s.prefix - 1);
          next_p = s.prefix - 1;
        } else {
          f.lower_hi_slope(0);
        }
        break;
      case StructureKind::causal_blocks: {
        auto it = std::upper_bound(s.blocks.begin(), s.blocks.end(), p,
                                   [](std::int64_t v, const KeyRange& r) { return v < r.start; });
        if (it != s.blocks.begin() && p < std::prev(it)->end) {
          f.hi_c = std::min(f.hi_c, std::prev(it)->end - 1);
          next_p = std::prev(it)->end;
        } else {
          f.lower_hi_slope(0);
          if (it != s.blocks.end()) next_p = it->start;
        }
        break;
      }
      case StructureKind::arbitrary: return false;
    }
    if (docs) {  // Q == K: p == q
      const auto& spans = docs->spans;
      auto it = std::prev(std::upper_bound(spans.begin(), spans.end(), p,
                                           [](std::int64_t v, const KeyRange& r) { return v < r.start; }));
      if (p < it->end - 1) {  // p and p + 1 are bounds: the document [p, p + 1)
        f.raise_lo_slope(0);
        f.lower_hi_slope(0);
        next_p = std::min(next_p, it->end - 1);
      } else {
        const std::int64_t doc_end = std::next(it)->start;
        f.lo_c = std::max(f.lo_c, it->end - 1);
        f.hi_c = std::min(f.hi_c, doc_end - 1);
        next_p = std::min(next_p, doc_end);
      }
    }
    f.lo_c = std::max(f.lo_c, kv.start);
    f.hi_c = std::min(f.hi_c, kv.end - 1);
    const std::int64_t end = std::min(qv.end, next_p == kNever ? Q : std::max(next_p - d, q + 1));
    if (!emit_form(f, d, q, end, emit)) return false;
    q = end;
  }
  return true;
}

// The canonical segments of `s` inside `docs`; false when out of work.
inline bool structure_rows(const MaskStructure& s, const DocSet* docs, Work& work, KeyRows& out) {
  out.clear();
  auto collect = [&out](const KeySeg& seg) {
    out.push_back(seg);
    return true;
  };
  KeyRowsBuilder<decltype(collect)> builder(collect);
  auto push = [&builder](const KeySeg& seg) { return builder.push(seg); };
  return structure_pieces(s, docs, work, push) && builder.finish();
}

// Whether the rows of `probe` inside `docs` are `rows` (rows_match), stopping at the
// first segment that differs.
inline bool rows_match(const MaskStructure& probe, const DocSet* docs, const KeyRows& rows, Work& work) {
  std::size_t k = 0;
  auto compare = [&](const KeySeg& seg) { return k < rows.size() && rows[k++] == seg; };
  KeyRowsBuilder<decltype(compare)> builder(compare);
  auto push = [&builder](const KeySeg& seg) { return builder.push(seg); };
  return structure_pieces(probe, docs, work, push) && builder.finish() && k == rows.size();
}

// The segment holding row r. Precondition: rows cover r.
inline const KeySeg& segment_at(const KeyRows& rows, std::int64_t r) noexcept {
  auto it = std::upper_bound(rows.begin(), rows.end(), r, [](std::int64_t v, const KeySeg& s) { return v < s.q; });
  return *std::prev(it);
}
inline RowSpan row_at(const KeyRows& rows, std::int64_t r) noexcept {
  const KeySeg& s = segment_at(rows, r);
  return s.empty ? RowSpan{} : RowSpan::interval(s.first_at(r), s.last_at(r));
}

// ---------------------------------------------------------------------------------
// The search of classify.hpp on segments (same names, same steps)

struct UniqueBatch {
  const KeyRows* rows = nullptr;
  std::vector<std::int64_t> logical;  // as detail::UniqueBatch
};

struct Search {
  std::int64_t q_len = 0, k_len = 0;
  Work work;
};

// detect_documents: the same bounds, as runs of values; nothing when no bound but 0.
inline std::optional<DocSet> detect_documents(Search& ctx, const MaskStructure& probe, const KeyRows& rows,
                                              std::int64_t s, std::int64_t e, bool at_empty_edges) {
  const std::int64_t Q = static_cast<std::int64_t>(probe.q_len);
  MaskStructure base = probe;
  base.kv_valid.clear();
  base.q_valid.clear();
  KeyRows base_rows;
  if (!structure_rows(base, nullptr, ctx.work, base_rows)) return std::nullopt;
  std::vector<KeyRange> pushed;  // values, as ranges
  // Rows where one of two neighbours attends nothing and the other does: evaluated one
  // by one, as the reference does every row.
  std::vector<std::int64_t> edges;
  for (std::size_t i = 1; i < rows.size(); ++i)
    if (rows[i].empty != rows[i - 1].empty) edges.push_back(rows[i].q);
  for (std::int64_t t : edges) {
    const RowSpan here = row_at(rows, t), before = row_at(rows, t - 1);
    const RowSpan base_here = probe.base_row(t), base_before = probe.base_row(t - 1);
    const bool starts = !here.empty() && !base_here.empty() && here.first == t && t > std::max(base_here.first, s);
    const bool ends = !before.empty() && !base_before.empty() && before.last == t - 1 &&
                      t - 1 < std::min(base_before.last, e - 1);
    const bool q_edge = probe.has_q_valid() && (t == probe.q_valid[0].start || t == probe.q_valid[0].end);
    const bool edge = at_empty_edges && !q_edge;
    const bool hidden_start = (edge || q_edge) && !here.empty() && !base_here.empty() && here.first < t &&
                              here.first > std::max(base_here.first, s);
    const bool hidden_end = (edge || q_edge) && !before.empty() && !base_before.empty() && before.last + 1 > t &&
                            before.last < std::min(base_before.last, e - 1);
    if (hidden_start) pushed.push_back({here.first, here.first + 1});
    else if (hidden_end) pushed.push_back({before.last + 1, before.last + 2});
    else if (starts || ends || edge) pushed.push_back({t, t + 1});
  }
  // Elsewhere a bound is a row t where a document starts (rows[t] starts at t) or ends
  // (rows[t - 1] ends at t - 1) past what the base and [s, e) explain: conditions affine
  // in the row on each pair of a row segment and a base segment, so intervals of t.
  std::vector<KeyRange> found;
  std::size_t bi = 0;
  for (const KeySeg& r : rows) {
    if (!ctx.work.spend(1)) return std::nullopt;
    if (r.empty) continue;
    while (bi < base_rows.size() && base_rows[bi].end() <= r.q) ++bi;
    for (std::size_t k = bi; k < base_rows.size() && base_rows[k].q < r.end(); ++k) {
      if (!ctx.work.spend(1)) return std::nullopt;
      const KeySeg& b = base_rows[k];
      if (b.empty) continue;
      const KeyRange both{std::max(r.q, b.q), std::min(r.end(), b.end())};
      // starts at t in both (t >= 1): first(t) == t, t > b.first(t), t > s.
      {
        // first(t) - t = (r.first - r.q) + (d_first - 1)(t - r.q)
        const KeyRange at = on_diagonal(intersect(both, {std::max<std::int64_t>(1, s + 1), Q}), r.q, r.first - r.q,
                                        r.d_first - 1);
        // t - b.first(t) = (b.q - b.first) + (1 - b.d_first)(t - b.q) > 0
        const KeyRange past = positive_range(b.q - b.first, 1 - b.d_first, at.start - b.q, at.end - b.q);
        if (!none(past)) found.push_back({past.start + b.q, past.end + b.q});
      }
      // ends after row u in both (t = u + 1 < Q): last(u) == u, u < b.last(u), u < e - 1.
      {
        // last(u) - u = (r.last - r.q) + (d_last - 1)(u - r.q)
        const KeyRange at = on_diagonal(intersect(both, {0, std::min(Q - 1, e - 1)}), r.q, r.last - r.q, r.d_last - 1);
        // b.last(u) - u = (b.last - b.q) + (b.d_last - 1)(u - b.q) > 0
        const KeyRange below = positive_range(b.last - b.q, b.d_last - 1, at.start - b.q, at.end - b.q);
        if (!none(below)) found.push_back({below.start + b.q + 1, below.end + b.q + 1});
      }
    }
  }
  // The edge rows were decided above: take them out of the intervals.
  DocSet elsewhere = DocSet::from(std::move(found));
  for (std::int64_t t : edges)
    if (elsewhere.contains(t)) elsewhere.erase(t);
  for (const KeyRange& r : elsewhere.spans) pushed.push_back(r);
  if (pushed.empty()) return std::nullopt;
  pushed.push_back({0, 1});
  pushed.push_back({Q, Q + 1});
  return DocSet::from(std::move(pushed));
}

inline std::optional<BatchFit> fit_keys(Search& ctx, MaskStructure& probe, const KeyRows& rows, bool allow_segments,
                                        bool allow_kv, bool kv_paid) {
  probe.segments.clear();
  probe.kv_valid.clear();
  if (rows_match(probe, nullptr, rows, ctx.work)) return BatchFit{};
  if (ctx.work.exhausted()) return std::nullopt;

  const std::int64_t k_len = probe.k_len;
  std::int64_t f_first = -1, l_last = -1, f_min = RowSpan::kNoKey, l_max = -1;
  bool any_empty = false;
  for (const KeySeg& r : rows) {
    if (r.empty) {
      any_empty = true;
      continue;
    }
    if (f_first < 0) f_first = r.first;
    l_last = r.last_at(r.end() - 1);
    f_min = std::min({f_min, r.first, r.first_at(r.end() - 1)});
    l_max = std::max({l_max, r.last, r.last_at(r.end() - 1)});
  }
  std::vector<KeyRange> kv_candidates = kv_valid_candidates(allow_kv, f_first, l_last, f_min, l_max, k_len);
  for (const KeyRange& kv : kv_candidates) {
    probe.kv_valid.assign(1, kv);
    if (rows_match(probe, nullptr, rows, ctx.work)) return BatchFit{kv, {}, std::nullopt};
  }
  if (!allow_segments || ctx.work.exhausted()) return std::nullopt;

  std::optional<BatchFit> best;
  kv_candidates.insert(kv_candidates.begin(), KeyRange{0, k_len});
  for (const KeyRange& kv : kv_candidates)
    for (bool at_empty_edges : {false, true}) {
      if (at_empty_edges && !any_empty) continue;
      if (ctx.work.exhausted()) return std::nullopt;
      std::optional<DocSet> found = detect_documents(ctx, probe, rows, kv.start, kv.end, at_empty_edges);
      if (!found) continue;
      DocSet docs = std::move(*found);
      BatchFit fit;
      if (!(kv.start == 0 && kv.end == k_len)) fit.kv = kv;
      if (best && best->cost(kv_paid) <= fit.cost(kv_paid) + docs.count()) continue;
      if (fit.kv) probe.kv_valid.assign(1, *fit.kv);
      else probe.kv_valid.clear();
      if (!rows_match(probe, &docs, rows, ctx.work)) continue;
      // The reference drops, from the highest interior bound down, each bound at a kv
      // edge or next to an empty row that the rows do not need: the same bounds here.
      std::vector<KeyRange> suspects;
      for (std::int64_t t : {kv.start, kv.end}) suspects.push_back({t, t + 1});
      for (const KeySeg& r : rows)
        if (r.empty) suspects.push_back({r.q, r.end() + 1});  // rows[t] or rows[t - 1] empty
      const DocSet suspect_set = DocSet::from(std::move(suspects));
      std::vector<std::int64_t> order;  // interior bounds that are suspects, low to high
      std::size_t bi = 0;
      for (const KeyRange& sp : suspect_set.spans) {
        const KeyRange interior = intersect(sp, {1, ctx.q_len});
        if (none(interior)) continue;
        while (bi < docs.spans.size() && docs.spans[bi].end <= interior.start) ++bi;
        for (std::size_t k = bi; k < docs.spans.size() && docs.spans[k].start < interior.end; ++k) {
          const KeyRange both = intersect(interior, docs.spans[k]);
          if (!ctx.work.spend(1 + both.end - both.start)) return std::nullopt;
          for (std::int64_t t = both.start; t < both.end; ++t) order.push_back(t);
        }
      }
      std::reverse(order.begin(), order.end());
      for (std::int64_t t : order) {
        DocSet trial = docs;
        trial.erase(t);
        if (rows_match(probe, &trial, rows, ctx.work)) docs = std::move(trial);
        if (ctx.work.exhausted()) return std::nullopt;
      }
      if (docs.count() > 2) {
        if (!ctx.work.spend(docs.count())) return std::nullopt;
        fit.segments = docs.values();
      }
      if (fit.segments.empty() && !fit.kv) continue;
      if (!best || fit.cost(kv_paid) < best->cost(kv_paid)) best = std::move(fit);
    }
  return best;
}

// fit_batch on segments.
inline std::optional<BatchFit> fit_batch(Search& ctx, MaskStructure& probe, const KeyRows& rows, ModifierKinds kinds,
                                         bool kv_paid = false, bool q_paid = false) {
  const std::int64_t q_cost = q_paid ? 0 : 2;
  probe.q_valid.clear();
  std::optional<BatchFit> best = fit_keys(ctx, probe, rows, kinds.segments, kinds.kv, kv_paid);
  if (!kinds.q || (best && best->cost(kv_paid) <= q_cost)) return best;
  const auto first = std::find_if(rows.begin(), rows.end(), [](const KeySeg& s) { return !s.empty; });
  const auto last = std::find_if(rows.rbegin(), rows.rend(), [](const KeySeg& s) { return !s.empty; });
  const KeyRange attending = first == rows.end() ? KeyRange{0, 0} : KeyRange{first->q, last->end()};
  if (attending == KeyRange{0, ctx.q_len}) return best;
  probe.q_valid.assign(1, attending);
  std::optional<BatchFit> with_q = fit_keys(ctx, probe, rows, kinds.segments, kinds.kv, kv_paid);
  probe.q_valid.clear();
  if (!with_q || (best && with_q->cost(kv_paid) + q_cost >= best->cost(kv_paid))) return best;
  with_q->q = attending;
  return with_q;
}

// fit_structure_with and fit_structure on segments: the same assembly (classify.hpp).
inline std::optional<MaskStructure> fit_structure_with(Search& ctx, const MaskStructure& base,
                                                       const std::vector<UniqueBatch>& batches, ModifierKinds kinds) {
  return assemble_fit(base, batches, kinds,
                      [&ctx](MaskStructure& probe, const UniqueBatch& ub, ModifierKinds k, bool kv_paid, bool q_paid) {
                        return fit_batch(ctx, probe, *ub.rows, k, kv_paid, q_paid);
                      });
}

inline std::optional<MaskStructure> fit_structure(Search& ctx, const MaskStructure& base,
                                                  const std::vector<UniqueBatch>& batches) {
  return fit_fewest_numbers(base, [&](ModifierKinds kinds) { return fit_structure_with(ctx, base, batches, kinds); });
}

// gather_evidence on segments: the same candidates. Block evidence is kept as intervals
// per segment: a stretch of rows reaching past their position, each row's [p, last]
// overlapping the next row's, is one connected piece, and the blocks are the unions of
// overlapping pieces however they are cut.
// What add_joint_chunks reads of one batch: its fresh-or-empty rows, the rest (stale,
// in key positions), the fresh rows that attend, and how many logical batches it is.
struct FreshRows {
  DocSet fresh_or_empty;
  std::vector<KeyRange> stale;
  DocSet fresh_attending;
  std::int64_t copies = 1;
};

// Whether every multiple m >= from of c with m - d < Q is a fresh or empty row of `b`:
// multiple by multiple or stale stretch by stale stretch, whichever are fewer.
inline bool multiples_fresh(Search& ctx, const FreshRows& b, std::int64_t c, std::int64_t from, std::int64_t d) {
  const std::int64_t hi = ctx.q_len + d;  // [from, hi)
  if (from >= hi) return true;
  const std::int64_t multiples = (hi - 1) / c - (from - 1) / c;
  if (multiples <= static_cast<std::int64_t>(b.stale.size())) {
    for (std::int64_t m = from; m < hi; m += c) {
      if (!ctx.work.spend(1)) return false;
      if (!b.fresh_or_empty.contains(m - d)) return false;
    }
    return true;
  }
  for (const KeyRange& g : b.stale) {
    if (!ctx.work.spend(1)) return false;
    const KeyRange in = intersect(g, {from, hi});
    if (none(in)) continue;
    if ((in.start + c - 1) / c * c < in.end) return false;
  }
  return true;
}

// add_joint_chunks on the batches' fresh rows (the table's loops, done stretch by stretch).
inline void add_joint_chunks(Search& ctx, BaseEvidence& ev, const std::vector<FreshRows>& fresh, std::int64_t d) {
  std::vector<KeyRange> attending;
  for (const FreshRows& b : fresh) attending.insert(attending.end(), b.fresh_attending.spans.begin(), b.fresh_attending.spans.end());
  DocSet positions = DocSet::from(std::move(attending));  // rows, as the table's loop visits them
  for (const FreshRows& b : fresh) {
    if (!ctx.work.spend(static_cast<std::int64_t>(positions.spans.size() + b.fresh_or_empty.spans.size()))) return;
    positions = positions.meet(b.fresh_or_empty);
  }
  detail::add_joint_chunks(
      ev,
      [&](const auto& visit) {
        for (const KeyRange& r : positions.spans)
          for (std::int64_t q = std::max(r.start, 1 - d); q < r.end; ++q)
            if (!ctx.work.spend(1) || !visit(q + d)) return;
      },
      [&](std::int64_t c) {
        const std::int64_t from = first_multiple_on_rows(c, d);
        return std::all_of(fresh.begin(), fresh.end(), [&](const FreshRows& b) { return multiples_fresh(ctx, b, c, from, d); });
      },
      [&](std::int64_t c) {
        // Positive multiples of c at the positions of fresh attending rows: multiple by
        // multiple or stretch by stretch, whichever are fewer.
        std::int64_t shown = 0;
        const std::int64_t from = first_multiple_on_rows(c, d), hi = ctx.q_len + d;
        const std::int64_t multiples = from < hi ? (hi - 1) / c - (from - 1) / c : 0;
        for (const FreshRows& b : fresh) {
          if (multiples > static_cast<std::int64_t>(b.fresh_attending.spans.size())) continue;
          for (std::int64_t m = from; m < hi && shown < 2; m += c) {
            if (!ctx.work.spend(1)) return false;
            if (b.fresh_attending.contains(m - d)) shown += b.copies >= 2 ? 2 : 1;
          }
        }
        for (const FreshRows& b : fresh) {
          if (multiples <= static_cast<std::int64_t>(b.fresh_attending.spans.size())) continue;
          for (const KeyRange& r : b.fresh_attending.spans) {
            if (shown >= 2 || !ctx.work.spend(1)) return shown >= 2;
            const std::int64_t lo = std::max<std::int64_t>(r.start + d, 1), end = r.end + d;
            if (lo >= end) continue;
            const std::int64_t n = floor_div(end - 1, c) - floor_div(lo - 1, c);
            if (n > 0) shown += b.copies >= 2 || n >= 2 ? 2 : 1;
          }
        }
        return shown >= 2;
      });
}

// `batch`: the logical batch count (a broadcast table's one batch stands for all).
inline BaseEvidence gather_evidence(Search& ctx, const std::vector<UniqueBatch>& batches, std::int64_t d,
                                    std::int64_t batch) {
  BaseEvidence ev;
  std::vector<FreshRows> fresh_by_batch;
  std::vector<std::int64_t> all_starts;
  std::map<std::int64_t, std::int64_t> block_end;
  std::set<std::vector<std::int64_t>> seen_starts;
  std::set<std::int64_t> seen_ends;
  const std::int64_t Q = ctx.q_len;
  for (const UniqueBatch& ub : batches) {
    const KeyRows& rows = *ub.rows;
    std::vector<std::int64_t> starts;
    std::int64_t first_empty_after_rows = -1;
    std::int64_t max_window = 0;
    std::vector<KeyRange> fresh;  // rows that attend nothing or start at their own position
    std::vector<KeyRange> fresh_attending;  // of those, the rows that attend
    for (std::size_t i = 0; i < rows.size(); ++i) {
      if (!ctx.work.spend(1)) return ev;
      const KeySeg& r = rows[i];
      if (r.empty) {
        const std::int64_t p = r.q + d;
        if (first_empty_after_rows < 0 && i > 0 && p > 0) {  // rows[i - 1] attends: segments alternate
          first_empty_after_rows = p;
          ev.windows.push_back(p - rows[i - 1].last_at(r.q - 1));
        }
        fresh.push_back({r.q, r.end()});
        continue;
      }
      const std::int64_t n = r.n;
      // p - first + 1 where first > 0, greatest at an end of that stretch.
      const KeyRange positive = positive_range(r.first, r.d_first, 0, n);
      if (!none(positive))
        for (std::int64_t j : {positive.start, positive.end - 1})
          max_window = std::max(max_window, r.q + j + d - r.first_at(r.q + j) + 1);
      // last + 1 where last > p: (last - q - d) + (d_last - 1) j > 0.
      const KeyRange reach = positive_range(r.last - r.q - d, r.d_last - 1, 0, n);
      if (!none(reach))
        for (std::int64_t j : {reach.start, reach.end - 1}) ev.prefix = std::max(ev.prefix, r.last_at(r.q + j) + 1);
      // Starts: first > 0 and first <= p, the first four distinct in row order.
      const KeyRange starting = intersect(positive, positive_range(r.q + d - r.first + 1, 1 - r.d_first, 0, n));
      for (std::int64_t j = starting.start; j < starting.end && starts.size() < 4; ++j) {
        const std::int64_t v = r.first_at(r.q + j);
        if (std::find(starts.begin(), starts.end(), v) == starts.end()) starts.push_back(v);
        if (r.d_first == 0) break;  // one value
      }
      // Blocks: rows with last > p and p >= 0.
      const KeyRange block = intersect(reach, {std::clamp<std::int64_t>(-d - r.q, 0, n), n});
      if (!none(block)) {
        const std::int64_t start = r.q + block.start + d;
        const std::int64_t end =
            std::max(r.last_at(r.q + block.start), r.last_at(r.q + block.end - 1)) + 1;
        auto [it, inserted] = block_end.emplace(start, end);
        if (!inserted) it->second = std::max(it->second, end);
      }
      // Fresh rows: first == p, i.e. (first - q - d) + (d_first - 1) j == 0.
      const std::int64_t a0 = r.first - r.q - d, slope = r.d_first - 1;
      if (slope == 0) {
        if (a0 == 0) {
          fresh.push_back({r.q, r.end()});
          fresh_attending.push_back(fresh.back());
        }
      } else if (a0 % slope == 0) {
        const std::int64_t j = -a0 / slope;
        if (j >= 0 && j < n) {
          fresh.push_back({r.q + j, r.q + j + 1});
          fresh_attending.push_back(fresh.back());
        }
      }
    }
    if (max_window > 0) ev.windows.push_back(max_window);
    {
      const DocSet fresh_rows = DocSet::from(std::move(fresh));
      // Rows that are not fresh, in p coordinates: a chunk fails where one holds a multiple.
      std::vector<KeyRange> stale;
      std::int64_t at = 0;
      for (const KeyRange& f : fresh_rows.spans) {
        if (f.start > at) stale.push_back({at + d, f.start + d});
        at = f.end;
      }
      if (at < Q) stale.push_back({at + d, Q + d});
      const auto every_multiple = [&](std::int64_t c) {
        // Multiples m >= 2c with m - d < Q, none in a stale stretch.
        const std::int64_t lo = 2 * c, hi = Q + d;  // [lo, hi)
        if (lo >= hi) return true;
        const std::int64_t multiples = (hi - 1) / c - 1;
        if (multiples <= static_cast<std::int64_t>(stale.size())) {
          for (std::int64_t m = lo; m < hi; m += c) {
            if (!ctx.work.spend(1)) return false;
            if (!fresh_rows.contains(m - d)) return false;
          }
          return true;
        }
        for (const KeyRange& g : stale) {
          if (!ctx.work.spend(1)) return false;
          const KeyRange in = intersect(g, {lo, hi});
          if (none(in)) continue;
          if ((in.start + c - 1) / c * c < in.end) return false;
        }
        return true;
      };
      int found = 0;
      for (const KeyRange& f : fresh_rows.spans) {
        for (std::int64_t q = std::max(f.start, 1 - d); q < f.end && found < 3; ++q) {
          if (!ctx.work.spend(1)) return ev;
          const KeySeg& seg = segment_at(rows, q);
          if (seg.empty) {
            q = seg.end() - 1;  // an empty stretch holds no candidate
            continue;
          }
          const std::int64_t c = q + d;
          if (every_multiple(c)) {
            ev.chunks.push_back(c);
            ++found;
          }
          if (ctx.work.exhausted()) return ev;
        }
        if (found >= 3) break;
      }
      FreshRows joint;
      joint.fresh_or_empty = fresh_rows;
      joint.stale = std::move(stale);
      joint.fresh_attending = DocSet::from(std::move(fresh_attending));
      joint.copies = ub.logical.empty() ? batch : static_cast<std::int64_t>(ub.logical.size());
      fresh_by_batch.push_back(std::move(joint));
    }
    if (first_empty_after_rows > 0) {
      starts.push_back(first_empty_after_rows);
      if (seen_ends.insert(first_empty_after_rows).second)
        for (std::int64_t f = 1; f <= first_empty_after_rows / f; ++f) {
          if (!ctx.work.spend(1)) return ev;
          if (first_empty_after_rows % f == 0) ev.chunks.insert(ev.chunks.end(), {f, first_empty_after_rows / f});
        }
    }
    all_starts.insert(all_starts.end(), starts.begin(), starts.end());
    if (!seen_starts.insert(starts).second) continue;
    add_start_chunks(ev, starts);
  }
  if (batches.size() > 1) add_cross_batch_starts(ev, std::move(all_starts));
  add_joint_chunks(ctx, ev, fresh_by_batch, d);
  finish_evidence(ev, block_end);
  return ev;
}

// chunk_bounds_rows on segments: chunk by chunk along each segment, out at the first row
// outside its chunk.
inline bool chunk_bounds_rows(Search& ctx, const std::vector<UniqueBatch>& batches, std::int64_t c, std::int64_t d) {
  for (const UniqueBatch& ub : batches)
    for (const KeySeg& r : *ub.rows) {
      if (r.empty) continue;
      const std::int64_t pa = r.q + d, pb = r.end() - 1 + d;
      if (pa < 0) return false;
      for (std::int64_t k = pa / c; k <= pb / c; ++k) {
        if (!ctx.work.spend(1)) return false;
        const std::int64_t a = std::max(pa, k * c) - d, b = std::min(pb, k * c + c - 1) - d;  // rows, inclusive
        if (std::min(r.first_at(a), r.first_at(b)) < k * c) return false;
      }
    }
  return true;
}

// classify_spans on segments: the same search (classify.hpp), out when the work is spent.
inline std::optional<MaskStructure> search(Search& ctx, const MaskStructure& out, const std::vector<UniqueBatch>& batches) {
  return search_candidates(
      out, [&](const MaskStructure& base) { return fit_structure(ctx, base, batches); },
      [&](std::int64_t d) { return gather_evidence(ctx, batches, d, out.batch); },
      [&](std::int64_t c, std::int64_t d) { return chunk_bounds_rows(ctx, batches, c, d); },
      [&] { return ctx.work.exhausted(); });
}

// ---------------------------------------------------------------------------------
// The table's summary and its slices as segments

// summarize_rows on runs, plus what the run path needs to proceed.
struct RunSummary {
  RowSummary rows;
  bool tame = true;  // every run decodes to rows the run path can read (else: expand)
};

inline RunSummary summarize_runs(const SpanRuns& t) noexcept {
  RunSummary out;
  constexpr std::uint32_t kKnownFlags = kRowBias | kRowFiniteMasked | kRowInvalid;
  std::uint32_t flags = 0;
  for (const SpanRun& r : t.runs) {
    flags |= r.flags;
    switch (r.row_class()) {
      case RowClass::empty:
        out.rows.empty_rows += r.length;
        if (r.flags & kRowFiniteMasked) out.rows.finite_masked_rows += r.length;
        break;
      case RowClass::holed:
        out.rows.all_intervals = false;
        // A run of one row is read as the table reads it; longer ones go to the table.
        if (r.length != 1) out.tame = false;
        else if (!(0 <= r.first && r.first <= r.last && r.last < t.k_len && r.count >= 0 &&
                   r.count <= r.last - r.first + 1))
          out.rows.well_formed = false;
        break;
      case RowClass::interval: {
        // Keys in [0, K) at both ends with the step taken as an integer (no wrap): then
        // in [0, K) at every row between.
        const std::int64_t j = r.length - 1;
        const auto end_of = [j](std::int64_t v, std::int64_t step, std::int64_t& out_v) {
          if (step != 0 && (step > INT64_MAX / j || step < -(INT64_MAX / j))) return false;
          const std::int64_t delta = step * j;
          if ((delta > 0 && v > INT64_MAX - delta) || (delta < 0 && v < INT64_MIN - delta)) return false;
          out_v = v + delta;
          return true;
        };
        std::int64_t f_end = r.first, l_end = r.last;
        if (j > 0 && (!end_of(r.first, r.d_first, f_end) || !end_of(r.last, r.d_last, l_end))) {
          out.tame = false;
          break;
        }
        const auto ok = [&](std::int64_t f, std::int64_t l) { return 0 <= f && f <= l && l < t.k_len; };
        if (!ok(r.first, r.last) || !ok(f_end, l_end)) out.tame = false;  // the table names the row
        break;
      }
    }
  }
  if ((flags & ~kKnownFlags) != 0) out.rows.well_formed = false;
  out.rows.bias = (flags & kRowBias) != 0;
  if (flags & kRowInvalid) out.rows.first_invalid = 0;  // which row: the table says
  return out;
}

// The rows of distinct slice `slice` as canonical segments (flags set aside).
inline KeyRows slice_rows(const SpanRuns& t, std::size_t& run, std::int64_t slice) {
  KeyRows out;
  auto collect = [&out](const KeySeg& seg) {
    out.push_back(seg);
    return true;
  };
  KeyRowsBuilder<decltype(collect)> builder(collect);
  const std::int64_t base = slice * t.q_len, end = base + t.q_len;
  for (; run < t.runs.size() && t.runs[run].row < end; ++run) {
    const SpanRun& r = t.runs[run];
    KeySeg s;
    s.q = r.row - base;
    s.n = r.length;
    s.empty = r.row_class() == RowClass::empty;
    if (!s.empty) {
      s.first = r.first;
      s.last = r.last;
      s.d_first = r.d_first;
      s.d_last = r.d_last;
    }
    builder.push(s);
  }
  builder.finish();
  return out;
}

inline std::uint64_t hash_rows(const KeyRows& rows) noexcept {
  std::uint64_t h = 1469598103934665603ULL;
  for (const KeySeg& s : rows)
    for (std::int64_t v : {s.q, s.first, s.d_first, s.last, s.d_last, std::int64_t{s.empty}})
      h = (h ^ static_cast<std::uint64_t>(v)) * 1099511628211ULL;
  return h;
}

struct Options {
  // Expand when the runs are this dense or denser (runs * dense_ratio >= rows): the
  // table is as cheap to read. 0: never for density (tests hold the run path to it).
  std::int64_t dense_ratio = 4;
  // Work units per run, and a floor, before the search gives up and expands.
  std::int64_t work_per_run = 64, work_floor = 1 << 14;
};

inline Result<MaskStructure> expand_and_classify(const SpanRuns& runs, RunsClassifyStats* stats) {
  if (stats) stats->expanded = true;
  Result<SpanTable> table = runs.expand();
  if (!table) return table.status();
  return classify(*table);
}

inline Result<MaskStructure> classify_runs(const SpanRuns& t, Options options, RunsClassifyStats* stats) {
  if (stats) *stats = {};
  if (Status st = t.validate(); !st.ok()) return st;
  const auto runs = static_cast<std::int64_t>(t.runs.size());
  if (t.q_len > kMaxRunExtent || t.k_len > kMaxRunExtent ||
      (options.dense_ratio > 0 && runs > t.rows() / options.dense_ratio))
    return expand_and_classify(t, stats);
  const RunSummary summary = summarize_runs(t);
  if (!summary.tame || !summary.rows.well_formed || summary.rows.first_invalid >= 0)
    return expand_and_classify(t, stats);  // the table's error, naming the row
  return catch_alloc([&]() -> Result<MaskStructure> {
    Search ctx;
    ctx.q_len = t.q_len;
    ctx.k_len = t.k_len;
    ctx.work.limit = options.work_floor + options.work_per_run * runs;
    const auto done = [&](MaskStructure s) -> Result<MaskStructure> {
      if (stats) stats->work = ctx.work.used;
      return s;
    };
    MaskStructure out = unclassified(t, summary.rows.empty_rows, summary.rows.finite_masked_rows, summary.rows.bias);
    if (!summary.rows.all_intervals) return done(out);  // arbitrary: no cost-free match either

    std::vector<KeyRows> slices;
    slices.reserve(static_cast<std::size_t>(t.distinct_slices()));
    std::size_t run = 0;
    for (std::int64_t s = 0; s < t.distinct_slices(); ++s) slices.push_back(slice_rows(t, run, s));
    const auto slice = [&](std::int64_t b, std::int64_t h) -> const KeyRows& {
      return slices[static_cast<std::size_t>(t.slice_index(b, h))];
    };

    // The fast path: full, then causal top_left, then bottom_right (Q != K), each in
    // every stored slice.
    {
      MaskStructure probe = make_structure(StructureKind::full, 1, t.q_len, t.k_len);
      std::vector<std::pair<StructureKind, Alignment>> order{{StructureKind::full, Alignment::top_left},
                                                             {StructureKind::causal, Alignment::top_left}};
      if (t.q_len != t.k_len) order.push_back({StructureKind::causal, Alignment::bottom_right});
      for (const auto& [kind, alignment] : order) {
        probe.kind = kind;
        probe.alignment = alignment;
        KeyRows expected;
        if (!structure_rows(probe, nullptr, ctx.work, expected)) break;
        if (std::all_of(slices.begin(), slices.end(), [&](const KeyRows& r) { return r == expected; })) {
          out.kind = kind;
          out.alignment = alignment;
          return done(out);
        }
      }
    }

    // heads_agree, unique_batches.
    for (std::int64_t b = 0; b < t.distinct_batch; ++b)
      for (std::int64_t h = 1; h < t.distinct_heads; ++h)
        if (slice(b, h) != slice(b, 0)) return done(out);
    std::vector<UniqueBatch> batches;
    std::unordered_multimap<std::uint64_t, std::size_t> by_hash;
    for (std::int64_t b = 0; b < t.distinct_batch; ++b) {
      const KeyRows& rows = slice(b, 0);
      const std::uint64_t h = hash_rows(rows);
      std::optional<std::size_t> found;
      auto [lo, hi] = by_hash.equal_range(h);
      for (auto it = lo; it != hi && !found; ++it)
        if (*batches[it->second].rows == rows) found = it->second;
      if (!found) {
        found = batches.size();
        batches.push_back({&rows, {}});
        by_hash.emplace(h, *found);
      }
      if (t.distinct_batch > 1) batches[*found].logical.push_back(b);
    }

    std::optional<MaskStructure> best = search(ctx, out, batches);
    if (ctx.work.exhausted()) return expand_and_classify(t, stats);
    return done(finish_verdict(std::move(best), out));
  });
}

}  // namespace detail::runs

// The simplest exact structure of the table the runs stand for: what classify(SpanTable)
// gives for runs.expand(), field for field, or its error. Runs that do not tile the
// rows are refused as SpanRuns::validate() says. `stats`, when given, says how it went.
inline Result<MaskStructure> classify(const SpanRuns& runs, RunsClassifyStats* stats = nullptr) {
  return detail::runs::classify_runs(runs, {}, stats);
}

}  // namespace masklens
