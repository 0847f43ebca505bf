// How large the CUDA suite runs, and the tests that make a CUDA API call fail on purpose.
//
// The plain run (meson test --suite cuda) checks masks of gigabytes: Q*K past 2^32, a tile
// of 2^32 elements, thousands of generated masks. Under compute-sanitizer every device
// access is instrumented (racecheck and initcheck run such a test for many minutes), so
// MASKLENS_CUDA_SANITIZER=1 runs every test at a size that takes the same kernels and the
// same paths (a block per row, counters flushed to the 64-bit counts, ragged tiles) in
// seconds; tests/cuda/sanitize.sh runs the whole suite that way under each tool. What only
// the large sizes prove (64-bit offsets and counts) is the plain run's.
// MASKLENS_CUDA_CASES=N caps the generated-mask counts in either mode.
#pragma once

#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

namespace masklens::testing {

inline bool sanitizer_sized() {
  const char* env = std::getenv("MASKLENS_CUDA_SANITIZER");
  return env != nullptr && std::string_view(env) != "" && std::string_view(env) != "0";
}

// The count of generated masks a test checks: `full` in the plain run, 40 sanitizer-sized,
// at most MASKLENS_CUDA_CASES where that is set.
inline int suite_cases(int full) {
  int n = sanitizer_sized() ? std::min(full, 40) : full;
  if (const char* env = std::getenv("MASKLENS_CUDA_CASES")) n = std::min(n, std::max(1, std::atoi(env)));
  return n;
}

// A mask length: `full` in the plain run, `sanitizer` sanitizer-sized.
inline std::int64_t suite_length(std::int64_t full, std::int64_t sanitizer) {
  return sanitizer_sized() ? sanitizer : full;
}

// Leaves cudaErrorMemoryAllocation as the caller's pending error, as a caller's own failed
// allocation does, for the tests that the library neither clears nor takes it. Such a test
// makes one failing API call on purpose, which compute-sanitizer reports: they are in the
// suite "cuda_api_error_on_purpose" (see kApiErrorOnPurpose), so that a sanitizer run of
// the rest reads 0 errors and a run of these reads one API error each and nothing else.
inline void leave_allocation_error_pending() {
  void* huge = nullptr;
  REQUIRE(cudaMalloc(&huge, std::size_t{1} << 62) == cudaErrorMemoryAllocation);
  REQUIRE(cudaPeekAtLastError() == cudaErrorMemoryAllocation);
}

// The decorator of the tests that call leave_allocation_error_pending():
// TEST_CASE("..." * kApiErrorOnPurpose).
inline const auto kApiErrorOnPurpose = doctest::test_suite("cuda_api_error_on_purpose");

}  // namespace masklens::testing
