// masklens::gpu — what nvcc code includes to launch the device scanner: MaskView (device
// memory) -> one result per row in one pass at memory bandwidth, the same RowSpans as
// the host scanner (scan.hpp) for every element type, polarity, shape and stride a view
// accepts. nvcc only. The layers, each a header with one job, as CUB splits an
// algorithm:
//   tuning.cuh         launch shapes per (element size, architecture)
//   device_policy.cuh  which of them the running device takes
//   accumulators.cuh   what a row's pass accumulates (RowSpan today) and its concept
//   agent_scan.cuh     one thread's share of a row: loads, classification, accumulation
//   dispatch_scan.cuh  kernels (CUB reductions of the agents' accumulators) and launch
// The entry points are declared for any compiler in scan.hpp and defined in src/scan.cu.
#pragma once

#include "accumulators.cuh"
#include "agent_scan.cuh"
#include "device_policy.cuh"
#include "dispatch_scan.cuh"
#include "tuning.cuh"
