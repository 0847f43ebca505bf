// A definition's tables read on the device (masklens/cuda/table_runs.hpp) from a
// translation unit the host compiler builds, in every build: a section's words (the
// kernel's output, in the unordered slot order atomics give) read back into sorted,
// indexed runs, positions as position - index, a count past the room or past the table
// refused; without CUDA the entry point says so; with CUDA its arguments are checked
// before any CUDA call. (On a GPU, tests/python/test_table_runs.py compares the device
// read with torch's.)
#include <doctest/doctest.h>

#include <masklens/cuda/table_runs.hpp>

#include <cstdint>
#include <string>
#include <vector>

using namespace masklens;

namespace {

gpu::DeviceTable table(std::int64_t batch, std::int64_t length, bool positions = false) {
  gpu::DeviceTable t;
  t.data = reinterpret_cast<const void*>(std::uintptr_t{0x1000});
  t.batch = batch, t.length = length, t.batch_stride = length, t.length_stride = 1, t.positions = positions;
  return t;
}

}  // namespace

TEST_SUITE("host") {

TEST_CASE("table runs: a section's changes, in any slot order, become each batch's runs in order") {
  // Batch 0: 1 1 0 0 0 1; batch 1: 7 7 7 2 2 2 (flat starts 2, 5 and 9).
  const gpu::DeviceTable t = table(2, 6);
  const std::int64_t room = 4;
  std::vector<std::int64_t> section(static_cast<std::size_t>(gpu::table_section_words(2, room)), -99);
  section[0] = 3;                     // changes
  section[1] = 1, section[2] = 7;     // firsts
  const std::int64_t pairs[] = {9, 2, 2, 0, 5, 1};  // (flat index, value), unordered
  for (int i = 0; i < 6; ++i) section[static_cast<std::size_t>(3 + i)] = pairs[i];
  Result<gpu::TableSection> read = gpu::table_runs_from(t, room, section.data());
  REQUIRE(read.ok());
  REQUIRE(read->runs.size() == 1);
  const definition::TableRuns& r = read->runs[0];
  CHECK(r.batch == std::vector<std::int64_t>{0, 0, 0, 1, 1});
  CHECK(r.start == std::vector<std::int64_t>{0, 2, 5, 0, 3});
  CHECK(r.end == std::vector<std::int64_t>{2, 5, 6, 3, 6});
  CHECK(r.value == std::vector<std::int64_t>{1, 0, 1, 7, 2});
  CHECK(r.first_run == std::vector<std::int64_t>{0, 3, 5});  // indexed
}

TEST_CASE("table runs: positions read as position - index; past the room only the count") {
  // position_ids 0 1 2 0 1: a new document at 3, runs of position - index 0 and -3.
  const gpu::DeviceTable t = table(1, 5, true);
  std::vector<std::int64_t> section(static_cast<std::size_t>(gpu::table_section_words(1, 2)), 0);
  section[0] = 1, section[1] = 0, section[2] = 3, section[3] = 0;
  Result<gpu::TableSection> read = gpu::table_runs_from(t, 2, section.data());
  REQUIRE(read.ok());
  CHECK(read->runs[0].value == std::vector<std::int64_t>{0, -3});
  section[0] = 3;  // more changes than the room of 2: the caller reads the table again
  read = gpu::table_runs_from(t, 2, section.data());
  REQUIRE(read.ok());
  CHECK(read->count == 3);
  CHECK(read->runs.empty());
  section[0] = 5;  // more changes than positions: the device wrote nonsense
  CHECK(gpu::table_runs_from(t, 8, section.data()).status().code() == ErrorCode::device_error);
}

TEST_CASE("table runs: the block's words and the counters' words") {
  const gpu::DeviceTable lists[] = {table(1, 3)};
  const gpu::DeviceTable ts[] = {table(2, 6), table(1, 9)};
  CHECK(gpu::table_block_words(lists, ts, 4) == 3 + (1 + 2 + 8) + (1 + 1 + 8));
  CHECK(gpu::table_block_words({}, ts, 4) == (1 + 2 + 8) + (1 + 1 + 8));
  // A launch's counts and its blocks-done count, a launch a kTableJobsPerLaunch items.
  CHECK(gpu::table_counter_words(1) == gpu::kTableJobsPerLaunch + 1);
  CHECK(gpu::table_counter_words(gpu::kTableJobsPerLaunch) == gpu::kTableJobsPerLaunch + 1);
  CHECK(gpu::table_counter_words(gpu::kTableJobsPerLaunch + 1) == 2 * (gpu::kTableJobsPerLaunch + 1));
}

TEST_CASE("table runs: a read's lists, tables and room are checked, naming which") {
  const gpu::DeviceTable ts[] = {table(1, 4)};
  const gpu::DeviceTable empty_list[] = {table(1, 0)};
  CHECK(gpu::check_table_read({}, ts, 2).ok());
  CHECK(gpu::check_table_read({}, {}, 2).message() == "no table to read");
  CHECK(gpu::check_table_read({}, ts, 0).message() == "room must be in [1, 2^40], got 0");
  CHECK(gpu::check_table_read({}, ts, (std::int64_t{1} << 40) + 1).code() == ErrorCode::invalid_argument);
  CHECK(gpu::check_table_read(empty_list, ts, 2).message() == "list 0 is [1, 0]: empty or past 2^40 elements");
  gpu::DeviceTable odd = table(1, 4);
  odd.data = reinterpret_cast<const void*>(std::uintptr_t{0x1001});
  const gpu::DeviceTable odd_tables[] = {table(1, 4), odd};
  CHECK(gpu::check_table_read({}, odd_tables, 2).message() == "table 1's data is not aligned to its element");
}

#if !MASKLENS_TEST_CUDA_BUILT

bool begins_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

TEST_CASE("table runs: built without CUDA, the entry point says so") {
  const gpu::DeviceTable ts[] = {table(1, 4)};
  std::vector<std::int64_t> host(16);
  std::vector<std::uint64_t> counters(static_cast<std::size_t>(gpu::table_counter_words(1)));
  const Status st = gpu::table_changes_to_host({}, ts, 1, host.data(), gpu::table_block_words({}, ts, 1),
                                               counters.data(), gpu::table_counter_words(1));
  CHECK(st.code() == ErrorCode::device_error);
  CHECK(begins_with(st.message(), "masklens was built without CUDA"));
  CHECK(begins_with(gpu::load_table_runs_kernels().message(), "masklens was built without CUDA"));
}

#else

TEST_CASE("table runs: arguments are checked before any CUDA call") {
  auto* d_counters = reinterpret_cast<std::uint64_t*>(std::uintptr_t{0x2000});
  std::vector<std::int64_t> host(64);
  const auto call = [&](const gpu::DeviceTable& t, std::int64_t room = 2, std::int64_t words = -1) {
    const gpu::DeviceTable ts[] = {t};
    return gpu::table_changes_to_host({}, ts, room, host.data(), words < 0 ? gpu::table_block_words({}, ts, room) : words,
                                      d_counters, gpu::table_counter_words(1));
  };
  CHECK(gpu::table_changes_to_host({}, {}, 2, host.data(), 0, d_counters, 17).message() == "no table to read");
  CHECK(call(table(1, 4), 0).message() == "room must be in [1, 2^40], got 0");
  CHECK(call(table(0, 4)).code() == ErrorCode::invalid_shape);
  CHECK(call(table(1 << 21, 1 << 20)).message() == "table 0 is [2097152, 1048576]: empty or past 2^40 elements");
  gpu::DeviceTable t = table(1, 4);
  t.data = nullptr;
  CHECK(call(t).message() == "table 0's data is null");
  t = table(1, 4);
  t.data = reinterpret_cast<const void*>(std::uintptr_t{0x1001});
  CHECK(call(t).code() == ErrorCode::misaligned_pointer);
  t = table(1, 4);
  t.length_stride = -1;
  CHECK(call(t).code() == ErrorCode::invalid_stride);
  CHECK(call(table(1, 4), 2, 3).message() == "block_words 3 is not the tables' 6");
  const gpu::DeviceTable ts[] = {table(1, 4)};
  const gpu::DeviceTable lists[] = {table(1, 0)};
  CHECK(gpu::table_changes_to_host(lists, ts, 2, host.data(), 6, d_counters, 17).message() ==
        "list 0 is [1, 0]: empty or past 2^40 elements");
  CHECK(gpu::table_changes_to_host(ts, ts, 2, nullptr, 10, d_counters, 17).message() ==
        "h_block or d_counters is null");
  CHECK(gpu::table_changes_to_host({}, ts, 2, host.data(), 6, nullptr, 17).message() ==
        "h_block or d_counters is null");
  CHECK(gpu::table_changes_to_host({}, ts, 2, reinterpret_cast<std::int64_t*>(std::uintptr_t{0x2004}), 6, d_counters,
                                   17)
            .code() == ErrorCode::misaligned_pointer);
  CHECK(gpu::table_changes_to_host({}, ts, 2, host.data(), 6, reinterpret_cast<std::uint64_t*>(std::uintptr_t{0x2004}),
                                   17)
            .code() == ErrorCode::misaligned_pointer);
  CHECK(gpu::table_changes_to_host({}, ts, 2, host.data(), 6, d_counters, 16).message() ==
        "counter_words 16 is under the 17 these tables need");
}

#endif

}  // TEST_SUITE
