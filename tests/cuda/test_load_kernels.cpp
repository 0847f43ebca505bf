// gpu::load_kernels() on a GPU, in a program of its own (tests/meson.build: the cuda
// suite's cuda-load-kernels, run with CUDA_MODULE_LOADING=LAZY) so that it meets a process
// in which nothing of masklens is loaded yet, as a framework calls it at start-up: it is
// the process's first CUDA work after cudaGetDeviceCount (no context exists yet), it
// succeeds and succeeds again, leaves a CUDA error the caller left pending alone, and
// every entry point whose kernels it loaded then gives the host's answer — the scan with
// every element size and both kernels (a warp and a block per row), the run reduction,
// the tile scan with its counters in shared memory and in the 64-bit counts, and the
// BlockMask writer from the scan's counts and from states given. Plain C++: the CUDA
// runtime API and the masklens headers.
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>
#include <masklens/cuda/load_kernels.hpp>
#include <masklens/cuda/runs.hpp>
#include <masklens/cuda/tile_plan.hpp>
#include <masklens/cuda/tiles.hpp>
#include <masklens/masklens.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "../support/device_buffer.hpp"
#include "../support/mask_gen.hpp"
#include "../support/structure_fields.hpp"
#include "suite_size.hpp"

using namespace masklens;
using namespace masklens::testing;

