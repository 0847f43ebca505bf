// masklens — a mask definition's [B, L] tables (its metadata: a padding mask, packed
// document ids, position_ids, block ids) as views of memory, and their runs of equal
// values read on the host. A definition (definition.hpp) reads a table only as its runs,
// O(edges) of them; read_table_runs() walks the table once where it lies in host memory,
// and cuda/table_runs.hpp finds the same runs on the device for a table in device memory.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "definition.hpp"
#include "status.hpp"

namespace masklens {

enum class TableElement : std::uint8_t { boolean, int32, int64 };

// One [batch, length] table, strides in elements (0 for a dimension of one, or a
// broadcast). positions: a new run wherever a value is not the previous one + 1
// (position_ids), and a run's value is position - index; otherwise a new run wherever the
// value changes. A bool table is read as bytes, any nonzero byte 1.
struct TableView {
  const void* data = nullptr;
  TableElement element = TableElement::int64;
  std::int64_t batch = 0, length = 0, batch_stride = 0, length_stride = 0;
  bool positions = false;
};

// Tables past this many elements are refused (definition.hpp's bound on lengths).
inline constexpr std::int64_t kMaxTableElements = std::int64_t{1} << 40;

[[nodiscard]] constexpr std::size_t table_element_bytes(TableElement e) noexcept {
  return e == TableElement::boolean ? 1 : (e == TableElement::int32 ? 4 : 8);
}

namespace detail {

// (n - 1) * stride, or -1 where it passes `limit` (no product is formed that could overflow).
[[nodiscard]] constexpr std::int64_t table_reach(std::int64_t n, std::int64_t stride, std::int64_t limit) noexcept {
  if (n <= 1 || stride == 0) return 0;
  return n - 1 > limit / stride ? -1 : (n - 1) * stride;
}

}  // namespace detail

// The checks both reads make before touching a table; errors name it (`name`): empty
// (batch or length < 1) or past kMaxTableElements, null data, data off its element's
// alignment, negative strides or strides past kMaxTableElements, or a farthest element
// ((batch - 1) * batch_stride + (length - 1) * length_stride) whose byte offset no
// pointer holds (a view that describes no memory: its indexing would overflow).
[[nodiscard]] inline Status check_table(const TableView& t, const std::string& name) {
  if (t.batch < 1 || t.length < 1 || t.batch > kMaxTableElements / t.length)
    return error(ErrorCode::invalid_shape, name + " is [" + std::to_string(t.batch) + ", " + std::to_string(t.length) +
                                               "]: empty or past 2^40 elements");
  if (t.data == nullptr) return error(ErrorCode::invalid_argument, name + "'s data is null");
  if (reinterpret_cast<std::uintptr_t>(t.data) % table_element_bytes(t.element) != 0)
    return error(ErrorCode::misaligned_pointer, name + "'s data is not aligned to its element");
  if (t.batch_stride < 0 || t.length_stride < 0 || t.batch_stride > kMaxTableElements ||
      t.length_stride > kMaxTableElements)
    return error(ErrorCode::invalid_stride, name + "'s strides are negative or past 2^40");
  // In elements: the farthest byte offset both a pointer (ptrdiff_t) and int64 hold.
  const auto limit = static_cast<std::int64_t>(std::min<std::uintmax_t>(PTRDIFF_MAX, INT64_MAX) /
                                               table_element_bytes(t.element));
  const std::int64_t down = detail::table_reach(t.batch, t.batch_stride, limit);
  const std::int64_t along = detail::table_reach(t.length, t.length_stride, limit);
  if (down < 0 || along < 0 || down > limit - along)
    return error(ErrorCode::invalid_stride, name + "'s strides reach past any address: [" + std::to_string(t.batch) +
                                                ", " + std::to_string(t.length) + "] with strides " +
                                                std::to_string(t.batch_stride) + ", " + std::to_string(t.length_stride));
  return {};
}

namespace detail {

// Values are widened to int64 first (an int32 table's INT32_MAX and INT32_MIN are 2^32
// apart, as transformers' positions compare as values); differences and position - index
// then wrap as two's complement in int64, as the device pass's do, rather than overflow: a
// table's values are data, and definition.hpp refuses what they cannot say.
[[nodiscard]] constexpr std::int64_t wrapping_minus(std::int64_t a, std::int64_t b) noexcept {
  return static_cast<std::int64_t>(static_cast<std::uint64_t>(a) - static_cast<std::uint64_t>(b));
}

template <class T>
[[nodiscard]] Result<definition::TableRuns> read_table_runs_as(const TableView& t) {
  return catch_alloc([&]() -> Result<definition::TableRuns> {
    definition::TableRuns r;
    r.batches = t.batch, r.length = t.length;
    const T* data = static_cast<const T*>(t.data);
    for (std::int64_t b = 0; b < t.batch; ++b) {
      const T* row = data + b * t.batch_stride;
      const auto at = [&](std::int64_t j) {
        if constexpr (std::is_same_v<T, std::uint8_t>) return static_cast<std::int64_t>(row[j * t.length_stride] != 0);
        else return static_cast<std::int64_t>(row[j * t.length_stride]);
      };
      const auto start_run = [&](std::int64_t j, std::int64_t value) {
        if (j > 0) r.end.back() = j;
        r.batch.push_back(b), r.start.push_back(j), r.end.push_back(t.length);
        r.value.push_back(t.positions ? wrapping_minus(value, j) : value);
      };
      std::int64_t previous = at(0);
      start_run(0, previous);
      for (std::int64_t j = 1; j < t.length; ++j) {
        const std::int64_t value = at(j);
        if (t.positions ? wrapping_minus(value, previous) != 1 : value != previous) start_run(j, value);
        previous = value;
      }
    }
    if (Status st = r.index(); !st.ok()) return st;
    return r;
  });
}

}  // namespace detail

// The runs of a table in host memory, sorted by batch and start and indexed
// (TableRuns::index): one pass over its elements. Errors: check_table's.
[[nodiscard]] inline Result<definition::TableRuns> read_table_runs(const TableView& t,
                                                                   const std::string& name = "the table") {
  if (Status st = check_table(t, name); !st.ok()) return st;
  switch (t.element) {
    case TableElement::boolean: return detail::read_table_runs_as<std::uint8_t>(t);
    case TableElement::int32: return detail::read_table_runs_as<std::int32_t>(t);
    case TableElement::int64: return detail::read_table_runs_as<std::int64_t>(t);
  }
  return error(ErrorCode::unsupported_dtype, name + " has an element type that is not bool, int32 or int64");
}

}  // namespace masklens
