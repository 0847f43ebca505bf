// The device scanner's entry points (masklens/cuda/scan.hpp) from a translation unit
// the host compiler builds, in every build: without CUDA each says so; with CUDA its
// arguments are checked before any CUDA call, a missing device is an error naming the
// call that found it, and on a GPU the result equals the host scanner's.
// MASKLENS_TEST_CUDA_BUILT (from tests/meson.build) says which build this is, so each
// case below runs where it applies and none passes by returning early.
#include <doctest/doctest.h>

#include <masklens/cuda/scan.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "support/mask_gen.hpp"

using namespace masklens;
using namespace masklens::testing;

namespace {

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

// A [2, 3, 5, 37] bool causal mask with a padded batch, on the host.
struct SmallMask {
  std::vector<std::uint8_t> bytes = std::vector<std::uint8_t>(2 * 3 * 5 * 37);
  MaskView view;
  SmallMask() {
    for (std::int64_t b = 0; b < 2; ++b)
      for (std::int64_t h = 0; h < 3; ++h)
        for (std::int64_t q = 0; q < 5; ++q)
          for (std::int64_t k = 0; k < 37; ++k)
            bytes[static_cast<std::size_t>(((b * 3 + h) * 5 + q) * 37 + k)] = k <= q + 32 && k >= 4 * b;
    const std::int64_t shape[] = {2, 3, 5, 37};
    view = *MaskView::contiguous(bytes.data(), ElementType::boolean, shape);
  }
};

}  // namespace

