// Tile summaries on the device: the spans, the tile counts and torch's eight BlockMask
// tensors at 128 x 128 from one read of the mask (gpu::scan_spans_tiles into the
// caller's arrays), each case side by side in the same run with a plain read of the same
// bytes (a vectorised 16-byte load kernel that only reads: the ceiling) and with
// gpu::scan_spans alone (the spans without tiles):
//   bool 32768^2, 65536^2 and 69632^2 (1, 4 and 4.5 GiB): a sliding window of 4096, three packed
//   causal documents (cut inside tiles), random block-sparse (128-blocks kept at 25% and
//   on the diagonal, causal); and a bf16 sliding window at 32768^2 (2 GiB).
// CUDA events, median of --reps (20). Prints a markdown table for bench/README.md; with
// a path (or --json PATH), also one JSON line per case. Each case's tiles are checked
// first (states against tiles_from_structure, or the blocks the mask was built from):
// it exits 1 if a case is wrong, as its figures would then measure a wrong scan.
//
//   ./build-gpu/bench/device_tiles [out.jsonl] [--reps N] [--only SUBSTRING] [--sweep]
//
// --sweep also times the tile scan with other launch shapes (blocks per SM, threads,
// loads in flight, units), each checked, to choose the tuning (tuning.cuh).
//
// nvcc for its own kernels (the plain read, the fills); masklens comes from
// masklens_cuda_dep as any program gets it.
#include <cuda_runtime.h>
#include <masklens/cuda/dispatch_tiles.cuh>  // --sweep: the tile scan's kernels with other launch shapes
#include <masklens/cuda/scan.hpp>
#include <masklens/cuda/tiles.hpp>
#include <masklens/masklens.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "device_bench.cuh"

using namespace masklens;

namespace {

using namespace masklens_bench;  // the timer, the baseline, the command line

namespace dev = masklens::gpu::detail;

void check_ok(const Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.to_string().c_str());
    std::exit(1);
  }
}

// The masks, element (q, k) of an L x L mask.
struct Window {  // q - 4096 < k <= q
  std::int64_t w;
  __device__ bool operator()(std::int64_t q, std::int64_t k) const { return k <= q && k > q - w; }
};
struct Documents {  // causal inside three documents [0, a), [a, b), [b, L)
  std::int64_t a, b;
  __device__ bool operator()(std::int64_t q, std::int64_t k) const {
    const std::int64_t start = q < a ? 0 : q < b ? a : b;
    return k <= q && k >= start;
  }
};
// 128-blocks (i, j), j <= i, kept on the diagonal and at 25% below it, then causal.
__host__ __device__ inline bool kept_block(std::int64_t i, std::int64_t j) {
  if (j > i) return false;
  if (j == i) return true;
  std::uint64_t h = static_cast<std::uint64_t>(i) * 0x9e3779b97f4a7c15ull ^ static_cast<std::uint64_t>(j) * 0xc2b2ae3d27d4eb4full;
  h ^= h >> 29;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 32;
  return h % 4 == 0;
}
struct BlockSparse {
  __device__ bool operator()(std::int64_t q, std::int64_t k) const { return k <= q && kept_block(q / 128, k / 128); }
};

template <class T, class Rule>
__global__ void fill(T* m, std::int64_t L, T attend, T masked, Rule rule) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < L * L;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    m[i] = rule(i / L, i % L) ? attend : masked;
}

// --sweep: the tile scan (memset, scan kernel, BlockMask writer) with other launch shapes
// than the tuned one, each checked against the expected kv side and timed like the rest.
struct Variant {
  const char* name;
  cudaError_t (*launch)(const dev::ScanParams&, const TileGrid&, RowSpan*, unsigned long long*, cudaStream_t);
};

