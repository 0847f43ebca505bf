// masklens — build configuration shared by host and device code.
#pragma once

#define MASKLENS_VERSION_MAJOR 0
#define MASKLENS_VERSION_MINOR 1
#define MASKLENS_VERSION_PATCH 0
#define MASKLENS_VERSION_STRING "0.1.0"

// One annotation so the same header compiles with a host compiler and with nvcc
// (the CuTe convention). Without nvcc it expands to nothing.
#if defined(__CUDACC__)
#define MASKLENS_HOST_DEVICE __host__ __device__
#else
#define MASKLENS_HOST_DEVICE
#endif

// Unrolls the loop that follows in device code (nvcc's #pragma unroll); nothing in host
// code, where compilers unroll short constant loops themselves.
#if defined(__CUDA_ARCH__)
#define MASKLENS_UNROLL _Pragma("unroll")
#else
#define MASKLENS_UNROLL
#endif
