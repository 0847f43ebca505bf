// --device cuda: the GPU scanner for a host mask (copied to the device once). Built
// with CUDA it is gpu_scan.cu; without, a clear error.
#pragma once

#include <masklens/masklens.hpp>

namespace masklens::cli {

Result<SpanTable> scan_on_gpu(const MaskView& host_view);

}  // namespace masklens::cli
