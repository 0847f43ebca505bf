// The classifier of another tree (a git ref) in this program, beside this tree's: bench/
// classify_against.sh compiles classify_baseline.cpp against that tree's headers with the
// namespace `masklens` renamed, so the two classifiers share no symbol. Only plain data
// crosses: the rows in, the verdict as text and a number to sink out.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace classify_baseline {

struct Shape {
  std::int64_t batch, heads, q_len, k_len, distinct_batch, distinct_heads;
};
struct Row {
  std::int64_t first, last, count;
  std::uint32_t flags;
};

// A span table, and its runs where the baseline tree has them, in the baseline's types.
struct Table;
std::shared_ptr<const Table> load(const Shape& shape, const std::vector<Row>& rows);

// Whether the baseline tree has classify(SpanRuns) (span_runs.hpp).
bool has_runs();
// Every field of the verdict (tests/support/structure_fields.hpp's line), or the error.
std::string verdict(const Table& t);
std::string verdict_from_runs(const Table& t);
// classify(table) and classify(runs): kv_valid's size, for a timing loop to sink.
std::size_t classify_rows(const Table& t);
std::size_t classify_runs(const Table& t);

}  // namespace classify_baseline

// A table of this tree in the baseline's terms (not in the baseline's own translation
// unit, where <masklens/...> names the other tree).
#ifndef CLASSIFY_BASELINE_TU
#include <masklens/span_table.hpp>

namespace classify_baseline {

inline std::shared_ptr<const Table> load(const masklens::SpanTable& t) {
  std::vector<Row> rows;
  rows.reserve(t.rows.size());
  for (const masklens::RowSpan& r : t.rows) rows.push_back({r.first, r.last, r.count, r.flags});
  return load({t.batch, t.heads, t.q_len, t.k_len, t.distinct_batch, t.distinct_heads}, rows);
}

}  // namespace classify_baseline
#endif
