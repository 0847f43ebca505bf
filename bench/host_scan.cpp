// Host scanner throughput on a 16384^2 bool causal mask (256 MiB) and a bf16 additive
// one (512 MiB, masked = finfo(bf16).min as transformers writes it), side by side in the
// same run with a plain sequential read of the same bytes (the ceiling) and, for bf16,
// the element-by-element path. Reports GB/s and ratios; the goal is >= 0.5 of the plain
// read on one core.
//
// --threads-sweep [reps]: where a scan on every hardware thread starts to beat one thread,
// the question kThreadedScanBytes (scan_threads.hpp) answers: bool causal masks of 1 to
// 256 MiB, each scanned on one thread and on every thread in the same run, with the
// ratio and what scan_options_for() picks at that size.
#include <masklens/masklens.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "bench_support.hpp"

namespace {

using masklens::bench::median_seconds;
using masklens::bench::plain_read;

std::vector<std::uint8_t> causal_mask(std::int64_t L) {
  std::vector<std::uint8_t> mask(static_cast<std::size_t>(L * L));
  for (std::int64_t q = 0; q < L; ++q) std::memset(mask.data() + q * L, 1, static_cast<std::size_t>(q + 1));
  return mask;
}

int threads_sweep(int reps) {
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  std::printf("threshold %lld MiB, %u hardware threads\n", static_cast<long long>(masklens::kThreadedScanBytes >> 20),
              cores);
  std::printf("%8s %12s %14s %8s  %s\n", "MiB", "1 thread ms", "all threads ms", "ratio", "scan_options_for");
  for (int mib = 1; mib <= 256; mib *= 2) {
    std::int64_t L = 1;
    while ((L + 1) * (L + 1) <= (std::int64_t{mib} << 20)) ++L;
    const std::vector<std::uint8_t> mask = causal_mask(L);
    const std::int64_t shape[] = {L, L};
    auto view = masklens::MaskView::contiguous(mask.data(), masklens::ElementType::boolean, shape);
    if (!view) return std::fprintf(stderr, "%s\n", view.status().to_string().c_str()), 1;
    // Each thread count's scan checked once, outside the timing: it is the scan that is timed.
    masklens::Result<masklens::SpanTable> spans = masklens::error(masklens::ErrorCode::ok, "");
    const auto scan_on = [&](int threads) {
      const double seconds = median_seconds(reps, [&] { spans = masklens::scan(*view, {threads}); });
      auto verdict = spans ? masklens::classify(*spans) : spans.status();
      return verdict && verdict->kind == masklens::StructureKind::causal ? seconds : -1.0;
    };
    const double one = scan_on(1), all = scan_on(0);
    if (one < 0 || all < 0) return std::fprintf(stderr, "a scan of %lld^2 is not causal\n", static_cast<long long>(L)), 1;
    const int picked = masklens::scan_options_for(*view).threads;
    std::printf("%8.1f %12.3f %14.3f %8.2f  %s\n", static_cast<double>(L * L) / (1 << 20), one * 1e3, all * 1e3,
                one / all, picked == 1 ? "1 thread" : "all threads");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--threads-sweep") == 0) return threads_sweep(argc > 2 ? std::atoi(argv[2]) : 7);
  const std::int64_t L = argc > 1 ? std::atoll(argv[1]) : 16384;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 7;
  const std::vector<std::uint8_t> mask = causal_mask(L);
  const double bytes = static_cast<double>(mask.size());
  const std::int64_t shape[] = {L, L};
  auto view = masklens::MaskView::contiguous(mask.data(), masklens::ElementType::boolean, shape);
  if (!view) return std::fprintf(stderr, "%s\n", view.status().to_string().c_str()), 1;

  volatile std::uint64_t sink = 0;
  const double t_read = median_seconds(reps, [&] { sink = sink + plain_read(mask.data(), mask.size()); });
  masklens::Result<masklens::SpanTable> spans = masklens::error(masklens::ErrorCode::ok, "");
  const double t_scan = median_seconds(reps, [&] { spans = masklens::scan(*view, {1}); });
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const double t_scan_mt = median_seconds(reps, [&] { spans = masklens::scan(*view, {0}); });
  const double t_classify = median_seconds(reps, [&] { (void)masklens::classify(*spans); });
  auto verdict = masklens::classify(*spans);

  std::printf("mask            %lld x %lld bool causal, %.0f MiB\n", static_cast<long long>(L),
              static_cast<long long>(L), bytes / (1 << 20));
  std::printf("plain read      %8.3f ms  %6.2f GB/s  (baseline, 1 core)\n", t_read * 1e3, bytes / t_read / 1e9);
  std::printf("scan, 1 thread  %8.3f ms  %6.2f GB/s  ratio %.2f of plain read\n", t_scan * 1e3,
              bytes / t_scan / 1e9, t_read / t_scan);
  std::printf("scan, %u threads %7.3f ms  %6.2f GB/s  ratio %.2f of the 1-core plain read\n", cores,
              t_scan_mt * 1e3, bytes / t_scan_mt / 1e9, t_read / t_scan_mt);
  std::printf("classify        %8.3f ms  (%lld rows)\n", t_classify * 1e3, static_cast<long long>(L));
  std::printf("verdict         %s\n", verdict ? masklens::describe(*verdict).c_str() : "error");
  if (!verdict || verdict->kind != masklens::StructureKind::causal) return 1;

  // bf16 additive: 0 attends, finfo(bf16).min (0xFF7F) masks.
  std::vector<std::uint16_t> additive(static_cast<std::size_t>(L * L), 0xff7f);
  for (std::int64_t q = 0; q < L; ++q) std::fill_n(additive.begin() + q * L, q + 1, std::uint16_t{0});
  const double add_bytes = static_cast<double>(additive.size()) * 2;
  auto add_view = masklens::MaskView::contiguous(additive.data(), masklens::ElementType::bfloat16, shape);
  if (!add_view) return std::fprintf(stderr, "%s\n", add_view.status().to_string().c_str()), 1;
  const auto* add_bytes_ptr = reinterpret_cast<const std::uint8_t*>(additive.data());
  const double t_add_read = median_seconds(reps, [&] { sink = sink + plain_read(add_bytes_ptr, additive.size() * 2); });
  const double t_add_scan = median_seconds(reps, [&] { spans = masklens::scan(*add_view, {1}); });
  auto add_verdict = masklens::classify(*spans);
  const double t_add_generic = median_seconds(std::max(1, reps / 3), [&] {
    for (std::int64_t q = 0; q < L; ++q)
      sink = sink + masklens::detail::scan_generic_row(add_bytes_ptr + q * L * 2, L, 2,
                                                       masklens::ElementType::bfloat16, add_view->encoding())
                        .count;
  });
  std::printf("bf16 additive   %lld x %lld causal, finfo.min masked, %.0f MiB\n", static_cast<long long>(L),
              static_cast<long long>(L), add_bytes / (1 << 20));
  std::printf("plain read      %8.3f ms  %6.2f GB/s  (baseline, 1 core)\n", t_add_read * 1e3, add_bytes / t_add_read / 1e9);
  std::printf("scan, 1 thread  %8.3f ms  %6.2f GB/s  ratio %.2f of plain read\n", t_add_scan * 1e3,
              add_bytes / t_add_scan / 1e9, t_add_read / t_add_scan);
  std::printf("element by elt  %8.3f ms  %6.2f GB/s  ratio %.2f of plain read (the reference path)\n",
              t_add_generic * 1e3, add_bytes / t_add_generic / 1e9, t_add_read / t_add_generic);
  std::printf("verdict         %s\n", add_verdict ? masklens::describe(*add_verdict).c_str() : "error");
  return add_verdict && add_verdict->kind == masklens::StructureKind::causal ? 0 : 1;
}
