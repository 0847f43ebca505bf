// The CUDA suite: exits 77 (Meson's "skipped") where no GPU is usable, so CI counts
// it as skipped — never as passed — and says why.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <masklens/cuda/scan.hpp>

#include <cstdio>

int main(int argc, char** argv) {
  if (auto devices = masklens::gpu::device_count(); !devices) {
    std::printf("no usable CUDA device (%s): skipping the cuda suite\n", devices.status().to_string().c_str());
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