// Waves: 0 = as many blocks as the device holds at once (the tuned launch), n > 0 = n
// times that, -1 = a block per unit. FromIntervals: TileScanPlan::tiles_from_intervals
// (false: every row counted vector by vector, as before). Fold: TileScanPlan::fold_ranges
// (false: one range of consecutive units a block, as before).
template <class Policy, int Esize, std::int64_t TargetUnits, std::int64_t MaxRows, int Waves = 0,
          bool FromIntervals = true, bool Fold = true>
cudaError_t launch_variant(const dev::ScanParams& s, const TileGrid& g, RowSpan* rows, unsigned long long* counts,
                           cudaStream_t stream) {
  dev::TileScanPlan plan = dev::plan_tile_scan(g, Esize, Policy::kWarpRowsPerBlock, TargetUnits, MaxRows);
  plan.tiles_from_intervals = FromIntervals;
  plan.fold_ranges = Fold;
  std::int64_t blocks = 0;
  if constexpr (Waves < 0) {
    blocks = plan.units;
  } else if constexpr (Waves > 0) {
    if (const cudaError_t e = dev::resident_tile_blocks<Policy, Esize>(plan, blocks); e != cudaSuccess) return e;
    blocks *= Waves;
  }
  return dev::launch_tile_plan<Policy, Esize>(s, plan, rows, counts, stream, blocks);
}

// The tuned shape first. A block per row (the span scan's choice for long rows) measured
// 1.3-1.5x slower than a warp per row here (2026-12-03, bench/README.md) and is gone.
template <int Esize>
std::vector<Variant> variants() {
  constexpr std::int64_t T = dev::kTileTargetUnits, M = dev::kTileMaxRowsPerParallelRow;
  using Tuned = typename dev::TileScanTuning<Esize, 900>::Policy;
  // ScanPolicy<threads, loads in flight, 2048, blocks an SM must hold, vote on masked
  // batches>. A shape equal to the tuned one for some element size (7 blocks an SM for 1
  // byte, 8 loads in flight for 2) times it again there: the spread between two timings.
  using dev::ScanPolicy;
  return {
      {"tuned (tuning.cuh)", launch_variant<Tuned, Esize, T, M>},
      {"every row counted by vector (before)", launch_variant<Tuned, Esize, T, M, 0, false>},
      {"tuned, no vote on masked batches", launch_variant<dev::WithBatchVote<Tuned, false>, Esize, T, M>},
      {"tuned, one range of units a block (not folded)", launch_variant<Tuned, Esize, T, M, 0, true, false>},
      {"warp/row, 128 threads, registers uncapped", launch_variant<ScanPolicy<128, 4, 2048, 1, true>, Esize, T, M>},
      {"warp/row, 128 threads, 7 blocks/SM (72 registers)", launch_variant<ScanPolicy<128, 4, 2048, 7, true>, Esize, T, M>},
      {"warp/row, 256 threads", launch_variant<ScanPolicy<256, 4, 2048, 1, true>, Esize, T, M>},
      {"warp/row, 128 threads, 8 loads in flight", launch_variant<ScanPolicy<128, 8, 2048, 1, true>, Esize, T, M>},
      {"warp/row, 128 threads, a block per unit", launch_variant<Tuned, Esize, T, M, -1>},
      {"warp/row, 128 threads, 2 x resident blocks", launch_variant<Tuned, Esize, T, M, 2>},
      {"warp/row, 128 threads, 8 blocks/SM (64 registers)", launch_variant<ScanPolicy<128, 4, 2048, 8, true>, Esize, T, M>},
      {"warp/row, 128 threads, 10 blocks/SM", launch_variant<ScanPolicy<128, 4, 2048, 10, true>, Esize, T, M>},
      {"warp/row, 128 threads, 2 loads in flight", launch_variant<ScanPolicy<128, 2, 2048, 1, true>, Esize, T, M>},
      {"warp/row, 64 threads", launch_variant<ScanPolicy<64, 4, 2048, 1, true>, Esize, T, M>},
      {"warp/row, 128 threads, 2048 units", launch_variant<Tuned, Esize, 2048, 64>},
      {"warp/row, 128 threads, 32768 units", launch_variant<Tuned, Esize, 32768, M>},
      // A ring of staged batches a warp in shared memory (cp.async): loads stay in flight
      // while the warp classifies a batch. ScanPolicy's sixth argument; the tuned 1-byte
      // shape is one of them.
      {"loads into registers, 4 in flight, 7 blocks/SM (before)", launch_variant<ScanPolicy<128, 4, 2048, 7, true>, Esize, T, M>},
      {"ring of 2 batches x 4 loads, 7 blocks/SM", launch_variant<ScanPolicy<128, 4, 2048, 7, true, 2>, Esize, T, M>},
      {"ring of 3 batches x 2 loads, 7 blocks/SM", launch_variant<ScanPolicy<128, 2, 2048, 7, true, 3>, Esize, T, M>},
      {"ring of 4 batches x 2 loads, 7 blocks/SM", launch_variant<ScanPolicy<128, 2, 2048, 7, true, 4>, Esize, T, M>},
      {"ring of 8 batches x 1 load, 7 blocks/SM", launch_variant<ScanPolicy<128, 1, 2048, 7, true, 8>, Esize, T, M>},
      {"ring of 4 batches x 2 loads, registers uncapped", launch_variant<ScanPolicy<128, 2, 2048, 1, true, 4>, Esize, T, M>},
      {"ring of 2 batches x 4 loads, registers uncapped", launch_variant<ScanPolicy<128, 4, 2048, 1, true, 2>, Esize, T, M>},
  };
}

