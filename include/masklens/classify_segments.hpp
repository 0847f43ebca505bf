// Rows as segments: stretches of rows whose first and last key are affine in the row
// (KeySeg), the canonical form two row sequences compare in (KeyRowsBuilder), document
// bounds kept as runs of consecutive values (DocSet), and a structure's own rows produced
// segment by segment (structure_pieces). The vocabulary the search's steps are written in
// (classify_rows.hpp): the run reader's rows are canonical segments, the table's rows are
// one-row segments, and a step reads both the same way.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "row_span.hpp"
#include "structure.hpp"

namespace masklens::detail {

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

// The table's budget: its search is O(rows x candidates) by design and never gives up.
struct Unlimited {
  static constexpr bool spend(std::int64_t) noexcept { return true; }
  static constexpr bool exhausted() noexcept { return false; }
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
    // The table's bounds come in row order: a sorted list is only checked.
    const auto by_start = [](const KeyRange& a, const KeyRange& b) { return a.start < b.start; };
    if (!std::is_sorted(ranges.begin(), ranges.end(), by_start)) std::sort(ranges.begin(), ranges.end(), by_start);
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
template <class Budget, class Emit>
bool structure_pieces(const MaskStructure& s, const DocSet* docs, Budget& work, Emit&& emit) {
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
template <class Budget>
bool structure_rows(const MaskStructure& s, const DocSet* docs, Budget& work, KeyRows& out) {
  out.clear();
  auto collect = [&out](const KeySeg& seg) {
    out.push_back(seg);
    return true;
  };
  KeyRowsBuilder<decltype(collect)> builder(collect);
  auto push = [&builder](const KeySeg& seg) { return builder.push(seg); };
  return structure_pieces(s, docs, work, push) && builder.finish();
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

}  // namespace masklens::detail
