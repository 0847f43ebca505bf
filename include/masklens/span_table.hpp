// SpanTable: the RowSpans of every distinct (batch, head) slice of a mask — what any
// scanner (host, GPU, sharded) produces and the one classifier consumes. Slices read
// through a stride-0 batch or head dimension are stored once and shared.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "mask_view.hpp"
#include "row_span.hpp"
#include "status.hpp"

namespace masklens {

namespace detail {

// The shape rules SpanTable and SpanRuns (span_runs.hpp) share, over their shape fields
// (batch, heads, q_len, k_len, distinct_batch, distinct_heads): every dimension >= 1,
// batch * heads * q_len within 64 bits, each distinct dimension 1 (broadcast) or the
// whole dimension. `what` names the object in the messages ("span table").
template <class Shape>
Status validate_span_shape(const Shape& t, const char* what) {
  const auto text = [](std::int64_t v) { return std::to_string(v); };
  const std::pair<const char*, std::int64_t> dims[] = {
      {"batch", t.batch}, {"heads", t.heads}, {"q_len", t.q_len}, {"k_len", t.k_len}};
  for (const auto& [name, v] : dims)
    if (v < 1) return error(ErrorCode::invalid_shape, std::string(what) + " " + name + " must be >= 1, got " + text(v));
  if (t.batch > INT64_MAX / t.heads || t.batch * t.heads > INT64_MAX / t.q_len)
    return error(ErrorCode::invalid_shape, std::string(what) + " batch * heads * q_len (rows to count) overflows 64 bits");
  if (t.distinct_batch != 1 && t.distinct_batch != t.batch)
    return error(ErrorCode::invalid_argument, std::string(what) + " distinct_batch must be 1 (broadcast) or batch (" +
                                                  text(t.batch) + "), got " + text(t.distinct_batch));
  if (t.distinct_heads != 1 && t.distinct_heads != t.heads)
    return error(ErrorCode::invalid_argument, std::string(what) + " distinct_heads must be 1 (broadcast) or heads (" +
                                                  text(t.heads) + "), got " + text(t.distinct_heads));
  return {};
}

// The error for span row `row` of `t` (a SpanTable or SpanRuns: slices of q_len rows,
// distinct_heads a batch) holding NaN or +inf, the row named as [batch, head, q]: the
// words of every scanner that cannot name the element (a mask on the device, a table).
template <class Shape>
[[nodiscard]] Status invalid_row_error(const Shape& t, std::int64_t row) {
  const std::int64_t slice = row / t.q_len;
  return error(ErrorCode::invalid_value,
               "mask row [" + std::to_string(slice / t.distinct_heads) + ", " + std::to_string(slice % t.distinct_heads) +
                   ", " + std::to_string(row % t.q_len) +
                   "] holds NaN or +inf; an additive mask holds 0, a bias, or -inf / a value <= the threshold");
}

// Copies the shape fields (as validate_span_shape lists them) from one holder to another.
template <class To, class From>
void copy_span_shape(To& to, const From& from) noexcept {
  to.batch = from.batch;
  to.heads = from.heads;
  to.q_len = from.q_len;
  to.k_len = from.k_len;
  to.distinct_batch = from.distinct_batch;
  to.distinct_heads = from.distinct_heads;
}

// The shape fields of a view's spans (a table's or its runs'): one slice per distinct
// (b, h) its strides allow.
template <class To>
void span_shape_of(To& to, const MaskView& view) noexcept {
  to.batch = view.batch();
  to.heads = view.heads();
  to.q_len = view.q_len();
  to.k_len = view.k_len();
  to.distinct_batch = view.stride(kBatch) == 0 ? 1 : view.batch();
  to.distinct_heads = view.stride(kHeads) == 0 ? 1 : view.heads();
}

}  // namespace detail

struct SpanTable {
  std::int64_t batch = 0, heads = 0, q_len = 0, k_len = 0;
  // Distinct slices are indexed (b', h') with b' = b when the batch stride is non-zero
  // and 0 otherwise (likewise h'); distinct_batch x distinct_heads slices in all.
  std::int64_t distinct_batch = 0, distinct_heads = 0;
  std::vector<RowSpan> rows;  // [distinct slice][query row]

