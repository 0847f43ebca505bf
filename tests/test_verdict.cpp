// Verdict (verdict.hpp): a host scan's verdict is classify() of its spans and keeps them;
// the verdict of the same rows as runs has the same structure and the same attending
// rows; attends() on empty, finite-masked and keyed rows and runs; a run flagged NaN /
// +inf is named as its first row [b, h, q]; the thread count a scan chooses from the
// mask's size.
#include <doctest/doctest.h>

#include <masklens/verdict.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "support/mask_gen.hpp"
#include "support/structure_fields.hpp"

using namespace masklens;
using namespace masklens::testing;

namespace {

std::vector<std::uint8_t> attending(const Verdict& v) {
  std::vector<std::uint8_t> out(static_cast<std::size_t>(v.rows()), 2);
  attending_rows(v, out);
  return out;
}

SpanRun run_of(std::int64_t row, std::int64_t length, RowSpan r) {
  SpanRun run;
  run.row = row;
  run.length = length;
  run.first = r.first;
  run.last = r.last;
  run.count = r.count;
  run.flags = r.flags;
  return run;
}

}  // namespace

TEST_SUITE("host") {

TEST_CASE("verdict: a host scan's verdict is classify() of its spans, and the runs' verdict is the same") {
  Rng rng(test_seed(20260443));
  for (int i = 0; i < 300; ++i) {
    const std::int64_t batch = uniform(rng, 1, 3), q_len = uniform(rng, 1, 40);
    const std::int64_t k_len = coin(rng, 0.6) ? q_len : uniform(rng, 1, 40);
    const MaskStructure spec = random_structure(rng, batch, q_len, k_len);
    const ElementType dtype = coin(rng) ? ElementType::boolean : ElementType::float32;
    const Layout layout = coin(rng) ? Layout::contiguous : Layout::expand;
    const DenseMask dense = render(layout == Layout::expand ? repeat_batches(spec, 1) : spec, uniform(rng, 1, 2),
                                   dtype, Polarity::true_attends, layout, rng);
    CAPTURE(dense.describe);

    Result<SpanTable> spans = scan(dense.view);
    REQUIRE(spans.ok());
    Result<MaskStructure> want = classify(*spans);
    Result<Verdict> v = scan_verdict(dense.view, ScanOptions{static_cast<int>(uniform(rng, 1, 3))});
    REQUIRE(v.ok() == want.ok());
    if (!want.ok()) {
      CHECK(v.status().to_string() == want.status().to_string());
      continue;
    }
    CHECK(structure_fields(v->structure) == structure_fields(*want));
    CHECK(!v->runs);
    REQUIRE(v->spans.rows.size() == spans->rows.size());
    CHECK(v->rows() == static_cast<std::int64_t>(spans->rows.size()));
    for (std::size_t r = 0; r < spans->rows.size(); ++r) CHECK(v->spans.rows[r].same_keys(spans->rows[r]));

    Result<SpanRuns> runs = SpanRuns::encode(*spans);
    REQUIRE(runs.ok());
    Result<Verdict> from_runs = verdict_of(std::move(runs).value());
    REQUIRE(from_runs.ok());
    CHECK(from_runs->runs);
    CHECK(from_runs->spans.rows.empty());
    CHECK(structure_fields(from_runs->structure) == structure_fields(*want));
    CHECK(from_runs->rows() == v->rows());
    CHECK(attending(*from_runs) == attending(*v));
  }
}

TEST_CASE("verdict: attends() on empty, finite-masked and keyed rows and runs") {
  RowSpan empty;
  CHECK(!attends(empty));
  RowSpan finite = empty;
  finite.flags = kRowFiniteMasked;
  CHECK(attends(finite));  // masked only by finite values: attends uniformly
  RowSpan biased_empty = empty;
  biased_empty.flags = kRowBias;
  CHECK(!attends(biased_empty));
  CHECK(attends(RowSpan::interval(2, 5)));
  RowSpan holed = RowSpan::interval(0, 9);
  holed.count = 3;
  CHECK(attends(holed));
  static_assert(!attends(RowSpan{}));

  CHECK(!attends(run_of(0, 4, empty)));
  CHECK(attends(run_of(0, 4, finite)));
  CHECK(attends(run_of(0, 4, RowSpan::interval(0, 0))));
  CHECK(attends(run_of(0, 1, holed)));

  // A verdict's rows, a run at a time: [empty x2, keyed x3, finite-masked x1].
  Verdict v;
  SpanRuns& runs = v.runs.emplace();
  runs.batch = runs.heads = runs.distinct_batch = runs.distinct_heads = 1;
  runs.q_len = 6;
  runs.k_len = 8;
  runs.runs = {run_of(0, 2, empty), run_of(2, 3, RowSpan::interval(1, 4)), run_of(5, 1, finite)};
  CHECK(attending(v) == std::vector<std::uint8_t>{0, 0, 1, 1, 1, 1});
  Result<SpanTable> table = runs.expand();
  REQUIRE(table.ok());
  Verdict rows;
  rows.spans = *table;
  CHECK(attending(rows) == attending(v));
}

TEST_CASE("verdict: a run flagged NaN / +inf is an error naming its first row") {
  // Two batches of three rows each: rows 0-2 are batch 0, rows 3-5 batch 1.
  SpanRuns runs;
  runs.batch = runs.distinct_batch = 2;
  runs.heads = runs.distinct_heads = 1;
  runs.q_len = 3;
  runs.k_len = 4;
  RowSpan nan_row = RowSpan::interval(0, 3);
  nan_row.flags = kRowInvalid;
  runs.runs = {run_of(0, 3, RowSpan::interval(0, 3)), run_of(3, 1, RowSpan::interval(0, 3)),
               run_of(4, 1, nan_row), run_of(5, 1, nan_row)};
  REQUIRE(runs.validate().ok());
  Result<Verdict> v = verdict_of(runs);
  REQUIRE(!v.ok());
  CHECK(v.status().code() == ErrorCode::invalid_value);
  CHECK(v.status().message() ==
        "mask row [1, 0, 1] holds NaN or +inf; an additive mask holds 0, a bias, or -inf / a value <= the threshold");

  // The same rows as a table: classify() names the same row.
  Result<SpanTable> table = runs.expand();
  REQUIRE(table.ok());
  CHECK(verdict_of(*table).status().to_string() == v.status().to_string());

  // A shape with no rows is refused before any row is named.
  runs.q_len = 0;
  CHECK(verdict_of(runs).status().to_string() == "invalid_shape: span runs q_len must be >= 1, got 0");
}

TEST_CASE("verdict: a scan that names no thread count takes threads from kThreadedScanBytes up") {
  const std::uint8_t byte = 1;
  const auto view = [&](std::int64_t batch, std::int64_t q, std::int64_t k, std::int64_t batch_stride) {
    const std::int64_t shape[4] = {batch, 1, q, k}, strides[4] = {batch_stride, 0, 0, 0};
    Result<MaskView> v = MaskView::make(&byte, ElementType::boolean, shape, strides);
    REQUIRE(v.ok());
    return *v;
  };
  CHECK(scan_options_for(view(1, 4096, 4096, 0), 3).threads == 3);         // named: as named
  CHECK(scan_options_for(view(1, 4096, 4096, 0)).threads == 0);            // 16 MiB: every hardware thread
  CHECK(scan_options_for(view(1, 2048, 2048, 0)).threads == 1);            // 4 MiB: the calling thread
  CHECK(scan_options_for(view(4, 2048, 2048, 0)).threads == 1);            // a broadcast batch is read once
  CHECK(scan_options_for(view(4, 2048, 2048, 1)).threads == 0);            // 16 MiB of distinct batches
  CHECK(scan_options_for(view(2, 2048, 2048, 1), -1).threads == 0);        // 8 MiB: from the threshold up
}

}  // TEST_SUITE
