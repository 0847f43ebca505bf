// The search's steps that read rows, each written once over the row reader contract
// (RowReader): the evidence a base's parameters are read from (gather_evidence), the
// chunk check (chunk_bounds_rows), document bounds (detect_documents) and the fit of
// modifiers to one batch (fit_keys, fit_batch), and the search itself (search_rows).
// Two readers model the contract: the table's (classify.hpp: every row its own one-row
// segment, O(rows)) and the runs' (classify_runs.hpp: canonical segments, O(runs)).
// A step reads a segment of one row by the row rule and a longer one in closed form (a
// condition affine in the row holds on one interval of it), so both readers get the
// same answer from the same code, and the table pays no closed form per row.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "classify_search.hpp"
#include "classify_segments.hpp"
#include "row_span.hpp"
#include "structure.hpp"

namespace masklens::detail {

// The rows of one batch as the search reads them:
//   q_len()              rows in the batch
//   row(t)               row t (an interval or empty)
//   segments()           the rows in order as KeySegs, covering [0, q_len)
//   attending()          the rows from the first that attends to the last ([0, 0): none)
//   matches(probe, docs) whether `probe` (batch 1, at most one kv_valid / q_valid entry,
//                        inside `docs` when given; its `segments` are the reader's to
//                        overwrite) renders exactly these rows: the comparison every
//                        fit ends in, and where a reader's cost shows
//   budget()             the work the search may spend (spend(n), exhausted()): a run
//                        search that spends it hands the table to classify(SpanTable)
template <class R>
concept RowReader = requires(const R& rows, MaskStructure& probe, const DocSet* docs, std::int64_t t) {
  { rows.q_len() } -> std::same_as<std::int64_t>;
  { rows.row(t) } -> std::same_as<RowSpan>;
  { *rows.segments().begin() } -> std::convertible_to<KeySeg>;
  rows.segments().end();
  { rows.attending() } -> std::same_as<KeyRange>;
  { rows.matches(probe, docs) } -> std::same_as<bool>;
  { rows.budget().spend(t) } -> std::same_as<bool>;
  { rows.budget().exhausted() } -> std::same_as<bool>;
};

// Rows of one batch that several logical batches share (stride 0 or equal content).
template <RowReader Rows>
struct UniqueBatch {
  Rows rows;
  // The logical batch indices with these rows; empty when the table is broadcast over
  // the batch and these rows stand for every batch (B may be 2^40: nothing per batch).
  std::vector<std::int64_t> logical;
};

// Appends the values [r.start, r.end) to `ranges`, joined with the last range where
// they touch it: bounds found in row order stay a few ranges, not one per row.
inline void add_range(std::vector<KeyRange>& ranges, KeyRange r) {
  if (!ranges.empty() && ranges.back().start <= r.start && r.start <= ranges.back().end)
    ranges.back().end = std::max(ranges.back().end, r.end);
  else
    ranges.push_back(r);
}

// ---------------------------------------------------------------------------------
// Document bounds

// Whether a document starts at row t >= 1: the row starts exactly at its own position
// although neither the base row nor the key range's start s starts it there.
inline bool starts_document(const RowSpan& row, const RowSpan& base, std::int64_t t, std::int64_t s) noexcept {
  return !row.empty() && !base.empty() && row.first == t && t > std::max(base.first, s);
}
// Whether a document ends after row u: the row ends just before the next position
// although neither the base row nor the key range's end e ends it there.
inline bool ends_document(const RowSpan& row, const RowSpan& base, std::int64_t u, std::int64_t e) noexcept {
  return !row.empty() && !base.empty() && row.last == u && u < std::min(base.last, e - 1);
}

// The bound row t shows where the rows turn empty or non-empty between t - 1 and t
// (-1: none). With `at_empty_edges` the turn itself is one (a document whose keys are
// all padding leaves only empty rows); at a q_valid bound it is the padding's. Rows next
// to padded query rows may sit in a document that starts or ends among them: the edge
// shows only as their first key, or their last key + 1.
inline std::int64_t bound_at_empty_edge(const MaskStructure& probe, const RowSpan& here, const RowSpan& before,
                                        std::int64_t t, std::int64_t s, std::int64_t e, bool at_empty_edges) {
  const RowSpan base_here = probe.base_row(t), base_before = probe.base_row(t - 1);
  const bool q_edge = probe.has_q_valid() && (t == probe.q_valid[0].start || t == probe.q_valid[0].end);
  const bool edge = at_empty_edges && !q_edge;
  const bool hidden_start = (edge || q_edge) && !here.empty() && !base_here.empty() && here.first < t &&
                            here.first > std::max(base_here.first, s);
  const bool hidden_end = (edge || q_edge) && !before.empty() && !base_before.empty() && before.last + 1 > t &&
                          before.last < std::min(base_before.last, e - 1);
  if (hidden_start) return here.first;
  if (hidden_end) return before.last + 1;
  if (starts_document(here, base_here, t, s) || ends_document(before, base_before, t - 1, e) || edge) return t;
  return -1;
}

// Document bounds the rows show, given the base rule of `probe` and key range [s, e):
// where a document starts or ends past what the base and [s, e) explain, and where rows
// turn empty or non-empty (bound_at_empty_edge). 0 and Q included; nothing when no other
// bound shows (or the budget is spent).
template <RowReader Rows>
std::optional<DocSet> detect_documents(const MaskStructure& probe, const Rows& rows, std::int64_t s, std::int64_t e,
                                       bool at_empty_edges) {
  auto&& work = rows.budget();
  const std::int64_t Q = rows.q_len();
  std::vector<KeyRange> found;      // bounds of starts and ends, as ranges of values
  std::vector<std::int64_t> edges;  // rows whose neighbour above differs in emptiness
  KeyRows base_rows;                // the base's rows as segments, read at the first long segment
  bool base_read = false;
  std::size_t bi = 0;
  bool has_before = false, before_empty = false;
  for (const KeySeg& r : rows.segments()) {
    if (!work.spend(1)) return std::nullopt;
    if (has_before && r.empty != before_empty) edges.push_back(r.q);
    has_before = true;
    before_empty = r.empty;
    if (r.empty) continue;
    if (r.n == 1) {
      const RowSpan row = RowSpan::interval(r.first, r.last), base = probe.base_row(r.q);
      if (r.q >= 1 && starts_document(row, base, r.q, s)) add_range(found, {r.q, r.q + 1});
      if (r.q + 1 < Q && ends_document(row, base, r.q, e)) add_range(found, {r.q + 1, r.q + 2});
      continue;
    }
    if (!base_read) {
      MaskStructure base = probe;
      base.kv_valid.clear();
      base.q_valid.clear();
      if (!structure_rows(base, nullptr, work, base_rows)) return std::nullopt;
      base_read = true;
    }
    // Starts and ends are conditions affine in the row on each pair of a row segment and
    // a base segment: intervals of t.
    while (bi < base_rows.size() && base_rows[bi].end() <= r.q) ++bi;
    for (std::size_t k = bi; k < base_rows.size() && base_rows[k].q < r.end(); ++k) {
      if (!work.spend(1)) return std::nullopt;
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
        if (!none(past)) add_range(found, {past.start + b.q, past.end + b.q});
      }
      // ends after row u in both (t = u + 1 < Q): last(u) == u, u < b.last(u), u < e - 1.
      {
        // last(u) - u = (r.last - r.q) + (d_last - 1)(u - r.q)
        const KeyRange at = on_diagonal(intersect(both, {0, std::min(Q - 1, e - 1)}), r.q, r.last - r.q, r.d_last - 1);
        // b.last(u) - u = (b.last - b.q) + (b.d_last - 1)(u - b.q) > 0
        const KeyRange below = positive_range(b.last - b.q, b.d_last - 1, at.start - b.q, at.end - b.q);
        if (!none(below)) add_range(found, {below.start + b.q + 1, below.end + b.q + 1});
      }
    }
  }
  // An edge row's bound is the whole rule's (it may name another row's key): take the
  // edges out of what the starts and ends found, and evaluate them one by one.
  DocSet elsewhere = DocSet::from(std::move(found));
  std::vector<KeyRange> bounds;
  for (std::int64_t t : edges) {
    if (elsewhere.contains(t)) elsewhere.erase(t);
    const std::int64_t v = bound_at_empty_edge(probe, rows.row(t), rows.row(t - 1), t, s, e, at_empty_edges);
    if (v >= 0) bounds.push_back({v, v + 1});
  }
  bounds.insert(bounds.end(), elsewhere.spans.begin(), elsewhere.spans.end());
  if (bounds.empty()) return std::nullopt;
  bounds.push_back({0, 1});
  bounds.push_back({Q, Q + 1});
  return DocSet::from(std::move(bounds));
}

