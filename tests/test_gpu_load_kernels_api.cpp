// gpu::load_kernels() and its parts (masklens/cuda/load_kernels.hpp) from a translation
// unit the host compiler builds, in every build: without CUDA each says so, in the words
// of every other entry point; with CUDA and no usable device the error names the CUDA
// call that found it; with a device each loads (twice). (On a GPU the cuda suite's
// cuda-load-kernels program, tests/cuda/test_load_kernels.cpp, loads them first thing in
// its process and then scans.)
#include <doctest/doctest.h>

#include <masklens/cuda/load_kernels.hpp>

#include <string>
#include <utility>
#include <vector>

using namespace masklens;

namespace {

// Each loader with its name, for the messages.
std::vector<std::pair<const char*, Status (*)()>> loaders() {
  return {{"load_kernels", &gpu::load_kernels},
          {"load_scan_kernels", &gpu::load_scan_kernels},
          {"load_runs_kernels", &gpu::load_runs_kernels},
          {"load_tile_kernels", &gpu::load_tile_kernels}};
}

}  // namespace

TEST_SUITE("host") {

#if !MASKLENS_TEST_CUDA_BUILT

TEST_CASE("gpu load_kernels API: built without CUDA, each loader returns the stubs' status") {
  // The status every other stub returns, device_count()'s among them.
  const Status without = gpu::device_count().status();
  REQUIRE(without.code() == ErrorCode::device_error);
  REQUIRE(without.message().rfind("masklens was built without CUDA", 0) == 0);
  for (const auto& [name_of_loader, load] : loaders()) {
    const auto& name = name_of_loader;  // INFO's lambda captures it: clang 14 takes no structured binding there
    INFO(name);
    const Status st = load();
    CHECK(st.code() == ErrorCode::device_error);
    CHECK(st.message() == without.message());
    CHECK(load().message() == without.message());  // and again: nothing is remembered
  }
}

#else

TEST_CASE("gpu load_kernels API: without a usable device each loader names the CUDA call; with one each loads, twice") {
  const bool device = gpu::device_count().ok();
  for (const auto& [name, load] : loaders()) {
    INFO(name);
    for (int call = 0; call < 2; ++call) {
      const Status st = load();
      if (device) {
        CHECK_MESSAGE(st.ok(), st.to_string());
      } else {
        CHECK(st.code() == ErrorCode::device_error);
        CHECK_MESSAGE(st.message().rfind("cuda", 0) == 0, st.to_string());  // "cudaGetDevice / ...: cudaError..."
        CHECK(st.message().find(": cudaError") != std::string::npos);
      }
    }
  }
}

#endif  // MASKLENS_TEST_CUDA_BUILT

}  // TEST_SUITE