// The tiles the case must have: from the structure, or from the blocks it was built of.
Result<TileSummary> expected_tiles(const std::string& kind, std::int64_t L) {
  if (kind == "window") {
    MaskStructure s = make_structure(StructureKind::sliding_window, 1, L, L);
    s.window = 4096;
    return tiles_from_structure(s);
  }
  if (kind == "documents") {
    MaskStructure s = make_structure(StructureKind::causal, 1, L, L);
    s.segments = {{0, L * 27 / 100, L * 61 / 100, L}};
    return tiles_from_structure(s);
  }
  auto made = TileSummary::for_grid(*make_tile_grid(1, 1, L, L, TileSize{}));
  if (!made) return made;
  const std::int64_t n = L / 128;
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j <= i; ++j)
      if (kept_block(i, j)) made->states[static_cast<std::size_t>(i * n + j)] = j == i ? TileState::partial : TileState::full;
  return made;
}

struct Bench {
  BenchOptions options;
  PlainRead read;
  bool all_right = true;

  bool wanted(const std::string& name) const { return options.wanted(name); }

  void run_case(const std::string& name, const MaskView& view, const TileSummary& expected) {
    const double bytes = static_cast<double>(view.extent_bytes());
    // Right first: the convenience call (same kernels) against the expected tiles.
    auto check = gpu::scan_with_tiles(view);
    check_ok(check.status());
    auto tensors = block_mask_tensors(expected);
    check_ok(tensors.status());
    bool right = check->tiles.states == expected.states;
    for (const BlockMaskField f : kBlockMaskFields) right = right && check->block_mask.values(f) == tensors->values(f);
    all_right = all_right && right;
    const TileTally tally = check->tiles.tally();

    // The caller's buffers: spans, the eight arrays, temporary storage.
    const TileGrid g = check->tiles.grid;
    const std::int64_t rows = gpu::span_rows(view);
    const auto lines = static_cast<std::size_t>(g.slices() * g.q_tiles()),
               columns = static_cast<std::size_t>(g.slices() * g.k_tiles()), tiles = static_cast<std::size_t>(g.tiles());
    RowSpan* d_rows = nullptr;
    std::int32_t* arrays = nullptr;
    CHECK_CUDA(cudaMalloc(&d_rows, static_cast<std::size_t>(rows) * sizeof(RowSpan)));
    CHECK_CUDA(cudaMalloc(&arrays, (2 * lines + 2 * columns + 4 * tiles) * sizeof(std::int32_t)));
    BlockMaskArrays out;
    std::int32_t* at = arrays;
    const auto take = [&](std::size_t n) {
      std::int32_t* p = at;
      at += n;
      return p;
    };
    out.kv_num_blocks = take(lines);
    out.kv_indices = take(tiles);
    out.full_kv_num_blocks = take(lines);
    out.full_kv_indices = take(tiles);
    out.q_num_blocks = take(columns);
    out.q_indices = take(tiles);
    out.full_q_num_blocks = take(columns);
    out.full_q_indices = take(tiles);
    std::size_t span_temp_bytes = 0, tile_temp_bytes = 0;
    check_ok(gpu::scan_spans(nullptr, span_temp_bytes, view, nullptr));
    check_ok(gpu::scan_spans_tiles(nullptr, tile_temp_bytes, view, TileSize{}, nullptr, out));
    void *span_temp = nullptr, *tile_temp = nullptr;
    CHECK_CUDA(cudaMalloc(&span_temp, span_temp_bytes));
    CHECK_CUDA(cudaMalloc(&tile_temp, tile_temp_bytes));

    const float read_ms = read.ms(view.data(), view.extent_bytes(), options.reps);
    const float spans_ms =
        median_ms(options.reps, [&] { check_ok(gpu::scan_spans(span_temp, span_temp_bytes, view, d_rows)); });
    const float tiles_ms = median_ms(options.reps, [&] {
      check_ok(gpu::scan_spans_tiles(tile_temp, tile_temp_bytes, view, TileSize{}, d_rows, out));
    });
    const auto gbs = [&](float ms) { return bytes / (ms * 1e-3) / 1e9; };
    std::printf("| %s | %.3f ms | %.0f | %.3f ms | %.2f | %.3f ms | %.0f | **%.2f** | %.2f | %lld / %lld / %lld%s |\n",
                name.c_str(), read_ms, gbs(read_ms), spans_ms, spans_ms / read_ms, tiles_ms, gbs(tiles_ms),
                tiles_ms / read_ms, tiles_ms / spans_ms, static_cast<long long>(tally.empty),
                static_cast<long long>(tally.partial), static_cast<long long>(tally.full), right ? "" : " (WRONG)");
    std::fflush(stdout);
    if (options.json)
      std::fprintf(options.json,
                   "{\"case\": \"%s\", \"bytes\": %.0f, \"plain_read_ms\": %.4f, \"scan_spans_ms\": %.4f, "
                   "\"tiles_ms\": %.4f, \"tiles_gbs\": %.1f, \"tiles_over_read\": %.4f, \"tiles_over_spans\": %.4f, "
                   "\"empty\": %lld, \"partial\": %lld, \"full\": %lld, \"right\": %s}\n",
                   name.c_str(), bytes, read_ms, spans_ms, tiles_ms, gbs(tiles_ms), tiles_ms / read_ms,
                   tiles_ms / spans_ms, static_cast<long long>(tally.empty), static_cast<long long>(tally.partial),
                   static_cast<long long>(tally.full), right ? "true" : "false");
    if (options.sweep) sweep(view, g, d_rows, out, tile_temp, *tensors, read_ms);
    CHECK_CUDA(cudaFree(d_rows));
    CHECK_CUDA(cudaFree(arrays));
    CHECK_CUDA(cudaFree(span_temp));
    CHECK_CUDA(cudaFree(tile_temp));
  }

