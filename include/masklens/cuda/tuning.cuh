// The device scanner's launch shapes: one policy per (element size, architecture), the
// table the dispatch layer (dispatch_scan.cuh) chooses from, as CUB's tuning policies.
// A policy is a type whose values are its template arguments, so architectures that
// share a shape share one compiled kernel. nvcc only (included by dispatch_scan.cuh).
#pragma once

namespace masklens::gpu::detail {

template <int BlockThreads, int VectorsInFlight, int LongRowBytes, int MinBlocksPerSM = 1,
          bool SkipMaskedBatches = false, int StagedBatches = 0>
struct ScanPolicy {
  static_assert(BlockThreads % 32 == 0 && BlockThreads <= 1024, "whole warps, at most 1024 threads");
  static_assert(VectorsInFlight >= 1, "at least one load in flight");
  // Threads of a block, in either kernel.
  static constexpr int kBlockThreads = BlockThreads;
  // Independent 16-byte loads each thread issues before classifying any of them: the
  // memory-level parallelism that keeps HBM busy.
  static constexpr int kVectorsInFlight = VectorsInFlight;
  // Rows of at least this many bytes get a block each; shorter rows get a warp each
  // (kWarpRowsPerBlock rows per block), which would otherwise idle most of a block.
  static constexpr int kLongRowBytes = LongRowBytes;
  static constexpr int kWarpRowsPerBlock = BlockThreads / 32;
  // Blocks an SM must hold at once (__launch_bounds__' second argument: it caps the
  // registers a thread may take). The tile scan's kernels carry more state per thread
  // than the span scan's; bench/device_tiles.cu --sweep measures the choice.
  static constexpr int kMinBlocksPerSM = MinBlocksPerSM;
  // Whether a warp votes, after each batch of loads, on skipping the batch where no lane
  // read anything its accumulator takes (AgentScanRow). The tile scan's structured masks
  // gain a little (--sweep, H200, 2026-12-04, 32768^2: 1.12x a read against 1.13x
  // without, bf16 1.13x against 1.14x; block-sparse 1.21x against 1.19x), and a
  // per-vector test in its place did worse on the block-sparse mask (1.29-1.32x: lanes
  // diverging per vector). The span scan leaves it off (1.04-1.05x against 1.01x there).
  static constexpr bool kSkipMaskedBatches = SkipMaskedBatches;
  // Batches a warp keeps in shared memory (cp.async, sm_80+), 0 for none: with S > 0 the
  // warp's loads go to a ring of S batches in shared memory, S - 1 of them in flight while
  // it classifies the one it holds, where a warp loading into registers has none in flight
  // then (AgentScanRow; the kernel gives each warp its ring). Only a warp per row stages.
  static constexpr int kStagedBatches = StagedBatches;
  static_assert(StagedBatches == 0 || StagedBatches >= 2, "a ring of at least two batches");
  // Bytes of one warp's ring.
  static constexpr int kStageBytesPerWarp = StagedBatches * VectorsInFlight * 32 * 16;
  // No knob asks L2 for a later batch while a warp classifies the one it holds: one, two
  // or four batches ahead (cp.async.bulk.prefetch.L2) did worse on every tile-scan case,
  // 1.24x, 1.25x and 1.44x a read against 1.11x for the bool window at 32768^2,
  // block-sparse 1.25-1.49x against 1.20x (--sweep, H200, 2026-12-04).
  // Enough blocks to fill any device several times over; rows beyond it loop.
  static constexpr long long kMaxGrid = 1LL << 20;
};

// The architectures with a policy, newest first: a device takes the first one at or
// below its compute capability (major * 100 + minor * 10), the last one if none.
inline constexpr int kTunedArchs[] = {900, 800};

template <int Esize, int Sm>
struct ScanTuning;

// sm_90 (H200): measured with bench/device_scan.cu — 256 threads and four loads in
// flight per thread read a 4 GiB bool mask at 0.97 of a plain read (bench/README.md).
template <>
struct ScanTuning<1, 900> {
  using Policy = ScanPolicy<256, 4, 2048>;
};
template <>
struct ScanTuning<2, 900> {
  using Policy = ScanPolicy<256, 4, 2048>;
};
template <>
struct ScanTuning<4, 900> {
  using Policy = ScanPolicy<256, 4, 2048>;
};

// sm_80 and older: not measured; the sm_90 shapes, which ask nothing sm_80 lacks.
template <int Esize>
struct ScanTuning<Esize, 800> {
  using Policy = typename ScanTuning<Esize, 900>::Policy;
};

// `P` with the batch vote on or off (bench/device_tiles.cu --sweep, the host replay).
template <class P, bool Vote>
using WithBatchVote =
    ScanPolicy<P::kBlockThreads, P::kVectorsInFlight, P::kLongRowBytes, P::kMinBlocksPerSM, Vote, P::kStagedBatches>;
// `P` with a ring of `Stages` batches in shared memory (0: loads into registers).
template <class P, int Stages>
using WithStagedBatches =
    ScanPolicy<P::kBlockThreads, P::kVectorsInFlight, P::kLongRowBytes, P::kMinBlocksPerSM, P::kSkipMaskedBatches, Stages>;

// The tile scan's shapes (dispatch_tiles.cuh): its agent carries a tile sink beside the
// span (more registers a thread than the span scan's 48), and a block per row then
// holds fewer blocks per SM and waits at a barrier per row. A warp per row, for rows of
// any length, measured fastest (bench/device_tiles.cu --sweep, H200, 2026-12-03: 1.25x a
// plain read at bool 32768^2 and 1.11-1.15x at 65536^2, against 1.6-1.9x and 1.22-1.32x
// with a block per row), and blocks of 128 threads beat 256 (with the block-per-line
// writer and as many blocks as the device holds: 1.16-1.18x against 1.20-1.21x at
// 32768^2, 1.08-1.11x against 1.09-1.12x at 65536^2). Register counts below are nvcc
// 13.0's for sm_90.
template <int Esize, int Sm>
struct TileScanTuning {
  using Policy = ScanPolicy<128, 4, 2048, 1, true>;  // a warp per row: kLongRowBytes is not read
};
// 1-byte masks: capped at 72 registers (a few bytes spilled), 7 blocks an SM hold at once
// where the 76-80 uncapped held 6 (--sweep, H200, 2026-12-04: 1.10-1.12x a read at
// 32768^2 against 1.13-1.14x; the sixth session's kernel, at 72-74 registers, measured
// worse capped at 64). The 2-byte kernel takes 96 registers with four loads: capped as
// much it measured 1.20x against 1.10x. Not measured below sm_90: sm_80 takes these
// loads into registers, which ask nothing of shared memory (an A100's 164 KiB would
// hold fewer blocks with the rings below).
template <int Sm>
struct TileScanTuning<1, Sm> {
  using Policy = ScanPolicy<128, 4, 2048, 7, true>;
};
// sm_90: each warp reads through a ring of four batches of two loads in shared memory
// (16 KiB a block), three in flight while it classifies one (--sweep, H200, 2026-12-04,
// tenth session, the pass with a memset and plain launches, x a read, two runs: 32768^2
// window 1.10-1.11x, documents 1.10-1.11x, block-sparse 1.16-1.17x against 1.12-1.13x,
// 1.11-1.12x and 1.18-1.20x with four loads into registers; 65536^2 1.04-1.05x, 1.05x
// and 1.07-1.08x against 1.05x, 1.06x and 1.09-1.10x). Registers still bound the blocks
// an SM holds at 7 where the counters take 8 KiB (32768 keys at 128); from 16 KiB of
// counters (65536 keys) shared memory holds 6. A ring of two batches of four loads read
// at 1.15-1.16x at 32768^2; the bf16 window 1.18-1.21x with any ring at 72 registers,
// against 1.08x with its eight loads into registers. A ring carried from row to row (a
// warp copying its next row's first batches while it reads this row's last ones) took 96
// registers uncapped, spilled at 72, and read at 1.19-1.21x (block-sparse 1.33-1.36x).
// Whole vectors counted by warp ballot (the lowest whole lane of a tile's 8 adding the
// group's keys, one add a tile where each lane adds its own) read at 1.17x (window) and
// 1.24x (block-sparse) against 1.11x and 1.17x, 1.10x and 1.21x uncapped (--sweep, H200,
// 2026-12-04, bench/README.md).
template <>
struct TileScanTuning<1, 900> {
  using Policy = ScanPolicy<128, 2, 2048, 7, true, 4>;
};
// 2-byte masks: eight loads in flight a thread (4 blocks an SM at about 120 registers)
// read the bf16 window at 32768^2 at 1.09x a read in two runs on two machines, against
// 1.10x and 1.13x with four (--sweep, H200, 2026-12-04).
template <int Sm>
struct TileScanTuning<2, Sm> {
  using Policy = ScanPolicy<128, 8, 2048, 1, true>;
};

}  // namespace masklens::gpu::detail
