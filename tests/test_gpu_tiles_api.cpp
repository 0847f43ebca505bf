// Tile summaries on the device (masklens/cuda/tiles.hpp) from a translation unit the host
// compiler builds, in every build: the size query is host arithmetic and answers alike
// with or without CUDA; without CUDA every call that would run says so; with CUDA the
// arguments are checked before any CUDA call and a missing device is an error naming the
// call that found it. (On a GPU the cuda suite, tests/cuda/test_device_tiles.cpp,
// compares the results with the host's.)
#include <doctest/doctest.h>

#include <masklens/cuda/tiles.hpp>

#include <cstdint>
#include <string>
#include <vector>

using namespace masklens;

namespace {

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

void* fake(std::uintptr_t p) { return reinterpret_cast<void*>(p); }

// A [2, 3, 300, 1000] bool view over 8 bytes: every dimension but the keys broadcast.
struct Mask {
  std::vector<std::uint8_t> bytes = std::vector<std::uint8_t>(1000, 1);
  MaskView view;
  Mask() {
    const std::int64_t shape[] = {2, 3, 300, 1000}, strides[] = {0, 0, 0, 1};
    view = *MaskView::make(bytes.data(), ElementType::boolean, shape, strides);
  }
};

// Every BlockMask array at a fake, aligned device address.
BlockMaskArrays fake_arrays() {
  BlockMaskArrays a;
  a.kv_num_blocks = static_cast<std::int32_t*>(fake(0x100000));
  a.kv_indices = static_cast<std::int32_t*>(fake(0x200000));
  a.full_kv_num_blocks = static_cast<std::int32_t*>(fake(0x300000));
  a.full_kv_indices = static_cast<std::int32_t*>(fake(0x400000));
  a.q_num_blocks = static_cast<std::int32_t*>(fake(0x500000));
  a.q_indices = static_cast<std::int32_t*>(fake(0x600000));
  a.full_q_num_blocks = static_cast<std::int32_t*>(fake(0x700000));
  a.full_q_indices = static_cast<std::int32_t*>(fake(0x800000));
  return a;
}

}  // namespace