// ---------------------------------------------------------------------------------
// Fits

// The cheapest key-side modifiers (kv_valid, segments) that make `probe` (a base
// structure with batch 1, q_valid set or not) equal `rows`.
template <RowReader Rows>
std::optional<BatchFit> fit_keys(MaskStructure& probe, const Rows& rows, bool allow_segments, bool allow_kv,
                                 bool kv_paid = false) {
  auto&& work = rows.budget();
  probe.segments.clear();
  probe.kv_valid.clear();
  if (rows.matches(probe, nullptr)) return BatchFit{};
  if (work.exhausted()) return std::nullopt;

  const std::int64_t k_len = probe.k_len;
  std::int64_t f_first = -1, l_last = -1, f_min = RowSpan::kNoKey, l_max = -1;
  bool any_empty = false;
  for (const KeySeg& r : rows.segments()) {
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
    if (rows.matches(probe, nullptr)) return BatchFit{kv, {}, std::nullopt};  // cost 2: documents cost at least 3
  }
  if (!allow_segments || work.exhausted()) return std::nullopt;

  std::optional<BatchFit> best;
  kv_candidates.insert(kv_candidates.begin(), KeyRange{0, k_len});
  for (const KeyRange& kv : kv_candidates)
    for (bool at_empty_edges : {false, true}) {
      // Without empty rows there are no empty edges: the second pass would find the same
      // documents and reach the same fit (or the same mismatch) again.
      if (at_empty_edges && !any_empty) continue;
      if (work.exhausted()) return std::nullopt;
      std::optional<DocSet> found = detect_documents(probe, rows, kv.start, kv.end, at_empty_edges);
      if (!found) continue;
      DocSet docs = std::move(*found);
      BatchFit fit;
      if (!(kv.start == 0 && kv.end == k_len)) fit.kv = kv;
      if (best && best->cost(kv_paid) <= fit.cost(kv_paid) + docs.count()) continue;
      if (fit.kv) probe.kv_valid.assign(1, *fit.kv);
      else probe.kv_valid.clear();
      if (!rows.matches(probe, &docs)) continue;
      // Where padding meets a document edge the evidence can name a start twice over:
      // drop, from the highest interior bound down, each bound at a kv edge or next to an
      // empty row (rows[t] or rows[t - 1]) that the rows do not need.
      std::vector<KeyRange> suspects;
      for (std::int64_t t : {kv.start, kv.end}) suspects.push_back({t, t + 1});
      for (const KeySeg& r : rows.segments())
        if (r.empty) add_range(suspects, {r.q, r.end() + 1});
      const DocSet suspect_set = DocSet::from(std::move(suspects));
      std::vector<std::int64_t> order;  // interior bounds that are suspects, low to high
      std::size_t bi = 0;
      for (const KeyRange& sp : suspect_set.spans) {
        const KeyRange interior = intersect(sp, {1, rows.q_len()});
        if (none(interior)) continue;
        while (bi < docs.spans.size() && docs.spans[bi].end <= interior.start) ++bi;
        for (std::size_t k = bi; k < docs.spans.size() && docs.spans[k].start < interior.end; ++k) {
          const KeyRange both = intersect(interior, docs.spans[k]);
          if (!work.spend(1 + both.end - both.start)) return std::nullopt;
          for (std::int64_t t = both.start; t < both.end; ++t) order.push_back(t);
        }
      }
      for (auto t = order.rbegin(); t != order.rend(); ++t) {
        DocSet trial = docs;
        trial.erase(*t);
        if (rows.matches(probe, &trial)) docs = std::move(trial);
        if (work.exhausted()) return std::nullopt;
      }
      if (docs.count() > 2) {
        if (!work.spend(docs.count())) return std::nullopt;
        fit.segments = docs.values();
      }
      if (fit.segments.empty() && !fit.kv) continue;  // cannot happen: the base alone did not match
      if (!best || fit.cost(kv_paid) < best->cost(kv_paid)) best = std::move(fit);
    }
  return best;
}

