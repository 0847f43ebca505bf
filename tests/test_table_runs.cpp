// A definition's tables read on the host (masklens/table_runs.hpp) against the runs worked
// out by hand from the table's elements: every element type, strided and broadcast views,
// positions (runs of position - index, wrapping as two's complement), and every argument
// the read refuses, named, before any element is read.
#include <doctest/doctest.h>

#include <masklens/table_runs.hpp>

#include <cstdint>
#include <limits>
#include <random>
#include <vector>

using namespace masklens;

namespace {

struct Run {
  std::int64_t batch, start, end, value;
  bool operator==(const Run&) const = default;
};

// The runs of a table given as values[b][j], the plain way: a run starts at j = 0 and
// wherever the value changes (positions: wherever it is not the previous + 1).
std::vector<Run> expected_runs(const std::vector<std::vector<std::int64_t>>& values, bool positions) {
  std::vector<Run> out;
  for (std::size_t b = 0; b < values.size(); ++b) {
    const auto& row = values[b];
    const auto L = static_cast<std::int64_t>(row.size());
    for (std::int64_t j = 0; j < L; ++j) {
      const auto u = [&](std::int64_t x) { return static_cast<std::uint64_t>(row[static_cast<std::size_t>(x)]); };
      const bool starts = j == 0 || (positions ? u(j) - u(j - 1) != 1 : u(j) != u(j - 1));
      if (!starts) continue;
      if (!out.empty() && out.back().batch == static_cast<std::int64_t>(b)) out.back().end = j;
      const auto value = positions ? static_cast<std::int64_t>(u(j) - static_cast<std::uint64_t>(j)) : row[j];
      out.push_back({static_cast<std::int64_t>(b), j, L, value});
    }
  }
  return out;
}

std::vector<Run> runs_of(const definition::TableRuns& r) {
  std::vector<Run> out;
  for (std::size_t i = 0; i < r.batch.size(); ++i) out.push_back({r.batch[i], r.start[i], r.end[i], r.value[i]});
  return out;
}

template <class T>
TableView view_of(const std::vector<T>& data, TableElement e, std::int64_t B, std::int64_t L, std::int64_t bs,
                  std::int64_t ls, bool positions) {
  TableView t;
  t.data = data.data(), t.element = e, t.batch = B, t.length = L, t.batch_stride = bs, t.length_stride = ls;
  t.positions = positions;
  return t;
}

}  // namespace

TEST_SUITE("host") {

TEST_CASE("table read: random tables of every element type, contiguous, transposed, with dimensions of one") {
  std::mt19937_64 rng(41);
  const std::int64_t wide[] = {0, 1, 2, std::numeric_limits<std::int64_t>::max(),
                               std::numeric_limits<std::int64_t>::min(), -1};
  const std::int64_t wide32[] = {0, 1, 2, std::numeric_limits<std::int32_t>::max(),
                                 std::numeric_limits<std::int32_t>::min(), -1};
  for (int trial = 0; trial < 400; ++trial) {
    const std::int64_t B = 1 + static_cast<std::int64_t>(rng() % 4), L = 1 + static_cast<std::int64_t>(rng() % 40);
    const bool positions = rng() % 2 == 0;
    const int kind = static_cast<int>(rng() % 3);  // int64 (wide values), int32, bool
    std::vector<std::vector<std::int64_t>> values(static_cast<std::size_t>(B));
    for (auto& row : values) {
      for (std::int64_t j = 0; j < L; ++j) {
        // Positions mostly count up (documents); other tables mostly repeat (runs).
        const bool keep = !row.empty() && rng() % 4 != 0;
        std::int64_t v = kind == 0 ? wide[rng() % 6] : kind == 1 ? wide32[rng() % 6] : static_cast<std::int64_t>(rng() % 3);
        if (kind == 2) v = v != 0;
        if (keep) v = positions && kind != 2 ? static_cast<std::int64_t>(static_cast<std::uint64_t>(row.back()) + 1)
                                             : row.back();
        // An int32 table holds the value modulo 2^32: past INT32_MAX comes INT32_MIN, which
        // is not the previous + 1 once widened (a new run, as transformers' positions
        // compare as values).
        if (kind == 1) v = static_cast<std::int32_t>(v);
        row.push_back(v);
      }
    }
    const bool transposed = rng() % 2 == 0;  // stored [L, B]: the view steps B along a row
    const auto at = [&](std::int64_t b, std::int64_t j) { return transposed ? j * B + b : b * L + j; };
    const std::int64_t bs = transposed ? 1 : L, ls = transposed ? B : 1;
    Result<definition::TableRuns> got = error(ErrorCode::invalid_argument, "unset");
    if (kind == 0) {
      std::vector<std::int64_t> d(static_cast<std::size_t>(B * L));
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t j = 0; j < L; ++j) d[static_cast<std::size_t>(at(b, j))] = values[b][j];
      got = read_table_runs(view_of(d, TableElement::int64, B, L, B > 1 ? bs : 0, L > 1 ? ls : 0, positions));
    } else if (kind == 1) {
      std::vector<std::int32_t> d(static_cast<std::size_t>(B * L));
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t j = 0; j < L; ++j) d[static_cast<std::size_t>(at(b, j))] = static_cast<std::int32_t>(values[b][j]);
      got = read_table_runs(view_of(d, TableElement::int32, B, L, bs, ls, positions));
    } else {
      std::vector<std::uint8_t> d(static_cast<std::size_t>(B * L));
      // Any nonzero byte is true.
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t j = 0; j < L; ++j) d[static_cast<std::size_t>(at(b, j))] = values[b][j] ? 1 + rng() % 255 : 0;
      got = read_table_runs(view_of(d, TableElement::boolean, B, L, bs, ls, false));
      REQUIRE(got.ok());
      CHECK(runs_of(*got) == expected_runs(values, false));
      continue;
    }
    REQUIRE(got.ok());
    CHECK(got->batches == B);
    CHECK(got->length == L);
    CHECK(runs_of(*got) == expected_runs(values, positions));
  }
}

