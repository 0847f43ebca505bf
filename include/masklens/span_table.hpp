// SpanTable: the RowSpans of every distinct (batch, head) slice of a mask — what any
// scanner (host, GPU, sharded) produces and the one classifier consumes. Slices read
// through a stride-0 batch or head dimension are stored once and shared.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "mask_view.hpp"
#include "row_span.hpp"
#include "status.hpp"

namespace masklens {

struct SpanTable {
  std::int64_t batch = 0, heads = 0, q_len = 0, k_len = 0;
  // Distinct slices are indexed (b', h') with b' = b when the batch stride is non-zero
  // and 0 otherwise (likewise h'); distinct_batch x distinct_heads slices in all.
  std::int64_t distinct_batch = 0, distinct_heads = 0;
  std::vector<RowSpan> rows;  // [distinct slice][query row]

  [[nodiscard]] std::int64_t distinct_slices() const noexcept { return distinct_batch * distinct_heads; }
  [[nodiscard]] std::int64_t slice_index(std::int64_t b, std::int64_t h) const noexcept {
    return (distinct_batch == 1 ? 0 : b) * distinct_heads + (distinct_heads == 1 ? 0 : h);
  }
  [[nodiscard]] std::span<const RowSpan> slice(std::int64_t b, std::int64_t h) const noexcept {
    return {rows.data() + slice_index(b, h) * q_len, static_cast<std::size_t>(q_len)};
  }
  [[nodiscard]] std::span<RowSpan> slice_mut(std::int64_t distinct_index) noexcept {
    return {rows.data() + distinct_index * q_len, static_cast<std::size_t>(q_len)};
  }

  // Sizes the table for a view: one slice per distinct (b, h) the strides allow.
  static Result<SpanTable> for_view(const MaskView& view) {
    return catch_alloc([&]() -> Result<SpanTable> {
      SpanTable t;
      t.batch = view.batch();
      t.heads = view.heads();
      t.q_len = view.q_len();
      t.k_len = view.k_len();
      t.distinct_batch = view.stride(kBatch) == 0 ? 1 : view.batch();
      t.distinct_heads = view.stride(kHeads) == 0 ? 1 : view.heads();
      const std::int64_t slices = t.distinct_slices();
      if (slices > INT64_MAX / t.q_len || slices * t.q_len > static_cast<std::int64_t>(SIZE_MAX / sizeof(RowSpan)))
        return error(ErrorCode::out_of_memory, "span table of " + std::to_string(slices) + " x " +
                                                   std::to_string(t.q_len) + " rows is too large");
      t.rows.assign(static_cast<std::size_t>(slices * t.q_len), RowSpan{});
      return t;
    });
  }
};

}  // namespace masklens
