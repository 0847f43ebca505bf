// The run reduction's entry points (declared in masklens/cuda/runs.hpp), compiled once
// with nvcc into masklens_cuda_dep beside scan.cu. Every CUDA call's result is checked and
// returned as a Status naming the call; cleanup failures are reported too, after any
// earlier failure.
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
#include <masklens/cuda/temp_storage.hpp>

namespace masklens::gpu {

namespace {

using detail::allocate;
using detail::check;
using detail::keep_first;

// The rows one reduction takes (64 GiB of spans): its tiles, a grid's blocks, stay under
// 2^20, and the grid dimensions are unsigned.
constexpr std::int64_t kMaxRows = (std::int64_t{1} << 31) - 1;

// Runs copied back with the count in the first copy (16 KiB), and the room scan_runs
// allocates: the masks frameworks pass have far fewer, so one copy and one
// synchronisation bring everything; more than kRunRoom are reduced a second time.
constexpr std::int64_t kEagerRuns = 256;
constexpr std::int64_t kRunRoom = 4096;

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
  if (rows > kMaxRows)
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

Result<SpanRuns> scan_runs(const MaskView& device_view, Stream stream) {
  if (device_view.data() == nullptr) return error(ErrorCode::invalid_argument, "view is empty (data is null)");
  SpanRuns out;
  masklens::detail::span_shape_of(out, device_view);
  const std::int64_t rows = span_rows(device_view);
  if (rows > kMaxRows)
    return error(ErrorCode::invalid_argument, "the view has " + std::to_string(rows) +
                                                  " rows to scan; runs are reduced for at most 2^31 - 1");
  std::size_t scan_temp = 0, runs_temp = 0;
  Status st = scan_spans(nullptr, scan_temp, device_view, nullptr, stream);
  if (st.ok()) st = reduce_runs(nullptr, runs_temp, nullptr, rows, out.q_len, nullptr, 1, nullptr, nullptr, stream);
  if (!st.ok()) return st;
  const std::int64_t room = std::min(rows, kRunRoom), eager = std::min(room, kEagerRuns);
  // One device block: [count, first invalid row, padded to 64 bytes][runs][spans][temps].
  detail::StorageLayout layout;
  const std::size_t count_at = layout.add(2 * sizeof(std::int64_t));
  const std::size_t runs_at = layout.add(static_cast<std::size_t>(room) * sizeof(SpanRun), 64);
  const std::size_t spans_at = layout.add(static_cast<std::size_t>(rows) * sizeof(RowSpan));
  const std::size_t scan_temp_at = layout.add(std::max<std::size_t>(scan_temp, 1));
  const std::size_t reduce_temp_at = layout.add(runs_temp);
  void* block = nullptr;
  st = allocate(&block, layout.bytes(), stream, "cudaMallocAsync(runs)");
  if (!st.ok()) return st;
  auto* base = static_cast<std::uint8_t*>(block);
  auto* d_count = reinterpret_cast<std::int64_t*>(base + count_at);
  std::int64_t* d_first_invalid = d_count + 1;
  auto* d_runs = reinterpret_cast<SpanRun*>(base + runs_at);
  auto* d_rows = reinterpret_cast<RowSpan*>(base + spans_at);
  void* runs_temp_at = base + reduce_temp_at;
  // The count and the first runs come back in one copy of bytes [0, 64 + eager runs) of
  // the block: zeroed before the run reduction, so that the copy reads no byte the kernels
  // leave unwritten (the count's padding, the runs past the count; compute-sanitizer
  // initcheck), and after the scan's launch, which it would delay (the scan writes none).
  const std::size_t head_bytes = runs_at + static_cast<std::size_t>(eager) * sizeof(SpanRun);
  st = scan_spans(base + scan_temp_at, scan_temp, device_view, d_rows, stream);
  if (st.ok()) st = check(cudaMemsetAsync(block, 0, head_bytes, stream), "cudaMemsetAsync(run count and first runs)");
  if (st.ok())
    st = reduce_runs(runs_temp_at, runs_temp, d_rows, rows, out.q_len, d_runs, room, d_count, d_first_invalid, stream);
  std::vector<std::uint8_t> head;
  std::int64_t count = 0, first_invalid = -1;
  if (st.ok())
    st = catch_alloc([&]() -> Status {
      head.resize(head_bytes);
      return {};
    });
  if (st.ok())
    st = check(cudaMemcpyAsync(head.data(), block, head.size(), cudaMemcpyDeviceToHost, stream),
               "cudaMemcpyAsync(run count and first runs to the host)");
  if (st.ok()) st = check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  if (st.ok()) {
    std::memcpy(&count, head.data(), sizeof count);
    std::memcpy(&first_invalid, head.data() + sizeof count, sizeof first_invalid);
    if (count < 1 || count > rows)
      st = error(ErrorCode::device_error, "the run reduction returned " + std::to_string(count) + " runs for " +
                                              std::to_string(rows) + " rows");
    else if (first_invalid < -1 || first_invalid >= rows)
      st = error(ErrorCode::device_error, "the run reduction named row " + std::to_string(first_invalid) +
                                              " invalid of " + std::to_string(rows) + " rows");
  }
  // A NaN / +inf row: named as scan() names it, with no run copied past the first ones.
  if (st.ok() && first_invalid >= 0) st = masklens::detail::invalid_row_error(out, first_invalid);
  if (st.ok())
    st = catch_alloc([&]() -> Status {
      out.runs.resize(static_cast<std::size_t>(count));
      return {};
    });
  void* more = nullptr;  // room for every run, where there are more than `room`
  if (st.ok()) {
    const std::int64_t first = std::min(count, eager);
    std::memcpy(out.runs.data(), head.data() + runs_at, static_cast<std::size_t>(first) * sizeof(SpanRun));
    const SpanRun* from = d_runs;
    if (count > room) {
      st = allocate(&more, static_cast<std::size_t>(count) * sizeof(SpanRun), stream, "cudaMallocAsync(every run)");
      if (st.ok())
        st = reduce_runs(runs_temp_at, runs_temp, d_rows, rows, out.q_len, static_cast<SpanRun*>(more), count, d_count,
                         nullptr, stream);
      from = static_cast<const SpanRun*>(more);
    }
    if (st.ok() && count > first)
      st = check(cudaMemcpyAsync(out.runs.data() + first, from + first,
                                 static_cast<std::size_t>(count - first) * sizeof(SpanRun), cudaMemcpyDeviceToHost,
                                 stream),
                 "cudaMemcpyAsync(runs to the host)");
  }
  if (more) keep_first(st, check(cudaFreeAsync(more, stream), "cudaFreeAsync(every run)"));
  keep_first(st, check(cudaFreeAsync(block, stream), "cudaFreeAsync(runs)"));
  // The runs past the first copy are read only after a second synchronisation; with none
  // (or after a failure, whatever was enqueued) the frees need no wait.
  const bool copied_more = st.ok() && count > eager;
  if (copied_more || !st.ok()) keep_first(st, check(cudaStreamSynchronize(stream), "cudaStreamSynchronize"));
  if (!st.ok()) return st;
  return out;
}

}  // namespace masklens::gpu
