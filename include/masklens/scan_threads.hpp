// The host scanner with its rows split over threads: scan() and inspect() of scan.hpp
// and inspect.hpp, taking ScanOptions. A header of its own because <thread> (in C++20
// with <stop_token> and <semaphore>) costs a tenth of a second of parse in every file
// that includes it (bench/HISTORY.md), and a framework's call site scans on the device
// or on one thread; the umbrella masklens.hpp includes it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <system_error>
#include <thread>
#include <vector>

#include "classify.hpp"
#include "inspect.hpp"
#include "mask_view.hpp"
#include "scan.hpp"
#include "span_table.hpp"
#include "status.hpp"

namespace masklens {

struct ScanOptions {
  // Host threads to split rows over; 0 = std::thread::hardware_concurrency().
  int threads = 1;
};

// The mask bytes from which a scan whose caller names no thread count takes every
// hardware thread; a smaller mask is scanned on the calling thread. Threads pay off only
// where the scan outlasts starting and joining them, and one thread reads about 6 GB/s
// (bench/HISTORY.md, 2026-12-02), so 8 MiB is about 1.3 ms of scan. `bench/host_scan
// --threads-sweep` measures where every thread starts to beat one: between 16 and 32 MiB
// on a 2-vCPU VM, so 8 MiB sits just below the crossing there (bench/README.md); a
// many-core machine has not been swept.
inline constexpr std::int64_t kThreadedScanBytes = std::int64_t{8} << 20;

// ScanOptions for scanning `view` on `threads` threads, where 0 (or less) chooses: one
// thread under kThreadedScanBytes of distinct mask (a broadcast dim is read once), one
// per hardware thread from there. The Python package's scans choose so (threads=0).
inline ScanOptions scan_options_for(const MaskView& view, int threads = 0) noexcept {
  if (threads > 0) return ScanOptions{threads};
  const double bytes = static_cast<double>(view.q_len()) * static_cast<double>(view.k_len()) *
                       (view.stride(kBatch) ? static_cast<double>(view.batch()) : 1.0) *
                       (view.stride(kHeads) ? static_cast<double>(view.heads()) : 1.0) *
                       static_cast<double>(element_size(view.dtype()));
  return ScanOptions{bytes < static_cast<double>(kThreadedScanBytes) ? 1 : 0};
}

namespace detail {

// The threads to split `units` of work over: options.threads (0 = one per hardware
// thread), no more than there are units, and at least one.
inline unsigned split_threads(ScanOptions options, std::int64_t units) noexcept {
  const unsigned threads = options.threads > 0 ? static_cast<unsigned>(options.threads)
                                               : std::max(1u, std::thread::hardware_concurrency());
  return std::max(1u, static_cast<unsigned>(std::min<std::int64_t>(threads, units)));
}

// Runs work(begin, end, share) over [0, units) cut into `threads` equal shares, each on
// a thread of its own (one thread: here, with no pool), and returns once all are done.
// A share no thread can be had for is done on this thread; a pool that cannot be
// allocated is out_of_memory.
template <class Work>
Status parallel_for_ranges(std::int64_t units, unsigned threads, const Work& work) {
  if (threads <= 1) {
    work(std::int64_t{0}, units, 0u);
    return {};
  }
  return catch_alloc([&]() -> Status {
    std::vector<std::jthread> pool;
    pool.reserve(threads);
    const std::int64_t per = (units + threads - 1) / threads;
    for (unsigned t = 0; t < threads; ++t) {
      const std::int64_t begin = std::min(units, t * per), end = std::min(units, begin + per);
      try {
        pool.emplace_back([&work, begin, end, t] { work(begin, end, t); });
      } catch (const std::system_error&) {
        work(begin, end, t);  // no thread to be had: do the share here
      }
    }
    return {};
  });
}

}  // namespace detail

// scan(view) with the rows split over options.threads threads: the same table.
inline Result<SpanTable> scan(const MaskView& view, ScanOptions options) {
  Result<SpanTable> made = detail::table_for_scan(view);
  if (!made) return made;
  SpanTable& table = made.value();
  const std::int64_t total_rows = table.distinct_slices() * table.q_len;
  if (Status spawn = detail::parallel_for_ranges(
          total_rows, detail::split_threads(options, total_rows),
          [&view, &table](std::int64_t begin, std::int64_t end, unsigned) { detail::scan_rows(view, table, begin, end); });
      !spawn.ok())
    return spawn;
  if (Status invalid = detail::check_scanned_rows(view, table); !invalid.ok()) return invalid;
  return made;
}

// inspect(view) with the scan's rows split over options.threads threads.
inline Result<MaskStructure> inspect(const MaskView& view, ScanOptions options) {
  Result<SpanTable> spans = scan(view, options);
  if (!spans) return spans.status();
  return classify(*spans);
}

}  // namespace masklens
