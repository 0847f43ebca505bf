// The baseline classifier's translation unit (classify_baseline.hpp): compiled by
// bench/classify_against.sh with the include path of another tree's include/ (and the
// tree's root, for its tests/support/structure_fields.hpp), and `masklens` renamed so that
// its inline functions cannot merge with this tree's at link time.
#define CLASSIFY_BASELINE_TU
#include "classify_baseline.hpp"

#define masklens masklens_baseline
#include <masklens/classify.hpp>
#if __has_include(<masklens/classify_runs.hpp>)
#include <masklens/classify_runs.hpp>
#define BASELINE_HAS_RUNS 1
#endif
#if __has_include("tests/support/structure_fields.hpp")
#include "tests/support/structure_fields.hpp"
#define BASELINE_FIELDS(s) masklens_baseline::testing::structure_fields(s)
#else
#include <masklens/describe.hpp>
#define BASELINE_FIELDS(s) masklens_baseline::describe(s)
#endif
#undef masklens

namespace classify_baseline {

struct Table {
  masklens_baseline::SpanTable table;
#ifdef BASELINE_HAS_RUNS
  masklens_baseline::SpanRuns runs;
#endif
};

std::shared_ptr<const Table> load(const Shape& shape, const std::vector<Row>& rows) {
  auto t = std::make_shared<Table>();
  t->table.batch = shape.batch;
  t->table.heads = shape.heads;
  t->table.q_len = shape.q_len;
  t->table.k_len = shape.k_len;
  t->table.distinct_batch = shape.distinct_batch;
  t->table.distinct_heads = shape.distinct_heads;
  for (const Row& r : rows) {
    masklens_baseline::RowSpan s;
    s.first = r.first;
    s.last = r.last;
    s.count = r.count;
    s.flags = r.flags;
    t->table.rows.push_back(s);
  }
#ifdef BASELINE_HAS_RUNS
  if (auto runs = masklens_baseline::SpanRuns::encode(t->table)) t->runs = *std::move(runs);
#endif
  return t;
}

template <class Verdict>
std::string text_of(const Verdict& v) {
  return v ? BASELINE_FIELDS(*v) : v.status().to_string();
}

std::string verdict(const Table& t) { return text_of(masklens_baseline::classify(t.table)); }
std::size_t classify_rows(const Table& t) { return masklens_baseline::classify(t.table)->kv_valid.size(); }

#ifdef BASELINE_HAS_RUNS
bool has_runs() { return true; }
std::string verdict_from_runs(const Table& t) { return text_of(masklens_baseline::classify(t.runs)); }
std::size_t classify_runs(const Table& t) { return masklens_baseline::classify(t.runs)->kv_valid.size(); }
#else
bool has_runs() { return false; }
std::string verdict_from_runs(const Table&) { return {}; }
std::size_t classify_runs(const Table&) { return 0; }
#endif

}  // namespace classify_baseline