TEST_CASE("table read: a broadcast batch (stride 0) reads one row for every batch") {
  const std::vector<std::int64_t> row = {5, 6, 7, 0, 1, 9};
  auto got = read_table_runs(view_of(row, TableElement::int64, 3, 6, 0, 1, true));
  REQUIRE(got.ok());
  CHECK(runs_of(*got) == expected_runs({{5, 6, 7, 0, 1, 9}, {5, 6, 7, 0, 1, 9}, {5, 6, 7, 0, 1, 9}}, true));
  CHECK(got->find(2, 4) == got->first_run[2] + 1);  // indexed: batch 2's second run holds position 4
}

TEST_CASE("table read: what it refuses, named") {
  const std::vector<std::int64_t> d(8, 0);
  const TableView good = view_of(d, TableElement::int64, 2, 4, 4, 1, false);
  CHECK(read_table_runs(good).ok());
  auto refused = [](TableView t) {
    auto r = read_table_runs(t, "table 3");
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().message().find("table 3") != std::string::npos);
    return r.status().code();
  };
  TableView t = good;
  t.data = nullptr;
  CHECK(refused(t) == ErrorCode::invalid_argument);
  t = good, t.data = reinterpret_cast<const char*>(d.data()) + 4;
  CHECK(refused(t) == ErrorCode::misaligned_pointer);
  t = good, t.batch = 0;
  CHECK(refused(t) == ErrorCode::invalid_shape);
  t = good, t.length = std::int64_t{1} << 21, t.batch = std::int64_t{1} << 20;
  CHECK(refused(t) == ErrorCode::invalid_shape);
  t = good, t.length_stride = -1;
  CHECK(refused(t) == ErrorCode::invalid_stride);
  t = good, t.batch_stride = (std::int64_t{1} << 40) + 1;
  CHECK(refused(t) == ErrorCode::invalid_stride);
  // Each bound met, but the farthest element (2^40 - 1) * 2^40 lies past any address.
  t = good, t.batch = std::int64_t{1} << 40, t.length = 1, t.batch_stride = std::int64_t{1} << 40, t.length_stride = 0;
  CHECK(refused(t) == ErrorCode::invalid_stride);
  t.element = TableElement::boolean;
  CHECK(refused(t) == ErrorCode::invalid_stride);
  t = good, t.batch = 2, t.length = std::int64_t{1} << 39, t.batch_stride = std::int64_t{1} << 40,
  t.length_stride = std::int64_t{1} << 22;  // (2^39 - 1) * 2^22 + 2^40 elements of 8 bytes: past 2^63
  CHECK(refused(t) == ErrorCode::invalid_stride);
  t = good, t.element = static_cast<TableElement>(7);
  CHECK(refused(t) == ErrorCode::unsupported_dtype);
}

}  // TEST_SUITE