// The cheapest modifiers of `kinds` that make `probe` (a base structure with batch 1)
// equal `rows`. q_valid is the rows from the first that attends to the last: padded
// query rows at either end attend nothing whatever the base says. On equal cost the
// fit without it wins. `kv_paid`, `q_paid`: other batches list the modifier, so this
// batch's entry costs nothing more.
template <RowReader Rows>
std::optional<BatchFit> fit_batch(MaskStructure& probe, const Rows& rows, ModifierKinds kinds, bool kv_paid = false,
                                  bool q_paid = false) {
  const std::int64_t q_cost = q_paid ? 0 : 2;
  probe.q_valid.clear();
  std::optional<BatchFit> best = fit_keys(probe, rows, kinds.segments, kinds.kv, kv_paid);
  if (!kinds.q || (best && best->cost(kv_paid) <= q_cost)) return best;
  // Nothing attends: q_valid [0, 0) (kv_valid [0, 0) says the same, where allowed).
  const KeyRange attending = rows.attending();
  if (attending == KeyRange{0, rows.q_len()}) return best;
  probe.q_valid.assign(1, attending);
  std::optional<BatchFit> with_q = fit_keys(probe, rows, kinds.segments, kinds.kv, kv_paid);
  probe.q_valid.clear();
  if (!with_q || (best && with_q->cost(kv_paid) + q_cost >= best->cost(kv_paid))) return best;
  with_q->q = attending;
  return with_q;
}