  void sweep(const MaskView& view, const TileGrid& g, RowSpan* d_rows, const BlockMaskArrays& out, void* temp,
             const BlockMaskTensors& want, float read_ms) {
    const dev::ScanParams s = dev::scan_params(view);
    auto* counts =
        reinterpret_cast<unsigned long long*>((reinterpret_cast<std::uintptr_t>(temp) + 255) & ~std::uintptr_t{255});
    const auto tiles = static_cast<std::size_t>(g.tiles());
    const int esize = element_size(view.dtype());
    const std::vector<Variant> all = esize == 1 ? variants<1>() : esize == 2 ? variants<2>() : variants<4>();
    // The tuned pass split: the counts zeroed, then with the scan kernel (no writer).
    const float zeroed = median_ms(options.reps, [&] {
      CHECK_CUDA(cudaMemsetAsync(counts, 0, tiles * sizeof(std::uint64_t)));
    });
    const auto scan_kernel_ms = [&](const Variant& v) {  // the counts zeroed and the scan, no writer
      return median_ms(options.reps, [&] {
        CHECK_CUDA(cudaMemsetAsync(counts, 0, tiles * sizeof(std::uint64_t)));
        CHECK_CUDA(v.launch(s, g, d_rows, counts, nullptr));
      });
    };
    const float scanned = scan_kernel_ms(all[0]), scanned_by_vector = scan_kernel_ms(all[1]);
    std::printf("|   split: counts zeroed %.3f ms, + scan kernel %.3f ms (%.2fx read; every row by vector %.3f ms, "
                "%.2fx); the writer and the rest below | | | | | | | | | |\n",
                zeroed, scanned, scanned / read_ms, scanned_by_vector, scanned_by_vector / read_ms);
    // The whole pass (zeroing, scan, writer) as gpu::scan_spans_tiles enqueues it, its
    // launches chained where the device allows (dependent_launch.cuh), beside a memset
    // and three plain launches (before). Both checked below or by the main case.
    int arch = 0;
    bool chains = false;
    CHECK_CUDA(dev::current_arch(arch));
    CHECK_CUDA(dev::tile_pass_chains(chains));
    const float chained = median_ms(options.reps, [&] {
      CHECK_CUDA(dev::launch_zero_counts(counts, g.tiles(), nullptr));
      CHECK_CUDA(dev::dispatch_scan_tiles(view, g, d_rows, counts, nullptr, arch, chains));
      CHECK_CUDA(dev::launch_block_mask(dev::StatesFromCounts::of(g, counts), out, nullptr, nullptr, chains));
    });
    const float plain = median_ms(options.reps, [&] {
      CHECK_CUDA(cudaMemsetAsync(counts, 0, tiles * sizeof(std::uint64_t)));
      CHECK_CUDA(all[0].launch(s, g, d_rows, counts, nullptr));
      CHECK_CUDA(dev::launch_block_mask(dev::StatesFromCounts::of(g, counts), out, nullptr, nullptr));
    });
    std::printf("|   launches: zero kernel + scan + writer%s %.3f ms (%.2fx read), memset + plain launches "
                "(before) %.3f ms (%.2fx) | | | | | | | | | |\n",
                chains ? " chained" : " (not chained here)", chained, chained / read_ms, plain, plain / read_ms);
    for (const Variant& v : all) {
      const auto once = [&] {
        CHECK_CUDA(cudaMemsetAsync(counts, 0, tiles * sizeof(std::uint64_t)));
        CHECK_CUDA(v.launch(s, g, d_rows, counts, nullptr));
        CHECK_CUDA(dev::launch_block_mask(dev::StatesFromCounts::of(g, counts), out, nullptr, nullptr));
      };
      once();
      CHECK_CUDA(cudaDeviceSynchronize());
      bool right = true;  // every one of the eight arrays
      const BlockMaskArrays& got = out;
      const std::int32_t* fields[] = {got.kv_num_blocks, got.kv_indices, got.full_kv_num_blocks, got.full_kv_indices,
                                      got.q_num_blocks,  got.q_indices,  got.full_q_num_blocks,  got.full_q_indices};
      for (std::size_t i = 0; i < std::size(kBlockMaskFields); ++i) {
        const std::vector<std::int32_t>& expected = want.values(kBlockMaskFields[i]);
        std::vector<std::int32_t> values(expected.size());
        CHECK_CUDA(cudaMemcpy(values.data(), fields[i], values.size() * 4, cudaMemcpyDeviceToHost));
        right = right && values == expected;
      }
      all_right = all_right && right;
      const float ms = median_ms(options.reps, once);
      std::printf("|   sweep: %s | | | | | %.3f ms | | **%.2f** | | %s |\n", v.name, ms, ms / read_ms,
                  right ? "" : "WRONG");
      std::fflush(stdout);
    }
  }
};

}  // namespace

