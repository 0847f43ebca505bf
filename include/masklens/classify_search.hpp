// The search's steps that read no rows: the candidate order and its tie-breaks
// (search_candidates, precedes), the fit of a base over batches (assemble_fit,
// fit_fewest_numbers), the evidence's bookkeeping (kv_valid_candidates,
// add_start_chunks, add_joint_chunks, finish_evidence) and the verdict (finish_verdict).
// Each takes how rows are read as callables; classify_rows.hpp passes them the steps
// that read rows, written once over the row reader contract.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <numeric>
#include <optional>
#include <utility>
#include <vector>

#include "structure.hpp"

namespace masklens::detail {

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
// batch, and some batch's row there attends), each gap from the few previous such
// positions and the position itself are tried, and the first three that hold at every
// multiple and that `shown_twice(c)` (fresh attending rows at multiples of c, counted
// over logical batches, at least 2) are kept. Not only the gap from the previous
// position: a document starting between two visible chunk boundaries (left padding
// hiding the ones before) puts its own fresh row between them, and the chunk is the gap
// that skips it (chunk 4 over 22 keys, keys [13, 22) valid, documents from 14 and 19:
// the positions 13, 14, 16, 19, 20 show 4 only as 20 - 16).
template <class Positions, class EveryMultipleFresh, class ShownTwice>
void add_joint_chunks(BaseEvidence& ev, const Positions& fresh_positions, const EveryMultipleFresh& every_multiple_fresh,
                      const ShownTwice& shown_twice) {
  // Positions looked back over: each document start between two boundaries takes one.
  constexpr std::size_t kLookBack = 8;
  int found = 0;
  std::array<std::int64_t, kLookBack> previous{};  // the last positions, a ring
  std::size_t seen = 0;
  std::vector<std::int64_t> gaps_tried;  // sorted: distinct gaps are few (they sum to at most Q)
  const auto try_chunk = [&](std::int64_t c) {
    if (found < 3 && every_multiple_fresh(c) && shown_twice(c)) {
      ev.chunks.push_back(c);
      ++found;
    }
  };
  fresh_positions([&](std::int64_t p) {
    for (std::size_t back = 1; back <= std::min(seen, kLookBack) && found < 3; ++back) {
      const std::int64_t earlier = previous[(seen - back) % kLookBack];
      if (earlier <= 0) continue;
      const std::int64_t gap = p - earlier;
      const auto at = std::lower_bound(gaps_tried.begin(), gaps_tried.end(), gap);
      if (at == gaps_tried.end() || *at != gap) {
        gaps_tried.insert(at, gap);
        try_chunk(gap);
      }
    }
    try_chunk(p);
    previous[seen % kLookBack] = p;
    ++seen;
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
            // are joined pair by pair, where the all-at-once join above fails. Padded
            // query rows hide rows of a block as a document edge does, so with q_valid
            // the pieces may also lie apart ([2, 1, 6, 6] block [1, 6): one batch's keys
            // stop at 3, showing [1, 3), the other's queries start at 4, showing [4, 6);
            // row 3 shows the block in neither).
            if (best && best->kind == StructureKind::causal_blocks &&
                (best->has_segments() || best->has_kv_valid() || best->has_q_valid())) {
              MaskStructure trial = *best;
              const bool rows_hidden = best->has_segments() || best->has_q_valid();
              for (std::size_t i = 0; i + 1 < trial.blocks.size();) {
                if (!rows_hidden && trial.blocks[i].end != trial.blocks[i + 1].start) {
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

}  // namespace masklens::detail