TEST_SUITE("cuda") {

// First in this file, so first in the program: no CUDA context exists before it.
TEST_CASE("load_kernels: the process's first CUDA work; succeeds, and again") {
  const Status first = gpu::load_kernels();
  REQUIRE_MESSAGE(first.ok(), first.to_string());
  const Status again = gpu::load_kernels();
  CHECK_MESSAGE(again.ok(), again.to_string());
  for (Status (*part)() : {&gpu::load_scan_kernels, &gpu::load_tile_kernels, &gpu::load_runs_kernels,
                           &gpu::load_table_runs_kernels}) {
    const Status st = part();
    CHECK_MESSAGE(st.ok(), st.to_string());
  }
  // It created the primary context on the current device, which the runtime now uses.
  int device = -1;
  REQUIRE_CUDA(cudaGetDevice(&device));
  CHECK(device >= 0);
}

TEST_CASE("load_kernels: a CUDA error pending from the caller's own work is neither cleared nor taken for its own" *
          kApiErrorOnPurpose) {
  leave_allocation_error_pending();
  const Status st = gpu::load_kernels();
  const cudaError_t still = cudaGetLastError();  // the test is the caller: it clears its own error
  CHECK_MESSAGE(st.ok(), st.to_string());
  CHECK(still == cudaErrorMemoryAllocation);
}

TEST_CASE("load_kernels: afterwards every entry point it loaded for gives the host's answer") {
  REQUIRE(gpu::load_kernels().ok());
  Rng rng(test_seed(1313));
  int compared = 0;
  // Element sizes 1, 2 and 4; rows of 100 keys (a warp per row in the scan) and of 3000
  // (a block per row: at least ScanPolicy's 2048 bytes in every type); tiles whose
  // counters fit shared memory (64 x 64) and tiles of one key past the shared budget
  // (64 x 1 at 9000 keys: the 64-bit counts).
  struct Shape {
    std::int64_t q, k;
    TileSize tiles;
  };
  for (const ElementType dtype : {ElementType::boolean, ElementType::bfloat16, ElementType::float32})
    for (const Shape shape : {Shape{70, 100, {64, 64}}, Shape{40, 3000, {64, 64}}, Shape{20, 9000, {64, 1}}}) {
      const MaskStructure spec = random_structure(rng, 2, shape.q, shape.k);
      DenseMask m = render(spec, 2, dtype, Polarity::true_attends, Layout::contiguous, rng);
      INFO(m.describe);

      // The scan (scan_host_mask: a copy, then scan_spans) against the host scanner.
      auto host = scan(m.view);
      REQUIRE_MESSAGE(host.ok(), host.status().to_string());
      auto device = gpu::scan_host_mask(m.view);
      REQUIRE_MESSAGE(device.ok(), device.status().to_string());
      REQUIRE(device->rows.size() == host->rows.size());
      for (std::size_t r = 0; r < host->rows.size(); ++r) {
        INFO("row " << r);
        REQUIRE(device->rows[r].same_keys(host->rows[r]));
        REQUIRE(device->rows[r].flags == host->rows[r].flags);
      }

      // The run reduction (scan_runs, inspect_runs on a device copy) against encode and classify.
      DeviceBuffer buffer(static_cast<std::size_t>(m.view.extent_bytes()));
      const MaskView on_device = to_device(m.view, buffer);
      auto runs = gpu::scan_runs(on_device);
      REQUIRE_MESSAGE(runs.ok(), runs.status().to_string());
      auto encoded = SpanRuns::encode(*host);
      REQUIRE(encoded.ok());
      CHECK(runs->runs == encoded->runs);
      auto by_runs = gpu::inspect_runs(on_device);
      auto by_host = classify(*host);
      REQUIRE(by_runs.ok());
      REQUIRE(by_host.ok());
      CHECK(structure_fields(*by_runs) == structure_fields(*by_host));

      // The tile scan and the writer from its counts (scan_host_mask_with_tiles) against
      // the host's tiles and BlockMask tensors; the plan says which counters it used.
      auto grid = tile_grid_for(m.view, shape.tiles);
      REQUIRE(grid.ok());
      const bool shared = gpu::detail::plan_tile_scan(*grid, element_size(dtype), 4).shared;
      CHECK(shared == (shape.tiles.k > 1));
      auto host_tiles = scan_with_tiles(m.view, shape.tiles);
      REQUIRE(host_tiles.ok());
      auto want = block_mask_tensors(host_tiles->tiles);
      REQUIRE(want.ok());
      auto tiled = gpu::scan_host_mask_with_tiles(m.view, shape.tiles);
      REQUIRE_MESSAGE(tiled.ok(), tiled.status().to_string());
      CHECK(tiled->tiles.states == host_tiles->tiles.states);
      for (const BlockMaskField f : kBlockMaskFields) {
        INFO(to_string(f));
        CHECK(tiled->block_mask.values(f) == want->values(f));
      }

      // The writer from states given (write_block_mask): the host's states copied over.
      const auto tiles = static_cast<std::size_t>(grid->tiles());
      DeviceBuffer d_states(tiles);
      REQUIRE_CUDA(cudaMemcpy(d_states.get(), host_tiles->tiles.states.data(), tiles, cudaMemcpyHostToDevice));
      const std::vector<std::int32_t>& kv = want->values(BlockMaskField::kv_indices);
      DeviceBuffer d_kv(kv.size() * sizeof(std::int32_t));
      REQUIRE_CUDA(cudaMemset(d_kv.get(), 0xff, kv.size() * sizeof(std::int32_t)));  // leftovers must not pass
      BlockMaskArrays out{};
      out.kv_indices = d_kv.get<std::int32_t>();
      const Status written = gpu::write_block_mask(*grid, d_states.get<TileState>(), out);
      REQUIRE_MESSAGE(written.ok(), written.to_string());
      std::vector<std::int32_t> got(kv.size());
      REQUIRE_CUDA(cudaMemcpy(got.data(), d_kv.get(), got.size() * sizeof(std::int32_t), cudaMemcpyDeviceToHost));
      CHECK(got == kv);
      ++compared;
    }
  CHECK(compared == 9);

  // The writer from an exact structure's ranges (write_block_mask_from_ranges), loaded too.
  const MaskStructure window = [] {
    MaskStructure s = make_structure(StructureKind::sliding_window, 1, 300, 300);
    s.window = 70;
    return s;
  }();
  auto ranges = structure_tile_ranges(window, TileSize{32, 16});
  REQUIRE(ranges.ok());
  auto tiles = tiles_from_structure(window, TileSize{32, 16});
  REQUIRE(tiles.ok());
  auto want = block_mask_tensors(*tiles);
  REQUIRE(want.ok());
  const std::size_t range_bytes = ranges->rows.size() * sizeof(TileRowRanges);
  DeviceBuffer d_ranges(range_bytes);
  REQUIRE_CUDA(cudaMemcpy(d_ranges.get(), ranges->rows.data(), range_bytes, cudaMemcpyHostToDevice));
  const std::vector<std::int32_t>& full = want->values(BlockMaskField::full_q_indices);
  DeviceBuffer d_full(full.size() * sizeof(std::int32_t));
  REQUIRE_CUDA(cudaMemset(d_full.get(), 0xff, full.size() * sizeof(std::int32_t)));  // leftovers must not pass
  BlockMaskArrays out{};
  out.full_q_indices = d_full.get<std::int32_t>();
  const Status written = gpu::write_block_mask_from_ranges(ranges->grid, d_ranges.get<TileRowRanges>(), out);
  REQUIRE_MESSAGE(written.ok(), written.to_string());
  std::vector<std::int32_t> got(full.size());
  REQUIRE_CUDA(cudaMemcpy(got.data(), d_full.get(), got.size() * sizeof(std::int32_t), cudaMemcpyDeviceToHost));
  CHECK(got == full);
}

}  // TEST_SUITE
