// SpanRuns: a SpanTable told in runs of rows. Masks that frameworks pass change form at
// a few rows only (causal: never; a sliding window: where the window fills; packed
// documents: at each document start), and between those rows first and last move by a
// fixed step. A run is such a stretch of one slice: rows whose first and last key are
// affine in the row, first(j) = first + d_first j and last(j) = last + d_last j, all of
// one class (every row an interval, or every row empty) and with the same flags. A row
// with holes (count < last - first + 1) is a run of its own and carries its count. A
// causal slice is one run, a sliding window two, packed documents one per document,
// left padding a few; the classifier (classify_runs.hpp) works in O(runs), and the
// device (cuda/runs.hpp) sends the runs to the host instead of every row.
//
// The runs of a table are one function of its rows (encode), so that the host and the
// device produce the same ones: walking each slice from its first row, a row starts a
// new run when it is the slice's first row, when its class, flags or padding word
// differ from the row before, when it or the row before has holes, or when the run so
// far has two rows or more and the row is not the next term of their progression
// (the greedy maximal runs from the left). The second row of a run always joins (two
// rows define a step). Steps are any int64, taken modulo 2^64 as the row's fields are
// stored: a restriction to small steps would only cut more runs (arbitrary masks have
// any step) without making the device's test or the decoding any simpler, and the
// modular arithmetic makes decoding exact for every table, well formed or not.
//
// That rule reads as a state machine over rows (the run position: head, second, later),
// which the device evaluates with a parallel prefix scan of its transition functions
// (detail::RunStep): same runs, no sequential walk.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "config.hpp"
#include "row_span.hpp"
#include "span_table.hpp"
#include "status.hpp"

namespace masklens {

// What a row is, read from its fields alone (unsigned: any bits are a class).
enum class RowClass : std::uint8_t { empty, interval, holed };

MASKLENS_HOST_DEVICE constexpr RowClass row_class(const RowSpan& r) noexcept {
  using U = std::uint64_t;
  if (r.count == 0) return RowClass::empty;
  const U span = static_cast<U>(r.last) - static_cast<U>(r.first) + 1;
  return static_cast<U>(r.count) == span ? RowClass::interval : RowClass::holed;
}

// One run: rows [row, row + length) of SpanTable::rows, all in one slice.
struct SpanRun {
  std::int64_t row = 0;     // the run's first row, an index into SpanTable::rows
  std::int64_t length = 0;  // rows in the run, >= 1
  std::int64_t first = 0, last = 0;      // the first row's keys
  std::int64_t d_first = 0, d_last = 0;  // the step per row (mod 2^64); 0 in a run of one row
  std::int64_t count = 0;   // the first row's count; an interval row's is last - first + 1
  std::uint32_t flags = 0;
  std::uint32_t reserved = 0;  // RowSpan::reserved, kept so that decoding is exact

  // The run's class, from its first row.
  [[nodiscard]] MASKLENS_HOST_DEVICE constexpr RowClass row_class() const noexcept {
    RowSpan r;
    r.first = first;
    r.last = last;
    r.count = count;
    return masklens::row_class(r);
  }
  // Row `row + j` of the table (0 <= j < length).
  [[nodiscard]] MASKLENS_HOST_DEVICE constexpr RowSpan at(std::int64_t j) const noexcept {
    using U = std::uint64_t;
    const U f = static_cast<U>(first) + static_cast<U>(d_first) * static_cast<U>(j);
    const U l = static_cast<U>(last) + static_cast<U>(d_last) * static_cast<U>(j);
    RowSpan r;
    r.first = static_cast<std::int64_t>(f);
    r.last = static_cast<std::int64_t>(l);
    r.count = row_class() == RowClass::interval ? static_cast<std::int64_t>(l - f + 1) : count;
    r.flags = flags;
    r.reserved = reserved;
    return r;
  }
  [[nodiscard]] MASKLENS_HOST_DEVICE constexpr std::int64_t end() const noexcept { return row + length; }
  friend constexpr bool operator==(const SpanRun&, const SpanRun&) = default;
};
static_assert(sizeof(SpanRun) == 64, "SpanRun is copied between host and device as is");

namespace detail {

// Whether `row` may follow `prev` in one run, whatever the steps: the same class, flags
// and padding word, and neither row with holes.
MASKLENS_HOST_DEVICE constexpr bool may_share_run(const RowSpan& prev, const RowSpan& row) noexcept {
  const RowClass c = row_class(row);
  return c != RowClass::holed && c == row_class(prev) && row.flags == prev.flags && row.reserved == prev.reserved;
}

// Whether `row` is the next term of the progression before -> prev (mod 2^64).
MASKLENS_HOST_DEVICE constexpr bool continues_step(const RowSpan& before, const RowSpan& prev,
                                                   const RowSpan& row) noexcept {
  using U = std::uint64_t;
  const auto step = [](std::int64_t a, std::int64_t b) { return static_cast<U>(b) - static_cast<U>(a); };
  return step(prev.first, row.first) == step(before.first, prev.first) &&
         step(prev.last, row.last) == step(before.last, prev.last);
}

// A row's position in its run: the encoding's state machine.
enum RunPosition : std::uint8_t { kRunHead = 0, kRunSecond = 1, kRunLater = 2 };

// The transition at one row, a map from the previous row's position to this row's,
// packed two bits per input position (bits 2k..2k+1 hold the image of k). Transitions
// compose associatively, so every row's position is an inclusive prefix scan of them
// (the device's way); the first row of a slice maps everything to a head, so the scan
// needs no initial value.
struct RunStep {
  std::uint8_t map = 0;  // 0: every position to kRunHead