int main(int argc, char** argv) {
  Bench bench;
  if (const int exit_code = parse_options(argc, argv, bench.options, true); exit_code != 0) return exit_code;
  bench.read = open_device(bench.options.reps, "; tiles 128 x 128, all eight BlockMask arrays written");
  std::printf("| case | plain read | GB/s | scan_spans | x read | spans + tiles + BlockMask | GB/s | x read | x spans | "
              "empty / partial / full tiles |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|\n");

  const std::int64_t kLargest = 69632;  // the attention benchmark's length (4.5 GiB)
  void* buffer = nullptr;
  CHECK_CUDA(cudaMalloc(&buffer, static_cast<std::size_t>(kLargest * kLargest)));
  for (const std::int64_t L : {std::int64_t{32768}, std::int64_t{65536}, kLargest}) {
    const std::string size = std::to_string(L) + "^2";
    const std::string names[] = {"bool " + size + " window 4096", "bool " + size + " 3 documents",
                                 "bool " + size + " block-sparse 25%"};
    const std::string kinds[] = {"window", "documents", "blocks"};
    for (int c = 0; c < 3; ++c) {
      if (!bench.wanted(names[c])) continue;
      auto* m = static_cast<std::uint8_t*>(buffer);
      const std::uint8_t one = 1, zero = 0;
      if (c == 0) fill<<<8192, 256>>>(m, L, one, zero, Window{4096});
      if (c == 1) fill<<<8192, 256>>>(m, L, one, zero, Documents{L * 27 / 100, L * 61 / 100});
      if (c == 2) fill<<<8192, 256>>>(m, L, one, zero, BlockSparse{});
      CHECK_LAUNCH();
      CHECK_CUDA(cudaDeviceSynchronize());
      const std::int64_t shape[] = {L, L};
      auto view = MaskView::contiguous(m, ElementType::boolean, shape);
      check_ok(view.status());
      auto expected = expected_tiles(kinds[c], L);
      check_ok(expected.status());
      bench.run_case(names[c], *view, *expected);
    }
  }
  {  // an additive mask: bf16, 0 / -inf, the same window at 32768^2 (2 GiB)
    const std::int64_t L = 32768;
    const std::string name = "bf16 32768^2 window 4096, masked -inf";
    if (bench.wanted(name)) {
      auto* m = static_cast<std::uint16_t*>(buffer);
      fill<<<8192, 256>>>(m, L, std::uint16_t{0}, std::uint16_t{0xff80}, Window{4096});
      CHECK_LAUNCH();
      CHECK_CUDA(cudaDeviceSynchronize());
      const std::int64_t shape[] = {L, L};
      auto view = MaskView::contiguous(m, ElementType::bfloat16, shape);
      check_ok(view.status());
      auto expected = expected_tiles("window", L);
      check_ok(expected.status());
      bench.run_case(name, *view, *expected);
    }
  }
  CHECK_CUDA(cudaFree(buffer));
  if (!close_bench(bench.read, bench.options)) return 1;
  if (!bench.all_right) {
    std::fprintf(stderr, "a case's tiles were wrong: its figures measure a wrong scan\n");
    return 1;
  }
  return 0;
}
