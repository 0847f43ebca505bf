// MaskStructure: the canonical description of a mask, and its semantics — which keys
// each query row attends. Coordinates follow docs/structures.md: query row q sits at
// key position p = q (top_left) or p = q + K - Q (bottom_right), and every parameter
// is in key coordinates.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "row_span.hpp"
#include "status.hpp"
#include "tile_grid.hpp"

namespace masklens {

// In tie-break order: among equally short exact descriptions the earlier kind wins.
enum class StructureKind : std::uint8_t { full, causal, sliding_window, chunked, prefix_lm, causal_blocks, arbitrary };
enum class Alignment : std::uint8_t { top_left, bottom_right };

constexpr std::string_view to_string(StructureKind k) noexcept {
  switch (k) {
    case StructureKind::full: return "full";
    case StructureKind::causal: return "causal";
    case StructureKind::sliding_window: return "sliding_window";
    case StructureKind::chunked: return "chunked";
    case StructureKind::prefix_lm: return "prefix_lm";
    case StructureKind::causal_blocks: return "causal_blocks";
    case StructureKind::arbitrary: return "arbitrary";
  }
  return "unknown";
}
constexpr std::string_view to_string(Alignment a) noexcept {
  return a == Alignment::top_left ? "top_left" : "bottom_right";
}

// Every length and parameter stays at or below this, so key positions, window edges
// and the break points a plan adds around them (x - 1, x + 1) never overflow 64 bits.
inline constexpr std::int64_t kMaxExtent = std::int64_t{1} << 62;

// Half-open key range [start, end).
struct KeyRange {
  std::int64_t start = 0;
  std::int64_t end = 0;
  friend bool operator==(const KeyRange&, const KeyRange&) = default;
};

struct MaskStructure {
  std::int64_t batch = 1, heads = 1, q_len = 1, k_len = 1;  // the logical shape described

  StructureKind kind = StructureKind::arbitrary;
  Alignment alignment = Alignment::top_left;  // meaningful for every kind but full and arbitrary
  std::int64_t window = 0;  // sliding_window: p - window < k <= p (HF sliding_window)
  std::int64_t chunk = 0;   // chunked: floor(k / chunk) == floor(p / chunk) and k <= p
  std::int64_t prefix = 0;  // prefix_lm: k <= p or k < prefix
  std::vector<KeyRange> blocks;  // causal_blocks: sorted, disjoint bidirectional blocks

  // Modifiers: one entry per batch, or a single entry that holds for every batch (so a
  // mask broadcast over a batch of any size is described in O(1)); empty = absent (JSON
  // null). Read them through segments_of(b), kv_valid_of(b) and q_valid_of(b).
  // segments[b] = {0, e1, ..., q_len}: packed documents, attention stays inside p's document (Q == K).
  std::vector<std::vector<std::int64_t>> segments;
  // kv_valid[b] = [s, e): only these keys are real (padding).
  std::vector<KeyRange> kv_valid;
  // q_valid[b] = [s, e): only these query rows are real; the others attend nothing
  // (padded queries: cross-attention, a decode chunk with padding).
  std::vector<KeyRange> q_valid;

  // Query rows with no attending key, over all B*H slices. Every kind but arbitrary
  // implies it (implied_empty_rows()); there 0 means "not given" and any other value
  // must equal the implied count.
  std::int64_t empty_rows = 0;
  std::int64_t finite_masked_rows = 0;  // of those, rows masked by finite values (dense math attends uniformly)
  bool bias = false;                    // some attending element carries a non-zero additive value
  // arbitrary only: the share of the mask's tiles that are partial and full, as a scan
  // counted them (TileSummary::fractions(), tiles.hpp), so decide() can charge
  // FlexAttention for the tiles it computes. Absent: every tile is charged as partial.
  // Exact kinds take none: their tiles follow from their fields (structure_tiles.hpp).
  std::optional<TileFractions> tile_fractions;

  [[nodiscard]] bool has_segments() const noexcept { return !segments.empty(); }
  [[nodiscard]] bool has_kv_valid() const noexcept { return !kv_valid.empty(); }
  [[nodiscard]] bool has_q_valid() const noexcept { return !q_valid.empty(); }