template <RowReader Rows>
std::optional<MaskStructure> fit_structure(const MaskStructure& base, const std::vector<UniqueBatch<Rows>>& batches) {
  return fit_fewest_numbers(base, [&](ModifierKinds kinds) {
    return assemble_fit(base, batches, kinds,
                        [](MaskStructure& probe, const UniqueBatch<Rows>& ub, ModifierKinds k, bool kv_paid, bool q_paid) {
                          return fit_batch(probe, ub.rows, k, kv_paid, q_paid);
                        });
  });
}

// ---------------------------------------------------------------------------------
// Evidence

// What the joint chunk evidence reads of one batch: its fresh-or-empty rows, how many
// stretches of other rows (stale) lie between them, the fresh rows that attend, and how
// many logical batches it is.
struct FreshRows {
  DocSet fresh_or_empty;
  std::int64_t stale_stretches = 0;
  DocSet fresh_attending;
  std::int64_t copies = 1;
};

// Whether every multiple m >= from of c with m - d < Q is a fresh or empty row of `b`:
// multiple by multiple or stale stretch by stale stretch, whichever are fewer.
template <class Budget>
bool multiples_fresh(Budget& work, std::int64_t q_len, const FreshRows& b, std::int64_t c, std::int64_t from,
                     std::int64_t d) {
  const std::int64_t hi = q_len + d;  // [from, hi)
  if (from >= hi) return true;
  const std::int64_t multiples = (hi - 1) / c - (from - 1) / c;
  if (multiples <= b.stale_stretches) {
    for (std::int64_t m = from; m < hi; m += c) {
      if (!work.spend(1)) return false;
      if (!b.fresh_or_empty.contains(m - d)) return false;
    }
    return true;
  }
  // The stale stretches, in key positions: the gaps between fresh-or-empty rows.
  const auto stale_holds_multiple = [&](std::int64_t start, std::int64_t end) {
    const KeyRange in = intersect({start + d, end + d}, {from, hi});
    return !none(in) && (in.start + c - 1) / c * c < in.end;
  };
  std::int64_t at = 0;
  for (const KeyRange& f : b.fresh_or_empty.spans) {
    if (f.start > at) {
      if (!work.spend(1) || stale_holds_multiple(at, f.start)) return false;
    }
    at = f.end;
  }
  if (at < q_len && (!work.spend(1) || stale_holds_multiple(at, q_len))) return false;
  return true;
}

