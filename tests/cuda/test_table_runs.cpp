// A definition's tables read on the device (masklens/cuda/table_runs.hpp) against the
// host read (masklens/table_runs.hpp, the oracle) run for run: random tables of each
// element type, strided and broadcast views, positions tables, lists beside them, more
// lists and tables than one launch takes, a table long enough for every block of the grid
// to find changes, more changes than the room (only the count); the same counters reused
// read after read (the last block leaves them zero), and the read captured into a CUDA
// graph and replayed (no allocation, copy or synchronisation inside). Plain C++: the CUDA
// runtime API and masklens/cuda/table_runs.hpp, as a framework's own C++ would call it.
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>
#include <masklens/cuda/table_runs.hpp>
#include <masklens/table_runs.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "../support/device_buffer.hpp"
#include "suite_size.hpp"

using namespace masklens;
using namespace masklens::testing;

namespace {

// A table's values on the host, in the view's layout and element type; view() reads them
// there or at a device copy of the same bytes.
struct Table {
  TableElement element = TableElement::int64;
  std::int64_t batch = 1, length = 1, batch_stride = 1, length_stride = 1;
  bool positions = false;
  std::vector<std::uint8_t> bytes;

  [[nodiscard]] TableView view(const void* data) const {
    TableView v;
    v.data = data, v.element = element, v.batch = batch, v.length = length;
    v.batch_stride = batch_stride, v.length_stride = length_stride, v.positions = positions;
    return v;
  }
};

template <class T>
void put(std::vector<std::uint8_t>& bytes, std::int64_t at, std::int64_t value) {
  const auto v = static_cast<T>(value);
  std::memcpy(bytes.data() + at * static_cast<std::int64_t>(sizeof(T)), &v, sizeof(T));
}

// New values in the table's layout: runs of a few values (positions that restart: new
// documents), far from 0 in an int64 table so that the 64-bit reads are needed; a bool
// table's true is any nonzero byte. A value changes about every change_every positions
// (0: a random 1-64).
void fill(Table& t, std::mt19937_64& rng, std::int64_t change_every = 0) {
  if (change_every == 0) change_every = 1 + static_cast<std::int64_t>(rng() % 64);
  for (std::int64_t b = 0; b < t.batch; ++b) {
    std::int64_t value = static_cast<std::int64_t>(rng() % 3), position = static_cast<std::int64_t>(rng() % 5);
    for (std::int64_t j = 0; j < t.length; ++j) {
      if (rng() % static_cast<std::uint64_t>(change_every) == 0)
        value = static_cast<std::int64_t>(rng() % 3), position = static_cast<std::int64_t>(rng() % 5);
      const std::int64_t at = b * t.batch_stride + j * t.length_stride;
      switch (t.element) {
        case TableElement::boolean:
          put<std::uint8_t>(t.bytes, at, value != 0 ? 1 + static_cast<std::int64_t>(rng() % 3) : 0);
          break;
        case TableElement::int32: put<std::int32_t>(t.bytes, at, t.positions ? position : value - 1); break;
        case TableElement::int64:
          put<std::int64_t>(t.bytes, at, t.positions ? position + (std::int64_t{1} << 40) : value * (std::int64_t{1} << 40) - 7);
          break;
      }
      ++position;
    }
  }
}

// A random [batch, length] table: an element type, a length stride of 1 or 2 (a strided
// view: gaps between elements), batches apart or broadcast (a batch stride of 0).
Table random_table(std::mt19937_64& rng, std::int64_t batch, std::int64_t length, bool positions,
                   std::int64_t change_every = 0) {
  Table t;
  t.element = static_cast<TableElement>(rng() % 3);
  t.batch = batch, t.length = length, t.positions = positions && t.element != TableElement::boolean;
  t.length_stride = length == 1 ? 0 : 1 + static_cast<std::int64_t>(rng() % 2);
  t.batch_stride = batch == 1 || rng() % 5 == 0 ? 0 : length * std::max<std::int64_t>(t.length_stride, 1);
  const std::int64_t elements = (batch - 1) * t.batch_stride + (length - 1) * t.length_stride + 1;
  t.bytes.assign(static_cast<std::size_t>(elements) * table_element_bytes(t.element), 0);
  fill(t, rng, change_every);
  return t;
}

// Tables' device copies, freed with it.
class Uploads {
 public:
  const void* add(const Table& t) {
    buffers_.push_back(std::make_unique<DeviceBuffer>(t.bytes.size()));
    write(t, buffers_.back()->get());
    return buffers_.back()->get();
  }
  static void write(const Table& t, const void* device) {
    REQUIRE_CUDA(cudaMemcpy(const_cast<void*>(device), t.bytes.data(), t.bytes.size(), cudaMemcpyHostToDevice));
  }

