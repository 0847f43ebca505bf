// The error every device entry point gives in a build without CUDA (scan_none.cpp,
// runs_none.cpp and tiles_none.cpp, which Meson builds into masklens_cuda_dep when nvcc
// is not found or -Dcuda=disabled): one sentence saying why, and what to do instead.
#pragma once

#include <masklens/status.hpp>

namespace masklens::gpu::detail {

[[nodiscard]] inline Status without_cuda() {
  return error(ErrorCode::device_error,
               "masklens was built without CUDA (configure with -Dcuda=enabled where nvcc is found)");
}

}  // namespace masklens::gpu::detail
