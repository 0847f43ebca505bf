// What the host benchmarks share: the median timers, the plain sequential read that is
// the scanners' baseline, span tables built from a structure (no scan), and the masks
// both classify benchmarks time.
#pragma once

#include <masklens/span_table.hpp>
#include <masklens/structure.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace masklens::bench {

// Median wall time of body() in seconds over `reps` calls.
double median_seconds(int reps, auto&& body) {
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    body();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// How long median_us measures: calls enough to fill about `ms` (the first call, taken
// as at least `floor_us`, sets the count), at least 7 and at most `max_reps`.
struct TimeBudget {
  double ms = 300;
  int max_reps = 2001;
  double floor_us = 0.1;
};

// Median wall time of f in microseconds within `budget`.
template <class F>
double median_us(const TimeBudget& budget, F&& f) {
  const auto once = [&] {
    const auto a = std::chrono::steady_clock::now();
    f();
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - a).count();
  };
  const double first = once();
  const int reps =
      std::clamp(static_cast<int>(budget.ms * 1000 / std::max(first, budget.floor_us)), 7, budget.max_reps);
  std::vector<double> t;
  t.reserve(static_cast<std::size_t>(reps));
  for (int i = 0; i < reps; ++i) t.push_back(once());
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// The baseline: read every byte once, 8 at a time, into four sums.
inline std::uint64_t plain_read(const std::uint8_t* p, std::size_t n) {
  std::uint64_t a = 0, b = 0, c = 0, d = 0, w[4];
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    std::memcpy(w, p + i, 32);
    a += w[0];
    b += w[1];
    c += w[2];
    d += w[3];
  }
  for (; i < n; ++i) a += p[i];
  return a + b + c + d;
}

// The span table a scanner would produce for `s` over one head; a batch that is
// broadcast (stride 0) is stored once.
inline SpanTable table_of(const MaskStructure& s, bool broadcast_batch) {
  SpanTable t;
  t.batch = s.batch;
  t.heads = 1;
  t.q_len = s.q_len;
  t.k_len = s.k_len;
  t.distinct_batch = broadcast_batch ? 1 : s.batch;
  t.distinct_heads = 1;
  t.rows.reserve(static_cast<std::size_t>(t.distinct_batch * t.q_len));
  for (std::int64_t b = 0; b < t.distinct_batch; ++b)
    for (std::int64_t q = 0; q < t.q_len; ++q) t.rows.push_back(s.row(b, q));
  return t;
}

// A table a classify benchmark times, by name.
struct TableCase {
  std::string name;
  SpanTable table;
};

// A q_len x q_len table whose rows attend random intervals, each interval held for
// `rows_each` rows (1: no structure at all, every candidate fitted and rejected).
inline SpanTable random_intervals(std::int64_t q_len, std::int64_t rows_each, std::uint64_t seed) {
  SpanTable t;
  t.batch = t.heads = t.distinct_batch = t.distinct_heads = 1;
  t.q_len = t.k_len = q_len;
  std::mt19937_64 rng(seed);
  const auto n = static_cast<std::uint64_t>(q_len);
  for (std::int64_t q = 0; q < q_len; q += rows_each) {
    const auto a = static_cast<std::int64_t>(rng() % n), b = static_cast<std::int64_t>(rng() % n);
    for (std::int64_t i = 0; i < rows_each && q + i < q_len; ++i)
      t.rows.push_back(RowSpan::interval(std::min(a, b), std::max(a, b)));
  }
  return t;
}

// The masks both classify benchmarks (classify.cpp, classify_runs.cpp) time: causal at
// 69632 (and 8 batches broadcast), a 4096 window, three packed documents, right- and
// left-padded causal 8 x 8192, 64 decode rows with left padding, and 16384 rows of random
// intervals.
inline std::vector<TableCase> classify_cases() {
  constexpr std::int64_t L = 69632, P = 8192;
  std::vector<TableCase> cases;
  const MaskStructure causal = make_structure(StructureKind::causal, 1, L, L);
  cases.push_back({"causal 69632", table_of(causal, false)});
  cases.push_back({"causal 69632, batch 8 stride 0", table_of(make_structure(StructureKind::causal, 8, L, L), true)});
  MaskStructure window = make_structure(StructureKind::sliding_window, 1, L, L);
  window.window = 4096;
  cases.push_back({"sliding window 4096, 69632", table_of(window, false)});
  MaskStructure packed = causal;
  packed.segments = {{0, 20000, 45000, L}};
  cases.push_back({"3 packed documents, 69632", table_of(packed, false)});
  MaskStructure right = make_structure(StructureKind::causal, 8, P, P), left = right;
  for (std::int64_t b = 0; b < 8; ++b) {
    const std::int64_t pad = b == 0 ? 0 : 512 * b + 37;  // the longest sequence has no padding
    right.kv_valid.push_back({0, P - pad});
    left.kv_valid.push_back({pad, P});
  }
  cases.push_back({"right-padded causal 8 x 8192", table_of(right, false)});
  cases.push_back({"left-padded causal 8 x 8192", table_of(left, false)});
  MaskStructure decode = make_structure(StructureKind::full, 64, 1, P);
  for (std::int64_t b = 0; b < 64; ++b) decode.kv_valid.push_back({b == 0 ? 0 : 97 * b, P});
  cases.push_back({"decode [64, 1, 1, 8192], left padding", table_of(decode, false)});
  cases.push_back({"arbitrary (random intervals) 16384", random_intervals(16384, 1, 12)});
  return cases;
}

}  // namespace masklens::bench
