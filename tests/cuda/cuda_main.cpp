// The CUDA suite: exits 77 (Meson's "skipped") where no GPU is present, so CI counts
// it as skipped — never as passed.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "device_harness.hpp"

int main(int argc, char** argv) {
  if (!masklens::testing::gpu::device_available()) {
    std::puts("no CUDA device: skipping the cuda suite");
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
