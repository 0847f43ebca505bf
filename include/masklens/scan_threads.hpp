// The host scanner with its rows split over threads: scan() and inspect() of scan.hpp
// and inspect.hpp, taking ScanOptions. A header of its own because <thread> (in C++20
// with <stop_token> and <semaphore>) costs a tenth of a second of parse in every file
// that includes it (bench/README.md), and a framework's call site scans on the device
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

// scan(view) with the rows split over options.threads threads: the same table.
inline Result<SpanTable> scan(const MaskView& view, ScanOptions options) {
  Result<SpanTable> made = detail::table_for_scan(view);
  if (!made) return made;
  SpanTable& table = made.value();
  const std::int64_t total_rows = table.distinct_slices() * table.q_len;

  unsigned threads = options.threads > 0 ? static_cast<unsigned>(options.threads)
                                         : std::max(1u, std::thread::hardware_concurrency());
  threads = static_cast<unsigned>(std::min<std::int64_t>(threads, total_rows));
  if (threads <= 1) {
    detail::scan_rows(view, table, 0, total_rows);
  } else {
    Status spawn = catch_alloc([&]() -> Status {
      std::vector<std::jthread> pool;
      pool.reserve(threads);
      const std::int64_t per = (total_rows + threads - 1) / threads;
      for (unsigned t = 0; t < threads; ++t) {
        const std::int64_t begin = std::min(total_rows, t * per), end = std::min(total_rows, begin + per);
        try {
          pool.emplace_back([&view, &table, begin, end] { detail::scan_rows(view, table, begin, end); });
        } catch (const std::system_error&) {
          detail::scan_rows(view, table, begin, end);  // no thread to be had: do the share here
        }
      }
      return {};
    });
    if (!spawn.ok()) return spawn;
  }
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