 private:
  std::vector<std::unique_ptr<DeviceBuffer>> buffers_;
};

// Pinned host memory the kernel writes through (mapped: cudaMallocHost's under unified
// addressing, cudaHostGetDevicePointer's view of it) and zeroed device counters.
struct ReadMemory {
  std::int64_t* host = nullptr;
  std::int64_t* mapped = nullptr;
  std::int64_t words = 0;
  DeviceBuffer counters;
  std::int64_t counter_words = 0;

  ReadMemory(std::int64_t words_, std::int64_t counter_words_)
      : words(words_), counters(static_cast<std::size_t>(counter_words_) * sizeof(std::uint64_t)),
        counter_words(counter_words_) {
    REQUIRE_CUDA(cudaMallocHost(&host, static_cast<std::size_t>(words) * sizeof(std::int64_t)));
    void* m = nullptr;
    REQUIRE_CUDA(cudaHostGetDevicePointer(&m, host, 0));
    mapped = static_cast<std::int64_t*>(m);
    REQUIRE_CUDA(cudaMemset(counters.get(), 0, static_cast<std::size_t>(counter_words) * sizeof(std::uint64_t)));
  }
  ReadMemory(const ReadMemory&) = delete;
  ReadMemory& operator=(const ReadMemory&) = delete;
  ~ReadMemory() { CHECK(cudaFreeHost(host) == cudaSuccess); }

  // Every word something no read writes: leftovers must not pass for results.
  void poison() { std::fill(host, host + words, std::int64_t{-12345}); }
  [[nodiscard]] std::uint64_t* device_counters() const { return counters.get<std::uint64_t>(); }
};

// Each list's words against its values, each table's section against the host read of the
// same table (its runs, or only the count past the room).
void check_block(const std::vector<Table>& lists, const std::vector<Table>& tables, std::int64_t room,
                 const std::int64_t* words) {
  std::int64_t at = 0;
  for (const Table& l : lists) {
    Result<definition::TableRuns> host = read_table_runs(l.view(l.bytes.data()));
    REQUIRE(host.ok());
    for (std::size_t r = 0; r < host->start.size(); ++r)
      for (std::int64_t j = host->start[r]; j < host->end[r]; ++j) CHECK(words[at + j] == host->value[r]);
    at += l.length;
  }
  for (std::size_t k = 0; k < tables.size(); ++k) {
    const Table& t = tables[k];
    CAPTURE(k);
    Result<definition::TableRuns> host = read_table_runs(t.view(t.bytes.data()));
    REQUIRE(host.ok());
    Result<gpu::TableSection> device = gpu::table_runs_from(t.view(t.bytes.data()), room, words + at);
    REQUIRE_MESSAGE(device.ok(), device.status().to_string());
    const auto changes = static_cast<std::int64_t>(host->start.size()) - t.batch;
    CHECK(device->count == changes);
    if (changes <= room) {
      REQUIRE(device->runs.size() == 1);
      CHECK(device->runs[0].batch == host->batch);
      CHECK(device->runs[0].start == host->start);
      CHECK(device->runs[0].end == host->end);
      CHECK(device->runs[0].value == host->value);
    } else {
      CHECK(device->runs.empty());
    }
    at += gpu::table_section_words(t.batch, room);
  }
}

std::vector<TableView> device_views(const std::vector<Table>& tables, Uploads& uploads) {
  std::vector<TableView> views;
  for (const Table& t : tables) views.push_back(t.view(uploads.add(t)));
  return views;
}

}  // namespace

