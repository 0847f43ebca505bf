// A definition's tables read on the device (declared in masklens/cuda/table_runs.hpp):
// one memset zeroes the sections (their counts start at 0), one kernel a table marks
// where its values change and writes those positions and values into its section of the
// caller's block, then one copy brings the block back. Every CUDA call's result is checked
// and returned as a Status naming the call.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include <masklens/cuda/check.cuh>
#include <masklens/cuda/table_runs.hpp>

namespace masklens::gpu {

namespace detail {

// One thread an element, grid-striding: each batch's first value to its slot; a position
// whose value starts a new run takes a slot of the section's pairs by one atomic add (a
// definition's tables change a few times a document, so the adds rarely meet). Positions
// past the room are counted, not written.
template <class T>
__global__ void table_changes_kernel(const T* __restrict__ data, std::int64_t batch, std::int64_t length,
                                     std::int64_t batch_stride, std::int64_t length_stride, bool positions,
                                     std::int64_t room, std::int64_t* __restrict__ section) {
  const std::int64_t n = batch * length;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const std::int64_t b = i / length, j = i - b * length;
    const T* row = data + b * batch_stride;
    const auto value = static_cast<std::int64_t>(row[j * length_stride]);
    if (j == 0) {
      section[1 + b] = value;
      continue;
    }
    const auto previous = static_cast<std::int64_t>(row[(j - 1) * length_stride]);
    // The host read's difference (table_runs.hpp), wrapping as two's complement.
    if (positions ? masklens::detail::wrapping_minus(value, previous) == 1 : value == previous) continue;
    const auto slot = static_cast<std::int64_t>(
        atomicAdd(reinterpret_cast<unsigned long long*>(section), 1ull));
    if (slot < room) {
      section[1 + batch + 2 * slot] = i;
      section[2 + batch + 2 * slot] = value;
    }
  }
}

constexpr int kThreads = 256;
constexpr std::int64_t kMaxBlocks = 4096;  // grid-striding past it: enough to fill any device

template <class T>
cudaError_t launch_as(const DeviceTable& t, std::int64_t room, std::int64_t* section, cudaStream_t s) {
  const std::int64_t n = t.batch * t.length;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(std::min(kMaxBlocks, (n + kThreads - 1) / kThreads)));
  config.blockDim = dim3(kThreads);
  config.stream = s;
  return cudaLaunchKernelEx(&config, table_changes_kernel<T>, static_cast<const T*>(t.data), t.batch, t.length,
                            t.batch_stride, t.length_stride, t.positions, room, section);
}

// Launched with cudaLaunchKernelEx, whose result is the launch's own: the caller's CUDA
// "last error" is neither read nor cleared.
Status launch(const DeviceTable& t, std::int64_t room, std::int64_t* section, cudaStream_t s) {
  cudaError_t e = cudaSuccess;
  switch (t.element) {
    case TableElement::boolean: e = launch_as<bool>(t, room, section, s); break;
    case TableElement::int32: e = launch_as<std::int32_t>(t, room, section, s); break;
    case TableElement::int64: e = launch_as<std::int64_t>(t, room, section, s); break;
  }
  return check(e, "cudaLaunchKernelEx(table_changes_kernel)");
}

}  // namespace detail

Status load_table_runs_kernels() {
  return detail::load_kernels_named({
      {reinterpret_cast<const void*>(&detail::table_changes_kernel<bool>), "table_changes_kernel<bool>"},
      {reinterpret_cast<const void*>(&detail::table_changes_kernel<std::int32_t>), "table_changes_kernel<int32>"},
      {reinterpret_cast<const void*>(&detail::table_changes_kernel<std::int64_t>), "table_changes_kernel<int64>"},
  });
}

Status table_changes_into(std::span<const DeviceTable> tables, std::int64_t room, std::int64_t* d_block,
                          std::int64_t first_word, std::int64_t block_words, std::int64_t* h_block, Stream stream) {
  if (tables.empty()) return error(ErrorCode::invalid_argument, "no table to read");
  if (room < 1) return error(ErrorCode::invalid_argument, "room must be >= 1, got " + std::to_string(room));
  if (d_block == nullptr || h_block == nullptr) return error(ErrorCode::invalid_argument, "d_block or h_block is null");
  if (reinterpret_cast<std::uintptr_t>(d_block) % alignof(std::int64_t) != 0)
    return error(ErrorCode::misaligned_pointer, "d_block is not aligned to 8 bytes");
  if (first_word < 0) return error(ErrorCode::invalid_argument, "first_word is negative");
  for (std::size_t k = 0; k < tables.size(); ++k)
    if (Status st = check_table(tables[k], "table " + std::to_string(k)); !st.ok()) return st;
  if (block_words != table_block_words(tables, room, first_word))
    return error(ErrorCode::invalid_argument, "block_words " + std::to_string(block_words) + " is not the tables' " +
                                                  std::to_string(table_block_words(tables, room, first_word)));
  const auto s = static_cast<cudaStream_t>(stream);
  std::int64_t* section = d_block + first_word;
  // Every section's count starts at 0: one memset over the sections (1 + batch + 2 room
  // words a table, 16 KiB at room 1024) costs the host one call, where one a count costs
  // one a table.
  if (Status st = detail::check(cudaMemsetAsync(section, 0, static_cast<std::size_t>(block_words - first_word) *
                                                                 sizeof(std::int64_t), s),
                                "cudaMemsetAsync(counts)");
      !st.ok())
    return st;
  for (const DeviceTable& t : tables) {
    if (Status st = detail::launch(t, room, section, s); !st.ok()) return st;
    section += table_section_words(t.batch, room);
  }
  return detail::check(cudaMemcpyAsync(h_block, d_block, static_cast<std::size_t>(block_words) * sizeof(std::int64_t),
                                       cudaMemcpyDeviceToHost, s),
                       "cudaMemcpyAsync(table changes)");
}

}  // namespace masklens::gpu
