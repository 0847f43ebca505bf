// The BlockMask writer's agent: one block's work on one line of tiles (a q tile's k
// tiles, or a k tile's q tiles), turning their states into torch BlockMask's counts and
// indices — what write_kv_row / write_q_column write on the host (tile_grid.hpp), with
// ballots and a block prefix in place of their loops. The kernel and its launch are in
// dispatch_block_mask.cuh; the states come from a source of tile_state_sources.cuh.
// nvcc only.
#pragma once

#include <cstdint>

#include "../tile_grid.hpp"
#include "tuning.cuh"

namespace masklens::gpu::detail {

inline constexpr int kBlockMaskWarps = kBlockMaskThreads / 32;

// Each warp's count of each state in each chunk of a round: the block's prefix of ranks.
struct LineCounts {
  std::int32_t part[kLineChunk][kBlockMaskWarps];
  std::int32_t full[kLineChunk][kBlockMaskWarps];
};

// One block writes one line of n tiles (a q tile's k tiles, or a k tile's q tiles; tile
// i's state is state(i)): into part_* the partial tiles, into full_* the full ones, each
// as detail::write_ordered writes it — the count, the indices in the state in ascending
// order, then the others in ascending order. Null pointers are skipped; states[i] gets
// each state where states is not null. Every thread of the block calls it with the same
// arguments. A round holds tiles base + c x 256 + thread (c < Chunk), so (c, warp, lane)
// is index order: a tile's rank in its state is the round's tiles of that state before
// its (c, warp) — a prefix over `counts` — plus its lane's in its warp's ballot. Tile i
// not in a state goes after that state's `count` tiles, at count + i - (its tiles before
// i). A line longer than a round is read twice: the counts, then the indices. (A warp per
// line, as before, left an H200 idle: 512 lines at 32768^2, 28 us of latency; a block
// per line has 8 times the threads, each with one load of a 256-tile line in flight.)
template <int Chunk, class StateOf>
__device__ void write_line(std::int64_t n, StateOf state, std::int32_t* part_count, std::int32_t* part_idx,
                           std::int32_t* full_count, std::int32_t* full_idx, TileState* states, LineCounts& counts) {
  static_assert(Chunk >= 1 && Chunk <= kLineChunk);
  constexpr std::int64_t kRound = std::int64_t{kBlockMaskThreads} * Chunk;
  const int thread = static_cast<int>(threadIdx.x), warp = thread / 32;
  const unsigned below = (1u << (thread % 32)) - 1u;
  const auto tile = [&](std::int64_t base, int c) { return base + std::int64_t{c} * kBlockMaskThreads + thread; };
  TileState st[Chunk];
  unsigned part[Chunk], full[Chunk];  // the warp's ballots
  // Reads a round's states and counts them into `counts`; ends at a barrier.
  const auto read_round = [&](std::int64_t base) {
#pragma unroll
    for (int c = 0; c < Chunk; ++c) {
      const std::int64_t i = tile(base, c);
      st[c] = i < n ? state(i) : TileState::empty;
    }
#pragma unroll
    for (int c = 0; c < Chunk; ++c) {
      part[c] = __ballot_sync(0xffffffffu, st[c] == TileState::partial);
      full[c] = __ballot_sync(0xffffffffu, st[c] == TileState::full);
      if (thread % 32 == 0) {
        counts.part[c][warp] = __popc(part[c]);
        counts.full[c][warp] = __popc(full[c]);
      }
    }
    __syncthreads();
  };
  const bool one_round = n <= kRound;
  std::int32_t parts = 0, fulls = 0;  // the line's
  for (std::int64_t base = 0; base < n; base += kRound) {
    read_round(base);
    if (states)
#pragma unroll
      for (int c = 0; c < Chunk; ++c)
        if (tile(base, c) < n) states[tile(base, c)] = st[c];
#pragma unroll
    for (int c = 0; c < Chunk; ++c)
#pragma unroll
      for (int w = 0; w < kBlockMaskWarps; ++w) {
        parts += counts.part[c][w];
        fulls += counts.full[c][w];
      }
    if (!one_round) __syncthreads();  // the next round rewrites the counts (one round keeps them)
  }
  if (thread == 0) {
    if (part_count) *part_count = parts;
    if (full_count) *full_count = fulls;
  }
  if (part_idx != nullptr || full_idx != nullptr) {
    std::int32_t parts_before = 0, fulls_before = 0;  // tiles of each state in the rounds before
    for (std::int64_t base = 0; base < n; base += kRound) {
      if (!one_round) read_round(base);
      std::int32_t part_at[Chunk], full_at[Chunk];  // before (c, this warp) in the round
      std::int32_t p = 0, f = 0;
#pragma unroll
      for (int c = 0; c < Chunk; ++c)
#pragma unroll
        for (int w = 0; w < kBlockMaskWarps; ++w) {
          if (w == warp) {
            part_at[c] = p;
            full_at[c] = f;
          }
          p += counts.part[c][w];
          f += counts.full[c][w];
        }
#pragma unroll
      for (int c = 0; c < Chunk; ++c) {
        const std::int64_t i = tile(base, c);
        if (i >= n) continue;
        const auto index = static_cast<std::int32_t>(i);
        const std::int32_t p_rank = parts_before + part_at[c] + __popc(part[c] & below);
        const std::int32_t f_rank = fulls_before + full_at[c] + __popc(full[c] & below);
        if (part_idx) part_idx[st[c] == TileState::partial ? p_rank : parts + (index - p_rank)] = index;
        if (full_idx) full_idx[st[c] == TileState::full ? f_rank : fulls + (index - f_rank)] = index;
      }
      parts_before += p;
      fulls_before += f;
      __syncthreads();  // the counts are rewritten by the next round or line
    }
  } else {
    __syncthreads();  // the next line rewrites the counts
  }
}

// write_line with as few tiles a thread as hold the line in one round (a line of more
// than 256 x kLineChunk tiles takes kLineChunk a thread, round after round): a line of
// up to 512 tiles then has no chunk wholly past its end (at 32768^2 and 128, four tiles
// a thread had three of its four chunks past every line's 256 tiles).
template <class StateOf>
__device__ void write_line_of(std::int64_t n, StateOf state, std::int32_t* part_count, std::int32_t* part_idx,
                              std::int32_t* full_count, std::int32_t* full_idx, TileState* states,
                              LineCounts& counts) {
  if (n <= kBlockMaskThreads)
    write_line<1>(n, state, part_count, part_idx, full_count, full_idx, states, counts);
  else if (n <= 2 * kBlockMaskThreads)
    write_line<2>(n, state, part_count, part_idx, full_count, full_idx, states, counts);
  else
    write_line<kLineChunk>(n, state, part_count, part_idx, full_count, full_idx, states, counts);
}

// One block's writer over `source`'s lines (tile_state_sources.cuh) into `out` (null
// arrays skipped): lines [0, slices x q_tiles) are the kv side (and the states, where
// `states` is not null), the next slices x k_tiles lines the q side. Every thread of the
// block calls write(w) with the same line; `counts` is the block's, in shared memory.
template <class Source>
struct AgentBlockMask {
  const Source& source;
  const BlockMaskArrays& out;
  TileState* states;
  LineCounts& counts;
  std::int64_t nq, nk, kv_lines, lines;  // lines: both sides'