  // The modifiers of batch b. Preconditions: the modifier is present, 0 <= b < batch.
  [[nodiscard]] const std::vector<std::int64_t>& segments_of(std::int64_t b) const noexcept {
    return segments[segments.size() == 1 ? 0 : static_cast<std::size_t>(b)];
  }
  [[nodiscard]] const KeyRange& kv_valid_of(std::int64_t b) const noexcept {
    return kv_valid[kv_valid.size() == 1 ? 0 : static_cast<std::size_t>(b)];
  }
  [[nodiscard]] const KeyRange& q_valid_of(std::int64_t b) const noexcept {
    return q_valid[q_valid.size() == 1 ? 0 : static_cast<std::size_t>(b)];
  }
  // The query rows of batch b that may attend: q_valid, or every row.
  [[nodiscard]] KeyRange query_rows(std::int64_t b) const noexcept {
    return has_q_valid() ? q_valid_of(b) : KeyRange{0, q_len};
  }

  [[nodiscard]] std::int64_t key_position(std::int64_t q) const noexcept {
    return alignment == Alignment::bottom_right ? q + (k_len - q_len) : q;
  }

  // A row's attending keys as the inclusive bounds [lo, hi] the rules give, before they
  // are read as an interval (lo > hi: no key). Modifiers only raise lo and lower hi.
  struct Bounds {
    std::int64_t lo, hi;
  };

  // Row q under the base kind alone, clipped to [0, K). Precondition: kind != arbitrary.
  [[nodiscard]] Bounds base_bounds(std::int64_t q) const noexcept {
    const std::int64_t p = key_position(q), last_key = k_len - 1;
    std::int64_t lo = 0, hi = std::min(p, last_key);
    switch (kind) {
      case StructureKind::full: hi = last_key; break;
      case StructureKind::causal: break;
      case StructureKind::sliding_window: lo = p - window + 1; break;
      case StructureKind::chunked: lo = p >= 0 ? p / chunk * chunk : last_key + 1; break;
      case StructureKind::prefix_lm: hi = std::min(std::max(p, prefix - 1), last_key); break;
      case StructureKind::causal_blocks: {
        // The block holding p, if any: blocks are sorted by start.
        auto it = std::upper_bound(blocks.begin(), blocks.end(), p,
                                   [](std::int64_t v, const KeyRange& r) { return v < r.start; });
        if (it != blocks.begin() && p < std::prev(it)->end) hi = std::min(std::prev(it)->end - 1, last_key);
        break;
      }
      case StructureKind::arbitrary: return {1, 0};
    }
    return {std::max<std::int64_t>(lo, 0), hi};
  }

  // Keys row q attends under the base kind alone, as an inclusive interval clipped to [0, K).
  // Precondition: kind != arbitrary.
  [[nodiscard]] RowSpan base_row(std::int64_t q) const noexcept {
    const Bounds r = base_bounds(q);
    return RowSpan::interval(r.lo, r.hi);
  }

  // The document [start, end) holding position p of batch b (the whole sequence without segments).
  [[nodiscard]] KeyRange document(std::int64_t b, std::int64_t p) const noexcept {
    if (!has_segments()) return {0, k_len};
    const auto& s = segments_of(b);
    auto it = std::upper_bound(s.begin(), s.end(), p);
    if (it == s.begin() || it == s.end()) return {0, 0};
    return {*std::prev(it), *it};
  }

  // Row q of batch b: the base bounds, inside p's document and kv_valid; nothing outside q_valid.
  [[nodiscard]] Bounds row_bounds(std::int64_t b, std::int64_t q) const noexcept {
    const KeyRange rows = query_rows(b);
    if (q < rows.start || q >= rows.end) return {1, 0};
    Bounds r = base_bounds(q);
    if (has_segments()) {
      const KeyRange doc = document(b, key_position(q));
      r.lo = std::max(r.lo, doc.start);
      r.hi = std::min(r.hi, doc.end - 1);
    }
    if (has_kv_valid()) {
      const KeyRange& kv = kv_valid_of(b);
      r.lo = std::max(r.lo, kv.start);
      r.hi = std::min(r.hi, kv.end - 1);
    }
    return r;
  }