  MASKLENS_HOST_DEVICE constexpr std::uint8_t apply(std::uint8_t position) const noexcept {
    return static_cast<std::uint8_t>((map >> (2 * position)) & 3u);
  }
  // `a` then `b`.
  MASKLENS_HOST_DEVICE static constexpr RunStep then(RunStep a, RunStep b) noexcept {
    RunStep r;
    r.map = static_cast<std::uint8_t>(b.apply(a.apply(0)) | (b.apply(a.apply(1)) << 2) | (b.apply(a.apply(2)) << 4));
    return r;
  }
  // Row i of a table, row q of its slice. Reads row i-2 only where row i-1 is not the
  // first of its slice (then row i-1 may be a second row, whose run holds i-2).
  MASKLENS_HOST_DEVICE static constexpr RunStep at(const RowSpan* rows, std::int64_t i, std::int64_t q) noexcept {
    RunStep r;  // a slice's first row, or a row that may not share a run with the previous one
    if (q == 0 || !may_share_run(rows[i - 1], rows[i])) return r;
    // After a head: the second row. After a second or later row: on the step, or a new head.
    const bool on_step = q >= 2 && continues_step(rows[i - 2], rows[i - 1], rows[i]);
    const std::uint8_t later = on_step ? kRunLater : kRunHead;
    r.map = static_cast<std::uint8_t>(kRunSecond | (later << 2) | (later << 4));
    return r;
  }
};

// The run that starts at `head` (a row whose position is kRunHead) and ends before `end`.
MASKLENS_HOST_DEVICE constexpr SpanRun make_run(const RowSpan* rows, std::int64_t head, std::int64_t end) noexcept {
  using U = std::uint64_t;
  const RowSpan& r = rows[head];
  SpanRun run;
  run.row = head;
  run.length = end - head;
  run.first = r.first;
  run.last = r.last;
  run.count = r.count;
  run.flags = r.flags;
  run.reserved = r.reserved;
  if (run.length > 1) {
    run.d_first = static_cast<std::int64_t>(static_cast<U>(rows[head + 1].first) - static_cast<U>(r.first));
    run.d_last = static_cast<std::int64_t>(static_cast<U>(rows[head + 1].last) - static_cast<U>(r.last));
  }
  return run;
}

}  // namespace detail

struct SpanRuns {
  // The table's shape, as SpanTable holds it.
  std::int64_t batch = 0, heads = 0, q_len = 0, k_len = 0;
  std::int64_t distinct_batch = 0, distinct_heads = 0;
  std::vector<SpanRun> runs;  // in row order, tiling the table's rows

  [[nodiscard]] std::int64_t distinct_slices() const noexcept { return distinct_batch * distinct_heads; }
  // Rows the runs stand for. Precondition: validate_shape() is ok.
  [[nodiscard]] std::int64_t rows() const noexcept { return distinct_slices() * q_len; }
  [[nodiscard]] std::int64_t slice_index(std::int64_t b, std::int64_t h) const noexcept {
    return (distinct_batch == 1 ? 0 : b) * distinct_heads + (distinct_heads == 1 ? 0 : h);
  }