// add_joint_chunks on the batches' fresh rows, stretch by stretch.
template <class Budget>
void add_fresh_chunks(Budget& work, std::int64_t q_len, BaseEvidence& ev, const std::vector<FreshRows>& fresh,
                      std::int64_t d) {
  std::vector<KeyRange> attending;
  for (const FreshRows& b : fresh)
    attending.insert(attending.end(), b.fresh_attending.spans.begin(), b.fresh_attending.spans.end());
  DocSet positions = DocSet::from(std::move(attending));
  for (const FreshRows& b : fresh) {
    if (positions.spans.empty()) return;  // no row is fresh in every batch: no joint chunk
    if (!work.spend(static_cast<std::int64_t>(positions.spans.size() + b.fresh_or_empty.spans.size()))) return;
    positions = positions.meet(b.fresh_or_empty);
  }
  add_joint_chunks(
      ev,
      [&](const auto& visit) {
        for (const KeyRange& r : positions.spans)
          for (std::int64_t q = std::max(r.start, 1 - d); q < r.end; ++q)
            if (!work.spend(1) || !visit(q + d)) return;
      },
      [&](std::int64_t c) {
        const std::int64_t from = first_multiple_on_rows(c, d);
        return std::all_of(fresh.begin(), fresh.end(),
                           [&](const FreshRows& b) { return multiples_fresh(work, q_len, b, c, from, d); });
      },
      [&](std::int64_t c) {
        // Positive multiples of c at the positions of fresh attending rows: multiple by
        // multiple or stretch by stretch, whichever are fewer.
        std::int64_t shown = 0;
        const std::int64_t from = first_multiple_on_rows(c, d), hi = q_len + d;
        const std::int64_t multiples = from < hi ? (hi - 1) / c - (from - 1) / c : 0;
        for (const FreshRows& b : fresh) {
          if (multiples > static_cast<std::int64_t>(b.fresh_attending.spans.size())) continue;
          for (std::int64_t m = from; m < hi && shown < 2; m += c) {
            if (!work.spend(1)) return false;
            if (b.fresh_attending.contains(m - d)) shown += b.copies >= 2 ? 2 : 1;
          }
        }
        for (const FreshRows& b : fresh) {
          if (multiples <= static_cast<std::int64_t>(b.fresh_attending.spans.size())) continue;
          for (const KeyRange& r : b.fresh_attending.spans) {
            if (shown >= 2 || !work.spend(1)) return shown >= 2;
            const std::int64_t lo = std::max<std::int64_t>(r.start + d, 1), end = r.end + d;
            if (lo >= end) continue;
            const std::int64_t n = floor_div(end - 1, c) - floor_div(lo - 1, c);
            if (n > 0) shown += b.copies >= 2 || n >= 2 ? 2 : 1;
          }
        }
        return shown >= 2;
      });
}

