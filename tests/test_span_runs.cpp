// SpanRuns: the run encoding of a span table and the classifier that reads it.
//   * encoding: exact (expand gives back the table bit for bit, whatever its rows), the
//     greedy maximal runs of the documented rule (against a walk written separately),
//     the same runs from the transition scan in any grouping (what the device does),
//     few runs for the structures frameworks pass;
//   * classify(SpanRuns) gives classify(SpanTable)'s verdict field for field, or its
//     error, on generated structures of every kind with modifiers, broadcast dims, flags,
//     single-row mutations and random tables; and stays in O(runs) (no expansion, little
//     work) for the structures issue 13 names at 69632 rows;
//   * a candidate structure's rows produced as segments equal its rows one by one;
//   * the device's tiled reduction (cuda/agent_runs.hpp), replayed here with sequential
//     scans where the kernels use CUB block scans, gives encode()'s runs.
#include <doctest/doctest.h>

#include <masklens/classify_runs.hpp>
#include <masklens/cuda/agent_runs.hpp>
#include <masklens/span_runs.hpp>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "support/mask_gen.hpp"
#include "support/structure_fields.hpp"
#include "support/structure_tables.hpp"

using namespace masklens;
using namespace masklens::testing;

namespace {

// table_of (support/structure_tables.hpp) with no flags.
SpanTable table_of(const MaskStructure& spec) {
  Rng unused(0);
  return masklens::testing::table_of(spec, 1, false, unused, 0.0);
}

bool same_bits(const RowSpan& a, const RowSpan& b) { return std::memcmp(&a, &b, sizeof(RowSpan)) == 0; }

// encode then expand gives the table back bit for bit, and the runs tile it.
void check_round_trip(const SpanTable& t) {
  Result<SpanRuns> runs = SpanRuns::encode(t);
  REQUIRE(runs.ok());
  REQUIRE(runs->validate().ok());
  Result<SpanTable> back = runs->expand();
  REQUIRE(back.ok());
  CHECK(back->batch == t.batch);
  CHECK(back->heads == t.heads);
  CHECK(back->q_len == t.q_len);
  CHECK(back->k_len == t.k_len);
  CHECK(back->distinct_batch == t.distinct_batch);
  CHECK(back->distinct_heads == t.distinct_heads);
  REQUIRE(back->rows.size() == t.rows.size());
  for (std::size_t i = 0; i < t.rows.size(); ++i) REQUIRE_MESSAGE(same_bits(back->rows[i], t.rows[i]), "row " << i);
}

// The rule, written as a plain walk: from each head, the second row joins when it may
// share the run; later rows join while their step from the row before is the run's.
std::vector<SpanRun> naive_runs(const SpanTable& t) {
  using U = std::uint64_t;
  const auto cls = [](const RowSpan& r) {
    if (r.count == 0) return 0;
    return static_cast<U>(r.count) == static_cast<U>(r.last) - static_cast<U>(r.first) + 1 ? 1 : 2;
  };
  const auto compatible = [&](const RowSpan& a, const RowSpan& b) {
    return cls(a) == cls(b) && cls(b) != 2 && a.flags == b.flags && a.reserved == b.reserved;
  };
  const auto step = [](const RowSpan& a, const RowSpan& b) {
    return std::pair<U, U>{static_cast<U>(b.first) - static_cast<U>(a.first), static_cast<U>(b.last) - static_cast<U>(a.last)};
  };
  std::vector<SpanRun> out;
  for (std::int64_t s = 0; s < t.distinct_slices(); ++s) {
    const std::int64_t end = (s + 1) * t.q_len;
    for (std::int64_t i = s * t.q_len; i < end;) {
      std::int64_t j = i + 1;
      const auto& rows = t.rows;
      if (j < end && compatible(rows[static_cast<std::size_t>(i)], rows[static_cast<std::size_t>(j)])) {
        const auto run_step = step(rows[static_cast<std::size_t>(i)], rows[static_cast<std::size_t>(j)]);
        ++j;
        while (j < end && compatible(rows[static_cast<std::size_t>(j - 1)], rows[static_cast<std::size_t>(j)]) &&
               step(rows[static_cast<std::size_t>(j - 1)], rows[static_cast<std::size_t>(j)]) == run_step)
          ++j;
      }
      out.push_back(detail::make_run(t.rows.data(), i, j));
      i = j;
    }
  }
  return out;
}

// Each row's run position by composing transitions over a random split of the rows
// into groups, as a parallel scan groups them: the heads must be encode()'s.
std::vector<std::int64_t> heads_by_grouped_scan(const SpanTable& t, Rng& rng) {
  const auto n = static_cast<std::int64_t>(t.rows.size());
  std::vector<detail::RunStep> steps(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) steps[static_cast<std::size_t>(i)] = detail::RunStep::at(t.rows.data(), i, i % t.q_len);
  // Group aggregates, then each group's prefix from the aggregates before it.
  std::vector<std::int64_t> cuts{0};
  while (cuts.back() < n) cuts.push_back(std::min(n, cuts.back() + uniform(rng, 1, 9)));
  detail::RunStep carry;  // before row 0: anything (row 0 maps every position to a head)
  carry.map = 0b100100;   // identity
  std::vector<std::int64_t> heads;
  for (std::size_t g = 0; g + 1 < cuts.size(); ++g) {
    detail::RunStep local = carry;
    for (std::int64_t i = cuts[g]; i < cuts[g + 1]; ++i) {
      local = detail::RunStep::then(local, steps[static_cast<std::size_t>(i)]);
      if (local.apply(detail::kRunLater) == detail::kRunHead) heads.push_back(i);
    }
    detail::RunStep aggregate;
    aggregate.map = 0b100100;
    for (std::int64_t i = cuts[g]; i < cuts[g + 1]; ++i) aggregate = detail::RunStep::then(aggregate, steps[static_cast<std::size_t>(i)]);
    carry = detail::RunStep::then(carry, aggregate);
  }
  return heads;
}

RowSpan random_row(Rng& rng, std::int64_t k_len, bool garbage) {
  RowSpan r;
  if (garbage) {
    r.first = static_cast<std::int64_t>(rng());
    r.last = coin(rng) ? r.first + uniform(rng, -2, 2) : static_cast<std::int64_t>(rng());
    r.count = coin(rng) ? 0 : static_cast<std::int64_t>(rng() % 5);
    r.flags = static_cast<std::uint32_t>(rng() % 9);
    r.reserved = static_cast<std::uint32_t>(rng() % 3);
    return r;
  }
  switch (uniform(rng, 0, 3)) {
    case 0: break;  // empty
    case 1: {
      const std::int64_t a = uniform(rng, 0, k_len - 1), b = uniform(rng, 0, k_len - 1);
      r = RowSpan::interval(std::min(a, b), std::max(a, b));
      break;
    }
    case 2:
      r = RowSpan::interval(0, uniform(rng, 0, k_len - 1));
      break;
    default: {
      const std::int64_t a = uniform(rng, 0, k_len - 1), b = uniform(rng, 0, k_len - 1);
      r = RowSpan::interval(std::min(a, b), std::max(a, b));
      if (r.count > 2) --r.count;  // a hole
      break;
    }
  }
  if (coin(rng, 0.1)) r.flags |= kRowFiniteMasked;
  return r;
}

SpanTable random_table(Rng& rng, bool garbage) {
  SpanTable t;
  t.batch = uniform(rng, 1, 3);
  t.heads = uniform(rng, 1, 2);
  t.q_len = uniform(rng, 1, 30);
  t.k_len = coin(rng) ? t.q_len : uniform(rng, 1, 30);
  t.distinct_batch = coin(rng) ? t.batch : 1;
  t.distinct_heads = coin(rng) ? t.heads : 1;
  for (std::int64_t i = 0; i < t.distinct_slices() * t.q_len; ++i) t.rows.push_back(random_row(rng, t.k_len, garbage));
  return t;
}

// The run path held to it: never expanded for density.
constexpr detail::runs::Options kRunPath{0, 64, 1 << 14};

struct Agreement {
  int tables = 0, run_path = 0, errors = 0;
};

// classify(SpanRuns) against classify(SpanTable): the same status, or the same
// structure field for field; with the default options too.
void check_same_verdict(const SpanTable& t, Agreement& seen, const std::string& what) {
  INFO(what);
  const Result<MaskStructure> reference = classify(t);
  Result<SpanRuns> runs = SpanRuns::encode(t);
  REQUIRE(runs.ok());
  RunsClassifyStats stats;
  const Result<MaskStructure> got = detail::runs::classify_runs(*runs, kRunPath, &stats);
  const Result<MaskStructure> by_default = classify(*runs);
  // A budget spent anywhere in the search: the expanded table decides.
  const detail::runs::Options starved{0, 0, static_cast<std::int64_t>(seen.tables % 97)};
  const Result<MaskStructure> cut_short = detail::runs::classify_runs(*runs, starved, nullptr);
  ++seen.tables;
  REQUIRE(got.ok() == reference.ok());
  REQUIRE(by_default.ok() == reference.ok());
  REQUIRE(cut_short.ok() == reference.ok());
  if (!reference.ok()) {
    ++seen.errors;
    CHECK(got.status().to_string() == reference.status().to_string());
    CHECK(by_default.status().to_string() == reference.status().to_string());
    CHECK(cut_short.status().to_string() == reference.status().to_string());
    return;
  }
  if (!stats.expanded) ++seen.run_path;
  CHECK(structure_fields(*got) == structure_fields(*reference));
  CHECK(structure_fields(*by_default) == structure_fields(*reference));
  CHECK(structure_fields(*cut_short) == structure_fields(*reference));
}

// The canonical segments of rows given one by one.
detail::KeyRows key_rows_of(const std::vector<RowSpan>& rows) {
  detail::KeyRows out;
  auto collect = [&out](const detail::KeySeg& s) {
    out.push_back(s);
    return true;
  };
  detail::KeyRowsBuilder<decltype(collect)> builder(collect);
  for (std::size_t q = 0; q < rows.size(); ++q) {
    detail::KeySeg s;
    s.q = static_cast<std::int64_t>(q);
    s.n = 1;
    s.empty = rows[q].empty();
    if (!s.empty) {
      s.first = rows[q].first;
      s.last = rows[q].last;
    }
    builder.push(s);
  }
  builder.finish();
  return out;
}

// The four kernels of cuda/dispatch_runs.cuh, replayed: the same per-thread functions, an
// exclusive scan over threads (and over tiles, 256 at a time) written out in order.
SpanRuns replay_device_reduction(const SpanTable& t, std::int64_t max_runs, std::int64_t* count_out = nullptr,
                                 std::int64_t* first_invalid_out = nullptr) {
  namespace g = masklens::gpu::detail;
  using masklens::detail::RunStep;
  const auto n_rows = static_cast<std::int64_t>(t.rows.size());
  const std::int64_t tiles = g::runs_tiles(n_rows);
  std::vector<RunStep> tile_step(static_cast<std::size_t>(tiles));
  std::vector<g::HeadCounts> tile_heads(static_cast<std::size_t>(tiles));
  std::vector<std::uint8_t> tile_start(static_cast<std::size_t>(tiles));
  std::vector<std::int64_t> tile_offset(static_cast<std::size_t>(tiles));
  const auto threads_of = [&](std::int64_t tile) {
    std::vector<g::ThreadRows> threads;
    for (int th = 0; th < g::kRunsThreads; ++th) threads.push_back(g::thread_rows(t.rows.data(), n_rows, t.q_len, tile, th));
    return threads;
  };
  std::int64_t rank = 0;  // the largest invalid_rank, over the tiles' maxima
  for (std::int64_t tile = 0; tile < tiles; ++tile) {  // 1. tile summaries
    RunStep before = g::identity_step();
    g::HeadCounts total{{0, 0, 0}};
    std::int64_t tile_rank = 0;
    for (const g::ThreadRows& mine : threads_of(tile)) {
      total = g::add(total, g::heads_per_start(mine, before));
      before = RunStep::then(before, mine.all);
      tile_rank = std::max(tile_rank, g::invalid_rank(mine, t.rows.data(), n_rows));
    }
    tile_step[static_cast<std::size_t>(tile)] = before;
    tile_heads[static_cast<std::size_t>(tile)] = total;
    rank = std::max(rank, tile_rank);
  }
  if (first_invalid_out) *first_invalid_out = g::first_invalid_row(rank, n_rows);
  RunStep carried = g::identity_step();  // 2. the tiles in passes of one block
  std::int64_t runs_before = 0;
  for (std::int64_t base = 0; base < tiles; base += g::kRunsThreads) {
    RunStep before = g::identity_step();
    std::int64_t offset = 0;
    for (std::int64_t tt = base; tt < base + g::kRunsThreads && tt < tiles; ++tt) {
      const auto k = static_cast<std::size_t>(tt);
      const std::uint8_t start = RunStep::then(carried, before).apply(g::kRunHead);
      tile_start[k] = start;
      tile_offset[k] = runs_before + offset;
      offset += tile_heads[k].n[start];
      before = RunStep::then(before, tile_step[k]);
    }
    carried = RunStep::then(carried, before);
    runs_before += offset;
  }
  std::vector<SpanRun> runs(static_cast<std::size_t>(max_runs));
  std::int64_t next_row = -1;
  for (std::int64_t tile = 0; tile < tiles; ++tile) {  // 3. heads write their runs
    RunStep before = g::identity_step();
    std::int64_t at = 0;
    for (const g::ThreadRows& mine : threads_of(tile)) {
      const std::uint8_t start = before.apply(tile_start[static_cast<std::size_t>(tile)]);
      g::write_runs(mine, start, t.rows.data(), n_rows, t.q_len, runs.data(), max_runs, &next_row,
                    tile_offset[static_cast<std::size_t>(tile)] + at);
      at += g::heads_from(mine, start);
      before = RunStep::then(before, mine.all);
    }
  }
  const std::int64_t stored = std::min(runs_before, max_runs);
  for (std::int64_t k = 0; k < stored; ++k) g::set_length(runs.data(), k, runs_before, n_rows, max_runs, &next_row);
  runs.resize(static_cast<std::size_t>(stored));  // 4. lengths
  if (count_out) *count_out = runs_before;
  SpanRuns out = SpanRuns::shape_of(t);
  out.runs = std::move(runs);
  return out;
}

}  // namespace