TEST_SUITE("host") {

TEST_CASE("gpu API: the size query answers 1 byte in every build, with no device") {
  SmallMask m;
  std::size_t bytes = 0;
  const Status st = gpu::scan_spans(nullptr, bytes, m.view, nullptr);
  CHECK(st.ok());
  CHECK(bytes == 1);
  CHECK(gpu::span_rows(m.view) == 2 * 3 * 5);
  auto broadcast = MaskView::contiguous(m.bytes.data(), ElementType::boolean, std::vector<std::int64_t>{5, 37});
  REQUIRE(broadcast.ok());
  auto wide = broadcast->broadcast_to(4, 8);
  REQUIRE(wide.ok());
  CHECK(gpu::span_rows(*wide) == 5);  // stride-0 batch and heads are scanned once
}

TEST_CASE("gpu API: scan_to_host's size query holds the device spans and the scan's storage, in every build") {
  SmallMask m;
  std::size_t bytes = 0;
  REQUIRE(gpu::scan_to_host(nullptr, bytes, m.view, nullptr).ok());
  // 30 RowSpans (960 bytes) rounded up to 256, then scan_spans()'s 1 byte.
  CHECK(bytes == 1024 + 1);
  CHECK(gpu::detail::device_span_bytes(m.view) == 1024);
  auto broadcast = MaskView::contiguous(m.bytes.data(), ElementType::boolean, std::vector<std::int64_t>{5, 37});
  REQUIRE(broadcast.ok());
  auto wide = broadcast->broadcast_to(4, 8);
  REQUIRE(wide.ok());
  REQUIRE(gpu::scan_to_host(nullptr, bytes, *wide, nullptr).ok());
  CHECK(bytes == 256 + 1);  // 5 distinct rows
}

TEST_CASE("gpu API: the library was built as this build configured it") {
  CHECK(gpu::built_with_cuda() == static_cast<bool>(MASKLENS_TEST_CUDA_BUILT));
}

#if !MASKLENS_TEST_CUDA_BUILT

TEST_CASE("gpu API: built without CUDA, every call says so") {
  SmallMask m;
  const std::string why = "masklens was built without CUDA";
  auto count = gpu::device_count();
  REQUIRE_FALSE(count.ok());
  CHECK(count.status().code() == ErrorCode::device_error);
  CHECK(starts_with(count.status().message(), why));
  auto host = gpu::scan_host_mask(m.view);
  REQUIRE_FALSE(host.ok());
  CHECK(host.status().code() == ErrorCode::device_error);
  CHECK(starts_with(host.status().message(), why));
  auto device = gpu::scan(m.view);
  REQUIRE_FALSE(device.ok());
  CHECK(starts_with(device.status().message(), why));
  auto structure = gpu::inspect(m.view);
  REQUIRE_FALSE(structure.ok());
  CHECK(starts_with(structure.status().message(), why));
  std::size_t bytes = 1;
  std::uint8_t temp = 0;
  std::vector<RowSpan> rows(30);
  const Status st = gpu::scan_spans(&temp, bytes, m.view, rows.data());
  CHECK(st.code() == ErrorCode::device_error);
  CHECK(starts_with(st.message(), why));
  std::vector<RowSpan> storage(64);
  std::size_t step_bytes = storage.size() * sizeof(RowSpan);
  const Status step = gpu::scan_to_host(storage.data(), step_bytes, m.view, rows.data());
  CHECK(step.code() == ErrorCode::device_error);
  CHECK(starts_with(step.message(), why));
}

#else

TEST_CASE("gpu API: arguments are checked before any CUDA call") {
  SmallMask m;
  std::uint8_t temp = 0;
  std::size_t bytes = 1;
  // Not dereferenced: every one of these is refused on the host.
  Status st = gpu::scan_spans(&temp, bytes, m.view, nullptr);
  CHECK(st.code() == ErrorCode::invalid_argument);
  CHECK(st.message() == "d_rows is null");
  st = gpu::scan_spans(&temp, bytes, m.view, reinterpret_cast<RowSpan*>(std::uintptr_t{0x1004}));
  CHECK(st.code() == ErrorCode::misaligned_pointer);
  st = gpu::scan_spans(&temp, bytes, MaskView{}, reinterpret_cast<RowSpan*>(std::uintptr_t{0x1000}));
  CHECK(st.code() == ErrorCode::invalid_argument);
  CHECK(st.message() == "view is empty (data is null)");
  std::size_t zero = 0;
  st = gpu::scan_spans(&temp, zero, m.view, reinterpret_cast<RowSpan*>(std::uintptr_t{0x1000}));
  CHECK(st.code() == ErrorCode::invalid_argument);
  auto empty = gpu::scan(MaskView{});
  REQUIRE_FALSE(empty.ok());
  CHECK(empty.status().code() == ErrorCode::invalid_argument);
  for (const std::int64_t offset : {std::int64_t{-1}, std::int64_t{256}}) {
    auto off = gpu::scan_host_mask(m.view, offset);
    REQUIRE_FALSE(off.ok());
    CHECK(off.status().code() == ErrorCode::misaligned_pointer);
    CHECK(off.status().message().find("[0, 256)") != std::string::npos);
  }
  // scan_to_host: the storage's size and alignment and the host rows, before any CUDA call.
  std::size_t step_bytes = 0;
  REQUIRE(gpu::scan_to_host(nullptr, step_bytes, m.view, nullptr).ok());
  std::vector<RowSpan> host_rows(30);
  auto* fake_device = reinterpret_cast<void*>(std::uintptr_t{0x10000});
  std::size_t short_bytes = step_bytes - 1;
  st = gpu::scan_to_host(fake_device, short_bytes, m.view, host_rows.data());
  CHECK(st.code() == ErrorCode::invalid_argument);
  CHECK(st.message() == "temp_storage_bytes is 1024; this view needs 1025 (what the size query set)");
  st = gpu::scan_to_host(reinterpret_cast<void*>(std::uintptr_t{0x10004}), step_bytes, m.view, host_rows.data());
  CHECK(st.code() == ErrorCode::misaligned_pointer);
  st = gpu::scan_to_host(fake_device, step_bytes, m.view, nullptr);
  CHECK(st.code() == ErrorCode::invalid_argument);
  CHECK(st.message() == "h_rows is null");
  st = gpu::scan_to_host(fake_device, step_bytes, MaskView{}, host_rows.data());
  CHECK(st.code() == ErrorCode::invalid_argument);
  CHECK(st.message() == "view is empty (data is null)");
  std::vector<std::uint16_t> half(4 * 4, 0);
  const std::int64_t shape[] = {4, 4};
  auto fp16 = MaskView::contiguous(half.data(), ElementType::float16, shape);
  REQUIRE(fp16.ok());
  auto odd = gpu::scan_host_mask(*fp16, 3);
  REQUIRE_FALSE(odd.ok());
  CHECK(odd.status().code() == ErrorCode::misaligned_pointer);
}

TEST_CASE("gpu API: without a usable device, the error names the CUDA call; with one, device == host") {
  SmallMask m;
  auto count = gpu::device_count();
  auto scanned = gpu::scan_host_mask(m.view);
  if (!count.ok()) {
    INFO(count.status().to_string());
    CHECK(count.status().code() == ErrorCode::device_error);
    CHECK(starts_with(count.status().message(), "cudaGetDeviceCount: "));
    REQUIRE_FALSE(scanned.ok());
    CHECK(scanned.status().code() == ErrorCode::device_error);
    CHECK(starts_with(scanned.status().message(), "cudaMallocAsync(mask and temp storage): "));
    return;
  }
  CHECK(*count >= 1);
  REQUIRE_MESSAGE(scanned.ok(), scanned.status().to_string());
  auto host = scan(m.view);
  REQUIRE(host.ok());
  REQUIRE(scanned->rows.size() == host->rows.size());
  for (std::size_t r = 0; r < host->rows.size(); ++r) {
    CHECK(scanned->rows[r].same_keys(host->rows[r]));
    CHECK(scanned->rows[r].flags == host->rows[r].flags);
  }
}

#endif  // MASKLENS_TEST_CUDA_BUILT

}  // TEST_SUITE
