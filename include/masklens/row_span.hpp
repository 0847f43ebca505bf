// RowSpan: the sufficient statistic of one query row — first and last attending key
// and how many keys attend. A row is an interval iff count == last - first + 1, and
// every structure masklens names is an interval per row. Spans form a monoid under
// merge(), so a row may be scanned in key tiles, by several threads or devices, and
// the pieces merged in any order.
#pragma once

#include <cstdint>

#include "config.hpp"

namespace masklens {

// Row flags, merged with OR.
enum RowFlag : std::uint32_t {
  kRowBias = 1u << 0,          // an attending element carries a non-zero additive bias
  kRowFiniteMasked = 1u << 1,  // a masked element is finite (≤ threshold), not -inf
  kRowInvalid = 1u << 2,       // an element is NaN or +inf
};

struct RowSpan {
  static constexpr std::int64_t kNoKey = INT64_MAX;

  std::int64_t first = kNoKey;  // first attending key, kNoKey when none
  std::int64_t last = -1;       // last attending key, -1 when none
  std::int64_t count = 0;       // attending keys
  std::uint32_t flags = 0;      // RowFlag bits
  // Explicit padding: storing a span writes all 32 bytes, so copying spans (device to
  // host) never reads uninitialised memory (compute-sanitizer initcheck).
  std::uint32_t reserved = 0;

  MASKLENS_HOST_DEVICE constexpr bool empty() const noexcept { return count == 0; }
  MASKLENS_HOST_DEVICE constexpr bool is_interval() const noexcept {
    return count == 0 || count == last - first + 1;
  }
  // The interval [lo, hi] (inclusive), or the empty span when lo > hi.
  MASKLENS_HOST_DEVICE static constexpr RowSpan interval(std::int64_t lo, std::int64_t hi) noexcept {
    RowSpan s;
    if (lo <= hi) {
      s.first = lo;
      s.last = hi;
      s.count = hi - lo + 1;
    }
    return s;
  }
  // Same attending keys (flags are compared separately where they matter).
  MASKLENS_HOST_DEVICE constexpr bool same_keys(const RowSpan& o) const noexcept {
    return count == o.count && (count == 0 || (first == o.first && last == o.last));
  }
};

MASKLENS_HOST_DEVICE constexpr RowSpan merge(const RowSpan& a, const RowSpan& b) noexcept {
  RowSpan r;
  r.first = a.first < b.first ? a.first : b.first;
  r.last = a.last > b.last ? a.last : b.last;
  r.count = a.count + b.count;
  r.flags = a.flags | b.flags;
  return r;
}

}  // namespace masklens
