// The run reduction's entry points (masklens/cuda/runs.hpp) from a translation unit the
// host compiler builds, in every build: without CUDA each says so; with CUDA the size
// query needs no device, arguments are checked before any CUDA call, and a missing
// device is an error naming the CUDA call that found it. (On a GPU the cuda suite,
// tests/cuda/test_span_runs.cpp, compares the runs with the host's.)
#include <doctest/doctest.h>

#include <masklens/cuda/runs.hpp>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

using namespace masklens;

namespace {

bool begins_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

}  // namespace

TEST_SUITE("host") {

TEST_CASE("gpu runs block: one layout, parts 256-byte aligned, the head its first bytes") {
  const gpu::RunsBlock b = gpu::runs_block_layout(5000, 1000, 24, 777);
  CHECK(b.room == gpu::kRunRoom);
  CHECK(b.eager == gpu::kEagerRuns);
  CHECK(b.count_at == 0);
  CHECK(b.first_invalid_at == 8);
  CHECK(b.runs_at == 64);
  CHECK(b.head_bytes() == 64 + 256 * sizeof(SpanRun));
  for (std::size_t at : {b.spans_at, b.scan_temp_at, b.reduce_temp_at}) CHECK(at % 256 == 0);
  CHECK(b.spans_at >= b.runs_at + 4096 * sizeof(SpanRun));
  CHECK(b.scan_temp_at >= b.spans_at + 5000 * sizeof(RowSpan));
  CHECK(b.reduce_temp_at >= b.scan_temp_at + 24);
  CHECK(b.bytes == b.reduce_temp_at + 777);
  const gpu::RunsBlock small = gpu::runs_block_layout(7, 7, 0, 0);  // room and head bounded by the rows
  CHECK(small.room == 7);
  CHECK(small.eager == 7);
  CHECK(small.reduce_temp_at > small.scan_temp_at);  // a temporary of 0 bytes still has its own byte
}

TEST_CASE("gpu runs head: the count and the first invalid row, each checked against the block") {
  const gpu::RunsBlock b = gpu::runs_block_layout(16, 8, 1, 1);
  std::vector<std::uint8_t> head(b.head_bytes(), 0);
  const auto write = [&](std::int64_t count, std::int64_t invalid) {
    std::memcpy(head.data() + b.count_at, &count, 8);
    std::memcpy(head.data() + b.first_invalid_at, &invalid, 8);
    return gpu::read_runs_head(b, head.data());
  };
  auto ok = write(3, -1);
  REQUIRE(ok.ok());
  CHECK(ok->count == 3);
  CHECK(ok->first_invalid_row == -1);
  CHECK(write(16, 15)->first_invalid_row == 15);
  CHECK(write(0, -1).status().message() == "the run reduction returned 0 runs for 16 rows");
  CHECK(write(17, -1).status().code() == ErrorCode::device_error);
  CHECK(write(3, 16).status().message() ==
        "the run reduction named row 16 as holding NaN or +inf; the view has 16 rows");
  CHECK(write(3, -2).status().code() == ErrorCode::device_error);
}

#if !MASKLENS_TEST_CUDA_BUILT

TEST_CASE("gpu runs API: built without CUDA, every call says so") {
  std::vector<std::uint8_t> bytes(6 * 6, 1);
  const std::int64_t shape[] = {6, 6};
  auto view = MaskView::contiguous(bytes.data(), ElementType::boolean, shape);
  REQUIRE(view.ok());
  const std::string why = "masklens was built without CUDA";
  std::size_t temp_bytes = 0;
  const Status size = gpu::reduce_runs(nullptr, temp_bytes, nullptr, 6, 6, nullptr, 1, nullptr);
  CHECK(size.code() == ErrorCode::device_error);
  CHECK(begins_with(size.message(), why));
  auto runs = gpu::scan_runs(*view);
  REQUIRE_FALSE(runs.ok());
  CHECK(begins_with(runs.status().message(), why));
  auto verdict = gpu::inspect_runs(*view);
  REQUIRE_FALSE(verdict.ok());
  CHECK(begins_with(verdict.status().message(), why));
  CHECK(begins_with(gpu::runs_block_for(*view).status().message(), why));
  CHECK(begins_with(gpu::runs_block_for(*view, TileSize{2, 2}).status().message(), why));
  const gpu::RunsBlock block = gpu::runs_block_layout(6, 6, 1, 1);
  std::vector<std::uint8_t> head(block.head_bytes());
  CHECK(begins_with(gpu::scan_runs_into(block, bytes.data(), *view, head.data()).message(), why));
  CHECK(begins_with(
      gpu::scan_runs_tiles_into(block, bytes.data(), *view, TileSize{2, 2}, BlockMaskArrays{}, nullptr, head.data())
          .message(),
      why));
  std::vector<SpanRun> rest(6);
  CHECK(begins_with(gpu::copy_rest_runs(block, bytes.data(), 6, nullptr, rest.data()).message(), why));
}

#else

TEST_CASE("gpu runs API: the size query needs no device; arguments are checked before any CUDA call") {
  std::size_t small = 0, large = 0;
  REQUIRE(gpu::reduce_runs(nullptr, small, nullptr, 7, 7, nullptr, 1, nullptr).ok());
  REQUIRE(gpu::reduce_runs(nullptr, large, nullptr, 69632 * 8, 69632, nullptr, 1, nullptr).ok());
  CHECK(small > 0);
  CHECK(large > small);  // tile arrays grow with the rows
  std::size_t bytes = large;
  const auto fake = [](std::uintptr_t p) { return reinterpret_cast<void*>(p); };
  auto* rows = static_cast<const RowSpan*>(fake(0x10000));
  auto* runs = static_cast<SpanRun*>(fake(0x20000));
  auto* count = static_cast<std::int64_t*>(fake(0x30000));
  CHECK(gpu::reduce_runs(fake(0x40000), bytes, rows, 10, 4, runs, 8, count).message() ==
        "rows (10) must be a positive multiple of q_len (4)");
  CHECK(gpu::reduce_runs(fake(0x40000), bytes, rows, 0, 4, runs, 8, count).code() == ErrorCode::invalid_argument);
  CHECK(gpu::reduce_runs(fake(0x40000), bytes, rows, std::int64_t{1} << 31, 1, runs, 8, count).message() ==
        "rows (2147483648) must be at most 2^31 - 1");
  std::size_t none = 0;
  CHECK(begins_with(gpu::reduce_runs(fake(0x40000), none, rows, 8, 4, runs, 8, count).message(), "temp_storage_bytes is 0"));
  CHECK(gpu::reduce_runs(fake(0x40000), bytes, rows, 8, 4, runs, 0, count).message() == "max_runs must be >= 1, got 0");
  CHECK(gpu::reduce_runs(fake(0x40000), bytes, nullptr, 8, 4, runs, 8, count).message() == "d_rows is null");
  CHECK(gpu::reduce_runs(fake(0x40000), bytes, rows, 8, 4, nullptr, 8, count).message() == "d_runs is null");
  CHECK(gpu::reduce_runs(fake(0x40000), bytes, rows, 8, 4, runs, 8, nullptr).message() == "d_run_count is null");
  CHECK(gpu::reduce_runs(fake(0x40000), bytes, static_cast<const RowSpan*>(fake(0x10004)), 8, 4, runs, 8, count).code() ==
        ErrorCode::misaligned_pointer);
  CHECK(gpu::reduce_runs(fake(0x40000), bytes, rows, 8, 4, static_cast<SpanRun*>(fake(0x20004)), 8, count).code() ==
        ErrorCode::misaligned_pointer);
  CHECK(gpu::reduce_runs(fake(0x40000), bytes, rows, 8, 4, runs, 8, count,
                         static_cast<std::int64_t*>(fake(0x30004)))
            .message() == "d_first_invalid_row is not aligned to 8 bytes");
  auto empty = gpu::scan_runs(MaskView{});
  REQUIRE_FALSE(empty.ok());
  CHECK(empty.status().message() == "view is empty (data is null)");
}

TEST_CASE("gpu runs API: the composite scan's block is the library's; its arguments are checked before any CUDA call") {
  std::vector<std::uint8_t> bytes(3 * 40 * 24, 1);
  const std::int64_t shape[] = {3, 40, 24};
  auto view = MaskView::contiguous(bytes.data(), ElementType::boolean, shape);
  REQUIRE(view.ok());
  auto plain = gpu::runs_block_for(*view);
  auto tiled = gpu::runs_block_for(*view, TileSize{16, 8});
  REQUIRE(plain.ok());
  REQUIRE(tiled.ok());
  std::size_t scan_temp = 0, reduce_temp = 0;
  REQUIRE(gpu::scan_spans(nullptr, scan_temp, *view, nullptr).ok());
  REQUIRE(gpu::reduce_runs(nullptr, reduce_temp, nullptr, 120, 40, nullptr, 1, nullptr).ok());
  CHECK(*plain == gpu::runs_block_layout(120, 40, scan_temp, reduce_temp));  // the size queries, laid out
  CHECK(tiled->scan_temp_bytes > plain->scan_temp_bytes);                    // a count per tile too
  CHECK(tiled->spans_at == plain->spans_at);
  CHECK(gpu::runs_block_for(*view, TileSize{0, 8}).status().code() == ErrorCode::invalid_argument);
  CHECK(gpu::runs_block_for(MaskView{}).status().message() == "view is empty (data is null)");

  const auto fake = [](std::uintptr_t p) { return reinterpret_cast<void*>(p); };
  std::vector<std::uint8_t> head(plain->head_bytes());
  const Status other = gpu::scan_runs_into(*tiled, fake(1 << 20), *view, head.data());
  CHECK(other.code() == ErrorCode::invalid_argument);
  CHECK(begins_with(other.message(), "the block (" + std::to_string(tiled->bytes) +
                                         " bytes) was laid out for another view; this one's is " +
                                         std::to_string(plain->bytes) + " bytes"));
  CHECK(begins_with(gpu::scan_runs_tiles_into(*plain, fake(1 << 20), *view, TileSize{16, 8}, BlockMaskArrays{},
                                              nullptr, head.data())
                        .message(),
                    "the block ("));
  CHECK(gpu::scan_runs_into(*plain, nullptr, *view, head.data()).message() == "d_block is null");
  CHECK(gpu::scan_runs_into(*plain, fake((1 << 20) + 64), *view, head.data()).message() ==
        "d_block is not 256-byte aligned");
  CHECK(gpu::scan_runs_into(*plain, fake(1 << 20), *view, nullptr).message() == "h_head is null");

  std::vector<SpanRun> rest(120);
  auto* more = static_cast<SpanRun*>(fake(1 << 21));
  CHECK(gpu::copy_rest_runs(*plain, fake(1 << 20), 120, more, rest.data()).message() ==
        "copy_rest_runs is for counts in (120, 120], got 120");
  const gpu::RunsBlock big = gpu::runs_block_layout(5000, 1000, 1, 1);
  CHECK(gpu::copy_rest_runs(big, fake(1 << 20), 4097, nullptr, rest.data()).message() ==
        "4097 runs exceed the block's room (4096): pass d_more with room for them all");
  CHECK(gpu::copy_rest_runs(big, nullptr, 300, nullptr, rest.data()).message() == "d_block is null");
  CHECK(gpu::copy_rest_runs(big, fake(1 << 20), 300, nullptr, nullptr).message() == "h_rest is null");
  CHECK(gpu::copy_rest_runs(big, fake(1 << 20), 5001, more, rest.data()).code() == ErrorCode::invalid_argument);
}

TEST_CASE("gpu runs API: without a usable device, the error names the CUDA call") {
  if (gpu::device_count().ok()) return;  // with a device, the cuda suite covers the calls
  std::vector<std::uint8_t> bytes(6 * 6, 1);
  const std::int64_t shape[] = {6, 6};
  auto view = MaskView::contiguous(bytes.data(), ElementType::boolean, shape);
  REQUIRE(view.ok());
  auto runs = gpu::scan_runs(*view);
  REQUIRE_FALSE(runs.ok());
  CHECK(runs.status().code() == ErrorCode::device_error);
  CHECK(begins_with(runs.status().message(), "cudaMallocAsync(runs): "));
}

#endif  // MASKLENS_TEST_CUDA_BUILT

}  // TEST_SUITE
