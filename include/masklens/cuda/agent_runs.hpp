// The run reduction's agent: its per-thread work, for any compiler. The kernels of
// dispatch_runs.cuh call it between their CUB block scans, and a host test replays it
// with sequential scans in their place, so the tiling, offsets and run ends are tested
// without a GPU. No CUDA headers.
//
// Rows are cut into tiles of kRunsThreads threads x kRunsRowsPerThread consecutive rows.
// A row's run position is the composition of every transition before it applied to
// anything (row 0 maps every position to a head); a thread composes its own rows'
// transitions, a block scan composes the threads', a pass over the tiles composes the
// tiles'. "Start" below is always the position of the row just before a stretch.
#pragma once

#include <cstdint>

#include "../config.hpp"
#include "../row_span.hpp"
#include "../span_runs.hpp"
#include "tuning.cuh"

namespace masklens::gpu::detail {

// kRunsThreads x kRunsRowsPerThread (tuning.cuh).
inline constexpr std::int64_t kRunsTileRows = std::int64_t{kRunsThreads} * kRunsRowsPerThread;

using masklens::detail::kRunHead;
using masklens::detail::RunStep;

// The transition that changes nothing.
MASKLENS_HOST_DEVICE constexpr RunStep identity_step() noexcept {
  RunStep s;
  s.map = static_cast<std::uint8_t>(0 | (1 << 2) | (2 << 4));
  return s;
}

// Heads in a stretch of rows, for each position the row before it may have.
struct HeadCounts {
  std::int64_t n[3];
};

MASKLENS_HOST_DEVICE constexpr HeadCounts add(const HeadCounts& a, const HeadCounts& b) noexcept {
  return {{a.n[0] + b.n[0], a.n[1] + b.n[1], a.n[2] + b.n[2]}};
}

[[nodiscard]] constexpr std::int64_t runs_tiles(std::int64_t rows) noexcept {
  return (rows + kRunsTileRows - 1) / kRunsTileRows;
}

// One thread's rows: [begin, begin + count) and their transitions (identity past the end).
struct ThreadRows {
  std::int64_t begin = 0;
  int count = 0;
  RunStep steps[kRunsRowsPerThread];
  RunStep all;  // the steps composed
};

MASKLENS_HOST_DEVICE inline ThreadRows thread_rows(const RowSpan* rows, std::int64_t n_rows, std::int64_t q_len,
                                                   std::int64_t tile, int thread) noexcept {
  ThreadRows t;
  t.begin = tile * kRunsTileRows + std::int64_t{thread} * kRunsRowsPerThread;
  t.all = identity_step();
  for (int k = 0; k < kRunsRowsPerThread; ++k) {
    const std::int64_t i = t.begin + k;
    t.steps[k] = i < n_rows ? RunStep::at(rows, i, i % q_len) : identity_step();
    t.count += i < n_rows ? 1 : 0;
    t.all = RunStep::then(t.all, t.steps[k]);
  }
  return t;
}

// The thread's first row flagged kRowInvalid (an element that is NaN or +inf), ranked so
// that the largest rank over all threads is the first such row of all: n_rows - row, 0
// where the thread has none. A maximum, so tiles and passes combine it in any order.
MASKLENS_HOST_DEVICE inline std::int64_t invalid_rank(const ThreadRows& t, const RowSpan* rows,
                                                      std::int64_t n_rows) noexcept {
  for (int k = 0; k < t.count; ++k)
    if (rows[t.begin + k].flags & kRowInvalid) return n_rows - (t.begin + k);
  return 0;
}

// The first row flagged kRowInvalid from the largest rank (-1: none).
MASKLENS_HOST_DEVICE constexpr std::int64_t first_invalid_row(std::int64_t rank, std::int64_t n_rows) noexcept {
  return rank > 0 ? n_rows - rank : -1;
}

// Heads among the thread's rows when the row before them has position `start`.
MASKLENS_HOST_DEVICE inline std::int64_t heads_from(const ThreadRows& t, std::uint8_t start) noexcept {
  std::int64_t heads = 0;
  std::uint8_t position = start;
  for (int k = 0; k < kRunsRowsPerThread; ++k) {
    position = t.steps[k].apply(position);
    heads += (k < t.count && position == kRunHead) ? 1 : 0;
  }
  return heads;
}

// The thread's heads for each position the row before its tile may have; `before` is
// the composition of the tile's threads before this one.
MASKLENS_HOST_DEVICE inline HeadCounts heads_per_start(const ThreadRows& t, RunStep before) noexcept {
  HeadCounts c{{0, 0, 0}};
  for (std::uint8_t start = 0; start < 3; ++start) c.n[start] = heads_from(t, before.apply(start));
  return c;
}

// Writes the run of every head among the thread's rows, numbered from `at`, into
// d_runs[0, max_runs); the first head past them leaves its row in *next_row (where the
// last stored run ends). The row before the thread's rows has position `start`. A run's
// length is left for set_length: here it is 1, or 2 where the next row joins (a head's
// next row is its second iff it may share the run), which is what make_run needs to
// read the step.
MASKLENS_HOST_DEVICE inline void write_runs(const ThreadRows& t, std::uint8_t start, const RowSpan* rows,
                                            std::int64_t n_rows, std::int64_t q_len, SpanRun* d_runs,
                                            std::int64_t max_runs, std::int64_t* next_row, std::int64_t at) noexcept {
  std::uint8_t position = start;
  for (int k = 0; k < kRunsRowsPerThread; ++k) {
    position = t.steps[k].apply(position);
    if (k >= t.count || position != kRunHead) continue;
    const std::int64_t i = t.begin + k;
    if (at < max_runs) {
      const bool joins =
          i + 1 < n_rows && (i + 1) % q_len != 0 && masklens::detail::may_share_run(rows[i], rows[i + 1]);
      d_runs[at] = masklens::detail::make_run(rows, i, joins ? i + 2 : i + 1);
    } else if (at == max_runs) {
      *next_row = i;
    }
    ++at;
  }
}

// Stored run k of n ends where run k + 1 begins: stored, or past max_runs at *next_row;
// the last ends at the last row.
MASKLENS_HOST_DEVICE inline void set_length(SpanRun* d_runs, std::int64_t k, std::int64_t n, std::int64_t n_rows,
                                            std::int64_t max_runs, const std::int64_t* next_row) noexcept {
  const std::int64_t end = k + 1 >= n ? n_rows : k + 1 < max_runs ? d_runs[k + 1].row : *next_row;
  d_runs[k].length = end - d_runs[k].row;
}

}  // namespace masklens::gpu::detail
