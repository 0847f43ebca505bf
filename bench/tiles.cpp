// Tile summaries on the host: scan_with_tiles (the row spans and the 128 x 128 tiles in
// one read) and scan() (the spans alone) beside a plain sequential read of the same
// bytes, in the same run, on one core; then the rest of the path to torch's BlockMask
// (the eight int32 tensors) and the structure-derived tiles, which read nothing.
//   ./build-release/bench/tiles [L] [reps]     default 16384 7
// Masks: bool causal, bool block-sparse (arbitrary: a quarter of the 128-blocks below
// the diagonal kept), bf16 additive causal (finfo.min masked, as transformers writes it).
#include <masklens/masklens.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench_support.hpp"

namespace {

using masklens::bench::median_seconds;
using masklens::bench::plain_read;

volatile std::uint64_t sink = 0;

// One mask: the three reads side by side, then tensors; false when something fails.
bool run_case(const char* name, const masklens::MaskView& view, const std::uint8_t* bytes, std::size_t n, int reps) {
  using namespace masklens;
  const double size = static_cast<double>(n);
  const double t_read = median_seconds(reps, [&] { sink = sink + plain_read(bytes, n); });
  Result<SpanTable> spans = error(ErrorCode::ok, "");
  const double t_scan = median_seconds(reps, [&] { spans = scan(view, {1}); });
  Result<SpansAndTiles> both = error(ErrorCode::ok, "");
  const double t_tiles = median_seconds(reps, [&] { both = scan_with_tiles(view, TileSize{}, {1}); });
  if (!spans || !both) return std::fprintf(stderr, "%s: scan failed\n", name), false;
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const double t_tiles_mt = median_seconds(reps, [&] { both = scan_with_tiles(view, TileSize{}, {0}); });
  if (!both) return false;
  Result<BlockMaskTensors> tensors = error(ErrorCode::ok, "");
  const double t_tensors = median_seconds(reps, [&] { tensors = block_mask_tensors(both->tiles); });
  if (!tensors) return false;
  auto verdict = classify(both->spans);
  if (!verdict) return false;
  const TileTally t = both->tiles.tally();
  std::printf("%s, %.0f MiB: %s; tiles %lld empty, %lld partial, %lld full\n", name, size / (1 << 20),
              describe(*verdict).c_str(), static_cast<long long>(t.empty), static_cast<long long>(t.partial),
              static_cast<long long>(t.full));
  std::printf("  plain read              %8.2f ms  %6.2f GB/s  (baseline)\n", t_read * 1e3, size / t_read / 1e9);
  std::printf("  scan (spans)            %8.2f ms  %6.2f GB/s  ratio %.2f of plain read\n", t_scan * 1e3,
              size / t_scan / 1e9, t_read / t_scan);
  std::printf("  scan_with_tiles 128x128 %8.2f ms  %6.2f GB/s  ratio %.2f of plain read, %.2f of scan\n",
              t_tiles * 1e3, size / t_tiles / 1e9, t_read / t_tiles, t_scan / t_tiles);
  std::printf("  same, %u threads         %8.2f ms  %6.2f GB/s\n", cores, t_tiles_mt * 1e3, size / t_tiles_mt / 1e9);
  std::printf("  block_mask_tensors      %8.3f ms  (8 int32 tensors of %lld x %lld tiles)\n", t_tensors * 1e3,
              static_cast<long long>(both->tiles.grid.q_tiles()), static_cast<long long>(both->tiles.grid.k_tiles()));
  if (verdict->kind != StructureKind::arbitrary) {
    Result<TileSummary> derived = error(ErrorCode::ok, "");
    const double t_derived = median_seconds(reps, [&] { derived = tiles_from_structure(*verdict); });
    if (!derived || derived->states != both->tiles.states)
      return std::fprintf(stderr, "%s: derived tiles differ from scanned ones\n", name), false;
    std::printf("  tiles_from_structure    %8.3f ms  (no read; equal to the scanned tiles)\n", t_derived * 1e3);
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace masklens;
  const std::int64_t L = argc > 1 ? std::atoll(argv[1]) : 16384;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 7;
  const std::int64_t shape[] = {L, L};
  bool ok = true;

  std::vector<std::uint8_t> causal(static_cast<std::size_t>(L * L));
  for (std::int64_t q = 0; q < L; ++q) std::memset(causal.data() + q * L, 1, static_cast<std::size_t>(q + 1));
  auto causal_view = MaskView::contiguous(causal.data(), ElementType::boolean, shape);
  ok = ok && causal_view && run_case("bool causal", *causal_view, causal.data(), causal.size(), reps);

  // Block-sparse: a quarter of the 128 x 128 blocks below the diagonal kept, causal
  // inside the diagonal ones (arbitrary: no exact structure describes it).
  std::vector<std::uint8_t> sparse(causal.size(), 0);
  std::mt19937_64 rng(14);
  const std::int64_t T = 128, n = (L + T - 1) / T;
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j <= i; ++j) {
      if (i != j && rng() % 4 != 0) continue;
      for (std::int64_t q = i * T; q < std::min(L, (i + 1) * T); ++q) {
        const std::int64_t k0 = j * T, k1 = std::min({L, (j + 1) * T, q + 1});
        if (k1 > k0) std::memset(sparse.data() + q * L + k0, 1, static_cast<std::size_t>(k1 - k0));
      }
    }
  auto sparse_view = MaskView::contiguous(sparse.data(), ElementType::boolean, shape);
  ok = ok && sparse_view && run_case("bool block-sparse", *sparse_view, sparse.data(), sparse.size(), reps);
  std::vector<std::uint8_t>().swap(sparse);

  std::vector<std::uint16_t> additive(static_cast<std::size_t>(L * L), 0xff7f);  // finfo(bf16).min
  for (std::int64_t q = 0; q < L; ++q) std::fill_n(additive.begin() + q * L, q + 1, std::uint16_t{0});
  auto additive_view = MaskView::contiguous(additive.data(), ElementType::bfloat16, shape);
  ok = ok && additive_view &&
       run_case("bf16 additive causal", *additive_view, reinterpret_cast<const std::uint8_t*>(additive.data()),
                additive.size() * 2, reps);
  return ok ? 0 : 1;
}