  // The shape: the rules and messages of SpanTable::validate_shape, for "span runs".
  [[nodiscard]] Status validate_shape() const { return detail::validate_span_shape(*this, "span runs"); }

  // The shape, and runs that tile rows [0, rows()) in order, each inside one slice.
  // The rows themselves are not checked here: classify() checks them as it does a
  // table's (SpanTable::row_ok).
  [[nodiscard]] Status validate() const {
    if (Status shape = validate_shape(); !shape.ok()) return shape;
    const auto text = [](std::int64_t v) { return std::to_string(v); };
    std::int64_t next = 0;
    for (std::size_t i = 0; i < runs.size(); ++i) {
      const SpanRun& r = runs[i];
      const bool tiles = r.row == next && r.length >= 1 && r.length <= rows() - r.row &&
                         r.row / q_len == (r.row + r.length - 1) / q_len;
      if (tiles) {
        next = r.row + r.length;
        continue;
      }
      const std::string name = "span runs run " + text(static_cast<std::int64_t>(i));
      if (r.row != next)
        return error(ErrorCode::invalid_argument, name + " starts at row " + text(r.row) +
                                                      "; runs must tile the rows in order (expected " + text(next) + ")");
      if (r.length < 1 || r.length > rows() - r.row)
        return error(ErrorCode::invalid_argument,
                     name + " length " + text(r.length) + " must be in [1, " + text(rows() - r.row) + "]");
      return error(ErrorCode::invalid_argument, name + " (rows " + text(r.row) + " to " + text(r.row + r.length - 1) +
                                                    ") crosses a slice boundary (q_len " + text(q_len) + ")");
    }
    if (next != rows())
      return error(ErrorCode::invalid_argument, "span runs cover " + text(next) + " rows of " + text(rows()) +
                                                    " (distinct_batch * distinct_heads * q_len)");
    return {};
  }

  // The runs of `table` by the rule above. The table's shape must hold
  // (SpanTable::validate_shape); its rows may be anything.
  static Result<SpanRuns> encode(const SpanTable& table) {
    if (Status shape = table.validate_shape(); !shape.ok()) return shape;
    return catch_alloc([&]() -> Result<SpanRuns> {
      SpanRuns out = shape_of(table);
      const RowSpan* rows = table.rows.data();
      const auto n = static_cast<std::int64_t>(table.rows.size());
      for (std::int64_t slice = 0; slice * table.q_len < n; ++slice) {
        const RowSpan* first = rows + slice * table.q_len;
        std::uint8_t position = detail::kRunHead;
        std::int64_t head = 0;
        for (std::int64_t q = 1; q <= table.q_len; ++q) {
          position = q < table.q_len ? detail::RunStep::at(first, q, q).apply(position) : std::uint8_t{detail::kRunHead};
          if (position != detail::kRunHead) continue;
          out.runs.push_back(detail::make_run(rows, slice * table.q_len + head, slice * table.q_len + q));
          head = q;
        }
      }
      return out;
    });
  }

  // The table back, row for row and bit for bit.
  [[nodiscard]] Result<SpanTable> expand() const {
    if (Status st = validate(); !st.ok()) return st;
    if (rows() > static_cast<std::int64_t>(SIZE_MAX / sizeof(RowSpan)))
      return error(ErrorCode::out_of_memory, "span table of " + std::to_string(rows()) + " rows is too large");
    return catch_alloc([&]() -> Result<SpanTable> {
      SpanTable t;
      detail::copy_span_shape(t, *this);
      t.rows.resize(static_cast<std::size_t>(rows()));
      for (const SpanRun& r : runs)
        for (std::int64_t j = 0; j < r.length; ++j) t.rows[static_cast<std::size_t>(r.row + j)] = r.at(j);
      return t;
    });
  }

  // An empty SpanRuns with the table's shape.
  static SpanRuns shape_of(const SpanTable& t) {
    SpanRuns s;
    detail::copy_span_shape(s, t);
    return s;
  }
};

}  // namespace masklens