TEST_SUITE("host") {

TEST_CASE("span runs: the device's tiled reduction, replayed on the host, gives encode()'s runs") {
  Rng rng(test_seed(20261309));
  // Around a tile (kRunsTileRows) and a pass of the prefix kernel (kRunsThreads tiles).
  constexpr std::int64_t tile = masklens::gpu::detail::kRunsTileRows;
  constexpr std::int64_t pass = tile * masklens::gpu::detail::kRunsThreads;
  const std::int64_t row_counts[] = {1, 2, 9, tile - 1, tile, tile + 1, 6000, pass - 1, pass + 1};
  for (const std::int64_t rows : row_counts)
    for (int rep = 0; rep < 3; ++rep) {
      SpanTable t;
      t.q_len = rep == 0 ? rows : rep == 1 ? 1 : (rows % 3 == 0 && rows > 3 ? 3 : rows);
      t.batch = t.distinct_batch = rows / t.q_len;
      t.heads = t.distinct_heads = 1;
      t.k_len = uniform(rng, 1, 200);
      MaskStructure spec = random_structure(rng, 1, t.q_len, t.k_len);
      const double noise = rows > 100000 ? 0.001 : 0.1;
      for (std::int64_t i = 0; i < rows; ++i)
        t.rows.push_back(coin(rng, noise) ? random_row(rng, t.k_len, coin(rng, 0.3)) : spec.row(0, i % t.q_len));
      // Rows holding NaN / +inf in some tables (and wherever a garbage row's flags say so):
      // the first of them is reported.
      if (rep != 1)
        for (int k = uniform(rng, 0, 2); k > 0; --k)
          t.rows[static_cast<std::size_t>(uniform(rng, 0, rows - 1))].flags |= kRowInvalid;
      std::int64_t flagged = -1;
      for (std::int64_t i = rows - 1; i >= 0; --i)
        if (t.rows[static_cast<std::size_t>(i)].flags & kRowInvalid) flagged = i;
      INFO("rows " << rows << " q_len " << t.q_len);
      const Result<SpanRuns> encoded = SpanRuns::encode(t);
      REQUIRE(encoded.ok());
      const auto n = static_cast<std::int64_t>(encoded->runs.size());
      // Room for every run (the most there can be: a run per row), and for fewer.
      for (const std::int64_t room : {rows, n, std::max<std::int64_t>(1, n / 2), std::int64_t{1}}) {
        std::int64_t count = 0, first_invalid = -2;
        const SpanRuns replayed = replay_device_reduction(t, room, &count, &first_invalid);
        CHECK(count == n);
        CHECK(first_invalid == flagged);
        REQUIRE(static_cast<std::int64_t>(replayed.runs.size()) == std::min(n, room));
        for (std::size_t k = 0; k < replayed.runs.size(); ++k) REQUIRE(replayed.runs[k] == encoded->runs[k]);
      }
    }
}

TEST_CASE("span runs: encode then expand gives back every table bit for bit") {
  Rng rng(test_seed(20261301));
  for (int i = 0; i < 3000; ++i) {
    const SpanTable t = random_table(rng, coin(rng, 0.3));
    check_round_trip(t);
  }
  for (int i = 0; i < 1500; ++i) {
    const std::int64_t q_len = uniform(rng, 1, 80), k_len = coin(rng) ? q_len : uniform(rng, 1, 80);
    const std::int64_t batch = uniform(rng, 1, 3), heads = uniform(rng, 1, 3);
    const bool broadcast = coin(rng, 0.3);
    MaskStructure spec = random_structure(rng, broadcast ? 1 : batch, q_len, k_len);
    spec = broadcast ? repeat_batches(spec, batch) : spec;
    SpanTable t = table_of(spec, heads, broadcast, rng, coin(rng) ? 0.1 : 0.0);
    check_round_trip(t);
    // Every single-row change, one at a time, round-trips as well.
    RowSpan& r = t.rows[static_cast<std::size_t>(uniform(rng, 0, static_cast<std::int64_t>(t.rows.size()) - 1))];
    r = coin(rng, 0.2) ? random_row(rng, k_len, true) : random_row(rng, k_len, false);
    check_round_trip(t);
  }
  // A row whose step wraps modulo 2^64 and rows at the int64 limits.
  SpanTable t;
  t.batch = t.heads = t.distinct_batch = t.distinct_heads = 1;
  t.q_len = 5;
  t.k_len = 4;
  t.rows = {RowSpan{INT64_MAX, -1, 0, 0, 0}, RowSpan{INT64_MIN, INT64_MAX, 0, 0, 0}, RowSpan{0, -1, 0, 0, 0},
            RowSpan{INT64_MAX, INT64_MIN, 2, 0, 0}, RowSpan{INT64_MIN, INT64_MIN, 1, 0, 0}};
  check_round_trip(t);
}

TEST_CASE("span runs: the greedy maximal runs of the rule, and the same heads from a grouped scan") {
  Rng rng(test_seed(20261302));
  for (int i = 0; i < 2000; ++i) {
    SpanTable t;
    if (coin(rng)) {
      t = random_table(rng, coin(rng, 0.2));
    } else {
      const std::int64_t q_len = uniform(rng, 1, 60), k_len = coin(rng) ? q_len : uniform(rng, 1, 60);
      t = table_of(random_structure(rng, uniform(rng, 1, 2), q_len, k_len), uniform(rng, 1, 2), false, rng, 0.05);
    }
    Result<SpanRuns> runs = SpanRuns::encode(t);
    REQUIRE(runs.ok());
    const std::vector<SpanRun> expected = naive_runs(t);
    REQUIRE(runs->runs.size() == expected.size());
    for (std::size_t k = 0; k < expected.size(); ++k) CHECK(runs->runs[k] == expected[k]);
    std::vector<std::int64_t> heads;
    for (const SpanRun& r : runs->runs) heads.push_back(r.row);
    CHECK(heads_by_grouped_scan(t, rng) == heads);
  }
}

TEST_CASE("span runs: few runs for the structures frameworks pass") {
  const std::int64_t L = 4096;
  const auto runs_of = [](const MaskStructure& s) {
    Result<SpanRuns> r = SpanRuns::encode(table_of(s));
    REQUIRE(r.ok());
    return static_cast<std::int64_t>(r->runs.size());
  };
  CHECK(runs_of(make_structure(StructureKind::full, 1, L, L)) == 1);
  CHECK(runs_of(make_structure(StructureKind::causal, 1, L, L)) == 1);
  CHECK(runs_of(make_structure(StructureKind::causal, 3, L, L)) == 3);  // one per slice
  // Bottom-right, Q > K: rows before the diagonal attend nothing, then causal.
  CHECK(runs_of(make_structure(StructureKind::causal, 1, L, L / 2, Alignment::bottom_right)) == 2);
  // Bottom-right, Q < K: one run until the last key is reached.
  CHECK(runs_of(make_structure(StructureKind::causal, 1, L / 2, L, Alignment::bottom_right)) == 1);
  MaskStructure window = make_structure(StructureKind::sliding_window, 1, L, L);
  window.window = 512;
  CHECK(runs_of(window) == 2);
  MaskStructure docs = make_structure(StructureKind::causal, 1, L, L);
  docs.segments = {{0, 1000, 1001, 3000, L}};  // with a one-token document
  CHECK(runs_of(docs) == 4);
  MaskStructure left = make_structure(StructureKind::causal, 1, L, L);
  left.kv_valid = {{700, L}};
  CHECK(runs_of(left) == 2);
  MaskStructure right = make_structure(StructureKind::causal, 1, L, L);
  right.kv_valid = {{0, 3000}};
  CHECK(runs_of(right) == 2);
  MaskStructure prefix = make_structure(StructureKind::prefix_lm, 1, L, L);
  prefix.prefix = 100;
  CHECK(runs_of(prefix) == 2);
  MaskStructure q_pad = make_structure(StructureKind::causal, 1, L, L);
  q_pad.q_valid = {{0, 3000}};
  CHECK(runs_of(q_pad) == 2);
}

TEST_CASE("span runs: expand and classify refuse runs that do not tile the rows, naming the run") {
  SpanRuns r;
  r.batch = r.heads = r.distinct_batch = r.distinct_heads = 1;
  r.q_len = 10;
  r.k_len = 10;
  SpanRun a;
  a.length = 4;
  a.count = 0;
  SpanRun b = a;
  b.row = 4;
  b.length = 6;
  r.runs = {a, b};
  CHECK(r.validate().ok());
  CHECK(classify(r).ok());
  r.runs[1].row = 5;
  CHECK(r.validate().message() == "span runs run 1 starts at row 5; runs must tile the rows in order (expected 4)");
  CHECK(r.expand().status().code() == ErrorCode::invalid_argument);
  CHECK(classify(r).status().to_string() == r.validate().to_string());
  r.runs[1].row = 4;
  r.runs[1].length = 7;
  CHECK(r.validate().message() == "span runs run 1 length 7 must be in [1, 6]");
  r.runs[1].length = 5;
  CHECK(r.validate().message() == "span runs cover 9 rows of 10 (distinct_batch * distinct_heads * q_len)");
  r.q_len = 5;
  r.batch = r.distinct_batch = 2;
  r.runs[1].length = 6;
  CHECK(r.validate().message() == "span runs run 1 (rows 4 to 9) crosses a slice boundary (q_len 5)");
  r.q_len = 0;
  CHECK(classify(r).status().to_string() == "invalid_shape: span runs q_len must be >= 1, got 0");
}

TEST_CASE("span runs: a structure's rows as segments equal its rows one by one") {
  Rng rng(test_seed(20261303));
  int with_docs = 0, unit_stretches = 0;
  for (int i = 0; i < 4000; ++i) {
    const std::int64_t q_len = uniform(rng, 1, 50), k_len = coin(rng, 0.6) ? q_len : uniform(rng, 1, 50);
    MaskStructure s = random_structure(rng, 1, q_len, k_len);
    s.segments.clear();
    detail::DocSet docs;
    const bool use_docs = q_len == k_len && coin(rng, 0.5);
    if (use_docs) {
      // Bounds 0 and Q, scattered points and stretches of consecutive bounds.
      std::vector<KeyRange> ranges{{0, 1}, {q_len, q_len + 1}};
      for (int k = uniform(rng, 0, 4); k > 0; --k) {
        const std::int64_t a = uniform(rng, 0, q_len);
        ranges.push_back({a, std::min(q_len + 1, a + (coin(rng) ? 1 : uniform(rng, 2, 8)))});
      }
      docs = detail::DocSet::from(ranges);
      s.segments = {docs.values()};
      ++with_docs;
      for (const KeyRange& r : docs.spans) unit_stretches += r.end - r.start > 2;
    }
    std::vector<RowSpan> rows;
    for (std::int64_t q = 0; q < q_len; ++q) rows.push_back(s.row(0, q));
    MaskStructure probe = s;
    probe.segments.clear();
    detail::Work work{0, 1 << 20};
    detail::KeyRows got;
    REQUIRE(detail::structure_rows(probe, use_docs ? &docs : nullptr, work, got));
    INFO(describe(s));
    CHECK(got == key_rows_of(rows));
  }
  CHECK(with_docs > 1000);
  CHECK(unit_stretches > 200);
}

TEST_CASE("the search's steps on segments: the reference's evidence, document bounds and chunk checks") {
  // A verdict can hide a step that differs (an extra candidate that fails its fit), so
  // each step is compared on the same rows read by the two readers: one row at a time
  // (the table's, the row rules) and as canonical segments (the runs', closed forms).
  Rng rng(test_seed(20261308));
  int bounds_found = 0, chunks_found = 0, blocks_found = 0;
  for (int i = 0; i < 3000; ++i) {
    const std::int64_t q_len = uniform(rng, 1, 48), k_len = coin(rng, 0.6) ? q_len : uniform(rng, 1, 48);
    const std::int64_t batch = uniform(rng, 1, 3);
    SpanTable t = table_of(random_structure(rng, batch, q_len, k_len), 1, false, rng, 0.0);
    if (coin(rng, 0.3)) {  // a changed row, kept an interval
      RowSpan& r = t.rows[static_cast<std::size_t>(uniform(rng, 0, static_cast<std::int64_t>(t.rows.size()) - 1))];
      const std::int64_t a = uniform(rng, 0, k_len - 1), b = uniform(rng, 0, k_len - 1);
      r = coin(rng, 0.2) ? RowSpan{} : RowSpan::interval(std::min(a, b), std::max(a, b));
    }
    const std::vector<detail::UniqueBatch<detail::TableRows>> reference = detail::unique_batches(t);
    std::vector<detail::KeyRows> key_rows;
    for (const auto& ub : reference)
      key_rows.push_back(key_rows_of(std::vector<RowSpan>(ub.rows.rows.begin(), ub.rows.rows.end())));
    detail::Work work{0, 1 << 24};
    std::vector<detail::UniqueBatch<detail::runs::SegmentRows>> batches;
    for (std::size_t b = 0; b < reference.size(); ++b)
      batches.push_back({{&key_rows[b], q_len, &work}, reference[b].logical});
    INFO("Q=" << q_len << " K=" << k_len << " B=" << batch);
    for (std::int64_t d : {std::int64_t{0}, k_len - q_len}) {
      const detail::BaseEvidence want = detail::gather_evidence(reference, d, batch);
      const detail::BaseEvidence got = detail::gather_evidence(batches, d, batch);
      CHECK(got.windows == want.windows);
      CHECK(got.prefix == want.prefix);
      CHECK(got.chunks == want.chunks);
      CHECK(got.blocks == want.blocks);
      chunks_found += !want.chunks.empty();
      blocks_found += !want.blocks.empty();
      for (int k = 0; k < 4; ++k) {
        const std::int64_t c = uniform(rng, 1, k_len + 1);
        CHECK(detail::chunk_bounds_rows(batches, c, d) == detail::chunk_bounds_rows(reference, c, d));
      }
    }
    // Document bounds under random bases, q_valid set or not, key ranges and both passes.
    const std::int64_t max_p = q_len - 1;
    MaskStructure probe = random_structure(rng, 1, q_len, k_len);
    probe.segments.clear();
    probe.kv_valid.clear();
    if (probe.kind == StructureKind::sliding_window) probe.window = uniform(rng, 1, std::max<std::int64_t>(1, max_p + 1));
    for (std::size_t b = 0; b < reference.size(); ++b) {
      const auto& ub = reference[b];
      const std::int64_t s = coin(rng) ? 0 : uniform(rng, 0, k_len - 1), e = coin(rng) ? k_len : uniform(rng, s + 1, k_len);
      for (bool at_empty_edges : {false, true}) {
        const std::optional<detail::DocSet> want = detail::detect_documents(probe, ub.rows, s, e, at_empty_edges);
        const std::optional<detail::DocSet> got = detail::detect_documents(probe, batches[b].rows, s, e, at_empty_edges);
        INFO(describe(probe) << " s=" << s << " e=" << e << " edges " << at_empty_edges);
        CHECK(got.has_value() == want.has_value());
        if (got && want) CHECK(got->values() == want->values());
        bounds_found += want.has_value();
      }
    }
  }
  CHECK(bounds_found > 500);
  CHECK(chunks_found > 500);
  CHECK(blocks_found > 500);
}

TEST_CASE("classify(SpanRuns) gives classify(SpanTable)'s verdict on generated structures") {
  Rng rng(test_seed(20261304));
  const std::int64_t sizes[] = {1, 2, 3, 5, 7, 8, 13, 16, 31, 64, 100, 257, 1024};
  Agreement seen;
  for (int i = 0; i < 6000; ++i) {
    const GeneratedTable g = generated_table(rng, sizes, 9, 0.25);
    check_same_verdict(g.table, seen, g.text);
  }
  MESSAGE(seen.tables << " tables, " << seen.run_path << " decided on runs");
  // Almost never expanded: the budget is spent only by chunks with documents and padded
  // query rows over several batches (one table in these draws; the table decides it, with
  // the same verdict, as before the runs held q_valid members).
  CHECK(seen.tables - seen.run_path <= 2);
}

TEST_CASE("classify(SpanRuns) gives classify(SpanTable)'s verdict one row away from a structure") {
  Rng rng(test_seed(20261305));
  Agreement seen;
  for (int i = 0; i < 6000; ++i) {
    const std::int64_t q_len = uniform(rng, 1, 40), k_len = coin(rng) ? q_len : uniform(rng, 1, 40);
    const std::int64_t batch = uniform(rng, 1, 2), heads = uniform(rng, 1, 2);
    const bool broadcast = coin(rng, 0.3);
    MaskStructure spec = coin(rng, 0.3) ? cost_free_candidate(rng, 1, q_len, k_len)
                                        : random_structure(rng, broadcast ? 1 : batch, q_len, k_len);
    spec = broadcast || spec.batch != batch ? repeat_batches(spec, batch) : spec;
    SpanTable t = table_of(spec, heads, broadcast, rng, 0.0);
    RowSpan& r = t.rows[static_cast<std::size_t>(uniform(rng, 0, static_cast<std::int64_t>(t.rows.size()) - 1))];
    switch (uniform(rng, 0, 6)) {
      case 0: r = RowSpan::interval(uniform(rng, 0, k_len - 1), uniform(rng, 0, k_len - 1)); break;
      case 1: r = RowSpan{}; break;
      case 2: r = RowSpan{0, -1, 0, 0, 0}; break;  // empty, written with first 0
      case 3: r = RowSpan::interval(0, k_len - 1); break;
      case 4:
        if (!r.empty()) r = RowSpan::interval(r.first + (coin(rng) ? 1 : -1), r.last);
        if (r.first < 0 || r.first >= k_len) r = RowSpan{};
        break;
      case 5:
        if (!r.empty()) r = RowSpan::interval(r.first, std::min(k_len - 1, r.last + (coin(rng) ? 1 : -1)));
        break;
      default:
        if (!r.empty() && r.last > r.first) --r.count;  // a hole
        break;
    }
    check_same_verdict(t, seen, "changed row of " + describe(spec));
  }
  MESSAGE(seen.tables << " tables, " << seen.run_path << " decided on runs");
  CHECK(seen.run_path == seen.tables);
}

TEST_CASE("classify(SpanRuns) gives classify(SpanTable)'s verdict, or its error, on random tables") {
  Rng rng(test_seed(20261306));
  Agreement seen;
  for (int i = 0; i < 6000; ++i) {
    SpanTable t = random_table(rng, coin(rng, 0.1));
    if (coin(rng, 0.5)) {  // mostly a structure, with random rows spliced in
      const std::int64_t batch = t.distinct_batch == 1 ? 1 : t.batch;
      MaskStructure spec = random_structure(rng, batch, t.q_len, t.k_len);
      spec = repeat_batches(spec, t.batch);
      std::size_t i_row = 0;
      for (std::int64_t b = 0; b < t.distinct_batch; ++b)
        for (std::int64_t h = 0; h < t.distinct_heads; ++h)
          for (std::int64_t q = 0; q < t.q_len; ++q, ++i_row)
            if (coin(rng, 0.9)) t.rows[i_row] = spec.row(b, q);
    }
    if (coin(rng, 0.05)) t.rows[static_cast<std::size_t>(uniform(rng, 0, static_cast<std::int64_t>(t.rows.size()) - 1))].flags |= kRowInvalid;
    check_same_verdict(t, seen, "random table");
  }
  MESSAGE(seen.tables << " tables (" << seen.errors << " refused alike), " << seen.run_path << " decided on runs");
  CHECK(seen.errors > 100);
}

TEST_CASE("classify(SpanRuns) decides the structures of issue 13 in O(runs): no expansion, little work") {
  const std::int64_t L = 69632;
  struct Case {
    std::string name;
    MaskStructure spec;
    std::int64_t heads = 1;
    bool broadcast = false;
  };
  std::vector<Case> cases;
  cases.push_back({"full", make_structure(StructureKind::full, 1, L, L)});
  cases.push_back({"causal", make_structure(StructureKind::causal, 1, L, L)});
  cases.push_back({"causal, batch 8 broadcast, 4 heads", make_structure(StructureKind::causal, 8, L, L), 4, true});
  cases.push_back({"causal bottom_right Q < K", make_structure(StructureKind::causal, 1, L / 2, L, Alignment::bottom_right)});
  cases.push_back({"causal bottom_right Q > K", make_structure(StructureKind::causal, 1, L, L / 2, Alignment::bottom_right)});
  MaskStructure window = make_structure(StructureKind::sliding_window, 1, L, L);
  window.window = 4096;
  cases.push_back({"sliding window 4096", window});
  MaskStructure docs = make_structure(StructureKind::causal, 1, L, L);
  docs.segments = {{0, 20000, 45000, L}};
  cases.push_back({"3 packed documents", docs});
  MaskStructure many_docs = make_structure(StructureKind::causal, 1, L, L);
  many_docs.segments = {{0}};
  for (std::int64_t x = 1000; x < L; x += 997) many_docs.segments[0].push_back(x);
  many_docs.segments[0].push_back(L);
  cases.push_back({"70 packed documents", many_docs});
  MaskStructure left = make_structure(StructureKind::causal, 1, L, L);
  left.kv_valid = {{1234, L}};
  cases.push_back({"left-padded causal", left});
  MaskStructure padded8 = make_structure(StructureKind::causal, 8, 8192, 8192);
  for (std::int64_t b = 0; b < 8; ++b) padded8.kv_valid.push_back({b == 0 ? 0 : 512 * b + 37, 8192});
  cases.push_back({"left-padded causal 8 x 8192", padded8});
  MaskStructure right8 = make_structure(StructureKind::causal, 8, 8192, 8192);
  for (std::int64_t b = 0; b < 8; ++b) right8.kv_valid.push_back({0, 8192 - (b == 0 ? 0 : 512 * b + 37)});
  cases.push_back({"right-padded causal 8 x 8192", right8});
  MaskStructure q_pad = make_structure(StructureKind::causal, 2, L, L);
  q_pad.q_valid = {{0, L}, {0, 50000}};
  cases.push_back({"padded query rows", q_pad});
  MaskStructure decode = make_structure(StructureKind::full, 64, 1, 8192);
  for (std::int64_t b = 0; b < 64; ++b) decode.kv_valid.push_back({b == 0 ? 0 : 97 * b, 8192});
  cases.push_back({"decode [64, 1, 1, 8192], left padding", decode});
  MaskStructure prefix = make_structure(StructureKind::prefix_lm, 1, L, L);
  prefix.prefix = 1000;
  cases.push_back({"prefix-LM 1000", prefix});
  MaskStructure window_docs = window;
  window_docs.segments = {{0, 30000, L}};
  window_docs.kv_valid = {{0, 60000}};
  cases.push_back({"window, documents and padding", window_docs});
  Rng rng(1);
  for (const Case& c : cases) {
    INFO(c.name);
    const SpanTable t = table_of(c.spec, c.heads, c.broadcast, rng, 0.0);
    Result<SpanRuns> runs = SpanRuns::encode(t);
    REQUIRE(runs.ok());
    // The run path held to it (the decode case has a run per row: by default it is
    // expanded, as cheap to read).
    RunsClassifyStats stats;
    const Result<MaskStructure> got = detail::runs::classify_runs(*runs, kRunPath, &stats);
    const Result<MaskStructure> reference = classify(t);
    REQUIRE(got.ok());
    REQUIRE(reference.ok());
    CHECK(structure_fields(*got) == structure_fields(*reference));
    CHECK(structure_fields(*classify(*runs)) == structure_fields(*reference));
    CHECK_FALSE(stats.expanded);
    // Work in segments and candidate steps: some per run and candidate, never per row.
    const auto rows = static_cast<std::int64_t>(t.rows.size());
    CHECK(stats.work <= 2000 + 60 * static_cast<std::int64_t>(runs->runs.size()));
    if (rows > 8192) CHECK(stats.work * 20 < rows);
    MESSAGE(c.name << ": " << runs->runs.size() << " runs, work " << stats.work << ", " << describe(*got));
  }
}

TEST_CASE("classify(SpanRuns) hands a table with about as many runs as rows to classify(SpanTable)") {
  Rng rng(test_seed(20261307));
  SpanTable t;
  t.batch = t.heads = t.distinct_batch = t.distinct_heads = 1;
  t.q_len = t.k_len = 2000;
  for (std::int64_t q = 0; q < t.q_len; ++q) t.rows.push_back(random_row(rng, t.k_len, false));
  Result<SpanRuns> runs = SpanRuns::encode(t);
  REQUIRE(runs.ok());
  RunsClassifyStats stats;
  const Result<MaskStructure> got = classify(*runs, &stats);
  REQUIRE(got.ok());
  CHECK(stats.expanded);
  CHECK(structure_fields(*got) == structure_fields(*classify(t)));
}

}  // TEST_SUITE