// The parameters the rows suggest for bases at key offset d (0: top_left; K - Q:
// bottom_right). `batch`: the logical batch count (a broadcast table's one batch stands
// for all). Block evidence is kept as pieces: a stretch of rows reaching past their
// position, each row's [p, last] overlapping the next row's, is one connected piece, and
// the blocks are the unions of overlapping pieces however they are cut.
template <RowReader Rows>
BaseEvidence gather_evidence(const std::vector<UniqueBatch<Rows>>& batches, std::int64_t d, std::int64_t batch) {
  BaseEvidence ev;
  if (batches.empty()) return ev;
  auto&& work = batches.front().rows.budget();
  const std::int64_t Q = batches.front().rows.q_len();
  std::vector<FreshRows> fresh_by_batch;
  fresh_by_batch.reserve(batches.size());
  std::vector<std::int64_t> all_starts;                     // every batch's starts (add_cross_batch_starts)
  std::vector<std::pair<std::int64_t, std::int64_t>> pieces;  // (start, end) of block pieces
  std::vector<std::int64_t> empty_edges;                     // where rows turn empty, per batch
  for (const UniqueBatch<Rows>& ub : batches) {
    std::vector<std::int64_t> starts;  // the first distinct positive row starts, in row order
    std::int64_t first_empty_after_rows = -1;  // a chunk or window that starts past the last valid key
    std::int64_t max_window = 0;
    std::vector<KeyRange> fresh;            // rows that attend nothing or start at their own position
    std::vector<KeyRange> fresh_attending;  // of those, the rows that attend
    const auto add_piece = [&](std::int64_t start, std::int64_t end) {
      // Pieces of one batch come in row order: one that overlaps the last joins it.
      if (!pieces.empty() && pieces.back().first <= start && start < pieces.back().second)
        pieces.back().second = std::max(pieces.back().second, end);
      else
        pieces.emplace_back(start, end);
    };
    const auto add_start = [&](std::int64_t v) {
      if (starts.size() < 4 && std::find(starts.begin(), starts.end(), v) == starts.end()) starts.push_back(v);
    };
    bool has_before = false;
    KeySeg before;
    for (const KeySeg& r : ub.rows.segments()) {
      if (!work.spend(1)) return ev;
      const bool after_attending = has_before && !before.empty;
      const KeySeg prev = before;
      has_before = true;
      before = r;
      if (r.empty) {
        const std::int64_t p = r.q + d;
        if (first_empty_after_rows < 0 && after_attending && p > 0) {
          first_empty_after_rows = p;
          // A window slides past the last valid key L when p - window + 1 > L.
          ev.windows.push_back(p - prev.last_at(r.q - 1));
        }
        add_range(fresh, {r.q, r.end()});
        continue;
      }
      if (r.n == 1) {  // the row rules
        const std::int64_t p = r.q + d;
        if (r.first > 0) max_window = std::max(max_window, p - r.first + 1);
        if (r.last > p) ev.prefix = std::max(ev.prefix, r.last + 1);
        if (r.first > 0 && r.first <= p) add_start(r.first);
        if (r.last > p && p >= 0) add_piece(p, r.last + 1);
        if (r.first == p) {
          add_range(fresh, {r.q, r.q + 1});
          add_range(fresh_attending, {r.q, r.q + 1});
        }
        continue;
      }
      // The same rules on a stretch, in closed form.
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
        add_start(r.first_at(r.q + j));
        if (r.d_first == 0) break;  // one value
      }
      // Blocks: rows with last > p and p >= 0.
      const KeyRange block = intersect(reach, {std::clamp<std::int64_t>(-d - r.q, 0, n), n});
      if (!none(block))
        add_piece(r.q + block.start + d, std::max(r.last_at(r.q + block.start), r.last_at(r.q + block.end - 1)) + 1);
      // Fresh rows: first == p, i.e. (first - q - d) + (d_first - 1) j == 0.
      const KeyRange at = on_diagonal({r.q, r.end()}, r.q, r.first - r.q - d, r.d_first - 1);
      if (!none(at)) {
        add_range(fresh, at);
        add_range(fresh_attending, at);
      }
    }
    if (max_window > 0) ev.windows.push_back(max_window);
    {
      // A chunk C shows as a fresh start at every multiple of C that has a row (or an
      // empty row, past the valid keys): the first three fresh attending rows at whose
      // every multiple from 2C on the rows are fresh or empty.
      FreshRows rows;
      rows.fresh_or_empty = DocSet::from(std::move(fresh));
      std::int64_t at = 0;
      for (const KeyRange& f : rows.fresh_or_empty.spans) {
        rows.stale_stretches += f.start > at;
        at = f.end;
      }
      rows.stale_stretches += at < Q;
      rows.fresh_attending = DocSet::from(std::move(fresh_attending));
      rows.copies = ub.logical.empty() ? batch : static_cast<std::int64_t>(ub.logical.size());
      int found = 0;
      for (const KeyRange& f : rows.fresh_attending.spans) {
        for (std::int64_t q = std::max(f.start, 1 - d); q < f.end && found < 3; ++q) {
          if (!work.spend(1)) return ev;
          const std::int64_t c = q + d;
          if (multiples_fresh(work, Q, rows, c, 2 * c, d)) {
            ev.chunks.push_back(c);
            ++found;
          }
          if (work.exhausted()) return ev;
        }
        if (found >= 3) break;
      }
      fresh_by_batch.push_back(std::move(rows));
    }
    // A chunk start is a multiple of the chunk; kv_valid and documents add other starts.
    // Candidates: the first few starts (and where rows turn empty), their gaps and gcds.
    // Every distinct batch counts: padding can hide the chunk in all batches but one
    // (issue 11: [3,1,3,4], kv_valid [[3,4],[0,0],[0,2]] shows it only in the third).
    // Batches with the same starts add the same candidates (at most 25 numbers), which
    // finish_evidence makes unique.
    if (first_empty_after_rows > 0) {
      starts.push_back(first_empty_after_rows);
      empty_edges.push_back(first_empty_after_rows);
    }
    add_start_chunks(ev, starts);
    all_starts.insert(all_starts.end(), starts.begin(), starts.end());
  }
  if (batches.size() > 1) add_cross_batch_starts(ev, std::move(all_starts));
  add_fresh_chunks(work, Q, ev, fresh_by_batch, d);
  // Where rows turn empty past the valid keys is a chunk boundary, a multiple of the
  // chunk: its divisors hold the chunk even when no single batch shows it (two batches
  // ending at 4 and 6 show chunk 2 only together). Each distinct edge once.
  std::sort(empty_edges.begin(), empty_edges.end());
  empty_edges.erase(std::unique(empty_edges.begin(), empty_edges.end()), empty_edges.end());
  for (const std::int64_t edge : empty_edges)
    for (std::int64_t f = 1; f <= edge / f; ++f) {
      if (!work.spend(1)) return ev;
      if (edge % f == 0) ev.chunks.insert(ev.chunks.end(), {f, edge / f});
    }
  // Documents and kv_valid truncate a block differently in each batch (pieces sorted by
  // start, then end).
  std::sort(pieces.begin(), pieces.end());
  finish_evidence(ev, pieces);
  return ev;
}