  // Keys row q of batch b attends: the base interval, inside p's document and kv_valid,
  // and nothing for a row outside q_valid.
  [[nodiscard]] RowSpan row(std::int64_t b, std::int64_t q) const noexcept {
    const Bounds r = row_bounds(b, q);
    return RowSpan::interval(r.lo, r.hi);
  }

  // Element-wise semantics: the rule of mask_rule.hpp at one element, written apart from
  // row()'s interval form so tests can check one against the other. Precondition:
  // 0 <= b < batch, 0 <= q < q_len, 0 <= k < k_len (arbitrary attends nothing: no rule).
  [[nodiscard]] bool allows(std::int64_t b, std::int64_t q, std::int64_t k) const noexcept;

  // How many numbers the description takes; the canonical structure is the exact one
  // with the fewest (ties: the earlier kind). window, chunk, prefix: 1; each block: 2;
  // segments: every listed offset; kv_valid, q_valid: 2 per batch. A modifier written once for
  // every batch costs what it would written out per batch, so how a structure is
  // written never changes which one is canonical (saturates at INT64_MAX).
  [[nodiscard]] std::int64_t description_cost() const noexcept {
    std::int64_t cost = 0;
    switch (kind) {
      case StructureKind::sliding_window:
      case StructureKind::chunked:
      case StructureKind::prefix_lm: cost = 1; break;
      case StructureKind::causal_blocks: cost = 2 * static_cast<std::int64_t>(blocks.size()); break;
      default: break;
    }
    const auto add = [&cost](std::int64_t numbers, std::int64_t copies) {
      if (numbers > 0 && copies > (INT64_MAX - cost) / numbers) cost = INT64_MAX;
      else cost += numbers * copies;
    };
    const std::int64_t copies_of_one = batch < 1 ? 1 : batch;  // a single entry stands for every batch
    for (const auto& s : segments) add(static_cast<std::int64_t>(s.size()), segments.size() == 1 ? copies_of_one : 1);
    add(2 * static_cast<std::int64_t>(kv_valid.size()), kv_valid.size() == 1 ? copies_of_one : 1);
    add(2 * static_cast<std::int64_t>(q_valid.size()), q_valid.size() == 1 ? copies_of_one : 1);
    return cost;
  }

  // Query rows of batch b (one head) that attend no key. O(log Q) per piece of rows,
  // never O(Q * K): rows outside q_valid attend nothing, and the others are cut where
  // the rules change form (documents, blocks, the prefix); inside a piece lo(q) is a
  // maximum and hi(q) a minimum of affine functions of q, so lo - hi is convex and the
  // rows that attend form one interval, found by binary search. Chunks are counted in
  // closed form. Precondition: validate() is ok and kind != arbitrary.
  [[nodiscard]] std::int64_t empty_rows_in_batch(std::int64_t b) const noexcept {
    const KeyRange rows = query_rows(b);
    std::int64_t empty = q_len - (rows.end - rows.start);
    for (std::int64_t q = rows.start; q < rows.end;) {
      const std::int64_t end = std::min(next_piece(b, q), rows.end);
      empty += (end - q) - attending_rows(b, q, end);
      q = end;
    }
    return empty;
  }

  // Query rows with no attending key over all B*H slices, as the structure defines them;
  // for arbitrary, the count it was given. Precondition: validate() is ok (which keeps
  // B*H*Q, and so the count, inside 64 bits).
  [[nodiscard]] std::int64_t implied_empty_rows() const noexcept {
    if (kind == StructureKind::arbitrary) return empty_rows;
    if (segments.size() <= 1 && kv_valid.size() <= 1 && q_valid.size() <= 1)
      return empty_rows_in_batch(0) * batch * heads;
    std::int64_t empty = 0;
    for (std::int64_t b = 0; b < batch; ++b) empty += empty_rows_in_batch(b);
    return empty * heads;
  }

