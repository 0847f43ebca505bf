// masklens::gpu — a mask definition's tables (definition.hpp) read on the device: where the
// values of a [B, L] table (a padding mask, packed document ids, position_ids, block ids)
// change along each batch, found by one kernel for all the tables, which writes every
// table's changes with each batch's first value straight into host memory. A definition's
// rows need only those runs (O(edges)), not the table (O(B·L)). Declared for any C++20
// compiler, as runs.hpp: the kernel and the entry points are in src/table_runs.cu, and
// src/table_runs_none.cpp answers "built without CUDA".
//
// The host block, int64 words: first each list (a small 1-D table a definition also reads,
// such as chunked_overlay's left padding) element for element, then one section a table,
// in order, of table_section_words(batch, room) words: the number of changes (it may
// exceed room), each batch's first value, then room pairs (flat index b * L + j of a
// position whose value starts a new run, that value) in no order.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../definition.hpp"
#include "../status.hpp"
#include "../table_runs.hpp"
#include "scan.hpp"

namespace masklens::gpu {

// A table in device memory is a TableView (table_runs.hpp) whose data is a device pointer.
using masklens::kMaxTableElements;
using masklens::TableElement;
using DeviceTable = masklens::TableView;

[[nodiscard]] constexpr std::int64_t table_section_words(std::int64_t batch, std::int64_t room) noexcept {
  return 1 + batch + 2 * room;
}

// The words a block for these lists and tables takes.
[[nodiscard]] inline std::int64_t table_block_words(std::span<const DeviceTable> lists,
                                                    std::span<const DeviceTable> tables, std::int64_t room) noexcept {
  std::int64_t words = 0;
  for (const DeviceTable& l : lists) words += l.batch * l.length;
  for (const DeviceTable& t : tables) words += table_section_words(t.batch, room);
  return words;
}

// The checks of a read's lists, tables and room, made before any word is counted (a
// caller sizes its block from table_block_words only after them): no table, an empty
// list or table or one past kMaxTableElements, null data, data off its element's
// alignment, bad strides (check_table's, naming "list k" or "table k"), room outside
// [1, kMaxTableElements].
[[nodiscard]] inline Status check_table_read(std::span<const DeviceTable> lists, std::span<const DeviceTable> tables,
                                             std::int64_t room) {
  if (tables.empty()) return error(ErrorCode::invalid_argument, "no table to read");
  if (room < 1 || room > kMaxTableElements)
    return error(ErrorCode::invalid_argument, "room must be in [1, 2^40], got " + std::to_string(room));
  for (std::size_t k = 0; k < lists.size(); ++k)
    if (Status st = check_table(lists[k], "list " + std::to_string(k)); !st.ok()) return st;
  for (std::size_t k = 0; k < tables.size(); ++k)
    if (Status st = check_table(tables[k], "table " + std::to_string(k)); !st.ok()) return st;
  return {};
}

// Lists and tables one launch reads; more take more launches.
inline constexpr std::size_t kTableJobsPerLaunch = 16;

// The device words of counters a read of `items` lists and tables needs: per launch, a
// change count a table and the count of blocks done. They are zero between reads (the
// last block of a launch zeroes them as it hands the counts over), so a caller zeroes
// them once, when it allocates them, and may reuse them once a read has completed.
[[nodiscard]] constexpr std::int64_t table_counter_words(std::size_t items) noexcept {
  return static_cast<std::int64_t>((items + kTableJobsPerLaunch - 1) / kTableJobsPerLaunch *
                                   (kTableJobsPerLaunch + 1));
}

// Loads the change kernel on the current device now rather than at its first launch:
// load_scan_kernels()'s errors and cost.
[[nodiscard]] Status load_table_runs_kernels();

// Enqueues on `stream` one kernel (one a kTableJobsPerLaunch lists and tables) that writes
// the block straight into h_block: host memory the device writes through (pinned memory
// mapped into the device's address space: cudaMallocHost's under unified addressing; the
// device's view of it, cudaHostGetDevicePointer's). No copy, no memset, no allocation, no
// synchronisation: once the stream has passed the kernel, table_runs_from(h_block +
// section) reads each table. d_counters: table_counter_words(lists + tables) words of
// device memory, zero (see there). A list is a DeviceTable of one batch; its positions
// flag is not read. Errors, before any CUDA call: check_table_read's, h_block or
// d_counters null or off 8 bytes, block_words other than table_block_words(lists, tables,
// room), counter_words under table_counter_words.
[[nodiscard]] Status table_changes_to_host(std::span<const DeviceTable> lists, std::span<const DeviceTable> tables,
                                           std::int64_t room, std::int64_t* h_block, std::int64_t block_words,
                                           std::uint64_t* d_counters, std::int64_t counter_words,
                                           Stream stream = nullptr);

// What a table's section says: the runs, sorted by batch and start and indexed
// (TableRuns::index), or, where the changes exceeded the room (count > room), none and the
// count: the caller reads that table again with room for them all.
struct TableSection {
  std::int64_t count = 0;
  std::vector<definition::TableRuns> runs;  // one, or none past the room
};

[[nodiscard]] inline Result<TableSection> table_runs_from(const DeviceTable& t, std::int64_t room,
                                                          const std::int64_t* section) {
  TableSection out;
  out.count = section[0];
  if (out.count < 0 || out.count > t.batch * std::max<std::int64_t>(t.length - 1, 0))
    return error(ErrorCode::device_error, "a table section's change count is " + std::to_string(out.count));
  if (out.count > room) return out;
  return catch_alloc([&]() -> Result<TableSection> {
    const std::int64_t* firsts = section + 1;
    std::vector<std::pair<std::int64_t, std::int64_t>> changes(static_cast<std::size_t>(out.count));
    const std::int64_t* pairs = section + 1 + t.batch;
    for (std::size_t i = 0; i < changes.size(); ++i) changes[i] = {pairs[2 * i], pairs[2 * i + 1]};
    std::sort(changes.begin(), changes.end());
    definition::TableRuns r;
    r.batches = t.batch, r.length = t.length;
    const std::size_t n = changes.size() + static_cast<std::size_t>(t.batch);
    r.batch.reserve(n), r.start.reserve(n), r.end.reserve(n), r.value.reserve(n);
    std::size_t c = 0;
    for (std::int64_t b = 0; b < t.batch; ++b) {
      const auto add = [&](std::int64_t start, std::int64_t value) {
        if (!r.start.empty() && r.batch.back() == b) r.end.back() = start;
        r.batch.push_back(b), r.start.push_back(start), r.end.push_back(t.length);
        r.value.push_back(t.positions ? value - start : value);
      };
      add(0, firsts[b]);
      for (; c < changes.size() && changes[c].first / t.length == b; ++c) add(changes[c].first % t.length, changes[c].second);
    }
    if (c != changes.size()) return error(ErrorCode::device_error, "a table section's change lies past its batches");
    if (Status st = r.index(); !st.ok()) return st;
    out.runs.push_back(std::move(r));
    return out;
  });
}

}  // namespace masklens::gpu