// Whether every row lies inside its chunk of size c (first >= floor(p / c) c, p >= 0):
// modifiers only shrink rows, so a chunk failing this cannot fit, and one pass with an
// early exit spares the fit of the many candidates that evidence from every batch
// brings. A segment is checked chunk by chunk, out at the first row outside its chunk.
template <RowReader Rows>
bool chunk_bounds_rows(const std::vector<UniqueBatch<Rows>>& batches, std::int64_t c, std::int64_t d) {
  for (const UniqueBatch<Rows>& ub : batches) {
    auto&& work = ub.rows.budget();
    for (const KeySeg& r : ub.rows.segments()) {
      if (r.empty) continue;
      const std::int64_t pa = r.q + d, pb = r.end() - 1 + d;
      if (pa < 0) return false;
      for (std::int64_t k = pa / c; k <= pb / c; ++k) {
        if (!work.spend(1)) return false;
        const std::int64_t a = std::max(pa, k * c) - d, b = std::min(pb, k * c + c - 1) - d;  // rows, inclusive
        if (std::min(r.first_at(a), r.first_at(b)) < k * c) return false;
      }
    }
  }
  return true;
}

// The search over every candidate base for the unclassified structure `out`, reading
// the batches' rows: the best fit, or nothing (also when the budget is spent).
template <RowReader Rows>
std::optional<MaskStructure> search_rows(const MaskStructure& out, const std::vector<UniqueBatch<Rows>>& batches) {
  return search_candidates(
      out, [&](const MaskStructure& base) { return fit_structure(base, batches); },
      [&](std::int64_t d) { return gather_evidence(batches, d, out.batch); },
      [&](std::int64_t c, std::int64_t d) { return chunk_bounds_rows(batches, c, d); },
      [&] { return !batches.empty() && batches.front().rows.budget().exhausted(); });
}

}  // namespace masklens::detail
