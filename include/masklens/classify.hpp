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
#include <bit>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "classify_rows.hpp"
#include "classify_search.hpp"
#include "classify_segments.hpp"
#include "row_span.hpp"
#include "span_table.hpp"
#include "status.hpp"
#include "structure.hpp"

namespace masklens {
namespace detail {

// The table's rows in order, each a one-row segment (KeySeg, steps 0).
class OneRowSegments {
 public:
  class iterator {
   public:
    iterator(const RowSpan* at, std::int64_t q) noexcept : at_(at), q_(q) {}
    KeySeg operator*() const noexcept {
      KeySeg s;
      s.q = q_;
      s.n = 1;
      s.empty = at_->empty();
      if (!s.empty) {
        s.first = at_->first;
        s.last = at_->last;
      }
      return s;
    }
    iterator& operator++() noexcept {
      ++at_;
      ++q_;
      return *this;
    }
    bool operator!=(const iterator& o) const noexcept { return at_ != o.at_; }

   private:
    const RowSpan* at_;
    std::int64_t q_;
  };
  explicit OneRowSegments(std::span<const RowSpan> rows) noexcept : rows_(rows) {}
  [[nodiscard]] iterator begin() const noexcept { return {rows_.data(), 0}; }
  [[nodiscard]] iterator end() const noexcept {
    return {rows_.data() + rows_.size(), static_cast<std::int64_t>(rows_.size())};
  }

 private:
  std::span<const RowSpan> rows_;
};

// The table's reader of one batch (RowReader, classify_rows.hpp): O(rows) a comparison,
// every row rendered by MaskStructure::row, with no budget.
struct TableRows {
  std::span<const RowSpan> rows;

  [[nodiscard]] std::int64_t q_len() const noexcept { return static_cast<std::int64_t>(rows.size()); }
  [[nodiscard]] RowSpan row(std::int64_t t) const noexcept { return rows[static_cast<std::size_t>(t)]; }
  [[nodiscard]] OneRowSegments segments() const noexcept { return OneRowSegments(rows); }
  [[nodiscard]] KeyRange attending() const noexcept {
    const auto attends = [](const RowSpan& r) { return !r.empty(); };
    const auto first = std::find_if(rows.begin(), rows.end(), attends);
    if (first == rows.end()) return {0, 0};
    const auto last = std::find_if(rows.rbegin(), rows.rend(), attends);
    return {first - rows.begin(), rows.rend() - last};
  }
  bool matches(MaskStructure& probe, const DocSet* docs) const {
    if (docs) probe.segments.assign(1, docs->values());
    else probe.segments.clear();
    for (std::size_t q = 0; q < rows.size(); ++q)
      if (!probe.row(0, static_cast<std::int64_t>(q)).same_keys(rows[q])) return false;
    return true;
  }
  static Unlimited budget() noexcept { return {}; }
};
static_assert(RowReader<TableRows>);

inline std::vector<UniqueBatch<TableRows>> unique_batches(const SpanTable& t) {
  std::vector<UniqueBatch<TableRows>> out;
  // A hash table of the batches seen, chained through vectors (<unordered_map> would
  // cost every consumer's parse more than it saves here: bench/HISTORY.md, issue 15):
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
      const auto& other = out[i].rows.rows;
      if (hashes[i] == h && std::equal(rows.begin(), rows.end(), other.begin(),
                                       [](const RowSpan& a, const RowSpan& c) { return a.same_keys(c); }))
        found = i;
    }
    if (!found) {
      found = out.size();
      out.push_back({TableRows{rows}, {}});
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
// TableRows::matches does (same keys). It reads only what the comparison needs, keeps all its
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


// The simplest exact structure of a well-formed table without NaN / +inf rows, `rows`
// its summary: the search over every candidate.
inline MaskStructure classify_spans(const SpanTable& t, const RowSummary& rows) {
  const MaskStructure out = unclassified(t, rows.empty_rows, rows.finite_masked_rows, rows.bias);
  if (!rows.all_intervals || !heads_agree(t)) return out;  // arbitrary

  return finish_verdict(search_rows(out, unique_batches(t)), out);
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
