// The host half of one device scan, as masklens._core binds it (masklens.DeviceRuns:
// layout, the runs brought, finish()) and masklens._cuda fills it (plan_runs makes one
// from the library's size query, scan_runs / wait_runs / copy_rest take it): the view
// planned once, the block's layout (include/masklens/cuda/runs_block.hpp, the layout
// gpu::scan_runs_into fills), host memory for the head and for the runs past it.
//
// A device scan from Python: plan_runs (the size query), an allocation of block_bytes
// by the caller's allocator, scan_runs (the one call: launches, the head's copy, the
// one synchronisation and, for runs that all came with the head, their classification:
// two crossings). finish() classifies runs brought past the head by copy_rest.
#pragma once

#include <masklens/cuda/runs_block.hpp>
#include <masklens/cuda/scan.hpp>
#include <masklens/mask_view.hpp>
#include <masklens/span_runs.hpp>
#include <masklens/span_table.hpp>
#include <masklens/status.hpp>
#include <masklens/tile_grid.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace masklens::python {

struct DeviceRuns {
  MaskView view;                   // the mask's (its memory the caller's, alive through the scan)
  SpanRuns shape;                  // the span table's shape; runs filled by finish()
  gpu::RunsBlock block;            // the device block's layout
  std::optional<TileSize> tiles;   // the tile scan's block (its scan temporary is another)
  std::unique_ptr<std::uint8_t[]> head;  // the head's copy lands here (not zero-filled: it writes every byte)
  std::vector<SpanRun> rest;       // runs [eager, count), sized by rest_buffer(count)
  bool finished = false;

  // The head's run count and first NaN / +inf row, checked against the block.
  [[nodiscard]] Result<gpu::RunsHead> read_head() const { return gpu::read_runs_head(block, head.get()); }
};

// A DeviceRuns for `view` with this layout: the view's span table shape checked (and its
// rows under the reduction's limit), host memory for the head.
inline Result<DeviceRuns> device_runs(const MaskView& view, const gpu::RunsBlock& block,
                                      std::optional<TileSize> tiles = std::nullopt) {
  DeviceRuns d;
  d.view = view;
  masklens::detail::span_shape_of(d.shape, view);
  if (Status st = d.shape.validate_shape(); !st.ok()) return st;
  if (d.shape.distinct_slices() > gpu::kMaxRunRows / d.shape.q_len)
    return error(ErrorCode::invalid_argument, "the view has " + std::to_string(d.shape.rows()) +
                                                  " rows to scan; runs are reduced for at most 2^31 - 1");
  d.block = block;
  d.tiles = tiles;
  Status st = catch_alloc([&]() -> Status {
    d.head.reset(new std::uint8_t[block.head_bytes()]);
    return {};
  });
  if (!st.ok()) return st;
  return d;
}

// Host memory for runs [eager, count) in d.rest (what copy_rest fills).
inline Status hold_rest(DeviceRuns& d, std::int64_t count) {
  if (count <= d.block.eager || count > d.block.rows)
    return error(ErrorCode::invalid_argument, "rest_buffer is for counts in (" + std::to_string(d.block.eager) + ", " +
                                                  std::to_string(d.block.rows) + "], got " + std::to_string(count));
  return catch_alloc([&]() -> Status {
    d.rest.resize(static_cast<std::size_t>(count - d.block.eager));
    return {};
  });
}

// The runs now in host memory (the head's and copy_rest's) as a SpanRuns, once: what
// finish() classifies.
inline Result<SpanRuns> finish_runs(DeviceRuns& d) {
  if (d.finished) return error(ErrorCode::invalid_argument, "DeviceRuns.finish() was called already");
  Result<gpu::RunsHead> head = d.read_head();
  if (!head) return head.status();
  const std::int64_t count = head->count;
  const std::int64_t first = std::min(count, d.block.eager);
  if (count > first && static_cast<std::int64_t>(d.rest.size()) != count - first)
    return error(ErrorCode::invalid_argument, std::to_string(count) + " runs, of which " +
                                                  std::to_string(d.rest.size()) +
                                                  " past the first copy were brought: call masklens._cuda.copy_rest");
  d.finished = true;
  return catch_alloc([&]() -> Result<SpanRuns> {
    SpanRuns runs = std::move(d.shape);
    runs.runs.resize(static_cast<std::size_t>(count));
    std::memcpy(runs.runs.data(), d.head.get() + d.block.runs_at, static_cast<std::size_t>(first) * sizeof(SpanRun));
    std::copy(d.rest.begin(), d.rest.end(), runs.runs.begin() + first);
    return runs;
  });
}

}  // namespace masklens::python
