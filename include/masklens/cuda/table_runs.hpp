// masklens::gpu — a mask definition's tables (definition.hpp) read on the device: where the
// values of a [B, L] table (a padding mask, packed document ids, position_ids, block ids)
// change along each batch, found in one kernel a table, and every table's changes with
// each batch's first value brought back in one copy. A definition's rows need only those
// runs (O(edges)), not the table (O(B·L)). Declared for any C++20 compiler, as runs.hpp:
// the kernel and the entry points are in src/table_runs.cu, and src/table_runs_none.cpp
// answers "built without CUDA".
//
// The block, int64 words in the caller's device memory: words [0, first_word) are the
// caller's (copied back as they are: small lists a definition also reads), then one
// section a table, in order, of table_section_words(batch, room) words: the number of
// changes (it may exceed room), each batch's first value, then room pairs (flat index
// b * L + j of a position whose value starts a new run, that value) in no order.
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

// The words a block for these tables takes after first_word.
[[nodiscard]] inline std::int64_t table_block_words(std::span<const DeviceTable> tables, std::int64_t room,
                                                    std::int64_t first_word) noexcept {
  std::int64_t words = first_word;
  for (const DeviceTable& t : tables) words += table_section_words(t.batch, room);
  return words;
}

// Loads the change kernel (each element type) on the current device now rather than at
// its first launch: load_scan_kernels()'s errors and cost.
[[nodiscard]] Status load_table_runs_kernels();

// Enqueues on `stream` one memset of words [first_word, block_words) (every section's
// count zeroed), for each table the kernel that fills its section, then the copy of
// words [0, block_words) to h_block (host memory; pinned makes it asynchronous). No
// allocation, no synchronisation: once the stream has reached that point,
// table_runs_from(h_block + section) reads each table. Errors, before any CUDA call: no
// table or an empty one (batch or length < 1), past kMaxTableElements, room < 1, a null
// pointer, data off its element's alignment, d_block off 8 bytes, block_words other than
// table_block_words(tables, room, first_word).
[[nodiscard]] Status table_changes_into(std::span<const DeviceTable> tables, std::int64_t room, std::int64_t* d_block,
                                        std::int64_t first_word, std::int64_t block_words, std::int64_t* h_block,
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