  // Every field checked against the shape and the rules of docs/structures.md: what
  // decide(), classify() and the JSON reader accept. invalid_shape for the shape,
  // invalid_argument for any other field, each message naming the field and the rule.
  [[nodiscard]] Status validate() const {
    const auto text = [](std::int64_t v) { return std::to_string(v); };
    const auto range_text = [&](const KeyRange& r) { return "[" + text(r.start) + ", " + text(r.end) + "]"; };
    const auto bad = [](std::string message) { return error(ErrorCode::invalid_argument, std::move(message)); };
    const std::pair<const char*, std::int64_t> dims[] = {
        {"batch", batch}, {"heads", heads}, {"q_len", q_len}, {"k_len", k_len}};
    for (const auto& [name, v] : dims)
      if (v < 1 || v > kMaxExtent)
        return error(ErrorCode::invalid_shape, std::string("structure ") + name + " must be in [1, 2^62], got " + text(v));
    if (batch > INT64_MAX / heads || batch * heads > INT64_MAX / q_len)
      return error(ErrorCode::invalid_shape, "structure batch * heads * q_len (rows to count) overflows 64 bits");
    if (kind > StructureKind::arbitrary) return bad("structure.kind " + text(static_cast<int>(kind)) + " is not a kind");
    if (alignment > Alignment::bottom_right)
      return bad("structure.alignment " + text(static_cast<int>(alignment)) + " is not top_left or bottom_right");
    const auto parameter = [&](const char* name, std::int64_t v) -> Status {
      if (v < 1 || v > kMaxExtent)
        return bad(std::string("structure.") + name + " must be in [1, 2^62] for " + std::string(to_string(kind)) +
                   ", got " + text(v));
      return {};
    };
    if (kind == StructureKind::sliding_window)
      if (Status st = parameter("window", window); !st.ok()) return st;
    if (kind == StructureKind::chunked)
      if (Status st = parameter("chunk", chunk); !st.ok()) return st;
    if (kind == StructureKind::prefix_lm)
      if (Status st = parameter("prefix", prefix); !st.ok()) return st;
    if (kind == StructureKind::causal_blocks) {
      if (blocks.empty()) return bad("structure.blocks must hold at least one block for causal_blocks");
      std::int64_t prev_end = 0;
      for (std::size_t i = 0; i < blocks.size(); ++i) {
        const KeyRange& r = blocks[i];
        if (r.start < prev_end || r.end <= r.start || r.end > k_len)
          return bad("structure.blocks[" + text(static_cast<std::int64_t>(i)) + "] " + range_text(r) +
                     ": blocks must be sorted, disjoint, non-empty and inside [0, K) (K = " + text(k_len) + ")");
        prev_end = r.end;
      }
    }
    if (kind == StructureKind::arbitrary && (has_segments() || has_kv_valid() || has_q_valid()))
      return bad("structure.segments, kv_valid and q_valid modify a structured kind; arbitrary takes none");
    const auto entries = [&](const char* name, std::size_t n) -> Status {
      if (n > 1 && n != static_cast<std::size_t>(batch))
        return bad(std::string("structure.") + name + " must list one entry per batch (" + text(batch) +
                   ") or a single one for all batches, got " + text(static_cast<std::int64_t>(n)));
      return {};
    };
    if (tile_fractions) {
      if (kind != StructureKind::arbitrary)
        return bad("structure.tile_fractions are derived from an exact structure's fields; only arbitrary takes them");
      const TileFractions& t = *tile_fractions;
      if (t.block_q < 1 || t.block_q > kMaxExtent || t.block_k < 1 || t.block_k > kMaxExtent)
        return bad("structure.tile_fractions.block must be two tile sizes in [1, 2^62], got [" + text(t.block_q) + ", " +
                   text(t.block_k) + "]");
      // Written with comparisons so that NaN fails; a sum of two shares of one count may
      // round past 1 by an ulp.
      if (!(t.partial >= 0 && t.full >= 0 && t.partial + t.full <= 1 + 1e-9))
        return bad("structure.tile_fractions.partial and .full must be shares in [0, 1] that sum to at most 1, got " +
                   std::to_string(t.partial) + " and " + std::to_string(t.full));
    }
    if (Status st = entries("kv_valid", kv_valid.size()); !st.ok()) return st;
    for (std::size_t i = 0; i < kv_valid.size(); ++i) {
      const KeyRange& r = kv_valid[i];
      if (r.start < 0 || r.end < r.start || r.end > k_len)
        return bad("structure.kv_valid[" + text(static_cast<std::int64_t>(i)) + "] must satisfy 0 <= start <= end <= K (" +
                   text(k_len) + "), got " + range_text(r));
    }
    if (Status st = entries("q_valid", q_valid.size()); !st.ok()) return st;
    for (std::size_t i = 0; i < q_valid.size(); ++i) {
      const KeyRange& r = q_valid[i];
      if (r.start < 0 || r.end < r.start || r.end > q_len)
        return bad("structure.q_valid[" + text(static_cast<std::int64_t>(i)) + "] must satisfy 0 <= start <= end <= Q (" +
                   text(q_len) + "), got " + range_text(r));
    }
    if (has_segments() && q_len != k_len)
      return bad("structure.segments need Q == K, got Q " + text(q_len) + ", K " + text(k_len));
    if (Status st = entries("segments", segments.size()); !st.ok()) return st;
    for (std::size_t b = 0; b < segments.size(); ++b) {
      const auto& offsets = segments[b];
      bool rising = offsets.size() >= 2 && offsets.front() == 0 && offsets.back() == q_len;
      for (std::size_t i = 1; rising && i < offsets.size(); ++i) rising = offsets[i] > offsets[i - 1];
      if (!rising)
        return bad("structure.segments[" + text(static_cast<std::int64_t>(b)) + "] must rise strictly from 0 to Q (" +
                   text(q_len) + ")");
    }
    const std::int64_t rows = batch * heads * q_len;
    if (empty_rows < 0 || finite_masked_rows < 0)
      return bad("structure.empty_rows and structure.finite_masked_rows must be >= 0, got " + text(empty_rows) + " and " +
                 text(finite_masked_rows));
    if (empty_rows > rows)
      return bad("structure.empty_rows must be <= B*H*Q (" + text(rows) + "), got " + text(empty_rows));
    const std::int64_t implied = implied_empty_rows();
    if (kind != StructureKind::arbitrary && empty_rows != 0 && empty_rows != implied)
      return bad("structure.empty_rows is " + text(empty_rows) + " but the structure implies " + text(implied) +
                 " (give 0 to have it derived)");
    if (finite_masked_rows > implied)
      return bad("structure.finite_masked_rows (" + text(finite_masked_rows) + ") must be <= empty_rows (" +
                 text(implied) + ")");
    return {};
  }

