// The run reduction's entry points and the composite run scan in the caller's memory
// (declared in masklens/cuda/runs.hpp), compiled once with nvcc into masklens_cuda_dep
// beside scan.cu and tiles.cu. Every CUDA call's result is checked and returned as a
// Status naming the call; cleanup failures are reported too, after any earlier failure.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include <masklens/cuda/check.cuh>
#include <masklens/cuda/dispatch_runs.cuh>
#include <masklens/cuda/runs.hpp>
#include <masklens/cuda/runs_block.hpp>
#include <masklens/cuda/temp_storage.hpp>
#include <masklens/cuda/tiles.hpp>

namespace masklens::gpu {

namespace {

using detail::allocate;
using detail::check;
using detail::keep_first;

}  // namespace

Status load_runs_kernels() {
  // The four kernels launch_reduce_runs enqueues, in its order.
  return detail::load_kernels_named({
      {reinterpret_cast<const void*>(&detail::runs_tile_summary), "runs_tile_summary"},
      {reinterpret_cast<const void*>(&detail::runs_tile_prefix), "runs_tile_prefix"},
      {reinterpret_cast<const void*>(&detail::runs_write), "runs_write"},
      {reinterpret_cast<const void*>(&detail::runs_lengths), "runs_lengths"},
  });
}

Status reduce_runs(void* d_temp_storage, std::size_t& temp_storage_bytes, const RowSpan* d_rows, std::int64_t rows,
                   std::int64_t q_len, SpanRun* d_runs, std::int64_t max_runs, std::int64_t* d_run_count,
                   std::int64_t* d_first_invalid_row, Stream stream) {
  if (rows < 1 || q_len < 1 || rows % q_len != 0)
    return error(ErrorCode::invalid_argument, "rows (" + std::to_string(rows) + ") must be a positive multiple of q_len (" +
                                                  std::to_string(q_len) + ")");
  if (rows > kMaxRunRows)
    return error(ErrorCode::invalid_argument, "rows (" + std::to_string(rows) + ") must be at most 2^31 - 1");
  // 255 spare bytes: the tile arrays start at the first 256-byte boundary of the storage.
  const std::size_t needed = detail::runs_temp_layout(rows, nullptr, nullptr) + detail::kStorageAlignment - 1;
  if (detail::answer_size_query(d_temp_storage, temp_storage_bytes, needed)) return {};
  if (Status st = detail::check_temp_storage_bytes(temp_storage_bytes, needed); !st.ok()) return st;
  if (max_runs < 1) return error(ErrorCode::invalid_argument, "max_runs must be >= 1, got " + std::to_string(max_runs));
  if (d_rows == nullptr) return error(ErrorCode::invalid_argument, "d_rows is null");
  if (d_runs == nullptr) return error(ErrorCode::invalid_argument, "d_runs is null");
  if (d_run_count == nullptr) return error(ErrorCode::invalid_argument, "d_run_count is null");
  if (reinterpret_cast<std::uintptr_t>(d_rows) % alignof(RowSpan) != 0)
    return error(ErrorCode::misaligned_pointer, "d_rows is not aligned to RowSpan");
  if (reinterpret_cast<std::uintptr_t>(d_runs) % alignof(SpanRun) != 0)
    return error(ErrorCode::misaligned_pointer, "d_runs is not aligned to SpanRun");
  if (reinterpret_cast<std::uintptr_t>(d_run_count) % alignof(std::int64_t) != 0)
    return error(ErrorCode::misaligned_pointer, "d_run_count is not aligned to 8 bytes");
  if (reinterpret_cast<std::uintptr_t>(d_first_invalid_row) % alignof(std::int64_t) != 0)
    return error(ErrorCode::misaligned_pointer, "d_first_invalid_row is not aligned to 8 bytes");
  detail::RunsTemp temp{};
  detail::runs_temp_layout(rows, detail::align_up(d_temp_storage), &temp);
  return check(detail::launch_reduce_runs(d_rows, rows, q_len, temp, d_runs, max_runs, d_run_count,
                                          d_first_invalid_row, stream),
               "cudaLaunchKernelEx(run kernels)");
}


namespace {

// The block of `view` given the scan's temporary size (the plain scan's or the tile scan's).
Result<RunsBlock> block_with_scan_temp(const MaskView& view, std::size_t scan_temp) {
  const std::int64_t rows = span_rows(view);
  if (rows > kMaxRunRows)
    return error(ErrorCode::invalid_argument, "the view has " + std::to_string(rows) +
                                                  " rows to scan; runs are reduced for at most 2^31 - 1");
  std::size_t reduce_temp = 0;
  if (Status st = reduce_runs(nullptr, reduce_temp, nullptr, rows, view.q_len(), nullptr, 1, nullptr); !st.ok())
    return st;
  return runs_block_layout(rows, view.q_len(), scan_temp, reduce_temp);
}

// The checks scan_runs_into() and scan_runs_tiles_into() share: the block is the view's,
// the pointers are there.
Status check_block(const RunsBlock& block, const Result<RunsBlock>& expected, const void* d_block,
                   const void* h_head) {
  if (!expected) return expected.status();
  if (block != *expected)
    return error(ErrorCode::invalid_argument, "the block (" + std::to_string(block.bytes) +
                                                  " bytes) was laid out for another view; this one's is " +
                                                  std::to_string(expected->bytes) + " bytes (runs_block_for)");
  if (d_block == nullptr) return error(ErrorCode::invalid_argument, "d_block is null");
  if (reinterpret_cast<std::uintptr_t>(d_block) % detail::kStorageAlignment != 0)
    return error(ErrorCode::misaligned_pointer, "d_block is not 256-byte aligned");
  if (h_head == nullptr) return error(ErrorCode::invalid_argument, "h_head is null");
  return {};
}

// What both composite scans do around their scan: scan(temp, its bytes, spans, stream)
// into the block, the head zeroed (after the scan's launches, which it would delay; the
// scan writes none of it), the run reduction, the head's copy.
template <class Scan>
Status scan_reduce_copy(const RunsBlock& b, void* d_block, void* h_head, Stream stream, Scan&& scan) {
  auto* base = static_cast<std::uint8_t*>(d_block);
  auto* spans = reinterpret_cast<RowSpan*>(base + b.spans_at);
  std::size_t scan_temp = b.scan_temp_bytes, reduce_temp = b.reduce_temp_bytes;
  Status st = scan(base + b.scan_temp_at, scan_temp, spans, stream);
  if (st.ok())
    st = check(cudaMemsetAsync(base, 0, b.head_bytes(), stream), "cudaMemsetAsync(run count and first runs)");
  if (st.ok())
    st = reduce_runs(base + b.reduce_temp_at, reduce_temp, spans, b.rows, b.q_len,
                     reinterpret_cast<SpanRun*>(base + b.runs_at), b.room,
                     reinterpret_cast<std::int64_t*>(base + b.count_at),
                     reinterpret_cast<std::int64_t*>(base + b.first_invalid_at), stream);
  if (st.ok())
    st = check(cudaMemcpyAsync(h_head, base, b.head_bytes(), cudaMemcpyDeviceToHost, stream),
               "cudaMemcpyAsync(run count and first runs to the host)");
  return st;
}

}  // namespace

Result<RunsBlock> runs_block_for(const MaskView& device_view) {
  if (device_view.data() == nullptr) return error(ErrorCode::invalid_argument, "view is empty (data is null)");
  std::size_t scan_temp = 0;
  if (Status st = scan_spans(nullptr, scan_temp, device_view, nullptr); !st.ok()) return st;
  return block_with_scan_temp(device_view, scan_temp);
}

Result<RunsBlock> runs_block_for(const MaskView& device_view, TileSize tiles) {
  if (device_view.data() == nullptr) return error(ErrorCode::invalid_argument, "view is empty (data is null)");
  std::size_t scan_temp = 0;
  if (Status st = scan_spans_tiles(nullptr, scan_temp, device_view, tiles, nullptr, BlockMaskArrays{}); !st.ok())
    return st;
  return block_with_scan_temp(device_view, scan_temp);
}

Status scan_runs_into(const RunsBlock& block, void* d_block, const MaskView& device_view, void* h_head,
                      Stream stream) {
  if (Status st = check_block(block, runs_block_for(device_view), d_block, h_head); !st.ok()) return st;
  return scan_reduce_copy(block, d_block, h_head, stream,
                          [&](void* temp, std::size_t& temp_bytes, RowSpan* spans, Stream s) {
                            return scan_spans(temp, temp_bytes, device_view, spans, s);
                          });
}

Status scan_runs_tiles_into(const RunsBlock& block, void* d_block, const MaskView& device_view, TileSize tiles,
                            const BlockMaskArrays& d_block_mask, TileState* d_states, void* h_head, Stream stream) {
  if (Status st = check_block(block, runs_block_for(device_view, tiles), d_block, h_head); !st.ok()) return st;
  return scan_reduce_copy(block, d_block, h_head, stream,
                          [&](void* temp, std::size_t& temp_bytes, RowSpan* spans, Stream s) {
                            return scan_spans_tiles(temp, temp_bytes, device_view, tiles, spans, d_block_mask,
                                                    d_states, s);
                          });
}

Status copy_rest_runs(const RunsBlock& block, void* d_block, std::int64_t count, SpanRun* d_more, SpanRun* h_rest,
                      Stream stream) {
  if (count <= block.eager || count > block.rows)
    return error(ErrorCode::invalid_argument, "copy_rest_runs is for counts in (" + std::to_string(block.eager) +
                                                  ", " + std::to_string(block.rows) + "], got " +
                                                  std::to_string(count));
  if (d_block == nullptr) return error(ErrorCode::invalid_argument, "d_block is null");
  if (h_rest == nullptr) return error(ErrorCode::invalid_argument, "h_rest is null");
  if (count > block.room && d_more == nullptr)
    return error(ErrorCode::invalid_argument, std::to_string(count) + " runs exceed the block's room (" +
                                                  std::to_string(block.room) + "): pass d_more with room for them all");
  auto* base = static_cast<std::uint8_t*>(d_block);
  const SpanRun* from = reinterpret_cast<const SpanRun*>(base + block.runs_at);
  Status st;
  if (count > block.room) {  // reduced again into room for every run: the spans are still in the block
    std::size_t reduce_temp = block.reduce_temp_bytes;
    st = reduce_runs(base + block.reduce_temp_at, reduce_temp, reinterpret_cast<const RowSpan*>(base + block.spans_at),
                     block.rows, block.q_len, d_more, count, reinterpret_cast<std::int64_t*>(base + block.count_at),
                     nullptr, stream);
    from = d_more;
  }
  if (st.ok())
    st = check(cudaMemcpyAsync(h_rest, from + block.eager,
                               static_cast<std::size_t>(count - block.eager) * sizeof(SpanRun), cudaMemcpyDeviceToHost,
                               stream),
               "cudaMemcpyAsync(runs to the host)");
  return st;
}

Result<SpanRuns> scan_runs(const MaskView& device_view, Stream stream) {
  Result<RunsBlock> planned = runs_block_for(device_view);
  if (!planned) return planned.status();
  const RunsBlock& b = *planned;
  SpanRuns out;
  masklens::detail::span_shape_of(out, device_view);
  std::vector<std::uint8_t> head;
  Status st = catch_alloc([&]() -> Status {
    head.resize(b.head_bytes());
    return {};
  });
  void* block = nullptr;
  if (st.ok()) st = allocate(&block, b.bytes, stream, "cudaMallocAsync(runs)");
  if (!st.ok()) return st;
  st = scan_runs_into(b, block, device_view, head.data(), stream);
  if (st.ok()) st = check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  RunsHead h;
  if (st.ok()) {
    Result<RunsHead> read = read_runs_head(b, head.data());
    if (read) h = *read;
    else st = read.status();
  }
  // A NaN / +inf row: named as scan() names it, with no run copied past the first ones.
  if (st.ok() && h.first_invalid_row >= 0) st = masklens::detail::invalid_row_error(out, h.first_invalid_row);
  if (st.ok())
    st = catch_alloc([&]() -> Status {
      out.runs.resize(static_cast<std::size_t>(h.count));
      return {};
    });
  void* more = nullptr;  // room for every run, where there are more than the block holds
  if (st.ok()) {
    std::memcpy(out.runs.data(), head.data() + b.runs_at,
                static_cast<std::size_t>(std::min(h.count, b.eager)) * sizeof(SpanRun));
    if (h.count > b.room)
      st = allocate(&more, static_cast<std::size_t>(h.count) * sizeof(SpanRun), stream, "cudaMallocAsync(every run)");
    if (st.ok() && h.count > b.eager)
      st = copy_rest_runs(b, block, h.count, static_cast<SpanRun*>(more), out.runs.data() + b.eager, stream);
  }
  if (more) keep_first(st, check(cudaFreeAsync(more, stream), "cudaFreeAsync(every run)"));
  keep_first(st, check(cudaFreeAsync(block, stream), "cudaFreeAsync(runs)"));
  // The runs past the first copy are read only after a second synchronisation; with none
  // (or after a failure, whatever was enqueued) the frees need no wait.
  const bool copied_more = st.ok() && h.count > b.eager;
  if (copied_more || !st.ok()) keep_first(st, check(cudaStreamSynchronize(stream), "cudaStreamSynchronize"));
  if (!st.ok()) return st;
  return out;
}

}  // namespace masklens::gpu
