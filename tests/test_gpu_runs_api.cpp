// The run reduction's entry points (masklens/cuda/runs.hpp) from a translation unit the
// host compiler builds, in every build: without CUDA each says so; with CUDA the size
// query needs no device, arguments are checked before any CUDA call, and a missing
// device is an error naming the CUDA call that found it. (On a GPU the cuda suite,
// tests/cuda/test_span_runs.cpp, compares the runs with the host's.)
#include <doctest/doctest.h>

#include <masklens/cuda/runs.hpp>

#include <cstdint>
#include <string>
#include <vector>

using namespace masklens;

namespace {

bool begins_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

}  // namespace

TEST_SUITE("host") {

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