TEST_SUITE("cuda") {

TEST_CASE("table runs on the device: the host read's runs, read after read on the same counters") {
  std::mt19937_64 rng(41);
  // Counters for the most lists and tables a case has, reused by every case: the last
  // block of each launch must leave them zero for the next.
  const std::size_t most_items = 4 * gpu::kTableJobsPerLaunch;
  ReadMemory memory(1 << 18, gpu::table_counter_words(most_items));
  cudaStream_t stream = nullptr;
  REQUIRE_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const int cases = suite_cases(300);
  for (int c = 0; c < cases; ++c) {
    CAPTURE(c);
    // Past one launch's kTableJobsPerLaunch lists and tables: now and then more tables, or
    // more lists (a first launch of lists alone, and lists in the second).
    const bool many = c % 7 == 0, many_lists = c % 13 == 0;
    std::vector<Table> lists, tables;
    const int list_count = static_cast<int>(rng() % 3) + (many ? 10 : 0) + (many_lists ? 20 : 0);
    const int table_count = 1 + static_cast<int>(rng() % 4) + (many ? 20 : 0);
    for (int k = 0; k < list_count; ++k)
      lists.push_back(random_table(rng, 1, 1 + static_cast<std::int64_t>(rng() % 9), false));
    for (int k = 0; k < table_count; ++k) {
      // Now and then a table long enough that every block of the grid strides over it,
      // with changes few enough (c % 2) that those the far blocks find are compared too.
      const bool long_table = k == 0 && c % 11 == 0;
      const std::int64_t length = long_table ? suite_length(1 << 20, 1 << 16) : 1 + static_cast<std::int64_t>(rng() % 700);
      tables.push_back(random_table(rng, 1 + static_cast<std::int64_t>(rng() % 4), length, rng() % 3 == 0,
                                    long_table && c % 2 == 0 ? length / 64 : 0));
    }
    const std::int64_t room = c % 5 == 0 ? 1 + static_cast<std::int64_t>(rng() % 4) : 1024;
    Uploads uploads;
    const std::vector<TableView> list_views = device_views(lists, uploads), table_views = device_views(tables, uploads);
    const std::int64_t words = gpu::table_block_words(list_views, table_views, room);
    REQUIRE(words <= memory.words);
    memory.poison();
    const Status st = gpu::table_changes_to_host(list_views, table_views, room, memory.mapped, words,
                                                 memory.device_counters(), memory.counter_words, stream);
    REQUIRE_MESSAGE(st.ok(), st.to_string());
    REQUIRE_CUDA(cudaStreamSynchronize(stream));
    check_block(lists, tables, room, memory.host);
  }
  std::vector<std::uint64_t> counters(static_cast<std::size_t>(memory.counter_words), 1);
  REQUIRE_CUDA(cudaMemcpy(counters.data(), memory.device_counters(), counters.size() * sizeof(std::uint64_t),
                          cudaMemcpyDeviceToHost));
  for (std::uint64_t x : counters) CHECK(x == 0);
  REQUIRE_CUDA(cudaStreamDestroy(stream));
}

TEST_CASE("table runs on the device: a table past 2^32 positions, its changes found past there") {
  // The kernel's flat index and a change's position past 32 bits (sanitizer-sized: the
  // same paths on a table of 2^20).
  const std::int64_t length = suite_length((std::int64_t{1} << 32) + 77, std::int64_t{1} << 20);
  std::vector<Table> tables(1);  // one table of 4 GiB, never copied
  Table& t = tables[0];
  t.element = TableElement::boolean, t.batch = 1, t.length = length, t.batch_stride = 0, t.length_stride = 1;
  t.bytes.assign(static_cast<std::size_t>(length), 0);
  for (const std::int64_t at : {std::int64_t{5}, length / 2, length - 70, length - 3}) t.bytes[static_cast<std::size_t>(at)] = 1;
  Uploads uploads;
  const std::vector<TableView> views = device_views(tables, uploads);
  const std::int64_t room = 16, words = gpu::table_block_words({}, views, room);
  ReadMemory memory(words, gpu::table_counter_words(1));
  memory.poison();
  const Status st = gpu::table_changes_to_host({}, views, room, memory.mapped, words, memory.device_counters(),
                                               memory.counter_words, nullptr);
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  REQUIRE_CUDA(cudaDeviceSynchronize());
  check_block({}, tables, room, memory.host);
  Result<gpu::TableSection> device = gpu::table_runs_from(t.view(t.bytes.data()), room, memory.host);
  REQUIRE(device.ok());
  REQUIRE(device->runs.size() == 1);
  CHECK(device->runs[0].start ==
        std::vector<std::int64_t>{0, 5, 6, length / 2, length / 2 + 1, length - 70, length - 69, length - 3, length - 2});
}

TEST_CASE("table runs on the device: captured into a CUDA graph, each replay reads the tables as they are then") {
  std::mt19937_64 rng(7);
  std::vector<Table> tables = {random_table(rng, 3, 5000, false), random_table(rng, 2, 777, true)};
  const std::vector<Table> lists = {random_table(rng, 1, 4, false)};
  Uploads uploads;
  const std::vector<TableView> list_views = device_views(lists, uploads), table_views = device_views(tables, uploads);
  const std::int64_t room = 1024, words = gpu::table_block_words(list_views, table_views, room);
  ReadMemory memory(words, gpu::table_counter_words(3));
  cudaStream_t stream = nullptr;
  REQUIRE_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // Captured: a read makes no allocation, copy or synchronisation of its own.
  cudaGraph_t graph = nullptr;
  REQUIRE_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const Status st = gpu::table_changes_to_host(list_views, table_views, room, memory.mapped, words,
                                               memory.device_counters(), memory.counter_words, stream);
  REQUIRE_CUDA(cudaStreamEndCapture(stream, &graph));
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  cudaGraphExec_t exec = nullptr;
  REQUIRE_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 3; ++replay) {
    CAPTURE(replay);
    if (replay > 0)  // new values in the same memory: the replay reads them, its counts start at 0
      for (std::size_t k = 0; k < tables.size(); ++k) {
        fill(tables[k], rng);
        Uploads::write(tables[k], table_views[k].data);
      }
    memory.poison();
    REQUIRE_CUDA(cudaGraphLaunch(exec, stream));
    REQUIRE_CUDA(cudaStreamSynchronize(stream));
    check_block(lists, tables, room, memory.host);
  }
  REQUIRE_CUDA(cudaGraphExecDestroy(exec));
  REQUIRE_CUDA(cudaGraphDestroy(graph));
  REQUIRE_CUDA(cudaStreamDestroy(stream));
}

}  // TEST_SUITE
