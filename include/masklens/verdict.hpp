// Verdict: a scanned mask's structure with the rows it was proven from. A structure
// alone cannot list the rows that attend to nothing where it is arbitrary, and a caller
// that zeroes those rows' output (torch's dense softmax gives them 0) needs them; so the
// verdict keeps the rows: a host scan's span table, or the span runs a device scan (or
// row shards put in order) brought to the host, O(runs) and expanded only where a
// caller asks for every row. What the Python package's scans return, for C++ callers.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <utility>

#include "classify.hpp"
#include "classify_runs.hpp"
#include "config.hpp"
#include "mask_view.hpp"
#include "row_span.hpp"
#include "scan_threads.hpp"
#include "span_runs.hpp"
#include "span_table.hpp"
#include "status.hpp"
#include "structure.hpp"

namespace masklens {

struct Verdict {
  MaskStructure structure;
  SpanTable spans;               // a host scan's rows
  std::optional<SpanRuns> runs;  // a device scan's runs (then `spans` is empty)

  // Rows of the scanned table, [distinct batch][distinct heads][q]: broadcast dims once.
  [[nodiscard]] std::int64_t distinct_batch() const noexcept {
    return runs ? runs->distinct_batch : spans.distinct_batch;
  }
  [[nodiscard]] std::int64_t distinct_heads() const noexcept {
    return runs ? runs->distinct_heads : spans.distinct_heads;
  }
  [[nodiscard]] std::int64_t q_len() const noexcept { return runs ? runs->q_len : spans.q_len; }
  [[nodiscard]] std::int64_t rows() const noexcept { return distinct_batch() * distinct_heads() * q_len(); }
};

// A row attends when it has a key, or is masked only by finite values: such a row
// attends uniformly in torch's dense softmax (only rows with no key at all come out 0).
MASKLENS_HOST_DEVICE constexpr bool attends(const RowSpan& r) noexcept {
  return !r.empty() || (r.flags & kRowFiniteMasked) != 0;
}
// The same for every row of a run (its rows share a class and flags).
MASKLENS_HOST_DEVICE constexpr bool attends(const SpanRun& r) noexcept {
  return r.row_class() != RowClass::empty || (r.flags & kRowFiniteMasked) != 0;
}

// Whether each of the verdict's rows attends, one byte (0 or 1) per row into `out`,
// which holds v.rows() bytes; a run is one fill, never expanded.
inline void attending_rows(const Verdict& v, std::span<std::uint8_t> out) noexcept {
  if (v.runs) {
    for (const SpanRun& r : v.runs->runs)
      std::memset(out.data() + r.row, attends(r) ? 1 : 0, static_cast<std::size_t>(r.length));
    return;
  }
  for (std::size_t i = 0; i < v.spans.rows.size(); ++i) out[i] = attends(v.spans.rows[i]) ? 1 : 0;
}

// The verdict of a scanned table: classify(spans), which keeps them.
inline Result<Verdict> verdict_of(SpanTable spans) {
  Result<MaskStructure> s = classify(spans);
  if (!s) return s.status();
  Verdict v;
  v.structure = std::move(s).value();
  v.spans = std::move(spans);
  return v;
}

// The verdict of span runs in host memory (a device scan's, or row shards' put in row
// order): a row flagged NaN / +inf is named as gpu::scan_runs() names it (the first
// flagged run's first row: the mask is elsewhere, so no element can be), then
// classify(runs) in O(runs), which refuses runs that do not tile the rows.
inline Result<Verdict> verdict_of(SpanRuns runs) {
  if (Status shape = runs.validate_shape(); !shape.ok()) return shape;  // q_len >= 1 before a row is named
  for (const SpanRun& r : runs.runs)
    if (r.flags & kRowInvalid) return detail::invalid_row_error(runs, r.row);
  Result<MaskStructure> s = classify(runs);
  if (!s) return s.status();
  Verdict v;
  v.structure = std::move(s).value();
  v.runs.emplace(std::move(runs));
  return v;
}

// Scans a host mask (scan_threads.hpp: threads as `options` say; scan_options_for()
// chooses as the Python package does) and classifies it: the verdict masklens._core.scan
// returns, or the scan's error naming the first bad element.
inline Result<Verdict> scan_verdict(const MaskView& view, ScanOptions options) {
  Result<SpanTable> spans = scan(view, options);
  if (!spans) return spans.status();
  return verdict_of(std::move(spans).value());
}

}  // namespace masklens
