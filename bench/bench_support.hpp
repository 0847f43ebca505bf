// What the host benchmarks share: the median timers, the plain sequential read that is
// the scanners' baseline, and span tables built from a structure (no scan).
#pragma once

#include <masklens/span_table.hpp>
#include <masklens/structure.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
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

}  // namespace masklens::bench
