// masklens::gpu — the one device block of a composite run scan (scan, run reduction, the
// head's copy: runs.hpp's scan_runs_into()), and what crosses back to the host with the
// run count. Host code for any C++20 compiler: the C++ convenience (gpu::scan_runs) and
// the Python binding (masklens._core.DeviceRuns, masklens._cuda) lay out and read the
// block through this header alone, so the block one sizes is the block the other fills.
//
// The block, one allocation of the caller's (every part on a 256-byte boundary of it):
//   [count: int64, first invalid row: int64, padded to 64 bytes][runs: room SpanRuns]
//   [spans: rows RowSpans][scan temporary storage][run reduction temporary storage]
// Count and runs are adjacent so that the count, the first row holding NaN / +inf (-1:
// none; reduce_runs finds it) and the first `eager` runs come back in one copy: the
// head, bytes [0, head_bytes()). The room is bounded (kRunRoom: the masks frameworks pass
// have far fewer runs); past it the reduction runs again into room the caller gives for
// every run (copy_rest_runs()).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "../row_span.hpp"
#include "../span_runs.hpp"
#include "../status.hpp"
#include "temp_storage.hpp"

namespace masklens::gpu {

// Runs that come back with the count in the head's one copy (16 KiB), and the runs the
// block holds: one copy and one synchronisation bring the runs of every mask with up to
// kEagerRuns; a second copy those up to kRunRoom; a second reduction those past it.
inline constexpr std::int64_t kEagerRuns = 256;
inline constexpr std::int64_t kRunRoom = 4096;
// The span rows one run reduction takes (64 GiB of spans): its tiles stay under 2^20
// blocks of a grid, and the grid's dimensions are unsigned.
inline constexpr std::int64_t kMaxRunRows = (std::int64_t{1} << 31) - 1;

struct RunsBlock {
  std::int64_t rows = 0, q_len = 0;  // span rows (distinct slices x q_len), rows a slice
  std::int64_t room = 0, eager = 0;  // runs the block holds; runs the head brings
  std::size_t count_at = 0, first_invalid_at = 8, runs_at = 64, spans_at = 0, scan_temp_at = 0, reduce_temp_at = 0;
  std::size_t bytes = 0;  // the whole block
  std::size_t scan_temp_bytes = 0, reduce_temp_bytes = 0;

  // Bytes [0, head_bytes()) of the block: the count (with its padding) and the first
  // `eager` runs, copied to the host in one copy.
  [[nodiscard]] std::size_t head_bytes() const noexcept {
    return runs_at + static_cast<std::size_t>(eager) * sizeof(SpanRun);
  }
  bool operator==(const RunsBlock&) const = default;
};

// The layout for `rows` span rows in slices of `q_len` (both >= 1) and the temporary
// sizes the scan's and the run reduction's size queries gave (runs.hpp's runs_block_for()
// asks them).
[[nodiscard]] inline RunsBlock runs_block_layout(std::int64_t rows, std::int64_t q_len, std::size_t scan_temp_bytes,
                                                 std::size_t reduce_temp_bytes) noexcept {
  RunsBlock b;
  b.rows = rows;
  b.q_len = q_len;
  b.room = std::min(rows, kRunRoom);
  b.eager = std::min(b.room, kEagerRuns);
  b.scan_temp_bytes = scan_temp_bytes;
  b.reduce_temp_bytes = reduce_temp_bytes;
  detail::StorageLayout layout;
  b.count_at = layout.add(2 * sizeof(std::int64_t));
  b.first_invalid_at = b.count_at + sizeof(std::int64_t);
  b.runs_at = layout.add(static_cast<std::size_t>(b.room) * sizeof(SpanRun), 64);
  b.spans_at = layout.add(static_cast<std::size_t>(rows) * sizeof(RowSpan));
  b.scan_temp_at = layout.add(std::max<std::size_t>(scan_temp_bytes, 1));
  b.reduce_temp_at = layout.add(std::max<std::size_t>(reduce_temp_bytes, 1));
  b.bytes = layout.bytes();
  return b;
}

// What the head says: the run count and the first span row holding NaN / +inf (-1: none).
struct RunsHead {
  std::int64_t count = 0;
  std::int64_t first_invalid_row = -1;
};

// The head at h_head (head_bytes() of host memory the head's copy has written), its two
// values checked against the block: device_error where the kernels returned a count or a
// row no reduction of `rows` rows can give.
[[nodiscard]] inline Result<RunsHead> read_runs_head(const RunsBlock& b, const void* h_head) {
  RunsHead h;
  const auto* bytes = static_cast<const std::uint8_t*>(h_head);
  std::memcpy(&h.count, bytes + b.count_at, sizeof h.count);
  std::memcpy(&h.first_invalid_row, bytes + b.first_invalid_at, sizeof h.first_invalid_row);
  if (h.count < 1 || h.count > b.rows)
    return error(ErrorCode::device_error, "the run reduction returned " + std::to_string(h.count) + " runs for " +
                                              std::to_string(b.rows) + " rows");
  if (h.first_invalid_row < -1 || h.first_invalid_row >= b.rows)
    return error(ErrorCode::device_error, "the run reduction named row " + std::to_string(h.first_invalid_row) +
                                              " as holding NaN or +inf; the view has " + std::to_string(b.rows) +
                                              " rows");
  return h;
}

}  // namespace masklens::gpu
