// Tile summaries on the device (masklens/cuda/tiles.hpp) against the host (the oracle:
// scan_with_tiles, block_mask_tensors and scan() of tiles.hpp / scan.hpp): the spans of
// the same pass row for row, every tile's state and torch's eight BlockMask tensors entry
// for entry, on generated and mutated masks of every kind, element type, additive
// encoding, layout (stride-0 broadcast included) and start alignment, at torch's 128 x
// 128 and at 64 x 128, 96 x 80, tiny and random tile sizes with ragged last tiles, short
// and long rows, both places the counters live; structures at 32768^2 against
// tiles_from_structure; a single tile of 2^32 elements (64-bit counts); and the contract:
// two-phase into the caller's arrays on the caller's stream with no synchronisation
// (a CUDA graph capture), null arrays skipped, NaN rows, the caller's pending CUDA error
// neither cleared nor taken. Plain C++: the CUDA runtime API and the masklens headers.
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>
#include <masklens/cuda/tiles.hpp>
#include <masklens/masklens.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "../support/additive_encodings.hpp"
#include "../support/block_masks.hpp"
#include "../support/device_buffer.hpp"
#include "../support/mask_gen.hpp"
#include "../support/mutated_masks.hpp"
#include "suite_size.hpp"

using namespace masklens;
using namespace masklens::testing;

namespace {

std::string text(TileSize s) { return std::to_string(s.q) + "x" + std::to_string(s.k); }

// The device's spans, states and tensors equal the host's for `view` (host memory).
void require_same_as_host(const MaskView& view, TileSize size, const gpu::TileScan& device) {
  auto host = scan_with_tiles(view, size);
  REQUIRE_MESSAGE(host.ok(), host.status().to_string());
  auto spans = scan(view);
  REQUIRE(spans.ok());
  REQUIRE(device.spans.rows.size() == spans->rows.size());
  for (std::size_t r = 0; r < spans->rows.size(); ++r) {
    INFO("row " << r);
    REQUIRE(device.spans.rows[r].count == spans->rows[r].count);
    REQUIRE(device.spans.rows[r].same_keys(spans->rows[r]));
    REQUIRE(device.spans.rows[r].flags == spans->rows[r].flags);
  }
  const TileGrid& g = host->tiles.grid;
  REQUIRE(device.tiles.grid.distinct_batch == g.distinct_batch);
  REQUIRE(device.tiles.grid.distinct_heads == g.distinct_heads);
  REQUIRE(device.tiles.grid.q_tiles() == g.q_tiles());
  REQUIRE(device.tiles.grid.k_tiles() == g.k_tiles());
  for (std::size_t t = 0; t < host->tiles.states.size(); ++t) {
    if (device.tiles.states[t] != host->tiles.states[t]) {
      const std::int64_t nk = g.k_tiles(), nq = g.q_tiles(), i = static_cast<std::int64_t>(t);
      FAIL("tile [slice " << i / (nq * nk) << ", q tile " << i / nk % nq << ", k tile " << i % nk << "] is "
                          << static_cast<int>(device.tiles.states[t]) << " on the device, "
                          << static_cast<int>(host->tiles.states[t]) << " on the host");
    }
  }
  auto tensors = block_mask_tensors(host->tiles);
  REQUIRE(tensors.ok());
  for (const BlockMaskField f : kBlockMaskFields) {
    INFO(to_string(f));
    const Int32Tensor want = tensors->tensor(f), got = device.block_mask.tensor(f);
    REQUIRE(got.rank == want.rank);
    REQUIRE(got.shape == want.shape);
    REQUIRE(device.block_mask.values(f) == tensors->values(f));
  }
}

}  // namespace

