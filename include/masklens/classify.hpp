// classify: SpanTable -> MaskStructure. A proof, not a heuristic: every candidate
// structure is rendered row by row and compared with the scanned spans, so the
// verdict is exact or `arbitrary`. Among exact descriptions the one with the fewest
// numbers wins (MaskStructure::description_cost), ties going to the earlier kind, then
// to the one without q_valid, then to top_left (precedes()).
// Work is O(rows x candidates), independent of K: the span table is the input. A fast
// path first looks for a description that takes no number (full, or causal at either
// alignment) in one pass over the rows; where one matches every row it is canonical
// and nothing else is built (cost_free_match).
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <numeric>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "row_span.hpp"
#include "span_table.hpp"
#include "status.hpp"
#include "structure.hpp"

namespace masklens {
namespace detail {

// Rows of one batch that several logical batches share (stride 0 or equal content).
struct UniqueBatch {
  std::span<const RowSpan> rows;
  // The logical batch indices with these rows; empty when the table is broadcast over
  // the batch and these rows stand for every batch (B may be 2^40: nothing per batch).
  std::vector<std::int64_t> logical;
};

// The modifiers one batch needs on top of a base structure.
struct BatchFit {
  std::optional<KeyRange> kv;             // absent = every key valid
  std::vector<std::int64_t> segments;     // empty = one document
  std::optional<KeyRange> q;              // absent = every query row valid
  // Numbers this batch adds; a modifier other batches already list (`paid`) adds none.
  [[nodiscard]] std::int64_t cost(bool kv_paid = false, bool q_paid = false) const noexcept {
    return (kv && !kv_paid ? 2 : 0) + static_cast<std::int64_t>(segments.size()) + (q && !q_paid ? 2 : 0);
  }
};

inline bool rows_match(const MaskStructure& probe, std::span<const RowSpan> rows) noexcept {
  for (std::size_t q = 0; q < rows.size(); ++q)
    if (!probe.row(0, static_cast<std::int64_t>(q)).same_keys(rows[q])) return false;
  return true;
}

// Document starts the rows show, given the base rule and key range [s, e): a row that
// starts exactly at its own position although neither the base nor s starts it there,
// or a row that ends just before the next position although neither the base nor e ends it.
// With `at_empty_edges`, also where rows turn empty or non-empty: a document whose keys
// are all padding leaves only empty rows, and its edge shows nowhere else.
inline std::vector<std::int64_t> detect_documents(const MaskStructure& probe, std::span<const RowSpan> rows,
                                                  std::int64_t s, std::int64_t e, bool at_empty_edges) {
  std::vector<std::int64_t> bounds{0};
  const auto q_len = static_cast<std::int64_t>(rows.size());
  RowSpan base_before = probe.base_row(0);  // carried from one row to the next: one base_row per row
  for (std::int64_t t = 1; t < q_len; base_before = probe.base_row(t), ++t) {
    const RowSpan& here = rows[static_cast<std::size_t>(t)];
    const RowSpan& before = rows[static_cast<std::size_t>(t - 1)];
    const RowSpan base_here = probe.base_row(t);
    const bool starts = !here.empty() && !base_here.empty() && here.first == t && t > std::max(base_here.first, s);
    const bool ends = !before.empty() && !base_before.empty() && before.last == t - 1 &&
                      t - 1 < std::min(base_before.last, e - 1);
    // Rows turning empty at a q_valid bound are the padding's, not a document's.
    const bool empty_edge = here.empty() != before.empty();
    const bool q_edge = empty_edge && probe.has_q_valid() && (t == probe.q_valid[0].start || t == probe.q_valid[0].end);
    const bool edge = at_empty_edges && empty_edge && !q_edge;
    // Rows next to padded query rows may sit in a document that starts or ends among
    // them: the edge shows only as their first key, or their last key + 1.
    const bool hidden_start = (edge || q_edge) && !here.empty() && !base_here.empty() && here.first < t &&
                              here.first > std::max(base_here.first, s);
    const bool hidden_end = (edge || q_edge) && !before.empty() && !base_before.empty() && before.last + 1 > t &&
                            before.last < std::min(base_before.last, e - 1);
    if (hidden_start) bounds.push_back(here.first);
    else if (hidden_end) bounds.push_back(before.last + 1);
    else if (starts || ends || edge) bounds.push_back(t);
  }
  if (bounds.size() == 1) return {};
  bounds.push_back(q_len);
  // Bounds come in row order but for the hidden starts and ends, which are rare: a
  // sorted list (under the full base every row of a causal mask ends one, Q of them)
  // is only checked.
  if (!std::is_sorted(bounds.begin(), bounds.end())) std::sort(bounds.begin(), bounds.end());
  bounds.erase(std::unique(bounds.begin(), bounds.end()), bounds.end());
  return bounds;
}

// Which modifiers a fit may use.
struct ModifierKinds {
  bool kv = true, segments = true, q = true;
  [[nodiscard]] int count() const noexcept { return int{kv} + int{segments} + int{q}; }
};

// The kv_valid ranges worth trying for a batch whose attending rows start at key
// `f_first` (the first of them; -1: none attends), end at `l_last` (the last), and span
// [f_min, l_max]: each combination of those ends, the whole range left out (tried
// without kv_valid). The table's fit_keys and the runs' (classify_runs.hpp) share it.
inline std::vector<KeyRange> kv_valid_candidates(bool allow_kv, std::int64_t f_first, std::int64_t l_last,
                                                 std::int64_t f_min, std::int64_t l_max, std::int64_t k_len) {
  std::vector<KeyRange> kv_candidates;
  if (!allow_kv) {
    // only the whole key range, tried by the caller
  } else if (f_first < 0) {
    kv_candidates.push_back({0, 0});  // nothing attends: no key is valid
  } else {
    for (std::int64_t s : {std::int64_t{0}, f_first, f_min})
      for (std::int64_t e : {k_len, l_last + 1, l_max + 1})
        if (s < e && !(s == 0 && e == k_len) &&
            std::find(kv_candidates.begin(), kv_candidates.end(), KeyRange{s, e}) == kv_candidates.end())
          kv_candidates.push_back({s, e});
  }
  return kv_candidates;
}

// The cheapest key-side modifiers (kv_valid, segments) that make `probe` (a base
// structure with batch 1, q_valid set or not) equal `rows`.
inline std::optional<BatchFit> fit_keys(MaskStructure& probe, std::span<const RowSpan> rows, bool allow_segments,
                                        bool allow_kv, bool kv_paid = false) {
  probe.segments.clear();
  probe.kv_valid.clear();
  if (rows_match(probe, rows)) return BatchFit{};

  const std::int64_t k_len = probe.k_len;
  std::int64_t f_first = -1, l_last = -1, f_min = RowSpan::kNoKey, l_max = -1;
  bool any_empty = false;
  for (const RowSpan& r : rows) {
    if (r.empty()) {
      any_empty = true;
      continue;
    }
    if (f_first < 0) f_first = r.first;
    l_last = r.last;
    f_min = std::min(f_min, r.first);
    l_max = std::max(l_max, r.last);
  }
  std::vector<KeyRange> kv_candidates = kv_valid_candidates(allow_kv, f_first, l_last, f_min, l_max, k_len);
  for (const KeyRange& kv : kv_candidates) {
    probe.kv_valid.assign(1, kv);
    if (rows_match(probe, rows)) return BatchFit{kv, {}, std::nullopt};  // cost 2: documents cost at least 3
  }
  if (!allow_segments) return std::nullopt;

  std::optional<BatchFit> best;
  kv_candidates.insert(kv_candidates.begin(), KeyRange{0, k_len});
  for (const KeyRange& kv : kv_candidates)
    for (bool at_empty_edges : {false, true}) {
    // Without empty rows there are no empty edges: the second pass would find the same
    // documents and reach the same fit (or the same mismatch) again.
    if (at_empty_edges && !any_empty) continue;
    std::vector<std::int64_t> docs = detect_documents(probe, rows, kv.start, kv.end, at_empty_edges);
    if (docs.empty()) continue;
    BatchFit fit;
    if (!(kv.start == 0 && kv.end == k_len)) fit.kv = kv;
    if (best && best->cost(kv_paid) <= fit.cost(kv_paid) + static_cast<std::int64_t>(docs.size())) continue;
    probe.segments.assign(1, docs);
    if (fit.kv) probe.kv_valid.assign(1, *fit.kv); else probe.kv_valid.clear();
    if (!rows_match(probe, rows)) continue;
    // Where padding meets a document edge the evidence can name a start twice over;
    // drop the starts the rows do not need (only those at kv edges or empty edges).
    for (std::size_t i = docs.size() - 1; i-- > 1;) {
      const std::int64_t t = docs[i];
      const bool suspect = t == kv.start || t == kv.end || rows[static_cast<std::size_t>(t)].empty() ||
                           rows[static_cast<std::size_t>(t - 1)].empty();
      if (!suspect) continue;
      probe.segments[0].erase(probe.segments[0].begin() + static_cast<std::ptrdiff_t>(i));
      if (rows_match(probe, rows)) docs = probe.segments[0];
      else probe.segments[0] = docs;
    }
    fit.segments = docs.size() > 2 ? std::move(docs) : std::vector<std::int64_t>{};
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
inline std::optional<BatchFit> fit_batch(MaskStructure& probe, std::span<const RowSpan> rows, ModifierKinds kinds,
                                         bool kv_paid = false, bool q_paid = false) {
  const std::int64_t q_cost = q_paid ? 0 : 2;
  probe.q_valid.clear();
  std::optional<BatchFit> best = fit_keys(probe, rows, kinds.segments, kinds.kv, kv_paid);
  if (!kinds.q || (best && best->cost(kv_paid) <= q_cost)) return best;
  const auto attends = [](const RowSpan& r) { return !r.empty(); };
  const auto first = std::find_if(rows.begin(), rows.end(), attends);
  const auto last = std::find_if(rows.rbegin(), rows.rend(), attends);
  // Nothing attends: q_valid [0, 0) (kv_valid [0, 0) says the same, where allowed).
  const KeyRange attending = first == rows.end() ? KeyRange{0, 0} : KeyRange{first - rows.begin(), rows.rend() - last};
  if (attending == KeyRange{0, static_cast<std::int64_t>(rows.size())}) return best;
  probe.q_valid.assign(1, attending);
  std::optional<BatchFit> with_q = fit_keys(probe, rows, kinds.segments, kinds.kv, kv_paid);
  probe.q_valid.clear();
  if (!with_q || (best && with_q->cost(kv_paid) + q_cost >= best->cost(kv_paid))) return best;
  with_q->q = attending;
  return with_q;
}

// Fits `base` to every unique batch with modifiers of `kinds`; the assembled structure,
// or nothing if some batch does not fit. `fit_batch_of(probe, batch, kinds, kv_paid,
// q_paid)` fits one batch: the table reads its rows, classify_runs.hpp its segments.
template <class Batches, class FitBatch>
std::optional<MaskStructure> assemble_fit(const MaskStructure& base, const Batches& batches, ModifierKinds kinds,
                                          const FitBatch& fit_batch_of) {
  MaskStructure probe = base;
  probe.batch = 1;
  std::vector<BatchFit> fits;
  fits.reserve(batches.size());
  for (const auto& ub : batches) {
    std::optional<BatchFit> fit = fit_batch_of(probe, ub, kinds, false, false);
    if (!fit) return std::nullopt;
    fits.push_back(std::move(*fit));
  }
  // Once one batch lists kv_valid or q_valid every batch has an entry: the others may
  // use theirs for free, which can save them documents.
  const bool kv_paid = std::any_of(fits.begin(), fits.end(), [](const BatchFit& f) { return f.kv.has_value(); });
  const bool q_paid = std::any_of(fits.begin(), fits.end(), [](const BatchFit& f) { return f.q.has_value(); });
  if (kv_paid || q_paid)
    for (std::size_t i = 0; i < fits.size(); ++i)
      if (fits[i].cost(kv_paid, q_paid) > 0)
        if (std::optional<BatchFit> fit = fit_batch_of(probe, batches[i], kinds, kv_paid, q_paid);
            fit && fit->cost(kv_paid, q_paid) < fits[i].cost(kv_paid, q_paid))
          fits[i] = std::move(*fit);
  MaskStructure s = base;
  s.segments.clear();
  s.kv_valid.clear();
  s.q_valid.clear();
  const bool any_kv = std::any_of(fits.begin(), fits.end(), [](const BatchFit& f) { return f.kv.has_value(); });
  const bool any_q = std::any_of(fits.begin(), fits.end(), [](const BatchFit& f) { return f.q.has_value(); });
  const bool any_docs = std::any_of(fits.begin(), fits.end(), [](const BatchFit& f) { return !f.segments.empty(); });
  // A table broadcast over the batch gets each modifier once, for every batch.
  const bool every_batch = batches.size() == 1 && batches[0].logical.empty();
  const auto entries = every_batch ? std::size_t{1} : static_cast<std::size_t>(s.batch);
  if (any_kv) s.kv_valid.assign(entries, KeyRange{0, s.k_len});
  if (any_docs) s.segments.assign(entries, std::vector<std::int64_t>{0, s.q_len});
  if (any_q) s.q_valid.assign(entries, KeyRange{0, s.q_len});
  const auto place = [&](std::size_t entry, const BatchFit& fit) {
    if (fit.kv) s.kv_valid[entry] = *fit.kv;
    if (fit.q) s.q_valid[entry] = *fit.q;
    if (!fit.segments.empty()) s.segments[entry] = fit.segments;
  };
  if (every_batch) place(0, fits[0]);
  else
    for (std::size_t i = 0; i < batches.size(); ++i)
      for (std::int64_t b : batches[i].logical) place(static_cast<std::size_t>(b), fits[i]);
  return s;
}

inline std::optional<MaskStructure> fit_structure_with(const MaskStructure& base, const std::vector<UniqueBatch>& batches,
                                                       ModifierKinds kinds) {
  return assemble_fit(base, batches, kinds,
                      [](MaskStructure& probe, const UniqueBatch& ub, ModifierKinds k, bool kv_paid, bool q_paid) {
                        return fit_batch(probe, ub.rows, k, kv_paid, q_paid);
                      });
}

// Whether exact description `a` comes before `b` in the canonical order
// (docs/structures.md): fewer numbers; at equal numbers the earlier kind, then the one
// without q_valid, then top_left (full has no alignment). What stays tied is not ordered:
// the search keeps the first it finds.
inline bool precedes(const MaskStructure& a, const MaskStructure& b) noexcept {
  const std::int64_t ca = a.description_cost(), cb = b.description_cost();
  if (ca != cb) return ca < cb;
  if (a.kind != b.kind) return a.kind < b.kind;
  if (a.has_q_valid() != b.has_q_valid()) return !a.has_q_valid();
  const auto aligned = [](const MaskStructure& s) {
    return s.kind == StructureKind::full ? Alignment::top_left : s.alignment;
  };
  return aligned(a) < aligned(b);
}

// Fits `base` to every unique batch with the fewest numbers. Each batch takes its own
// cheapest modifiers, but a modifier one batch needs is paid by every batch (an entry
// each), so when batches chose two or more kinds, fits restricted to fewer kinds can
// be cheaper in all: those are tried too. (With one kind or none the per-batch choice
// is the cheapest: no batch can do better under any set of kinds.)
// `fit_with(kinds)` is fit_structure_with for the given kinds (the table's or the runs').
template <class FitWith>
std::optional<MaskStructure> fit_fewest_numbers(const MaskStructure& base, const FitWith& fit_with) {
  const ModifierKinds all{true, base.q_len == base.k_len && base.q_len > 1, true};
  std::optional<MaskStructure> best = fit_with(all);
  if (!best || int{best->has_kv_valid()} + int{best->has_segments()} + int{best->has_q_valid()} < 2) return best;
  for (int mask = 1; mask < 8; ++mask) {
    const ModifierKinds kinds{(mask & 1) != 0, (mask & 2) != 0 && all.segments, (mask & 4) != 0};
    if (kinds.count() == all.count() || (mask & 2 && !all.segments)) continue;
    std::optional<MaskStructure> fitted = fit_with(kinds);
    if (fitted && precedes(*fitted, *best)) best = std::move(fitted);
  }
  return best;
}

inline std::optional<MaskStructure> fit_structure(const MaskStructure& base, const std::vector<UniqueBatch>& batches) {
  return fit_fewest_numbers(base, [&](ModifierKinds kinds) { return fit_structure_with(base, batches, kinds); });
}

// Parameters the base kinds could have, read off the rows (modifiers only shrink rows,
// so maxima over rows recover the base parameter wherever it binds once).
struct BaseEvidence {
  std::vector<std::int64_t> windows;       // max p - first + 1 over rows starting after key 0,
                                           // and where rows turn empty past the last key
  std::int64_t prefix = 0;                 // max last + 1 over rows reaching past p
  std::vector<std::int64_t> chunks;        // chunk sizes suggested by where rows start
  std::vector<KeyRange> blocks;            // runs of rows reaching the same key past p
};

// The chunk sizes a batch's first distinct row starts suggest: each start, and the
// gcd and difference of each pair.
inline void add_start_chunks(BaseEvidence& ev, const std::vector<std::int64_t>& starts) {
  for (std::size_t j = 0; j < starts.size(); ++j) {
    ev.chunks.push_back(starts[j]);
    for (std::size_t k = 0; k < j; ++k) {
      ev.chunks.push_back(std::gcd(starts[j], starts[k]));
      if (starts[j] > starts[k]) ev.chunks.push_back(starts[j] - starts[k]);
    }
  }
}

// The chunk sizes the starts of all batches suggest together: each batch's starts
// suggest chunks on their own (add_start_chunks), but where query padding leaves a batch
// one row, its one start says nothing alone ([2,1,8,10] bottom-right chunk 2 with
// q_valid [[4,5],[7,8]] starts at 6 in one batch and 8 in the other). The smallest few
// distinct starts over every batch, and their gaps and gcds.
inline void add_cross_batch_starts(BaseEvidence& ev, std::vector<std::int64_t> starts) {
  constexpr std::size_t kCrossStarts = 6;
  std::sort(starts.begin(), starts.end());
  starts.erase(std::unique(starts.begin(), starts.end()), starts.end());
  if (starts.size() > kCrossStarts) starts.resize(kCrossStarts);
  add_start_chunks(ev, starts);
}

// Chunk sizes that fresh rows (a row starting at its own key position) show across
// batches and across boundaries. A chunk C starts a fresh row at every multiple of C
// that has an attending row in every batch, so each multiple must be fresh or empty in
// every batch (`every_multiple_fresh(c)`). Per-batch evidence takes each batch's first
// few such starts; documents crowd those out (a chunk past Q/2 is one boundary, which
// one document offset per batch also describes: the chunk wins when two or more
// batches, or two boundaries, show it) and padding hides the first boundary (left
// padding empties the rows of chunk 5, and 10 and 15 show it only by their gap). So,
// in order of the key positions `fresh_positions` visits (fresh or empty in every
// batch, and some batch's row there attends), each gap from the previous such position
// and the position itself are tried, and the first three that hold at every multiple
// and that `shown_twice(c)` (fresh attending rows at multiples of c, counted over
// logical batches, at least 2) are kept.
template <class Positions, class EveryMultipleFresh, class ShownTwice>
void add_joint_chunks(BaseEvidence& ev, const Positions& fresh_positions, const EveryMultipleFresh& every_multiple_fresh,
                      const ShownTwice& shown_twice) {
  int found = 0;
  std::int64_t previous = 0;
  std::vector<std::int64_t> gaps_tried;  // sorted: distinct gaps are few (they sum to at most Q)
  const auto try_chunk = [&](std::int64_t c) {
    if (found < 3 && every_multiple_fresh(c) && shown_twice(c)) {
      ev.chunks.push_back(c);
      ++found;
    }
  };
  fresh_positions([&](std::int64_t p) {
    if (previous > 0) {
      const std::int64_t gap = p - previous;
      const auto at = std::lower_bound(gaps_tried.begin(), gaps_tried.end(), gap);
      if (at == gaps_tried.end() || *at != gap) {
        gaps_tried.insert(at, gap);
        try_chunk(gap);
      }
    }
    try_chunk(p);
    previous = p;
    return found < 3;
  });
}

// The first multiple of c that is a key position of some row (>= d, the position of
// row 0, when d > 0): rows before it do not exist. c >= 1.
inline std::int64_t first_multiple_on_rows(std::int64_t c, std::int64_t d) noexcept {
  return d <= c ? c : (d + c - 1) / c * c;
}

// The candidate lists sorted and unique, and the blocks: `pieces`, (start, end) key
// ranges sorted by start, joined where they overlap (the pieces of one block overlap,
// and their union is the block).
template <class Pieces>
void finish_evidence(BaseEvidence& ev, const Pieces& pieces) {
  for (auto* list : {&ev.chunks, &ev.windows}) {
    std::sort(list->begin(), list->end());
    list->erase(std::unique(list->begin(), list->end()), list->end());
  }
  // The window binds wherever rows show it at full length: the largest candidate first.
  std::reverse(ev.windows.begin(), ev.windows.end());
  for (const auto& [start, end] : pieces) {
    if (!ev.blocks.empty() && start < ev.blocks.back().end)
      ev.blocks.back().end = std::max(ev.blocks.back().end, end);
    else
      ev.blocks.push_back({start, end});
  }
}

// `batch`: the logical batch count (a broadcast table's one batch stands for all).
inline BaseEvidence gather_evidence(const std::vector<UniqueBatch>& batches, std::int64_t d, std::int64_t batch) {
  BaseEvidence ev;
  const std::size_t q_len = batches.empty() ? 0 : batches[0].rows.size();
  // Over every batch: whether each row is fresh or empty in all, and in how many logical
  // batches it attends and is fresh (add_joint_chunks).
  std::vector<char> fresh_or_empty_in_all(q_len, 1);
  std::vector<std::int64_t> fresh_attending(q_len, 0);
  std::vector<std::int64_t> all_starts;  // every batch's starts (add_cross_batch_starts)
  // Vectors, sorted once at the end, rather than ordered sets: <map> and <set> would
  // cost every consumer's parse more than they save here (bench/README.md, issue 15).
  std::vector<std::pair<std::int64_t, std::int64_t>> runs;  // (start, end) of each run
  std::vector<std::int64_t> empty_edges;                     // where rows turn empty, per batch
  for (std::size_t i = 0; i < batches.size(); ++i) {
    std::vector<std::int64_t> starts;  // the first distinct positive row starts, in row order
    std::int64_t run_start = -1, run_last = -1;
    const auto close_run = [&] {
      if (run_start >= 0) {
        runs.emplace_back(run_start, run_last + 1);
      }
      run_start = -1;
    };
    const std::span<const RowSpan> rows = batches[i].rows;
    std::int64_t first_empty_after_rows = -1;  // a chunk or window that starts past the last valid key
    std::int64_t max_window = 0;
    for (std::size_t q = 0; q < rows.size(); ++q) {
      const RowSpan& r = rows[q];
      const std::int64_t p = static_cast<std::int64_t>(q) + d;
      if (r.empty()) {
        if (first_empty_after_rows < 0 && q > 0 && !rows[q - 1].empty() && p > 0) {
          first_empty_after_rows = p;
          // A window slides past the last valid key L when p - window + 1 > L.
          ev.windows.push_back(p - rows[q - 1].last);
        }
        close_run();
        continue;
      }
      if (r.first > 0) max_window = std::max(max_window, p - r.first + 1);
      if (r.last > p) ev.prefix = std::max(ev.prefix, r.last + 1);
      if (r.first > 0 && r.first <= p && starts.size() < 4 &&
          std::find(starts.begin(), starts.end(), r.first) == starts.end())
        starts.push_back(r.first);
      if (r.last > p && p >= 0) {
        if (run_start >= 0 && r.last != run_last) close_run();
        if (run_start < 0) run_start = p;
        run_last = r.last;
      } else {
        close_run();
      }
    }
    close_run();
    // A chunk start is a multiple of the chunk; kv_valid and documents add other
    // starts, so the first few starts and their gaps are the candidates.
    // Chunk starts are multiples of the chunk; kv_valid and documents add other starts.
    // Candidates: the first few starts (and where rows turn empty), their gaps and gcds.
    if (max_window > 0) ev.windows.push_back(max_window);
    {
      // Rows that start afresh at their own position: a chunk C shows as a fresh start
      // at every multiple of C that has a row (or an empty row, past the valid keys).
      std::vector<char> fresh_or_empty(rows.size(), 0);
      const auto copies = batches[i].logical.empty() ? batch : static_cast<std::int64_t>(batches[i].logical.size());
      for (std::size_t q = 0; q < rows.size(); ++q) {
        fresh_or_empty[q] = rows[q].empty() || rows[q].first == static_cast<std::int64_t>(q) + d;
        fresh_or_empty_in_all[q] = static_cast<char>(fresh_or_empty_in_all[q] & fresh_or_empty[q]);
        if (!rows[q].empty() && fresh_or_empty[q]) fresh_attending[q] += copies;
      }
      int found = 0;
      for (std::size_t q = 0; q < rows.size() && found < 3; ++q) {
        const std::int64_t c = static_cast<std::int64_t>(q) + d;
        if (c <= 0 || rows[q].empty() || !fresh_or_empty[q]) continue;
        bool every_multiple = true;
        for (std::int64_t m = 2 * c; m - d < static_cast<std::int64_t>(rows.size()) && every_multiple; m += c)
          every_multiple = fresh_or_empty[static_cast<std::size_t>(m - d)] != 0;
        if (every_multiple) {
          ev.chunks.push_back(c);
          ++found;
        }
      }
    }
    // Every distinct batch counts: padding can hide the chunk in all batches but one
    // (issue 11: [3,1,3,4], kv_valid [[3,4],[0,0],[0,2]] shows it only in the third).
    // Batches with the same starts add the same candidates (at most 25 numbers), which
    // the sort below makes unique.
    if (first_empty_after_rows > 0) {
      starts.push_back(first_empty_after_rows);
      empty_edges.push_back(first_empty_after_rows);
    }
    add_start_chunks(ev, starts);
    all_starts.insert(all_starts.end(), starts.begin(), starts.end());
  }
  if (batches.size() > 1) add_cross_batch_starts(ev, std::move(all_starts));
  {
    const auto rows = static_cast<std::int64_t>(q_len);
    add_joint_chunks(
        ev,
        [&](const auto& visit) {
          for (std::int64_t q = 0; q < rows; ++q)
            if (q + d > 0 && fresh_attending[static_cast<std::size_t>(q)] > 0 &&
                fresh_or_empty_in_all[static_cast<std::size_t>(q)] && !visit(q + d))
              return;
        },
        [&](std::int64_t c) {
          for (std::int64_t m = first_multiple_on_rows(c, d); m - d < rows; m += c)
            if (!fresh_or_empty_in_all[static_cast<std::size_t>(m - d)]) return false;
          return true;
        },
        [&](std::int64_t c) {
          std::int64_t shown = 0;
          for (std::int64_t m = first_multiple_on_rows(c, d); m - d < rows && shown < 2; m += c)
            shown += fresh_attending[static_cast<std::size_t>(m - d)];
          return shown >= 2;
        });
  }
  // Where rows turn empty past the valid keys is a chunk boundary, a multiple of the
  // chunk: its divisors hold the chunk even when no single batch shows it (two batches
  // ending at 4 and 6 show chunk 2 only together). Each distinct edge once.
  std::sort(empty_edges.begin(), empty_edges.end());
  empty_edges.erase(std::unique(empty_edges.begin(), empty_edges.end()), empty_edges.end());
  for (const std::int64_t edge : empty_edges)
    for (std::int64_t f = 1; f <= edge / f; ++f)
      if (edge % f == 0) ev.chunks.insert(ev.chunks.end(), {f, edge / f});
  // Documents and kv_valid truncate a block differently in each batch (runs sorted by
  // start, then end).
  std::sort(runs.begin(), runs.end());
  finish_evidence(ev, runs);
  return ev;
}

// Whether every row lies inside its chunk of size c (first >= floor(p / c) c, p >= 0):
// modifiers only shrink rows, so a chunk failing this cannot fit, and one O(rows) pass
// with an early exit spares the fit of the many candidates that evidence from every
// batch brings.
inline bool chunk_bounds_rows(const std::vector<UniqueBatch>& batches, std::int64_t c, std::int64_t d) noexcept {
  for (const UniqueBatch& ub : batches)
    for (std::size_t q = 0; q < ub.rows.size(); ++q) {
      const RowSpan& r = ub.rows[q];
      const std::int64_t p = static_cast<std::int64_t>(q) + d;
      if (!r.empty() && (p < 0 || r.first < p / c * c)) return false;
    }
  return true;
}

inline std::vector<UniqueBatch> unique_batches(const SpanTable& t) {
  std::vector<UniqueBatch> out;
  // A hash table of the batches seen, chained through vectors (<unordered_map> would
  // cost every consumer's parse more than it saves here: bench/README.md, issue 15):
  // bucket h % buckets holds the last unique batch of such a hash, `next` the one before.
  constexpr std::size_t kNone = SIZE_MAX;
  const std::size_t buckets = std::bit_ceil(static_cast<std::size_t>(t.distinct_batch));
  std::vector<std::size_t> head(buckets, kNone), next;
  std::vector<std::uint64_t> hashes;  // of each unique batch
  for (std::int64_t b = 0; b < t.distinct_batch; ++b) {
    const std::span<const RowSpan> rows = t.slice(b, 0);
    std::uint64_t h = 1469598103934665603ULL;
    for (const RowSpan& r : rows) {
      const std::uint64_t v = r.empty() ? ~0ULL : (static_cast<std::uint64_t>(r.first) * 0x9E3779B97F4A7C15ULL) ^
                                                       static_cast<std::uint64_t>(r.last);
      h = (h ^ v) * 1099511628211ULL;
    }
    std::optional<std::size_t> found;
    std::size_t& bucket = head[h & (buckets - 1)];
    for (std::size_t i = bucket; i != kNone && !found; i = next[i]) {
      const auto& other = out[i].rows;
      if (hashes[i] == h && std::equal(rows.begin(), rows.end(), other.begin(),
                                       [](const RowSpan& a, const RowSpan& c) { return a.same_keys(c); }))
        found = i;
    }
    if (!found) {
      found = out.size();
      out.push_back({rows, {}});
      next.push_back(bucket);
      hashes.push_back(h);
      bucket = *found;
    }
    if (t.distinct_batch > 1) out[*found].logical.push_back(b);
  }
  return out;
}

inline bool heads_agree(const SpanTable& t) noexcept {
  for (std::int64_t b = 0; b < t.distinct_batch; ++b) {
    const auto first = t.slice(b, 0);
    for (std::int64_t h = 1; h < t.distinct_heads; ++h) {
      const auto other = t.slice(b, h);
      for (std::size_t q = 0; q < first.size(); ++q)
        if (!first[q].same_keys(other[q])) return false;
    }
  }
  return true;
}

// The fast path. A description that takes no number at all — full, or causal at
// either alignment, without modifiers — is canonical wherever it is exact: every exact
// description costs >= 0, and a tie goes to the earlier kind, then to top_left, the
// order in which the search in classify_spans() keeps them (with Q == K the two
// alignments coincide and top_left is reported). So one pass that finds such a match
// in every stored row (every distinct slice: a match also proves the heads agree)
// decides the verdict without building evidence or candidates. Rows are compared as
// rows_match does (same keys). It reads only what the comparison needs, keeps all its
// state in registers, never branches on the data within a block of rows, and stops at
// the first block where every candidate has failed.
struct CostFree {
  StructureKind kind = StructureKind::arbitrary;
  Alignment alignment = Alignment::top_left;
  std::uint32_t flags = 0;  // every row's flags ORed (bias; unknown or NaN bits send the table to the checks)
};

inline std::optional<CostFree> cost_free_match(const SpanTable& t) noexcept {
  using U = std::uint64_t;  // two's complement: a malformed row cannot overflow
  const U last_key = static_cast<U>(t.k_len) - 1;
  const std::int64_t d = t.k_len - t.q_len;
  constexpr std::int64_t kBlock = 1024;
  U full = 0, top_left = 0, bottom_right = 0;  // non-zero once some row differs
  std::uint32_t flags = 0;
  const RowSpan* row = t.rows.data();
  for (std::int64_t slice = 0; slice < t.distinct_slices(); ++slice)
    for (std::int64_t q0 = 0; q0 < t.q_len; q0 += kBlock) {
      const std::int64_t q1 = std::min(q0 + kBlock, t.q_len);
      for (std::int64_t q = q0; q < q1; ++q, ++row) {
        const U first = static_cast<U>(row->first), last = static_cast<U>(row->last), count = static_cast<U>(row->count);
        flags |= row->flags;
        // Zero iff the row is the interval [0, last] (first 0, count last + 1); an empty
        // row (count 0) is zero only with last = -1, where no expected row ends.
        const U from_zero = first | (count ^ (last + 1));
        full |= from_zero | (last ^ last_key);
        top_left |= from_zero | (last ^ std::min(static_cast<U>(q), last_key));
        // Bottom-right: p = q + d, and a row with p < 0 attends nothing.
        const std::int64_t p = q + d;
        bottom_right |= p < 0 ? count : from_zero | (last ^ std::min(static_cast<U>(p), last_key));
      }
      if (full != 0 && top_left != 0 && bottom_right != 0) return std::nullopt;
    }
  CostFree match;
  match.flags = flags;
  if (full == 0) match.kind = StructureKind::full;
  else if (top_left == 0) match.kind = StructureKind::causal;
  else if (bottom_right == 0 && t.q_len != t.k_len) {
    match.kind = StructureKind::causal;
    match.alignment = Alignment::bottom_right;
  } else {
    return std::nullopt;
  }
  return match;
}

// What one pass over the stored rows says before the search: whether each row is well
// formed (SpanTable::row_ok), the counts and flags the verdict carries, the first row
// flagged NaN / +inf, and whether every row is an interval. Branch-free, unsigned
// comparisons as in cost_free_match.
struct RowSummary {
  bool well_formed = true;              // every row passes SpanTable::row_ok
  std::int64_t empty_rows = 0;          // stored rows attending nothing
  std::int64_t finite_masked_rows = 0;  // of those, rows flagged kRowFiniteMasked
  bool bias = false;
  bool all_intervals = true;
  std::int64_t first_invalid = -1;      // index into rows of the first kRowInvalid row, or -1
};

inline RowSummary summarize_rows(const SpanTable& t) noexcept {
  using U = std::uint64_t;
  const U k_len = static_cast<U>(t.k_len);
  std::int64_t empty = 0, finite_masked = 0;
  std::uint32_t flags = 0;
  U bad = 0;  // bit 0: some row is malformed; bit 1: some row is not an interval
  for (const RowSpan& r : t.rows) {
    const U first = static_cast<U>(r.first), last = static_cast<U>(r.last), count = static_cast<U>(r.count);
    const U none = count == 0, span = last - first + 1;
    // row_ok's keys, unsigned: first <= last < K also says 0 <= first, and
    // count <= last - first + 1 (at most K) also says count >= 0.
    const U keys_ok = (first <= last) & (last < k_len) & (count <= span);
    bad |= ((none | keys_ok) ^ 1) | (((none | (count == span)) ^ 1) << 1);
    empty += static_cast<std::int64_t>(none);
    finite_masked += static_cast<std::int64_t>(none & ((r.flags & kRowFiniteMasked) != 0));
    flags |= r.flags;
  }
  constexpr std::uint32_t kKnownFlags = kRowBias | kRowFiniteMasked | kRowInvalid;
  RowSummary out;
  out.well_formed = (bad & 1) == 0 && (flags & ~kKnownFlags) == 0;
  out.empty_rows = empty;
  out.finite_masked_rows = finite_masked;
  out.bias = (flags & kRowBias) != 0;
  out.all_intervals = (bad & 2) == 0;
  if (flags & kRowInvalid)
    for (std::size_t i = 0; i < t.rows.size(); ++i)
      if (t.rows[i].flags & kRowInvalid) {
        out.first_invalid = static_cast<std::int64_t>(i);
        break;
      }
  return out;
}

// The logical shape of the table, with its counts over the logical B*H slices (a
// distinct slice stands for `copies` of them); kind arbitrary. `Table`: a SpanTable, or
// the SpanRuns of classify_runs.hpp (the same shape fields).
template <class Table>
MaskStructure unclassified(const Table& t, std::int64_t empty_rows, std::int64_t finite_masked_rows, bool bias) {
  MaskStructure out;
  out.batch = t.batch;
  out.heads = t.heads;
  out.q_len = t.q_len;
  out.k_len = t.k_len;
  const std::int64_t copies = (t.batch / t.distinct_batch) * (t.heads / t.distinct_heads);
  out.empty_rows = empty_rows * copies;
  out.finite_masked_rows = finite_masked_rows * copies;
  out.bias = bias;
  return out;
}

// The verdict for a cost-free match with known flags and no NaN / +inf row (then every
// row is well formed: it equals a row of the structure). Full and top_left causal rows
// all attend; bottom-right rows with p = q + K - Q < 0, the first Q - K of each slice,
// attend nothing.
inline MaskStructure cost_free_structure(const SpanTable& t, const CostFree& match) {
  std::int64_t empty = 0, finite_masked = 0;
  if (match.alignment == Alignment::bottom_right && t.q_len > t.k_len) {
    const std::int64_t per_slice = t.q_len - t.k_len;
    empty = per_slice * t.distinct_slices();
    if (match.flags & kRowFiniteMasked)
      for (std::int64_t slice = 0; slice < t.distinct_slices(); ++slice)
        for (std::int64_t q = 0; q < per_slice; ++q)
          finite_masked += (t.rows[static_cast<std::size_t>(slice * t.q_len + q)].flags & kRowFiniteMasked) != 0;
  }
  MaskStructure out = unclassified(t, empty, finite_masked, (match.flags & kRowBias) != 0);
  out.kind = match.kind;
  out.alignment = match.alignment;
  return out;
}

// The search over every candidate base and its parameters read off the rows, in a fixed
// order (the verdict's tie-breaks depend on it), for the unclassified structure `out`:
// the best fit or nothing. The table (classify_spans) and the runs (classify_runs.hpp)
// differ only in how they read rows, which the callables hide: `fit(base)` is
// fit_structure, `gather(d)` gather_evidence, `chunk_ok(c, d)` chunk_bounds_rows, and
// `exhausted()` says the work budget is spent (then nothing, at once).
template <class Fit, class Gather, class ChunkOk, class Exhausted>
std::optional<MaskStructure> search_candidates(const MaskStructure& out, const Fit& fit, const Gather& gather,
                                               const ChunkOk& chunk_ok, const Exhausted& exhausted) {
  std::optional<MaskStructure> best;
  const auto consider = [&](const MaskStructure& base) {
    // Modifiers only add numbers and q_valid: a base that does not precede the best
    // alone cannot win with them.
    if (best && !precedes(base, *best)) return;
    std::optional<MaskStructure> fitted = fit(base);
    if (fitted && (!best || precedes(*fitted, *best))) best = std::move(fitted);
  };

  MaskStructure base = out;
  base.kind = StructureKind::full;
  consider(base);
  // Q == K: the two alignments coincide; report top_left.
  const std::array<Alignment, 2> alignments{Alignment::top_left, Alignment::bottom_right};
  const std::size_t n_align = out.q_len == out.k_len ? 1 : 2;
  std::vector<BaseEvidence> evidence;
  for (std::size_t a = 0; a < n_align; ++a)
    evidence.push_back(gather(alignments[a] == Alignment::top_left ? 0 : out.k_len - out.q_len));

  for (StructureKind kind : {StructureKind::causal, StructureKind::sliding_window, StructureKind::chunked,
                             StructureKind::prefix_lm, StructureKind::causal_blocks}) {
    for (std::size_t a = 0; a < n_align; ++a) {
      if (exhausted()) return std::nullopt;
      base = out;
      base.kind = kind;
      base.alignment = alignments[a];
      const BaseEvidence& ev = evidence[a];
      // The largest key position any row has: a parameter that never binds below it
      // describes plain causal, which is cheaper and already tried.
      const std::int64_t max_p = base.key_position(out.q_len - 1);
      switch (kind) {
        case StructureKind::causal: consider(base); break;
        case StructureKind::sliding_window:
          for (std::int64_t w : ev.windows)
            if (w >= 1 && w <= max_p) {
              base.window = w;
              consider(base);
            }
          break;
        case StructureKind::chunked:
          for (std::int64_t c : ev.chunks)
            if (c >= 1 && c <= max_p && chunk_ok(c, base.key_position(0))) {
              base.chunk = c;
              consider(base);
            }
          break;
        case StructureKind::prefix_lm:
          // A prefix reaching past every row's position makes every row [0, prefix):
          // that is full with kv_valid, not a prefix-LM.
          if (ev.prefix > 0 && ev.prefix - 1 < max_p) {
            base.prefix = ev.prefix;
            consider(base);
          }
          break;
        case StructureKind::causal_blocks:
          // Likewise a block holding every row's position.
          if (!ev.blocks.empty() &&
              !(base.key_position(0) >= 0 && ev.blocks.front().start <= base.key_position(0) &&
                ev.blocks.front().end - 1 >= max_p)) {
            base.blocks = ev.blocks;
            consider(base);
            // Documents also cut one block into touching pieces: try them joined.
            std::vector<KeyRange> joined;
            for (const KeyRange& r : ev.blocks) {
              if (!joined.empty() && joined.back().end == r.start) joined.back().end = r.end;
              else joined.push_back(r);
            }
            if (joined.size() != ev.blocks.size()) {
              base.blocks = std::move(joined);
              consider(base);
            }
            // A document edge inside a block cuts its evidence in two (a one-row document
            // hides a row of it): join neighbours while the rows still agree. Padding cuts
            // it too, into touching pieces (a batch's rows stop at its last valid key, and
            // another's show the block from its first valid key or query row on): those
            // are joined pair by pair, where the all-at-once join above fails.
            if (best && best->kind == StructureKind::causal_blocks &&
                (best->has_segments() || best->has_kv_valid() || best->has_q_valid())) {
              MaskStructure trial = *best;
              for (std::size_t i = 0; i + 1 < trial.blocks.size();) {
                if (!best->has_segments() && trial.blocks[i].end != trial.blocks[i + 1].start) {
                  ++i;
                  continue;
                }
                MaskStructure joined_pair = trial;
                joined_pair.blocks[i].end = joined_pair.blocks[i + 1].end;
                joined_pair.blocks.erase(joined_pair.blocks.begin() + static_cast<std::ptrdiff_t>(i) + 1);
                joined_pair.segments.clear();
                joined_pair.kv_valid.clear();
                joined_pair.q_valid.clear();
                std::optional<MaskStructure> fitted = fit(joined_pair);
                if (fitted && precedes(*fitted, trial)) trial = std::move(*fitted);
                else ++i;
              }
              if (precedes(trial, *best)) best = std::move(trial);
            }
          }
          break;
        default: break;
      }
    }
  }
  return best;
}

// The verdict: the best fit with the table's counts, or `out` (arbitrary) without one.
inline MaskStructure finish_verdict(std::optional<MaskStructure> best, const MaskStructure& out) {
  if (!best) return out;
  best->empty_rows = out.empty_rows;
  best->finite_masked_rows = out.finite_masked_rows;
  best->bias = out.bias;
  if (best->kind == StructureKind::full) best->alignment = Alignment::top_left;
  return *std::move(best);
}

// The simplest exact structure of a well-formed table without NaN / +inf rows, `rows`
// its summary: the search over every candidate.
inline MaskStructure classify_spans(const SpanTable& t, const RowSummary& rows) {
  const MaskStructure out = unclassified(t, rows.empty_rows, rows.finite_masked_rows, rows.bias);
  if (!rows.all_intervals || !heads_agree(t)) return out;  // arbitrary

  const std::vector<UniqueBatch> batches = unique_batches(t);
  return finish_verdict(search_candidates(
                            out, [&](const MaskStructure& base) { return fit_structure(base, batches); },
                            [&](std::int64_t d) { return gather_evidence(batches, d, t.batch); },
                            [&](std::int64_t c, std::int64_t d) { return chunk_bounds_rows(batches, c, d); },
                            [] { return false; }),
                        out);
}

// classify() with the fast path on or off (off: every table goes through the checks
// and the search; tests compare the two).
inline Result<MaskStructure> classify_table(const SpanTable& table, bool fast_path) {
  if (Status malformed = table.validate_shape(); !malformed.ok()) return malformed;
  if (fast_path)
    if (const std::optional<CostFree> match = cost_free_match(table))
      if ((match->flags & ~(kRowBias | kRowFiniteMasked)) == 0)
        return catch_alloc([&]() -> Result<MaskStructure> { return cost_free_structure(table, *match); });
  const RowSummary rows = summarize_rows(table);
  if (!rows.well_formed) return table.validate();  // the message naming the first malformed row
  if (rows.first_invalid >= 0) return invalid_row_error(table, rows.first_invalid);
  return catch_alloc([&]() -> Result<MaskStructure> { return classify_spans(table, rows); });
}

}  // namespace detail

// The simplest exact structure of the scanned mask, or `arbitrary`. A row holding NaN
// or +inf has no meaning as a mask, whichever scanner flagged it (the two-phase device
// scan hands its rows here unchecked): invalid_value naming the row. A malformed table
// is refused as SpanTable::validate() says.
inline Result<MaskStructure> classify(const SpanTable& table) { return detail::classify_table(table, true); }

}  // namespace masklens