  [[nodiscard]] std::int64_t distinct_slices() const noexcept { return distinct_batch * distinct_heads; }
  [[nodiscard]] std::int64_t slice_index(std::int64_t b, std::int64_t h) const noexcept {
    return (distinct_batch == 1 ? 0 : b) * distinct_heads + (distinct_heads == 1 ? 0 : h);
  }
  [[nodiscard]] std::span<const RowSpan> slice(std::int64_t b, std::int64_t h) const noexcept {
    return {rows.data() + slice_index(b, h) * q_len, static_cast<std::size_t>(q_len)};
  }
  [[nodiscard]] std::span<RowSpan> slice_mut(std::int64_t distinct_index) noexcept {
    return {rows.data() + distinct_index * q_len, static_cast<std::size_t>(q_len)};
  }

  // Whether the table is one a scanner could have produced: a shape, distinct slices
  // that are 1 or the whole dimension, one row per distinct slice and query row, and
  // every row a well-formed span of keys in [0, K). invalid_shape for the shape,
  // invalid_argument for the rest, each message naming the field and the rule.
  [[nodiscard]] Status validate() const {
    if (Status shape = validate_shape(); !shape.ok()) return shape;
    for (std::size_t i = 0; i < rows.size(); ++i)
      if (!row_ok(rows[i])) return row_error(i);
    return {};
  }

  // validate() without the per-row check: the shape, the distinct slices and the row
  // count, so rows may be indexed as [slice][query row]. classify() checks the rows
  // in its own single pass over them (row_ok) and asks validate() for the message.
  [[nodiscard]] Status validate_shape() const {
    if (Status shape = detail::validate_span_shape(*this, "span table"); !shape.ok()) return shape;
    const auto text = [](std::int64_t v) { return std::to_string(v); };
    // distinct_slices() * q_len <= batch * heads * q_len, which fits.
    if (rows.size() != static_cast<std::size_t>(distinct_slices() * q_len))
      return error(ErrorCode::invalid_argument, "span table rows must hold distinct_batch * distinct_heads * q_len (" +
                                                    text(distinct_slices() * q_len) + ") spans, got " +
                                                    text(static_cast<std::int64_t>(rows.size())));
    return {};
  }

  // Whether a row is a set of keys in [0, K) with known flags (the rule validate()
  // applies to every row).
  [[nodiscard]] bool row_ok(const RowSpan& r) const noexcept {
    constexpr std::uint32_t kKnownFlags = kRowBias | kRowFiniteMasked | kRowInvalid;
    const bool keys_ok = r.count == 0 || (0 <= r.first && r.first <= r.last && r.last < k_len &&
                                          r.count <= r.last - r.first + 1);
    return keys_ok && r.count >= 0 && (r.flags & ~kKnownFlags) == 0;
  }

 private:
  [[nodiscard]] Status row_error(std::size_t i) const {
    const auto text = [](std::int64_t v) { return std::to_string(v); };
    const RowSpan& r = rows[i];
    const std::int64_t slice = static_cast<std::int64_t>(i) / q_len;
    return error(ErrorCode::invalid_argument,
                 "span table row [" + text(slice / distinct_heads) + ", " + text(slice % distinct_heads) + ", " +
                     text(static_cast<std::int64_t>(i) % q_len) + "] is not a span of keys in [0, K): first " +
                     text(r.first) + ", last " + text(r.last) + ", count " + text(r.count) + ", flags " +
                     text(r.flags));
  }

 public:

  // Sizes the table for a view: one slice per distinct (b, h) the strides allow.
  static Result<SpanTable> for_view(const MaskView& view) {
    return catch_alloc([&]() -> Result<SpanTable> {
      SpanTable t;
      detail::span_shape_of(t, view);
      const std::int64_t slices = t.distinct_slices();
      if (slices > INT64_MAX / t.q_len || slices * t.q_len > static_cast<std::int64_t>(SIZE_MAX / sizeof(RowSpan)))
        return error(ErrorCode::out_of_memory, "span table of " + std::to_string(slices) + " x " +
                                                   std::to_string(t.q_len) + " rows is too large");
      t.rows.assign(static_cast<std::size_t>(slices * t.q_len), RowSpan{});
      return t;
    });
  }
};

namespace detail {

// The error naming the first row of `table` flagged NaN / +inf (invalid_row_error), ok
// if none: check_scanned_rows (scan.hpp) for a scanner that cannot name the element (the
// mask is on the device).
[[nodiscard]] inline Status check_flagged_rows(const SpanTable& table) {
  for (std::size_t r = 0; r < table.rows.size(); ++r)
    if (table.rows[r].flags & kRowInvalid) return invalid_row_error(table, static_cast<std::int64_t>(r));
  return {};
}

}  // namespace detail

}  // namespace masklens
