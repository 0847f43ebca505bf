// Host-side declarations of the CUDA test harness (compiled by nvcc in
// device_harness.cu), so the doctest suites stay plain C++.
#pragma once

#include <cstdint>

#include <masklens/masklens.hpp>

namespace masklens::testing::gpu {

// A usable GPU is present.
bool device_available();

// Copies the memory a host view spans to the device, `offset_bytes` past a 256-byte
// aligned allocation (a multiple of the element size: exercises the scalar head), and
// scans the same view there with masklens::gpu::scan.
Result<SpanTable> scan_copy_on_device(const MaskView& host_view, std::int64_t offset_bytes);

// Builds a bool [L, L] causal mask on the device (L*L may exceed 2^32), clears
// element (flip_q, flip_k) when flip_q >= 0, and scans it on the device.
Result<SpanTable> scan_device_causal(std::int64_t L, std::int64_t flip_q, std::int64_t flip_k);

}  // namespace masklens::testing::gpu
