// A definition's tables read on the device (table_runs.hpp) in a build without CUDA: a
// clear device_error, so a program that offers it compiles and links either way.
#include <masklens/cuda/table_runs.hpp>

#include "without_cuda.hpp"

namespace masklens::gpu {

using detail::without_cuda;

Status load_table_runs_kernels() { return without_cuda(); }

Status table_changes_to_host(std::span<const DeviceTable>, std::span<const DeviceTable>, std::int64_t, std::int64_t*,
                             std::int64_t, std::uint64_t*, std::int64_t, Stream) {
  return without_cuda();
}

}  // namespace masklens::gpu
