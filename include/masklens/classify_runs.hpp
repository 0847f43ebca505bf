// classify(SpanRuns): the verdict classify(SpanTable) gives for the expanded table,
// field for field and error for error, in O(runs) instead of O(rows) for the masks
// frameworks pass (full, causal at either alignment, sliding windows, packed documents,
// padded keys or queries, prefix-LM; chunks and blocks too, in O(runs + chunks or blocks)).
//
// It is the same search as classify.hpp — the same fast path, and the same steps
// (classify_rows.hpp) over another reader of the rows, SegmentRows below:
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
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "classify.hpp"
#include "classify_rows.hpp"
#include "classify_search.hpp"
#include "classify_segments.hpp"
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

// One batch's rows as canonical segments (RowReader, classify_rows.hpp): a comparison
// renders the probe's rows as segments (structure_pieces) and compares them with these,
// out at the first that differs; every step spends `work`.
struct SegmentRows {
  const KeyRows* rows = nullptr;
  std::int64_t rows_in_batch = 0;
  Work* work = nullptr;

  [[nodiscard]] std::int64_t q_len() const noexcept { return rows_in_batch; }
  [[nodiscard]] RowSpan row(std::int64_t t) const noexcept { return row_at(*rows, t); }
  [[nodiscard]] const KeyRows& segments() const noexcept { return *rows; }
  [[nodiscard]] KeyRange attending() const noexcept {
    const auto attends = [](const KeySeg& s) { return !s.empty; };
    const auto first = std::find_if(rows->begin(), rows->end(), attends);
    if (first == rows->end()) return {0, 0};
    return {first->q, std::find_if(rows->rbegin(), rows->rend(), attends)->end()};
  }
  bool matches(MaskStructure& probe, const DocSet* docs) const {
    std::size_t k = 0;
    auto compare = [&](const KeySeg& seg) { return k < rows->size() && (*rows)[k++] == seg; };
    KeyRowsBuilder<decltype(compare)> builder(compare);
    auto push = [&builder](const KeySeg& seg) { return builder.push(seg); };
    return structure_pieces(probe, docs, *work, push) && builder.finish() && k == rows->size();
  }
  [[nodiscard]] Work& budget() const noexcept { return *work; }
};
static_assert(RowReader<SegmentRows>);

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
    Work work{0, options.work_floor + options.work_per_run * runs};
    const auto done = [&](MaskStructure s) -> Result<MaskStructure> {
      if (stats) stats->work = work.used;
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
        if (!structure_rows(probe, nullptr, work, expected)) break;
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
    std::vector<UniqueBatch<SegmentRows>> batches;
    std::unordered_multimap<std::uint64_t, std::size_t> by_hash;
    for (std::int64_t b = 0; b < t.distinct_batch; ++b) {
      const KeyRows& rows = slice(b, 0);
      const std::uint64_t h = hash_rows(rows);
      std::optional<std::size_t> found;
      auto [lo, hi] = by_hash.equal_range(h);
      for (auto it = lo; it != hi && !found; ++it)
        if (*batches[it->second].rows.rows == rows) found = it->second;
      if (!found) {
        found = batches.size();
        batches.push_back({SegmentRows{&rows, t.q_len, &work}, {}});
        by_hash.emplace(h, *found);
      }
      if (t.distinct_batch > 1) batches[*found].logical.push_back(b);
    }

    std::optional<MaskStructure> best = search_rows(out, batches);
    if (work.exhausted()) return expand_and_classify(t, stats);
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
