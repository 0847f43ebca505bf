// Every device pass's launch shapes in one table, as CUB keeps its tuning policies: the
// span scan and the tile scan take a ScanPolicy per (element size, architecture), the
// tile plan, the counts' zeroing, the BlockMask writer and the run reduction a fixed
// shape each. Each row says in a line why it is what it is; the measurements behind the
// lines are in bench/README.md ("Why the launch shapes are what they are"). Plain C++, no
// CUDA: the dispatch layers include it, and so do tile_plan.hpp, agent_runs.hpp and the
// host replays of the agents.
#pragma once

#include <cstddef>
#include <cstdint>

namespace masklens::gpu::detail {

// --- The row scans (dispatch_scan.cuh, dispatch_tiles.cuh) ---------------------------

// A policy is a type whose values are its template arguments, so architectures that
// share a shape share one compiled kernel.
template <int BlockThreads, int VectorsInFlight, int LongRowBytes, int MinBlocksPerSM = 1,
          bool SkipMaskedBatches = false, int StagedBatches = 0>
struct ScanPolicy {
  static_assert(BlockThreads % 32 == 0 && BlockThreads <= 1024, "whole warps, at most 1024 threads");
  static_assert(VectorsInFlight >= 1, "at least one load in flight");
  static_assert(StagedBatches == 0 || StagedBatches >= 2, "a ring of at least two batches");
  // Threads of a block, in either kernel.
  static constexpr int kBlockThreads = BlockThreads;
  // 16-byte loads a thread issues before classifying any: what keeps HBM busy.
  static constexpr int kVectorsInFlight = VectorsInFlight;
  // Rows of at least this many bytes get a block each, shorter ones a warp each.
  static constexpr int kLongRowBytes = LongRowBytes;
  static constexpr int kWarpRowsPerBlock = BlockThreads / 32;
  // Blocks an SM must hold at once (__launch_bounds__' second argument: a register cap).
  static constexpr int kMinBlocksPerSM = MinBlocksPerSM;
  // Whether a warp votes, after each batch of loads, to skip the batch where no lane read
  // anything its accumulator takes (AgentScanRow).
  static constexpr bool kSkipMaskedBatches = SkipMaskedBatches;
  // Batches a warp keeps in a ring in shared memory (cp.async, sm_80+; a warp per row
  // only): S - 1 in flight while it classifies one. 0: loads into registers.
  static constexpr int kStagedBatches = StagedBatches;
  static constexpr int kStageBytesPerWarp = StagedBatches * VectorsInFlight * 32 * 16;  // one warp's ring
  // Enough blocks to fill any device several times over; rows beyond it loop.
  static constexpr long long kMaxGrid = 1LL << 20;
};

// The architectures with a policy, newest first: a device takes the first one at or
// below its compute capability (major * 100 + minor * 10), the last one if none.
inline constexpr int kTunedArchs[] = {900, 800};

// The span scan.
template <int Esize, int Sm>
struct ScanTuning;
// sm_90: a 4 GiB bool mask at 0.97-1.00 of a plain read; additive masks 0.99-1.02.
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
// sm_80 and older: not measured; sm_90's shapes ask nothing sm_80 lacks.
template <int Esize>
struct ScanTuning<Esize, 800> {
  using Policy = typename ScanTuning<Esize, 900>::Policy;
};

// The tile scan: a warp per row at any length (kLongRowBytes is not read), 128 threads a
// block, the batch vote on.
template <int Esize, int Sm>
struct TileScanTuning {  // 4-byte masks
  using Policy = ScanPolicy<128, 4, 2048, 1, true>;
};
// 1-byte masks: capped at 72 registers, so an SM holds 7 blocks (6 uncapped).
template <int Sm>
struct TileScanTuning<1, Sm> {
  using Policy = ScanPolicy<128, 4, 2048, 7, true>;
};
// 1-byte masks on sm_90: a ring of four batches of two loads, three in flight a warp.
template <>
struct TileScanTuning<1, 900> {
  using Policy = ScanPolicy<128, 2, 2048, 7, true, 4>;
};
// 2-byte masks: eight loads in flight, uncapped (a cap at 72 registers spills).
template <int Sm>
struct TileScanTuning<2, Sm> {
  using Policy = ScanPolicy<128, 8, 2048, 1, true>;
};

// `P` with the batch vote on or off (bench/device_tiles.cu --sweep, the host replay).
template <class P, bool Vote>
using WithBatchVote =
    ScanPolicy<P::kBlockThreads, P::kVectorsInFlight, P::kLongRowBytes, P::kMinBlocksPerSM, Vote, P::kStagedBatches>;
// `P` with a ring of `Stages` batches in shared memory (0: loads into registers).
template <class P, int Stages>
using WithStagedBatches =
    ScanPolicy<P::kBlockThreads, P::kVectorsInFlight, P::kLongRowBytes, P::kMinBlocksPerSM, P::kSkipMaskedBatches, Stages>;

// --- The tile scan's plan (tile_plan.hpp) --------------------------------------------

// Shared-memory counters a block may take: 512 k tiles (65536 keys at 128) x 16 copies,
// and little enough that registers, not shared memory, bound the blocks an SM holds.
inline constexpr std::size_t kTileSharedBudget = 32 * 1024;
// Units of rows a scan aims for: fine enough that the device's blocks (132 SMs x about
// 8 on an H200) finish together.
inline constexpr std::int64_t kTileTargetUnits = 8192;
// The most rows a unit takes per row read at once: counters flush per q tile, so a
// coarser grain gains nothing.
inline constexpr std::int64_t kTileMaxRowsPerParallelRow = 16;

// --- The counts' zeroing (dispatch_tiles.cuh) ----------------------------------------

inline constexpr int kZeroCountsThreads = 256;
// One wave covers 2^18 counts (a 65536^2 mask's 128 x 128 tiles); more loop.
inline constexpr std::int64_t kZeroCountsMaxGrid = 1024;

// --- The BlockMask writer (dispatch_block_mask.cuh) ----------------------------------

// A block per line of tiles: 8 times a warp's loads in flight (a warp per line left an
// H200 idle).
inline constexpr int kBlockMaskThreads = 256;
// Registers capped so that a 32768^2 mask's 512 lines at 128 are all resident at once.
inline constexpr int kBlockMaskBlocksPerSM = 4;
// Tiles a thread holds at once: a line of 256 x 4 tiles (131072 keys at 128) is read once.
inline constexpr int kLineChunk = 4;
// Past this many lines a block takes several in turn (an H200 holds fewer at once).
inline constexpr std::int64_t kBlockMaskMaxGrid = 4096;

// --- The run reduction (dispatch_runs.cuh) -------------------------------------------

// A tile is 256 threads x 2 rows: 65536 rows are 128 blocks, about one an SM of an H200
// (8 rows a thread left 32 blocks each waiting out eight rounds of loads).
inline constexpr int kRunsThreads = 256;
inline constexpr int kRunsRowsPerThread = 2;
// The lengths kernel: blocks past the run count return at once; past this the grid loops.
inline constexpr std::int64_t kRunsMaxGrid = std::int64_t{1} << 20;

}  // namespace masklens::gpu::detail