TEST_SUITE("cuda") {

TEST_CASE("device tiles: tiles, BlockMask tensors and spans equal the host's on generated and mutated masks") {
  Rng rng(test_seed(1404));
  int compared = 0;
  const int n = suite_cases(2000);
  for (int i = 0; i < n; ++i) {
    MutatedMask mutated = mutated_mask(rng, 300);
    const DenseMask& dense = mutated.dense;
    const std::string& encoding = mutated.encoding;
    const int esize = element_size(dense.view.dtype());
    const Layout layout = mutated.layout;
    const std::int64_t q_len = dense.view.q_len(), k_len = dense.view.k_len();
    const TileSize sizes[] = {{128, 128}, {64, 128}, {96, 80}, {16, 16}, {7, 13}, {1, 1}, {128, 64},
                              {uniform(rng, 1, 64), uniform(rng, 1, 400)}};
    TileSize size = sizes[uniform(rng, 0, 7)];
    // Tiny tiles of a large mask make millions of tiles for the host to check: 16 x 64 there.
    if (size.q * size.k < 256 && q_len * k_len > 200000) size = TileSize{16, 64};
    const std::int64_t offset = esize * uniform(rng, 0, 16 / esize);
    INFO(dense.describe << " encoding " << encoding << " tiles " << text(size) << " offset " << offset);
    auto device = gpu::scan_host_mask_with_tiles(dense.view, size, offset);
    REQUIRE_MESSAGE(device.ok(), device.status().to_string());
    require_same_as_host(dense.view, size, *device);
    if (layout == Layout::expand) {
      CHECK(device->tiles.grid.distinct_batch == 1);
      CHECK(device->tiles.grid.distinct_heads == 1);
      CHECK(device->block_mask.tensor(BlockMaskField::kv_indices).shape[0] == 1);
    }
    ++compared;
  }
  MESSAGE("device == host on " << compared << " masks");
}

TEST_CASE("device tiles: block-structured masks, every state, whole and ragged tiles, short and long rows, counters in shared and in global memory") {
  Rng rng(test_seed(1405));
  const ElementType types[] = {ElementType::boolean, ElementType::bfloat16, ElementType::float16, ElementType::float32,
                               ElementType::uint8};
  struct Shape {
    std::int64_t Q, K;
    TileSize size;
    std::int64_t grain;
  };
  // Short rows and long ones (a warp per row either way), whole tiles and ragged
  // ones, and k tiles too many for the shared counters (9000 tiles of one key).
  const Shape shapes[] = {{512, 512, {128, 128}, 64},   {384, 1024, {64, 128}, 32}, {500, 700, {96, 80}, 16},
                          {257, 3000, {128, 128}, 128}, {130, 2100, {96, 80}, 8},   {200, 9000, {64, 1}, 16},
                          {64, 4500, {16, 16}, 16},     {300, 640, {100, 64}, 4}};
  const int rounds = suite_cases(12) >= 12 ? 6 : 1;
  int compared = 0;
  TileTally seen;
  for (int round = 0; round < rounds; ++round)
    for (const Shape& shape : shapes) {
      const ElementType dtype = types[uniform(rng, 0, 4)];
      const bool broadcast = coin(rng, 0.3);
      const std::int64_t B = uniform(rng, 1, 2), H = uniform(rng, 1, 3);
      DenseMask m = block_structured_mask(rng, B, H, shape.Q, shape.K, dtype, broadcast, shape.grain);
      const std::int64_t esize = element_size(dtype), offset = esize * uniform(rng, 0, 16 / esize - 1);
      INFO(m.describe << " tiles " << text(shape.size) << " offset " << offset);
      auto device = gpu::scan_host_mask_with_tiles(m.view, shape.size, offset);
      REQUIRE_MESSAGE(device.ok(), device.status().to_string());
      require_same_as_host(m.view, shape.size, *device);
      const TileTally t = device->tiles.tally();
      seen.empty += t.empty;
      seen.partial += t.partial;
      seen.full += t.full;
      ++compared;
    }
  MESSAGE(compared << " block-structured masks: " << seen.empty << " empty, " << seen.partial << " partial, "
                   << seen.full << " full tiles");
  CHECK(seen.empty > 0);
  CHECK(seen.partial > 0);
  CHECK(seen.full > 0);
}

TEST_CASE("device tiles: 32768^2 sliding window and packed documents equal tiles_from_structure") {
  const std::int64_t L = suite_length(32768, 3072);  // whole chunks of 1024 rows
  DeviceBuffer mask(static_cast<std::size_t>(L * L));
  const std::int64_t shape[] = {L, L};
  auto view = MaskView::contiguous(mask.get(), ElementType::boolean, shape);
  REQUIRE(view.ok());
  MaskStructure window = make_structure(StructureKind::sliding_window, 1, L, L);
  window.window = L / 8;
  MaskStructure documents = make_structure(StructureKind::causal, 1, L, L);
  documents.segments = {{0, L * 9001 / 32768, L * 20000 / 32768, L}};  // three documents, cut inside tiles
  for (const MaskStructure* s : {&window, &documents}) {
    std::vector<std::uint8_t> rows(static_cast<std::size_t>(1024 * L));
    for (std::int64_t q0 = 0; q0 < L; q0 += 1024) {
      std::fill(rows.begin(), rows.end(), std::uint8_t{0});
      for (std::int64_t i = 0; i < 1024; ++i) {
        const RowSpan r = s->row(0, q0 + i);
        if (r.count > 0)
          std::fill_n(rows.begin() + static_cast<std::ptrdiff_t>(i * L + r.first), r.last - r.first + 1, std::uint8_t{1});
      }
      REQUIRE_CUDA(cudaMemcpy(mask.get() + q0 * L, rows.data(), rows.size(), cudaMemcpyHostToDevice));
    }
    for (const TileSize size : {TileSize{128, 128}, TileSize{96, 80}}) {
      INFO(describe(*s) << " tiles " << text(size));
      auto device = gpu::scan_with_tiles(*view, size);
      REQUIRE_MESSAGE(device.ok(), device.status().to_string());
      auto want = tiles_from_structure(*s, size);
      REQUIRE(want.ok());
      CHECK(device->tiles.states == want->states);
      auto tensors = block_mask_tensors(*want);
      REQUIRE(tensors.ok());
      for (const BlockMaskField f : kBlockMaskFields) CHECK(device->block_mask.values(f) == tensors->values(f));
      auto verdict = classify(device->spans);
      REQUIRE(verdict.ok());
      CHECK(verdict->kind == s->kind);
    }
  }
}

TEST_CASE("device tiles: a tile of 2^32 elements is counted in 64 bits, full; one masked element makes it partial") {
  const std::int64_t L = suite_length(65536, 2048);  // sanitizer-sized: the counts' flush, not their width
  DeviceBuffer mask(static_cast<std::size_t>(L * L));
  REQUIRE_CUDA(cudaMemset(mask.get(), 1, static_cast<std::size_t>(L * L)));
  const std::int64_t shape[] = {L, L};
  auto view = MaskView::contiguous(mask.get(), ElementType::boolean, shape);
  REQUIRE(view.ok());
  auto whole = gpu::scan_with_tiles(*view, TileSize{L, L});
  REQUIRE_MESSAGE(whole.ok(), whole.status().to_string());
  REQUIRE(whole->tiles.states.size() == 1);
  CHECK(whole->tiles.states[0] == TileState::full);  // 2^32 attending: 0 in 32 bits
  CHECK(whole->block_mask.full_kv_num_blocks == std::vector<std::int32_t>{1});
  CHECK(whole->block_mask.kv_num_blocks == std::vector<std::int32_t>{0});
  const std::uint8_t zero = 0;
  const std::int64_t hole = 12345 % L;
  REQUIRE_CUDA(cudaMemcpy(mask.get() + (L - 1) * L + hole, &zero, 1, cudaMemcpyHostToDevice));
  auto holed = gpu::scan_with_tiles(*view, TileSize{L, L});
  REQUIRE(holed.ok());
  CHECK(holed->tiles.states[0] == TileState::partial);
  // The same mask at 128 x 128: every tile full but the one holding the hole.
  auto small = gpu::scan_with_tiles(*view, TileSize{});
  REQUIRE(small.ok());
  const TileTally t = small->tiles.tally();
  CHECK(t.partial == 1);
  CHECK(t.full == (L / 128) * (L / 128) - 1);
  CHECK(small->tiles.state(0, L / 128 - 1, hole / 128) == TileState::partial);
}

TEST_CASE("device tiles: two-phase into the caller's arrays on the caller's stream, null arrays skipped, records into a CUDA graph") {
  Rng rng(test_seed(1406));
  DenseMask m = block_structured_mask(rng, 2, 3, 300, 2500, ElementType::bfloat16, false, 16);
  const TileSize size{64, 128};
  auto host = scan_with_tiles(m.view, size);
  REQUIRE(host.ok());
  auto tensors = block_mask_tensors(host->tiles);
  REQUIRE(tensors.ok());
  DeviceBuffer d_mask(static_cast<std::size_t>(m.view.extent_bytes()));
  const MaskView view = to_device(m.view, d_mask);
  const TileGrid& g = host->tiles.grid;
  const auto tiles = static_cast<std::size_t>(g.tiles()), kv_rows = static_cast<std::size_t>(g.slices() * g.q_tiles());
  const std::size_t row_bytes = host->spans.rows.size() * sizeof(RowSpan);
  DeviceBuffer d_rows(row_bytes), d_states(tiles), kv_count(kv_rows * 4), kv_index(tiles * 4), full_count(kv_rows * 4),
      full_index(tiles * 4);
  BlockMaskArrays out;  // the forward pass's four: the q side stays null
  out.kv_num_blocks = kv_count.get<std::int32_t>();
  out.kv_indices = kv_index.get<std::int32_t>();
  out.full_kv_num_blocks = full_count.get<std::int32_t>();
  out.full_kv_indices = full_index.get<std::int32_t>();
  cudaStream_t stream = nullptr;
  REQUIRE_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::size_t temp_bytes = 0;
  REQUIRE(gpu::scan_spans_tiles(nullptr, temp_bytes, view, size, nullptr, out, nullptr, stream).ok());
  DeviceBuffer temp(temp_bytes + 3);
  void* odd_temp = temp.get() + 3;  // the storage may start at any address

  const auto check_results = [&](bool with_states) {
    REQUIRE_CUDA(cudaStreamSynchronize(stream));
    std::vector<RowSpan> rows(host->spans.rows.size());
    REQUIRE_CUDA(cudaMemcpy(rows.data(), d_rows.get(), row_bytes, cudaMemcpyDeviceToHost));
    for (std::size_t r = 0; r < rows.size(); ++r) {
      REQUIRE(rows[r].same_keys(host->spans.rows[r]));
      REQUIRE(rows[r].flags == host->spans.rows[r].flags);
    }
    const auto fetch = [](const DeviceBuffer& b, std::size_t n) {
      std::vector<std::int32_t> v(n);
      REQUIRE_CUDA(cudaMemcpy(v.data(), b.get(), n * 4, cudaMemcpyDeviceToHost));
      return v;
    };
    CHECK(fetch(kv_count, kv_rows) == tensors->kv_num_blocks);
    CHECK(fetch(kv_index, tiles) == tensors->kv_indices);
    CHECK(fetch(full_count, kv_rows) == tensors->full_kv_num_blocks);
    CHECK(fetch(full_index, tiles) == tensors->full_kv_indices);
    if (with_states) {
      std::vector<TileState> states(tiles);
      REQUIRE_CUDA(cudaMemcpy(states.data(), d_states.get(), tiles, cudaMemcpyDeviceToHost));
      CHECK(states == host->tiles.states);
    }
  };
  // The temporary storage too: the counts in it must be zeroed by the pass itself, before
  // the scan (chained to the zeroing kernel on sm_90) adds into them.
  const std::pair<const DeviceBuffer*, std::size_t> outputs[] = {
      {&d_rows, row_bytes},      {&d_states, tiles},         {&kv_count, kv_rows * 4},     {&kv_index, tiles * 4},
      {&full_count, kv_rows * 4}, {&full_index, tiles * 4}, {&temp, temp_bytes + 3}};
  const auto poison = [&] {  // leftovers must not pass for results
    for (const auto& [buffer, bytes] : outputs) REQUIRE_CUDA(cudaMemsetAsync(buffer->get(), 0xff, bytes, stream));
  };

  SUBCASE("enqueued; the caller synchronises once") {
    poison();
    REQUIRE(gpu::scan_spans_tiles(odd_temp, temp_bytes, view, size, d_rows.get<RowSpan>(), out,
                                  d_states.get<TileState>(), stream)
                .ok());
    check_results(true);
    // Without the states: the same arrays.
    poison();
    REQUIRE(gpu::scan_spans_tiles(odd_temp, temp_bytes, view, size, d_rows.get<RowSpan>(), out, nullptr, stream).ok());
    check_results(false);
  }
  SUBCASE("captured: a synchronisation or an allocation inside would invalidate the capture") {
    REQUIRE_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    const Status st = gpu::scan_spans_tiles(odd_temp, temp_bytes, view, size, d_rows.get<RowSpan>(), out,
                                            d_states.get<TileState>(), stream);
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
    REQUIRE_MESSAGE(st.ok(), st.to_string());
    REQUIRE_MESSAGE(ended == cudaSuccess, std::string(cudaGetErrorName(ended)));
    cudaGraphExec_t exec = nullptr;
    REQUIRE_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    for (int launch = 0; launch < 2; ++launch) {  // twice: the counts are zeroed inside
      poison();
      REQUIRE_CUDA(cudaGraphLaunch(exec, stream));
      check_results(true);
    }
    REQUIRE_CUDA(cudaGraphExecDestroy(exec));
    REQUIRE_CUDA(cudaGraphDestroy(graph));
  }
  REQUIRE_CUDA(cudaStreamDestroy(stream));
}

// Device arrays for a BlockMask's fields, each filled with 0xff first (leftovers must not
// pass for results), and the check of what a writer wrote into them.
class FieldArrays {
 public:
  BlockMaskArrays out;  // null where a field was not added

  // Field i, room for `entries` int32.
  void add(std::size_t i, std::size_t entries) {
    const std::size_t bytes = entries * sizeof(std::int32_t);
    buffers_.push_back(std::make_unique<DeviceBuffer>(bytes));
    REQUIRE_CUDA(cudaMemset(buffers_.back()->get(), 0xff, bytes));
    *slot(i) = buffers_.back()->get<std::int32_t>();
  }

  // The first field added whose array differs from want's, if any.
  std::optional<BlockMaskField> first_difference(const BlockMaskTensors& want) {
    for (std::size_t i = 0; i < std::size(kBlockMaskFields); ++i) {
      if (*slot(i) == nullptr) continue;
      const std::vector<std::int32_t>& expected = want.values(kBlockMaskFields[i]);
      std::vector<std::int32_t> got(expected.size());
      REQUIRE_CUDA(cudaMemcpy(got.data(), *slot(i), got.size() * 4, cudaMemcpyDeviceToHost));
      if (got != expected) return kBlockMaskFields[i];
    }
    return std::nullopt;
  }

 private:
  std::int32_t** slot(std::size_t i) {
    std::int32_t** slots[] = {&out.kv_num_blocks, &out.kv_indices, &out.full_kv_num_blocks, &out.full_kv_indices,
                              &out.q_num_blocks,  &out.q_indices,  &out.full_q_num_blocks,  &out.full_q_indices};
    return slots[i];
  }
  std::vector<std::unique_ptr<DeviceBuffer>> buffers_;
};

// gpu::write_block_mask over `summary`'s states, copied to the device, into `arrays`:
// the first field that differs from `want`, if one does.
static std::optional<BlockMaskField> write_given_states(const TileSummary& summary, FieldArrays& arrays,
                                                        const BlockMaskTensors& want) {
  const auto tiles = summary.states.size();
  DeviceBuffer d_states(tiles);
  REQUIRE_CUDA(cudaMemcpy(d_states.get(), summary.states.data(), tiles, cudaMemcpyHostToDevice));
  const Status st = gpu::write_block_mask(summary.grid, d_states.get<TileState>(), arrays.out);
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  REQUIRE_CUDA(cudaDeviceSynchronize());
  return arrays.first_difference(want);
}

TEST_CASE("device tiles: write_block_mask from states the caller has equals block_mask_tensors, any subset of arrays") {
  Rng rng(test_seed(1407));
  const int n = suite_cases(300);
  for (int c = 0; c < n; ++c) {
    // Random grids: ragged and whole tiles, long lines (up to 2500 tiles: more than two
    // rounds of the writer's block, 1024 tiles), broadcast and distinct slices, every mix
    // of states. Case 0 always: 9 distinct slices of 2500 q tiles, ~23000 lines, more
    // than the writer's grid (a block takes several lines in turn).
    const bool long_q = c % 10 == 0, long_k = c % 7 == 0 && !long_q;  // never both: arrays stay small
    const std::int64_t B = c == 0 ? 3 : uniform(rng, 1, 3), H = c == 0 ? 3 : uniform(rng, 1, 3);
    const TileSize size{long_q ? (c == 0 ? 16 : uniform(rng, 1, 2) * 16) : uniform(rng, 1, 4) * 32,
                        long_k ? uniform(rng, 1, 2) * 16 : uniform(rng, 1, 4) * 32};
    const std::int64_t Q = c == 0 ? 40000 : uniform(rng, 1, long_q ? 40000 : 3000);
    const std::int64_t K = uniform(rng, 1, long_k ? 40000 : 3000);
    auto grid = make_tile_grid(B, H, Q, K, size, c == 0 || coin(rng, 0.5) ? B : 1, c == 0 || coin(rng, 0.5) ? H : 1);
    REQUIRE(grid.ok());
    auto summary = TileSummary::for_grid(*grid);
    REQUIRE(summary.ok());
    const double p_partial = static_cast<double>(uniform(rng, 0, 10)) / 10, p_full = static_cast<double>(uniform(rng, 0, 10)) / 10;
    for (TileState& st : summary->states)
      st = coin(rng, p_partial) ? TileState::partial : coin(rng, p_full) ? TileState::full : TileState::empty;
    auto want = block_mask_tensors(*summary);
    REQUIRE(want.ok());
    FieldArrays arrays;
    const bool every = c % 2 == 0;  // else a random subset (a null array is skipped)
    bool any = false;
    for (std::size_t i = 0; i < std::size(kBlockMaskFields); ++i) {
      if (!every && coin(rng, 0.5) && (any || i + 1 < std::size(kBlockMaskFields))) continue;
      arrays.add(i, want->values(kBlockMaskFields[i]).size());
      any = true;
    }
    const std::optional<BlockMaskField> differs = write_given_states(*summary, arrays, *want);
    REQUIRE_MESSAGE(!differs, to_string(*differs) << " differs, grid " << B << "x" << H << "x" << Q << "x" << K
                                                  << " tiles " << text(size));
  }
  MESSAGE("write_block_mask == block_mask_tensors on " << n << " grids");
}

TEST_CASE("device tiles: write_block_mask at the writer's chunk boundaries (lines of 255 to 1025 tiles)") {
  // The writer takes one tile a thread up to 256 tiles a line, two up to 512, four past
  // that, round after round past 1024: lines of every length either side of each step,
  // as q tiles and as k tiles, tiles of 1 x 1 keys and every mix of states.
  Rng rng(test_seed(1409));
  const std::int64_t lengths[] = {255, 256, 257, 511, 512, 513, 1023, 1024, 1025};
  int grids = 0;
  for (std::size_t i = 0; i < std::size(lengths); ++i)
    for (const std::int64_t nk : {lengths[i], lengths[(i + 4) % std::size(lengths)]}) {  // square, and not
      const std::int64_t nq = lengths[i];
      ++grids;
      auto grid = make_tile_grid(1, 1, nq, nk, TileSize{1, 1});
      REQUIRE(grid.ok());
      auto summary = TileSummary::for_grid(*grid);
      REQUIRE(summary.ok());
      for (TileState& st : summary->states)
        st = static_cast<TileState>(static_cast<std::uint8_t>(uniform(rng, 0, 2)));
      auto want = block_mask_tensors(*summary);
      REQUIRE(want.ok());
      FieldArrays arrays;
      for (std::size_t f = 0; f < std::size(kBlockMaskFields); ++f) arrays.add(f, want->values(kBlockMaskFields[f]).size());
      const std::optional<BlockMaskField> differs = write_given_states(*summary, arrays, *want);
      REQUIRE_MESSAGE(!differs, to_string(*differs) << " differs, " << nq << " q tiles x " << nk << " k tiles");
    }
  MESSAGE("write_block_mask == block_mask_tensors on " << grids << " grids at the chunk boundaries");
}

TEST_CASE("device tiles: write_block_mask_from_ranges of random structures equals block_mask_tensors of their tiles") {
  Rng rng(test_seed(1408));
  const int n = suite_cases(400);
  int written = 0;
  for (int c = 0; c < n; ++c) {
    // Lengths from a few keys to lines longer than a round of the writer's block (at
    // tiles of 8: 3000 / 8 = 375 tiles; a round is 1024), ragged and whole tiles.
    const std::int64_t B = uniform(rng, 1, 3), Q = uniform(rng, 1, c % 5 == 0 ? 9000 : 3000);
    const std::int64_t K = coin(rng, 0.4) ? Q : uniform(rng, 1, c % 7 == 0 ? 9000 : 3000);
    const MaskStructure s = random_structure(rng, B, Q, K);
    if (!s.validate().ok()) continue;
    const TileSize size{uniform(rng, 1, 4) * (c % 3 == 0 ? 8 : 32), uniform(rng, 1, 4) * (c % 4 == 0 ? 8 : 32)};
    auto ranges = structure_tile_ranges(s, size);
    REQUIRE_MESSAGE(ranges.ok(), ranges.status().to_string());
    auto tiles = tiles_from_structure(s, size);
    REQUIRE(tiles.ok());
    auto want = block_mask_tensors(*tiles);
    REQUIRE(want.ok());
    const TileGrid& g = ranges->grid;
    const std::size_t range_bytes = ranges->rows.size() * sizeof(TileRowRanges);
    DeviceBuffer d_ranges(range_bytes);
    REQUIRE_CUDA(cudaMemcpy(d_ranges.get(), ranges->rows.data(), range_bytes, cudaMemcpyHostToDevice));
    FieldArrays arrays;
    for (std::size_t i = 0; i < std::size(kBlockMaskFields); ++i) arrays.add(i, want->values(kBlockMaskFields[i]).size());
    const Status st = gpu::write_block_mask_from_ranges(g, d_ranges.get<TileRowRanges>(), arrays.out);
    REQUIRE_MESSAGE(st.ok(), st.to_string());
    REQUIRE_CUDA(cudaDeviceSynchronize());
    const std::optional<BlockMaskField> differs = arrays.first_difference(*want);
    REQUIRE_MESSAGE(!differs, to_string(*differs) << " differs: " << describe(s) << " [" << B << "," << Q << "," << K
                                                  << "] tiles " << text(size));
    ++written;
  }
  CHECK(written > n / 2);
  // Bad input, before any CUDA call.
  const MaskStructure causal = make_structure(StructureKind::causal, 1, 64, 64);
  auto ranges = structure_tile_ranges(causal, TileSize{16, 16});
  REQUIRE(ranges.ok());
  BlockMaskArrays one;
  one.kv_num_blocks = reinterpret_cast<std::int32_t*>(std::uintptr_t{0x1000});
  CHECK(gpu::write_block_mask_from_ranges(ranges->grid, nullptr, one).message() == "d_ranges is null");
  CHECK(gpu::write_block_mask_from_ranges(ranges->grid, reinterpret_cast<const TileRowRanges*>(std::uintptr_t{0x1004}),
                                          one)
            .code() == ErrorCode::misaligned_pointer);
  CHECK(gpu::write_block_mask_from_ranges(ranges->grid, reinterpret_cast<const TileRowRanges*>(std::uintptr_t{0x1000}),
                                          BlockMaskArrays{})
            .message() == "no BlockMask array: every d_block_mask pointer is null");
  MESSAGE("write_block_mask_from_ranges == block_mask_tensors on " << written << " structures");
}

TEST_CASE("device tiles: NaN in a device mask names the row, in a host mask the element, the two-phase spans flag it") {
  std::vector<float> m(4 * 300, 0.0f);
  m[2 * 300 + 7] = std::numeric_limits<float>::quiet_NaN();
  const std::int64_t shape[] = {4, 300};
  auto v = MaskView::contiguous(m.data(), ElementType::float32, shape);
  REQUIRE(v.ok());
  auto from_host = gpu::scan_host_mask_with_tiles(*v, TileSize{2, 128});
  REQUIRE_FALSE(from_host.ok());
  CHECK(from_host.status().code() == ErrorCode::invalid_value);
  CHECK(from_host.status().message() == scan_with_tiles(*v, TileSize{2, 128}).status().message());
  DeviceBuffer buffer(m.size() * sizeof(float));
  const MaskView on_device = to_device(*v, buffer);
  auto from_device = gpu::scan_with_tiles(on_device, TileSize{2, 128});
  REQUIRE_FALSE(from_device.ok());
  CHECK(from_device.status().code() == ErrorCode::invalid_value);
  CHECK(from_device.status().message().find("mask row [0, 0, 2]") != std::string::npos);
  std::size_t temp_bytes = 0;
  REQUIRE(gpu::scan_spans_tiles(nullptr, temp_bytes, on_device, TileSize{2, 128}, nullptr, BlockMaskArrays{}).ok());
  DeviceBuffer temp(temp_bytes), rows(4 * sizeof(RowSpan)), states(2 * 3);
  REQUIRE(gpu::scan_spans_tiles(temp.get(), temp_bytes, on_device, TileSize{2, 128}, rows.get<RowSpan>(),
                                BlockMaskArrays{}, states.get<TileState>())
              .ok());
  std::vector<RowSpan> spans(4);
  REQUIRE_CUDA(cudaMemcpy(spans.data(), rows.get(), 4 * sizeof(RowSpan), cudaMemcpyDeviceToHost));
  for (int r = 0; r < 4; ++r) CHECK(static_cast<bool>(spans[static_cast<std::size_t>(r)].flags & kRowInvalid) == (r == 2));
}

TEST_CASE("device tiles: a CUDA error pending from the caller's own work is neither cleared nor taken for the tile scan's" *
          kApiErrorOnPurpose) {
  std::vector<std::uint8_t> m(200 * 300);
  for (std::size_t i = 0; i < m.size(); ++i) m[i] = i % 300 <= i / 300;
  const std::int64_t shape[] = {200, 300};
  auto v = MaskView::contiguous(m.data(), ElementType::boolean, shape);
  REQUIRE(v.ok());
  DeviceBuffer buffer(m.size());
  const MaskView on_device = to_device(*v, buffer);
  leave_allocation_error_pending();
  auto device = gpu::scan_with_tiles(on_device, TileSize{64, 64});
  auto from_host = gpu::scan_host_mask_with_tiles(*v, TileSize{64, 64}, 5);
  const cudaError_t still = cudaGetLastError();
  CHECK_MESSAGE(device.ok(), device.status().to_string());
  CHECK_MESSAGE(from_host.ok(), from_host.status().to_string());
  CHECK(still == cudaErrorMemoryAllocation);
  if (device.ok()) require_same_as_host(*v, TileSize{64, 64}, *device);
}

}  // TEST_SUITE
