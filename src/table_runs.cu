// A definition's tables read on the device (declared in masklens/cuda/table_runs.hpp):
// one kernel reads every list and table of a read (up to kTableJobsPerLaunch a launch),
// marks where each table's values change and writes those positions and values, each
// batch's first value and the lists straight into the caller's host block; the last
// block of the launch to finish hands each table's change count over and zeroes the
// counters for the next read. One driver call a read, where a memset, a kernel a table
// and a copy made three and more. Every CUDA call's result is checked and returned as a
// Status naming the call.
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

enum class JobKind : std::int32_t { list, table, positions };

// A list or table of one launch: its elements are the launch's flat indices [first,
// first + batch * length); out is its words of the host block.
struct TableJob {
  const void* data;
  std::int64_t batch, length, batch_stride, length_stride;
  std::int64_t first;
  std::int64_t* out;
  TableElement element;
  JobKind kind;
};

// Passed by value as a __grid_constant__ parameter (about 1 KiB), read where it lies: the
// jobs are indexed by a thread's element, which a copy into registers could not follow.
struct TableJobs {
  TableJob job[kTableJobsPerLaunch];
  int count;
  std::int64_t elements;
};

__device__ __forceinline__ std::int64_t element_at(const TableJob& t, std::int64_t offset) {
  switch (t.element) {
    case TableElement::boolean: return static_cast<const std::uint8_t*>(t.data)[offset] != 0;
    case TableElement::int32: return static_cast<const std::int32_t*>(t.data)[offset];
    default: return static_cast<const std::int64_t*>(t.data)[offset];
  }
}

// One thread an element of all the jobs, grid-striding. A list element goes to its word; a
// table's first value of a batch to its slot; a position whose value starts a new run
// takes a slot of its section's pairs by one atomic add on its counter (a definition's
// tables change a few times a document, so the adds rarely meet); positions past the
// room are counted, not written. counters: a count a job, then the blocks done.
__global__ void table_changes_kernel(const __grid_constant__ TableJobs jobs, std::int64_t room,
                                     unsigned long long* __restrict__ counters) {
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < jobs.elements;
       i += step) {
    int k = 0;
    while (k + 1 < jobs.count && i >= jobs.job[k + 1].first) ++k;
    const TableJob& t = jobs.job[k];
    const std::int64_t flat = i - t.first, b = flat / t.length, j = flat - b * t.length;
    const std::int64_t row = b * t.batch_stride;
    const std::int64_t value = element_at(t, row + j * t.length_stride);
    if (t.kind == JobKind::list) {
      t.out[flat] = value;
      continue;
    }
    if (j == 0) {
      t.out[1 + b] = value;
      continue;
    }
    const std::int64_t previous = element_at(t, row + (j - 1) * t.length_stride);
    // The host read's difference (table_runs.hpp), wrapping as two's complement.
    if (t.kind == JobKind::positions ? masklens::detail::wrapping_minus(value, previous) == 1 : value == previous)
      continue;
    const auto slot = static_cast<std::int64_t>(atomicAdd(&counters[k], 1ull));
    if (slot < room) {
      t.out[1 + t.batch + 2 * slot] = flat;
      t.out[2 + t.batch + 2 * slot] = value;
    }
  }
  // The last block done hands the counts over (every block's adds are ordered before its
  // ticket by the fence) and leaves the counters zero for the next read.
  __threadfence();
  __syncthreads();
  if (threadIdx.x != 0) return;
  unsigned long long* done = counters + kTableJobsPerLaunch;
  if (atomicAdd(done, 1ull) != gridDim.x - 1) return;
  __threadfence();
  for (int k = 0; k < jobs.count; ++k)
    if (jobs.job[k].kind != JobKind::list) jobs.job[k].out[0] = static_cast<std::int64_t>(atomicExch(&counters[k], 0ull));
  atomicExch(done, 0ull);
}

constexpr int kThreads = 256;
constexpr std::int64_t kMaxBlocks = 4096;  // grid-striding past it: enough to fill any device

// Launched with cudaLaunchKernelEx, whose result is the launch's own: the caller's CUDA
// "last error" is neither read nor cleared.
Status launch(const TableJobs& jobs, std::int64_t room, unsigned long long* counters, cudaStream_t s) {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(std::min(kMaxBlocks, (jobs.elements + kThreads - 1) / kThreads)));
  config.blockDim = dim3(kThreads);
  config.stream = s;
  return check(cudaLaunchKernelEx(&config, table_changes_kernel, jobs, room, counters),
               "cudaLaunchKernelEx(table_changes_kernel)");
}

}  // namespace detail

Status load_table_runs_kernels() {
  return detail::load_kernels_named(
      {{reinterpret_cast<const void*>(&detail::table_changes_kernel), "table_changes_kernel"}});
}

Status table_changes_to_host(std::span<const DeviceTable> lists, std::span<const DeviceTable> tables,
                             std::int64_t room, std::int64_t* h_block, std::int64_t block_words,
                             std::uint64_t* d_counters, std::int64_t counter_words, Stream stream) {
  if (Status st = check_table_read(lists, tables, room); !st.ok()) return st;
  if (h_block == nullptr || d_counters == nullptr)
    return error(ErrorCode::invalid_argument, "h_block or d_counters is null");
  if (reinterpret_cast<std::uintptr_t>(h_block) % alignof(std::int64_t) != 0 ||
      reinterpret_cast<std::uintptr_t>(d_counters) % alignof(std::uint64_t) != 0)
    return error(ErrorCode::misaligned_pointer, "h_block or d_counters is not aligned to 8 bytes");
  if (block_words != table_block_words(lists, tables, room))
    return error(ErrorCode::invalid_argument, "block_words " + std::to_string(block_words) + " is not the tables' " +
                                                  std::to_string(table_block_words(lists, tables, room)));
  const std::size_t items = lists.size() + tables.size();
  if (counter_words < table_counter_words(items))
    return error(ErrorCode::invalid_argument, "counter_words " + std::to_string(counter_words) + " is under the " +
                                                  std::to_string(table_counter_words(items)) + " these tables need");
  const auto s = static_cast<cudaStream_t>(stream);
  auto* counters = reinterpret_cast<unsigned long long*>(d_counters);
  detail::TableJobs jobs{};
  std::int64_t* out = h_block;
  for (std::size_t k = 0; k < items; ++k) {
    const bool list = k < lists.size();
    const DeviceTable& t = list ? lists[k] : tables[k - lists.size()];
    detail::TableJob& job = jobs.job[jobs.count++];
    job = {t.data, t.batch, t.length, t.batch_stride, t.length_stride, jobs.elements, out, t.element,
           list ? detail::JobKind::list : (t.positions ? detail::JobKind::positions : detail::JobKind::table)};
    jobs.elements += t.batch * t.length;
    out += list ? t.batch * t.length : table_section_words(t.batch, room);
    if (jobs.count == static_cast<int>(kTableJobsPerLaunch) || k + 1 == items) {
      if (Status st = detail::launch(jobs, room, counters, s); !st.ok()) return st;
      counters += kTableJobsPerLaunch + 1;
      jobs = {};
    }
  }
  return {};
}

}  // namespace masklens::gpu