TEST_SUITE("host") {

TEST_CASE("gpu tiles API: the size query is one 64-bit count per tile, in every build, with no device") {
  Mask m;
  std::size_t bytes = 0;
  REQUIRE(gpu::scan_spans_tiles(nullptr, bytes, m.view, TileSize{}, nullptr, BlockMaskArrays{}).ok());
  CHECK(bytes == 1 * 1 * 3 * 8 * 8 + 255);  // one stored slice, 3 q tiles x 8 k tiles
  REQUIRE(gpu::scan_spans_tiles(nullptr, bytes, m.view, TileSize{96, 80}, nullptr, BlockMaskArrays{}).ok());
  CHECK(bytes == 4 * 13 * 8 + 255);
  // The size query checks the tile size and the view as the call does.
  CHECK(gpu::scan_spans_tiles(nullptr, bytes, m.view, TileSize{0, 128}, nullptr, BlockMaskArrays{}).message() ==
        "tile size q (block_q) must be in [1, 2^62], got 0");
  CHECK(gpu::scan_spans_tiles(nullptr, bytes, m.view, TileSize{128, -3}, nullptr, BlockMaskArrays{}).message() ==
        "tile size k (block_k) must be in [1, 2^62], got -3");
  CHECK(gpu::scan_spans_tiles(nullptr, bytes, MaskView{}, TileSize{}, nullptr, BlockMaskArrays{}).message() ==
        "view is empty (data is null)");
  // torch's indices are int32: more than 2^31 - 1 tiles a side cannot be written.
  const std::int64_t shape[] = {std::int64_t{1} << 31, 2}, strides[] = {0, 1};
  auto tall = MaskView::make(m.bytes.data(), ElementType::boolean, shape, strides);
  REQUIRE(tall.ok());
  const Status too_many = gpu::scan_spans_tiles(nullptr, bytes, *tall, TileSize{1, 1}, nullptr, BlockMaskArrays{});
  CHECK(too_many.code() == ErrorCode::invalid_argument);
  CHECK(too_many.message().find("int32") != std::string::npos);
}

#if !MASKLENS_TEST_CUDA_BUILT

TEST_CASE("gpu tiles API: built without CUDA, every call that would run says so") {
  Mask m;
  const std::string why = "masklens was built without CUDA";
  std::size_t bytes = 1 << 20;
  const Status st = gpu::scan_spans_tiles(fake(0x10000), bytes, m.view, TileSize{}, static_cast<RowSpan*>(fake(0x20000)),
                                          fake_arrays());
  CHECK(st.code() == ErrorCode::device_error);
  CHECK(starts_with(st.message(), why));
  auto scanned = gpu::scan_with_tiles(m.view);
  REQUIRE_FALSE(scanned.ok());
  CHECK(starts_with(scanned.status().message(), why));
  auto from_host = gpu::scan_host_mask_with_tiles(m.view, TileSize{64, 128}, 1);
  REQUIRE_FALSE(from_host.ok());
  CHECK(starts_with(from_host.status().message(), why));
  const TileGrid g = *make_tile_grid(2, 3, 300, 1000, TileSize{});
  const Status written = gpu::write_block_mask(g, static_cast<TileState*>(fake(0x30000)), fake_arrays());
  CHECK(written.code() == ErrorCode::device_error);
  CHECK(starts_with(written.message(), why));
}

#else

TEST_CASE("gpu tiles API: arguments are checked before any CUDA call") {
  Mask m;
  std::size_t needed = 0;
  REQUIRE(gpu::scan_spans_tiles(nullptr, needed, m.view, TileSize{}, nullptr, BlockMaskArrays{}).ok());
  std::size_t bytes = needed;
  auto* rows = static_cast<RowSpan*>(fake(0x20000));
  const BlockMaskArrays out = fake_arrays();
  const auto call = [&](TileSize size, RowSpan* r, const BlockMaskArrays& o, TileState* states = nullptr) {
    return gpu::scan_spans_tiles(fake(0x10000), bytes, m.view, size, r, o, states);
  };
  CHECK(call(TileSize{0, 0}, rows, out).message() == "tile size q (block_q) must be in [1, 2^62], got 0");
  CHECK(call(TileSize{128, 0}, rows, out).code() == ErrorCode::invalid_argument);
  CHECK(call(TileSize{}, nullptr, out).message() == "d_rows is null");
  CHECK(call(TileSize{}, static_cast<RowSpan*>(fake(0x20004)), out).code() == ErrorCode::misaligned_pointer);
  BlockMaskArrays odd = out;
  odd.kv_indices = static_cast<std::int32_t*>(fake(0x200002));
  const Status misaligned = call(TileSize{}, rows, odd);
  CHECK(misaligned.code() == ErrorCode::misaligned_pointer);
  CHECK(misaligned.message() == "d_block_mask.kv_indices is not aligned to int32 (4 bytes)");
  odd = out;
  odd.full_q_num_blocks = static_cast<std::int32_t*>(fake(0x700001));
  CHECK(call(TileSize{}, rows, odd).message() == "d_block_mask.full_q_num_blocks is not aligned to int32 (4 bytes)");
  const Status nothing = call(TileSize{}, rows, BlockMaskArrays{});
  CHECK(nothing.code() == ErrorCode::invalid_argument);
  CHECK(starts_with(nothing.message(), "no tile output"));
  bytes = needed - 1;
  CHECK(call(TileSize{}, rows, out).message() ==
        "temp_storage_bytes is " + std::to_string(needed - 1) + "; pass what the size query set (" +
            std::to_string(needed) + ")");
  bytes = needed;
  CHECK(gpu::scan_spans_tiles(fake(0x10000), bytes, MaskView{}, TileSize{}, rows, out).message() ==
        "view is empty (data is null)");
  auto empty = gpu::scan_with_tiles(MaskView{});
  REQUIRE_FALSE(empty.ok());
  CHECK(empty.status().message() == "view is empty (data is null)");
  auto bad_offset = gpu::scan_host_mask_with_tiles(m.view, TileSize{}, 3 * 1 + 256);
  REQUIRE_FALSE(bad_offset.ok());
  CHECK(bad_offset.status().code() == ErrorCode::misaligned_pointer);
  auto bad_size = gpu::scan_host_mask_with_tiles(m.view, TileSize{-1, 128});
  REQUIRE_FALSE(bad_size.ok());
  CHECK(bad_size.status().message() == "tile size q (block_q) must be in [1, 2^62], got -1");
}

TEST_CASE("gpu tiles API: write_block_mask checks the grid, the states and the arrays before any CUDA call") {
  const auto* states = static_cast<const TileState*>(fake(0x30000));
  const TileGrid g = *make_tile_grid(2, 3, 300, 1000, TileSize{}, 1, 3);
  TileGrid bad = g;
  bad.block_q = 0;
  CHECK(gpu::write_block_mask(bad, states, fake_arrays()).message() == "tile size q (block_q) must be in [1, 2^62], got 0");
  bad = g;
  bad.distinct_batch = 5;  // neither 1 nor the batch
  CHECK(gpu::write_block_mask(bad, states, fake_arrays()).message() ==
        "tile grid distinct_batch must be 1 or batch (2), got 5");
  bad = g;
  bad.q_len = 0;
  CHECK(gpu::write_block_mask(bad, states, fake_arrays()).code() == ErrorCode::invalid_shape);
  CHECK(gpu::write_block_mask(g, nullptr, fake_arrays()).message() == "d_states is null");
  CHECK(gpu::write_block_mask(g, states, BlockMaskArrays{}).message() ==
        "no BlockMask array: every d_block_mask pointer is null");
  BlockMaskArrays odd = fake_arrays();
  odd.q_indices = static_cast<std::int32_t*>(fake(0x600002));
  const Status misaligned = gpu::write_block_mask(g, states, odd);
  CHECK(misaligned.code() == ErrorCode::misaligned_pointer);
  CHECK(misaligned.message() == "d_block_mask.q_indices is not aligned to int32 (4 bytes)");
}

TEST_CASE("gpu tiles API: without a usable device, the error names the CUDA call") {
  if (gpu::device_count().ok()) return;  // with a device, the cuda suite covers the calls
  Mask m;
  std::size_t bytes = 0;
  REQUIRE(gpu::scan_spans_tiles(nullptr, bytes, m.view, TileSize{}, nullptr, BlockMaskArrays{}).ok());
  const Status st = gpu::scan_spans_tiles(fake(0x10000), bytes, m.view, TileSize{}, static_cast<RowSpan*>(fake(0x20000)),
                                          BlockMaskArrays{}, static_cast<TileState*>(fake(0x30000)));
  CHECK(st.code() == ErrorCode::device_error);
  CHECK(starts_with(st.message(), "cudaLaunchKernelEx(tile counts zeroed): "));
  auto scanned = gpu::scan_host_mask_with_tiles(m.view);
  REQUIRE_FALSE(scanned.ok());
  CHECK(scanned.status().code() == ErrorCode::device_error);
  CHECK(starts_with(scanned.status().message(), "cudaMallocAsync(tile scan): "));
}

#endif  // MASKLENS_TEST_CUDA_BUILT

}  // TEST_SUITE
