#include "gpu_scan.hpp"

namespace masklens::cli {

Result<SpanTable> scan_on_gpu(const MaskView&) {
  return error(ErrorCode::invalid_argument, "--device cuda: this masklens was built without CUDA (-Dcuda=enabled)");
}

}  // namespace masklens::cli