  __device__ __forceinline__ AgentBlockMask(const Source& source_, const BlockMaskArrays& out_, TileState* states_,
                                            LineCounts& counts_)
      : source(source_),
        out(out_),
        states(states_),
        counts(counts_),
        nq(source_.lines.q_tiles),
        nk(source_.lines.k_tiles),
        kv_lines(source_.lines.slices * nq),
        lines(kv_lines + source_.lines.slices * nk) {}

  __device__ __forceinline__ void write(std::int64_t w) const {
    if (w < kv_lines) {
      const std::int64_t slice = w / nq, qt = w - slice * nq;
      write_line_of(nk, source.kv_line(slice, qt), out.kv_num_blocks ? out.kv_num_blocks + w : nullptr,
                    out.kv_indices ? out.kv_indices + w * nk : nullptr,
                    out.full_kv_num_blocks ? out.full_kv_num_blocks + w : nullptr,
                    out.full_kv_indices ? out.full_kv_indices + w * nk : nullptr, states ? states + w * nk : nullptr,
                    counts);
    } else {
      const std::int64_t column = w - kv_lines, slice = column / nk, kt = column - slice * nk;
      write_line_of(nq, source.q_line(slice, kt), out.q_num_blocks ? out.q_num_blocks + column : nullptr,
                    out.q_indices ? out.q_indices + column * nq : nullptr,
                    out.full_q_num_blocks ? out.full_q_num_blocks + column : nullptr,
                    out.full_q_indices ? out.full_q_indices + column * nq : nullptr, nullptr, counts);
    }
  }
};

}  // namespace masklens::gpu::detail
