// The one device block of a Python device scan, as masklens._core and masklens._cuda
// both lay it out (so the block one sizes is the block the other fills), and what
// crosses back to the host: the run count and the first runs in one copy.
//
// Block, one allocation of torch's caching allocator (its blocks are 512-byte aligned;
// every part starts on a 256-byte boundary of the block):
//   [count: int64, first invalid row: int64, padded to 64 bytes][runs: room SpanRuns]
//   [spans: rows RowSpans]
//   [scan temporary storage][run reduction temporary storage]
// Count and runs are adjacent so that the count, the first row holding NaN / +inf (-1:
// none; gpu::reduce_runs finds it) and the first `eager` runs come back in one copy (the
// host "head"), as gpu::scan_runs (src/runs.cu) does.
// The room is bounded (4096 runs, the masks frameworks pass have far fewer); past it the
// reduction runs again into a buffer with room for every run.
#pragma once

#include <masklens/span_runs.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace masklens::python {

inline constexpr std::int64_t kEagerRuns = 256;  // runs brought back with the count (16 KiB)
inline constexpr std::int64_t kRunRoom = 4096;   // runs the block holds

struct RunsBlock {
  std::int64_t rows = 0, room = 0, eager = 0;
  std::size_t count_at = 0, first_invalid_at = 8, runs_at = 64, spans_at = 0, scan_temp_at = 0, reduce_temp_at = 0,
              bytes = 0;
  std::size_t scan_temp_bytes = 0, reduce_temp_bytes = 0;

  // Bytes [0, head_bytes()) of the block: the count (with its padding) and the first
  // `eager` runs, copied to the host in one copy.
  [[nodiscard]] std::size_t head_bytes() const noexcept {
    return runs_at + static_cast<std::size_t>(eager) * sizeof(SpanRun);
  }
};

inline std::size_t align256(std::size_t n) noexcept { return (n + 255) & ~std::size_t{255}; }

// The layout for `rows` span rows (>= 1) and the two temporary sizes the size queries gave.
inline RunsBlock runs_block(std::int64_t rows, std::size_t scan_temp_bytes, std::size_t reduce_temp_bytes) noexcept {
  RunsBlock b;
  b.rows = rows;
  b.room = std::min(rows, kRunRoom);
  b.eager = std::min(b.room, kEagerRuns);
  b.scan_temp_bytes = scan_temp_bytes;
  b.reduce_temp_bytes = reduce_temp_bytes;
  b.spans_at = align256(b.runs_at + static_cast<std::size_t>(b.room) * sizeof(SpanRun));
  b.scan_temp_at = align256(b.spans_at + static_cast<std::size_t>(rows) * sizeof(RowSpan));
  b.reduce_temp_at = align256(b.scan_temp_at + std::max<std::size_t>(scan_temp_bytes, 1));
  b.bytes = b.reduce_temp_at + std::max<std::size_t>(reduce_temp_bytes, 1);
  return b;
}

}  // namespace masklens::python