 private:
  // The first row after q where a piece of empty_rows_in_batch ends (INT64_MAX: none).
  [[nodiscard]] std::int64_t next_piece(std::int64_t b, std::int64_t q) const noexcept {
    const std::int64_t d = key_position(0), p = q + d;  // rows at q and after sit at p and after
    std::int64_t next_p = INT64_MAX;
    if (kind == StructureKind::prefix_lm && prefix - 1 > p) next_p = prefix - 1;
    if (kind == StructureKind::causal_blocks) {
      // The first block bound past p: blocks are sorted and disjoint, so bounds rise.
      auto it = std::partition_point(blocks.begin(), blocks.end(), [p](const KeyRange& r) { return r.end <= p; });
      if (it != blocks.end()) next_p = std::min(next_p, it->start > p ? it->start : it->end);
    }
    if (has_segments()) {
      const auto& offsets = segments_of(b);
      auto it = std::upper_bound(offsets.begin(), offsets.end(), p);
      if (it != offsets.end()) next_p = std::min(next_p, *it);
    }
    return next_p == INT64_MAX ? INT64_MAX : next_p - d;
  }

  // Rows in [qa, qb) of batch b that attend some key; the piece holds no break of next_piece.
  [[nodiscard]] std::int64_t attending_rows(std::int64_t b, std::int64_t qa, std::int64_t qb) const noexcept {
    const std::int64_t d = key_position(0);
    if (kind == StructureKind::chunked) {
      // Row p attends max(floor(p / C) C, s) .. min(p, e - 1), with [s, e) the valid keys of
      // its document: some key iff 0 <= p, s <= p, s < e and floor(p / C) C < e.
      const KeyRange doc = document(b, qa + d);
      const KeyRange kv = has_kv_valid() ? kv_valid_of(b) : KeyRange{0, k_len};
      const std::int64_t s = std::max(doc.start, kv.start), e = std::min({doc.end, kv.end, k_len});
      if (s >= e) return 0;
      const std::int64_t first = std::max({qa + d, s, std::int64_t{0}});
      const std::int64_t past = std::min(qb + d, ((e - 1) / chunk + 1) * chunk);
      return std::max<std::int64_t>(past - first, 0);
    }
    const auto gap = [&](std::int64_t q) {  // > 0: row q attends nothing
      const Bounds r = row_bounds(b, q);
      return r.lo - r.hi;
    };
    // gap is convex on the piece: its differences rise, so the first q whose next
    // difference is >= 0 is a minimum.
    std::int64_t lo = qa, hi = qb - 1;
    while (lo < hi) {
      const std::int64_t mid = lo + (hi - lo) / 2;
      if (gap(mid + 1) >= gap(mid)) hi = mid;
      else lo = mid + 1;
    }
    const std::int64_t m = lo;
    if (gap(m) > 0) return 0;
    // Left of m gap falls, right of m it rises: the attending rows are [first, last].
    std::int64_t first = qa, upto = m;
    while (first < upto) {
      const std::int64_t mid = first + (upto - first) / 2;
      if (gap(mid) <= 0) upto = mid;
      else first = mid + 1;
    }
    std::int64_t from = m, last = qb - 1;
    while (from < last) {
      const std::int64_t mid = from + (last - from + 1) / 2;
      if (gap(mid) <= 0) from = mid;
      else last = mid - 1;
    }
    return last - first + 1;
  }
};

// A structure of `kind` over [batch, 1, q_len, k_len], parameters and modifiers unset.
inline MaskStructure make_structure(StructureKind kind, std::int64_t batch, std::int64_t q_len, std::int64_t k_len,
                                    Alignment alignment = Alignment::top_left) {
  MaskStructure s;
  s.kind = kind;
  s.batch = batch;
  s.q_len = q_len;
  s.k_len = k_len;
  s.alignment = alignment;
  return s;
}

// Whether `s` is written the way decide() and the backends read it: its empty-row count
// the one it implies, each modifier one entry per batch. Precondition: s.validate() is ok.
inline bool spelled_out(const MaskStructure& s) noexcept {
  return s.empty_rows == s.implied_empty_rows() &&
         (s.batch == 1 || (s.segments.size() != 1 && s.kv_valid.size() != 1 && s.q_valid.size() != 1));
}

// `s` with its implied empty-row count and each modifier written out per batch.
// Precondition: s.validate() is ok.
inline Result<MaskStructure> spell_out(const MaskStructure& s) {
  // Past this a modifier given once is not written out per batch (B = 2^40 would ask
  // for terabytes): out_of_memory, as any allocation that cannot succeed.
  constexpr std::int64_t kMaxWrittenBatches = std::int64_t{1} << 24;
  if (s.batch > kMaxWrittenBatches && (s.segments.size() == 1 || s.kv_valid.size() == 1 || s.q_valid.size() == 1))
    return error(ErrorCode::out_of_memory, "a modifier given once for " + std::to_string(s.batch) +
                                               " batches is too large to write out per batch (at most 2^24)");
  return catch_alloc([&]() -> Result<MaskStructure> {
    MaskStructure out = s;
    out.empty_rows = s.implied_empty_rows();
    const auto n = static_cast<std::size_t>(s.batch);
    if (s.segments.size() == 1) out.segments.assign(n, s.segments[0]);
    if (s.kv_valid.size() == 1) out.kv_valid.assign(n, s.kv_valid[0]);
    if (s.q_valid.size() == 1) out.q_valid.assign(n, s.q_valid[0]);
    return out;
  });
}

}  // namespace masklens

// allows() is defined with the rule it evaluates.
#include "mask_rule.hpp"  // IWYU pragma: export
