// What the CUDA suite's files share (tests/cuda/*.cpp, plain C++ over the CUDA runtime
// API): the test's own CUDA calls checked where they are made, device memory the test
// owns, and a host mask view copied to the device.
#pragma once

#include <cuda_runtime.h>
#include <doctest/doctest.h>

#include <masklens/mask_view.hpp>

#include <cstddef>
#include <cstdint>
#include <string>

#define REQUIRE_CUDA(call)                                                                  \
  do {                                                                                      \
    const cudaError_t e_ = (call);                                                          \
    REQUIRE_MESSAGE(e_ == cudaSuccess, #call << ": " << std::string(cudaGetErrorName(e_))); \
  } while (0)

namespace masklens::testing {

// Device memory the test owns (at least one byte); freeing it is checked too.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t bytes) { REQUIRE_CUDA(cudaMalloc(&p_, bytes < 1 ? 1 : bytes)); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (p_) CHECK(cudaFree(p_) == cudaSuccess);
  }
  template <class T = std::uint8_t>
  T* get() const {
    return static_cast<T*>(p_);
  }

 private:
  void* p_ = nullptr;
};

// A host view's bytes copied into `buffer` (data() is its lowest address: strides are
// non-negative) and the same view over the copy.
inline MaskView to_device(const MaskView& host, const DeviceBuffer& buffer) {
  REQUIRE_CUDA(cudaMemcpy(buffer.get(), host.data(), static_cast<std::size_t>(host.extent_bytes()),
                          cudaMemcpyHostToDevice));
  // A pageable copy may still be in flight when cudaMemcpy returns; streams that do not
  // order after the legacy stream (non-blocking ones) must not see it half done.
  REQUIRE_CUDA(cudaDeviceSynchronize());
  auto view = MaskView::make(buffer.get(), host.dtype(), host.shape(), host.strides(), host.encoding());
  REQUIRE(view.ok());
  return *view;
}

}  // namespace masklens::testing
