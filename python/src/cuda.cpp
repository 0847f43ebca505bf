// masklens._cuda: the device scanner (include/masklens/cuda/) for CUDA tensors, built
// only where Meson finds nvcc. A module of its own so that masklens._core never needs the
// CUDA runtime: where this one cannot be loaded, the package still imports and copies
// CUDA masks to the host instead (masklens._scan).
//
// The binding converts arguments and stages host memory; the device protocol is the
// library's (include/masklens/cuda/runs.hpp): plan_runs() is its size query
// (gpu::runs_block_for) and gives a masklens._core.DeviceRuns with the block's layout;
// the caller allocates the block (torch's caching allocator, a jax array); scan_runs() is
// gpu::scan_runs_into (or scan_runs_tiles_into, writing torch BlockMask's eight int32
// arrays into the caller's device tensors in the same read) with the head copied through
// this thread's pinned staging and the one synchronisation of the caller's stream;
// copy_rest() brings runs past the head (gpu::copy_rest_runs) with a second. O(runs)
// cross to the host, not O(rows). No allocation, no device-wide synchronisation.
#include <cuda_runtime.h>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <masklens/cuda/check.cuh>
#include <masklens/cuda/load_kernels.hpp>
#include <masklens/cuda/runs.hpp>
#include <masklens/cuda/scan.hpp>
#include <masklens/cuda/table_runs.hpp>
#include <masklens/cuda/tiles.hpp>
#include <masklens/verdict.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "device_runs.hpp"
#include "device_view.hpp"
#include "staging.hpp"
#include "status_error.hpp"
#include "table_binding.hpp"

namespace nb = nanobind;
using namespace nb::literals;
using namespace masklens;
using masklens::python::DeviceRuns;
using masklens::python::raise;
using masklens::python::StatusError;
using masklens::python::take;

// Every CUDA call checked as scan.cu checks its own ("cudaSetDevice:
// cudaErrorInvalidDevice: invalid device ordinal"), with the same helpers.
using masklens::gpu::detail::check;
using masklens::gpu::detail::keep_first;

namespace {

// torch BlockMask's eight arrays of grid `g` from the caller's device addresses and
// sizes in bytes, each checked: given, int32-aligned, exactly the grid's size.
BlockMaskArrays block_mask_arrays(const TileGrid& g, const std::vector<std::uintptr_t>& arrays,
                                  const std::vector<std::size_t>& array_bytes) {
  constexpr std::size_t n = std::size(kBlockMaskFields);
  if (arrays.size() != n || array_bytes.size() != n)
    raise(error(ErrorCode::invalid_argument, "pass the eight BlockMask arrays and their sizes in bytes, got " +
                                                 std::to_string(arrays.size()) + " and " +
                                                 std::to_string(array_bytes.size())));
  std::int32_t* out[n] = {};
  for (std::size_t i = 0; i < n; ++i) {
    const std::string name(to_string(kBlockMaskFields[i]));
    const auto elements = static_cast<std::size_t>(block_mask_entries(g, kBlockMaskFields[i]));
    if (arrays[i] == 0) raise(error(ErrorCode::invalid_argument, name + " is null"));
    if (arrays[i] % alignof(std::int32_t) != 0)
      raise(error(ErrorCode::misaligned_pointer, name + " is not aligned to int32 (4 bytes)"));
    if (array_bytes[i] != elements * sizeof(std::int32_t))
      raise(error(ErrorCode::invalid_argument, name + " holds " + std::to_string(array_bytes[i]) +
                                                   " bytes; this grid needs " + std::to_string(elements) +
                                                   " int32 (" + std::to_string(elements * 4) + " bytes)"));
    out[i] = reinterpret_cast<std::int32_t*>(arrays[i]);
  }
  return {out[0], out[1], out[2], out[3], out[4], out[5], out[6], out[7]};
}

// A tile grid given as [batch, heads, q_len, k_len, block_q, block_k, distinct_batch,
// distinct_heads] (the writers' argument), checked by make_tile_grid.
TileGrid grid_of(const std::vector<std::int64_t>& grid) {
  if (grid.size() != 8)
    raise(error(ErrorCode::invalid_argument,
                "grid is [batch, heads, q_len, k_len, block_q, block_k, distinct_batch, distinct_heads], got " +
                    std::to_string(grid.size()) + " values"));
  return take(make_tile_grid(grid[0], grid[1], grid[2], grid[3], TileSize{grid[4], grid[5]}, grid[6], grid[7]));
}

// Tile states at d_states (one TileState byte a tile of g), as the caller sized them.
void check_states(const TileGrid& g, std::size_t states_bytes) {
  if (states_bytes != static_cast<std::size_t>(g.tiles()) * sizeof(TileState))
    raise(error(ErrorCode::invalid_argument, "states hold " + std::to_string(states_bytes) + " bytes; this grid has " +
                                                 std::to_string(g.tiles()) + " tiles"));
}

// Runs `work` with `device` current (the stream belongs to the tensor's device; launches
// go to the current one), the GIL released, and the previous device restored.
template <class Work>
Status on_device(int device, Work&& work) {
  nb::gil_scoped_release unlocked;
  int previous = -1;
  Status st = check(cudaGetDevice(&previous), "cudaGetDevice");
  const bool switched = st.ok() && previous != device;
  if (switched) st = check(cudaSetDevice(device), "cudaSetDevice");
  if (st.ok()) st = work();
  if (switched) keep_first(st, check(cudaSetDevice(previous), "cudaSetDevice(back)"));
  return st;
}

// A scan whose head copy is enqueued and not yet waited for (wait_runs(): at once for
// wait=True, by the caller for wait=False): one per thread, as the pinned staging its
// head is copied into is the thread's.
struct PendingHead {
  const DeviceRuns* runs = nullptr;  // the scan's host half (null: none pending)
  const void* pinned = nullptr;      // the thread's staging, written by the enqueued copy
  cudaStream_t stream = nullptr;
  int device = 0;
};

PendingHead& pending_head() {
  thread_local PendingHead head;
  return head;
}

// The second half of the scan this thread enqueued: the stream synchronised, the head
// copied from the staging to its DeviceRuns, the run count.
std::int64_t wait_runs(DeviceRuns& runs) {
  PendingHead& pending = pending_head();
  if (pending.runs == nullptr)
    raise(error(ErrorCode::invalid_argument, "no scan enqueued with wait=False is pending on this thread"));
  if (pending.runs != &runs)  // the runs the copy lands in: the caller's, still alive
    raise(error(ErrorCode::invalid_argument, "these DeviceRuns are not the scan pending on this thread"));
  const PendingHead head = pending;
  pending = PendingHead{};  // waited for, whatever the outcome: the next scan may start
  Status st = on_device(head.device, [&]() -> Status {
    Status r = check(cudaStreamSynchronize(head.stream), "cudaStreamSynchronize");
    if (r.ok()) std::memcpy(runs.head.get(), head.pinned, runs.block.head_bytes());
    return r;
  });
  if (!st.ok()) raise(st);
  return take(runs.read_head()).count;
}

// The run count, or, where the runs are at most classify_up_to and all came with the
// head, their Verdict (classified here, the GIL released): the scan and its
// classification in one crossing from Python.
nb::object count_or_verdict(DeviceRuns& runs, std::int64_t count, std::int64_t classify_up_to) {
  if (classify_up_to <= 0 || count > std::min(classify_up_to, runs.block.eager)) return nb::int_(count);
  Result<SpanRuns> spans = masklens::python::finish_runs(runs);
  if (!spans) raise(spans.status());
  Result<Verdict> v = [&] {
    nb::gil_scoped_release unlocked;
    return verdict_of(std::move(spans).value());
  }();
  return nb::cast(take(std::move(v)));
}

// The device block the caller allocated for `runs`, checked before any CUDA call (the
// library checks it again, and that the layout is the view's, once the device is set).
void check_block(const DeviceRuns& runs, std::uintptr_t d_block, std::size_t block_bytes) {
  if (d_block == 0) raise(error(ErrorCode::invalid_argument, "device block is null"));
  if (d_block % gpu::detail::kStorageAlignment != 0)
    raise(error(ErrorCode::misaligned_pointer, "device block is not 256-byte aligned"));
  if (block_bytes != runs.block.bytes)
    raise(error(ErrorCode::invalid_argument, "device block holds " + std::to_string(block_bytes) +
                                                 " bytes; this view's layout needs " +
                                                 std::to_string(runs.block.bytes)));
}

// The device: whether CUDA was built, the devices, the kernels loaded ahead of their first launch.
void bind_device(nb::module_& m) {
  m.def("built_with_cuda", &gpu::built_with_cuda);

  m.def(
      "device_count", [] { return take(gpu::device_count()); },
      "CUDA devices this process can use; MaskError (device_error) naming the call when none.");

  m.def(
      "load_kernels",
      [](int device) {
        if (Status st = on_device(device, [] { return gpu::load_kernels(); }); !st.ok()) raise(st);
      },
      "device"_a,
      "Loads every kernel masklens' device entry points can launch (gpu::load_kernels(), "
      "include/masklens/cuda/load_kernels.hpp) on CUDA device `device` now, instead of at their first launch "
      "(CUDA's lazy loading), with that device current and the previous one restored. Creates the device's primary "
      "context if there is none; nothing is enqueued or allocated. MaskError (device_error) naming what failed; "
      "again, it finds them loaded.");
}

// The device scan on the caller's block: plan (the size query), scan (with tiles or
// not), the wait and the runs past the first copy.
void bind_scans(nb::module_& m) {
  m.def(
      "plan_runs",
      [](std::uintptr_t data, const std::string& dtype, const std::vector<std::int64_t>& shape,
         const std::vector<std::int64_t>& strides, float masked_threshold, std::int64_t block_q,
         std::int64_t block_k) {
        const MaskView view = take(python::view_of(data, dtype, shape, strides, masked_threshold));
        if (block_q == 0 && block_k == 0) return take(python::device_runs(view, take(gpu::runs_block_for(view))));
        const TileSize tiles{block_q, block_k};
        return take(python::device_runs(view, take(gpu::runs_block_for(view, tiles)), tiles));
      },
      "data"_a, "dtype"_a, "shape"_a, "strides"_a, "masked_threshold"_a, "block_q"_a = 0, "block_k"_a = 0,
      "The size query of a device scan of this view (gpu::runs_block_for; no CUDA call): a masklens._core.DeviceRuns "
      "with the block's layout (block_bytes to allocate) and host memory for what comes back. With block_q and "
      "block_k, of a scan that also writes torch BlockMask's arrays at that tile size (their grid: tile_grid). The "
      "mask's memory must stay alive until the scan has been waited for.");

  m.def(
      "scan_runs",
      [](DeviceRuns& runs, std::uintptr_t d_block, std::size_t block_bytes, std::uintptr_t stream, int device,
         const std::vector<std::uintptr_t>& arrays, const std::vector<std::size_t>& array_bytes,
         std::uintptr_t d_states, std::size_t states_bytes, bool wait, std::int64_t classify_up_to) -> nb::object {
        check_block(runs, d_block, block_bytes);
        if (runs.finished) raise(error(ErrorCode::invalid_argument, "these DeviceRuns were finished already"));
        BlockMaskArrays d_block_mask{};
        if (runs.tiles) {
          const TileGrid g = take(tile_grid_for(runs.view, *runs.tiles));
          d_block_mask = block_mask_arrays(g, arrays, array_bytes);
          if (d_states != 0) check_states(g, states_bytes);
        } else if (!arrays.empty() || d_states != 0) {
          raise(error(ErrorCode::invalid_argument, "BlockMask arrays or tile states given to a scan planned without "
                                                   "tiles: plan_runs(..., block_q, block_k)"));
        }
        PendingHead& pending = pending_head();
        if (pending.runs != nullptr)
          raise(error(ErrorCode::invalid_argument,
                      "a scan enqueued with wait=False on this thread was not waited for: call wait_runs first"));
        const cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);  // gpu::Stream is the same type
        void* pinned = nullptr;
        Status st = on_device(device, [&]() -> Status {
          Status r = python::staging().reserve(runs.block.head_bytes(), pinned);
          if (!r.ok()) return r;
          void* block = reinterpret_cast<void*>(d_block);
          if (!runs.tiles) return gpu::scan_runs_into(runs.block, block, runs.view, pinned, s);
          return gpu::scan_runs_tiles_into(runs.block, block, runs.view, *runs.tiles, d_block_mask,
                                           reinterpret_cast<TileState*>(d_states), pinned, s);
        });
        if (!st.ok()) raise(st);
        pending = PendingHead{&runs, pinned, s, device};
        if (!wait) return nb::none();
        return count_or_verdict(runs, wait_runs(runs), classify_up_to);
      },
      "runs"_a, "d_block"_a, "block_bytes"_a, "stream"_a, "device"_a, "arrays"_a = std::vector<std::uintptr_t>{},
      "array_bytes"_a = std::vector<std::size_t>{}, "d_states"_a = 0, "states_bytes"_a = 0, "wait"_a = true,
      "classify_up_to"_a = 0,
      "Scans the planned view into the block (device memory of runs.block_bytes at d_block) on `stream` (a "
      "cudaStream_t as an int; 0 is the legacy default stream) of CUDA device `device`, reduces the spans to runs, "
      "copies the count and the first runs to the host and synchronises the stream once: returns the run count, or "
      "the runs' Verdict where classify_up_to > 0 and they are at most that many and all came with that copy "
      "(runs.finish() done). "
      "A scan planned with tiles also writes torch BlockMask's eight int32 arrays (device addresses, in the order "
      "kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices, q_num_blocks, q_indices, full_q_num_blocks, "
      "full_q_indices, each contiguous over runs.tile_grid, with its size in bytes) and, with d_states (one byte a "
      "tile), each tile's state ([slice][q tile][k tile], 0 empty, 1 partial, 2 full). wait=False: returns None "
      "once everything is enqueued; wait_runs(runs) on the same thread then synchronises and returns the count (no "
      "other scan may start on the thread before). Every argument is checked before any CUDA call.");

  m.def(
      "wait_runs",
      [](DeviceRuns& runs, std::int64_t classify_up_to) {
        return count_or_verdict(runs, wait_runs(runs), classify_up_to);
      },
      "runs"_a, "classify_up_to"_a = 0,
      "The run count (or Verdict, as scan_runs' classify_up_to says) of the scan this thread enqueued with "
      "wait=False: synchronises its stream and brings the head into `runs`. MaskError (invalid_argument) where none is pending or it is another scan's; after a CUDA "
        "error (raised here) none is pending.");

  m.def(
      "copy_rest",
      [](DeviceRuns& runs, std::uintptr_t d_block, std::size_t block_bytes, std::uintptr_t d_more,
         std::uintptr_t stream, int device) {
        check_block(runs, d_block, block_bytes);
        const std::int64_t count = take(runs.read_head()).count;
        if (Status st = python::hold_rest(runs, count); !st.ok()) raise(st);
        Status st = on_device(device, [&]() -> Status {
          const cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
          Status r = gpu::copy_rest_runs(runs.block, reinterpret_cast<void*>(d_block), count,
                                         reinterpret_cast<SpanRun*>(d_more), runs.rest.data(), s);
          if (r.ok()) r = check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
          return r;
        });
        if (!st.ok()) raise(st);
      },
      "runs"_a, "d_block"_a, "block_bytes"_a, "d_more"_a, "stream"_a, "device"_a,
      "After scan_runs() returned more runs than came with the count (runs.eager): brings runs [eager, count) into "
      "`runs` (reducing again into d_more, device memory for `count` runs, where they exceed runs.room; 0 "
      "otherwise) and synchronises the stream: the second synchronisation.");
}

// torch BlockMask's eight arrays written on the device from what is already known: tile
// states, or an exact structure's tile ranges.
void bind_block_masks(nb::module_& m) {
  // torch BlockMask's eight arrays from tile states already on the device (a host tile
  // summary's states copied over: masklens._run.block_mask_from_tiles), no host writer.
  m.def(
      "write_block_mask",
      [](std::uintptr_t d_states, std::size_t states_bytes, const std::vector<std::int64_t>& grid,
         const std::vector<std::uintptr_t>& arrays, const std::vector<std::size_t>& array_bytes, std::uintptr_t stream,
         int device) {
        const TileGrid g = grid_of(grid);
        if (d_states == 0) raise(error(ErrorCode::invalid_argument, "states is null"));
        check_states(g, states_bytes);
        const BlockMaskArrays out = block_mask_arrays(g, arrays, array_bytes);
        const cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
        Status st = on_device(device, [&] {
          return gpu::write_block_mask(g, reinterpret_cast<const TileState*>(d_states), out, s);
        });
        if (!st.ok()) raise(st);
      },
      "states"_a, "states_bytes"_a, "grid"_a, "arrays"_a, "array_bytes"_a, "stream"_a, "device"_a,
      "Writes torch BlockMask's eight int32 arrays (device addresses and sizes in bytes, in scan_runs_tiles()' order) "
      "from one uint8 TileState per tile of the grid [batch, heads, q_len, k_len, block_q, block_k, distinct_batch, "
      "distinct_heads] at `states` (device memory), on `stream`: one kernel, no synchronisation. Every argument is "
      "checked before any CUDA call.");

  // torch BlockMask's eight arrays of an exact structure from its tile ranges
  // (masklens._core.structure_tile_ranges), copied over by this module: no host writer,
  // no tile states.
  m.def(
      "write_block_mask_from_ranges",
      [](std::uintptr_t h_ranges, std::size_t ranges_bytes, std::uintptr_t d_ranges, const std::vector<std::int64_t>& grid,
         const std::vector<std::uintptr_t>& arrays, const std::vector<std::size_t>& array_bytes, std::uintptr_t stream,
         int device) {
        const TileGrid g = grid_of(grid);
        if (h_ranges == 0) raise(error(ErrorCode::invalid_argument, "host ranges are null"));
        if (d_ranges == 0) raise(error(ErrorCode::invalid_argument, "device ranges are null"));
        if (d_ranges % alignof(TileRowRanges) != 0)
          raise(error(ErrorCode::misaligned_pointer, "device ranges are not aligned to 8 bytes"));
        const auto want = static_cast<std::size_t>(g.slices() * g.q_tiles()) * sizeof(TileRowRanges);
        if (ranges_bytes != want)
          raise(error(ErrorCode::invalid_argument, "ranges hold " + std::to_string(ranges_bytes) + " bytes; this grid has " +
                                                       std::to_string(g.slices() * g.q_tiles()) + " q tiles (" +
                                                       std::to_string(want) + " bytes)"));
        const BlockMaskArrays out = block_mask_arrays(g, arrays, array_bytes);
        const cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
        auto* ranges = reinterpret_cast<TileRowRanges*>(d_ranges);
        Status st = on_device(device, [&] {
          Status r = python::uploads().upload(device, reinterpret_cast<const void*>(h_ranges), ranges_bytes, ranges, s);
          if (r.ok()) r = gpu::write_block_mask_from_ranges(g, ranges, out, s);
          return r;
        });
        if (!st.ok()) raise(st);
      },
      "h_ranges"_a, "ranges_bytes"_a, "d_ranges"_a, "grid"_a, "arrays"_a, "array_bytes"_a, "stream"_a, "device"_a,
      "Writes torch BlockMask's eight int32 arrays (device addresses and sizes in bytes, in scan_runs_tiles()' order) "
      "of an exact structure from its tile ranges: h_ranges (host memory, int64 [distinct slices x q tiles, 4] as "
      "masklens._core.structure_tile_ranges() gives them for this grid) is copied to d_ranges (device memory the "
      "caller keeps until the kernel has run) through pinned staging, then one kernel writes the arrays on `stream`: "
      "no synchronisation. Every argument is checked before any CUDA call.");
}

// Host to device copies through this module's pinned staging.
void bind_uploads(nb::module_& m) {
  m.def(
      "upload",
      [](std::uintptr_t h_data, std::size_t bytes, std::uintptr_t d_dst, std::uintptr_t stream, int device) {
        if (bytes != 0 && (h_data == 0 || d_dst == 0))
          raise(error(ErrorCode::invalid_argument, h_data == 0 ? "host data is null" : "device destination is null"));
        Status st = on_device(device, [&] {
          return python::uploads().upload(device, reinterpret_cast<const void*>(h_data), bytes,
                                  reinterpret_cast<void*>(d_dst), reinterpret_cast<cudaStream_t>(stream));
        });
        if (!st.ok()) raise(st);
      },
      "h_data"_a, "bytes"_a, "d_dst"_a, "stream"_a, "device"_a,
      "Copies `bytes` of host memory at h_data to device memory at d_dst on `stream` of CUDA device `device`, "
      "through this module's pinned staging (a few slots a device, each reused once its last copy has finished): "
      "h_data may be reused at once; nothing is waited for. A copy from pageable memory is staged by the driver and "
      "can wait for earlier copies.");

  m.def(
      "reserve_uploads",
      [](int device, std::size_t bytes) {
        if (Status st = on_device(device, [&] { return python::uploads().reserve(device, bytes); }); !st.ok()) raise(st);
      },
      "device"_a, "bytes"_a = python::UploadStaging::kMinBytes,
      "Allocates every upload() slot of CUDA device `device` at `bytes` now (masklens.load_kernels does), so that a "
      "first BlockMask allocates no pinned memory.");
}

// A definition's tables read on the device (table_runs.hpp) whose wait is the caller's to
// make: the kernel writes into a pinned slot of its own, the event is recorded after it,
// and the stream is left running. finish() waits for that event alone (the work enqueued
// after it goes on) and reads each table's section.
class PendingTableRuns {
 public:
  PendingTableRuns(std::vector<gpu::DeviceTable> tables, std::int64_t room, std::int64_t first_word,
                   python::ReadbackSlots::Slot* slot)
      : tables_(std::move(tables)), room_(room), first_word_(first_word), slot_(slot) {}
  PendingTableRuns(const PendingTableRuns&) = delete;
  PendingTableRuns& operator=(const PendingTableRuns&) = delete;
  ~PendingTableRuns() {
    if (slot_ != nullptr) python::readbacks().release(slot_);  // reused once its read has completed
  }

  [[nodiscard]] bool finished() const noexcept { return slot_ == nullptr; }

  // Whether the read has completed (finish() would not wait): cudaEventQuery, no wait.
  [[nodiscard]] bool ready() const {
    if (slot_ == nullptr) return true;
    const cudaError_t e = cudaEventQuery(slot_->done);
    if (e == cudaErrorNotReady) return false;
    if (Status st = check(e, "cudaEventQuery(table changes)"); !st.ok()) raise(st);
    return true;
  }

  // ([each table's runs, or its change count past the room], the lists' first_word words);
  // again, the same answer (an interrupt raised as the first call returned loses nothing).
  nb::tuple finish() {
    if (result_) return *result_;
    if (slot_ == nullptr) raise(error(ErrorCode::device_error, "this table read failed on the device"));
    python::ReadbackSlots::Slot* slot = std::exchange(slot_, nullptr);
    Status st;
    {
      nb::gil_scoped_release unlocked;
      st = check(cudaEventSynchronize(slot->done), "cudaEventSynchronize(table changes)");
    }
    // Parsed before the slot goes back: another thread may take it at once.
    std::optional<nb::tuple> out;
    if (st.ok()) {
      try {
        out = sections(static_cast<const std::int64_t*>(slot->buffer.data));
      } catch (...) {
        python::readbacks().release(slot);
        throw;
      }
    }
    python::readbacks().release(slot);
    if (!st.ok()) raise(st);
    result_ = std::move(out);
    return *result_;
  }

 private:
  nb::tuple sections(const std::int64_t* words) const {
    nb::list out;
    std::int64_t at = first_word_;
    for (const gpu::DeviceTable& t : tables_) {
      gpu::TableSection section = take(gpu::table_runs_from(t, room_, words + at));
      at += gpu::table_section_words(t.batch, room_);
      if (section.runs.empty())
        out.append(section.count);
      else
        out.append(nb::cast(std::move(section.runs[0])));  // masklens._core.TableRuns
    }
    return nb::make_tuple(out, python::int64_array(std::vector<std::int64_t>(words, words + first_word_)));
  }

  std::vector<gpu::DeviceTable> tables_;
  std::int64_t room_ = 0;
  std::int64_t first_word_ = 0;
  python::ReadbackSlots::Slot* slot_ = nullptr;  // null once finished
  std::optional<nb::tuple> result_;              // finish()'s answer, once it has one
};

// gpu::table_changes_to_host on `device`'s `stream` into a readback slot, its event recorded.
std::unique_ptr<PendingTableRuns> begin_table_runs(nb::list lists, nb::list tables, std::int64_t room,
                                                   std::uintptr_t stream, int device) {
  std::vector<gpu::DeviceTable> ls, ts;
  for (nb::handle h : lists) ls.push_back(python::table_view_from(h));
  for (nb::handle h : tables) ts.push_back(python::table_view_from(h));
  // Checked before the words are counted, so that no slot is sized from a view past its
  // bounds, and before a slot is taken, so that a read past its counters costs no CUDA call.
  if (Status st = gpu::check_table_read(ls, ts, room); !st.ok()) raise(st);
  if (gpu::table_counter_words(ls.size() + ts.size()) > python::ReadbackSlots::kCounterWords)
    raise(error(ErrorCode::invalid_argument, std::to_string(ls.size() + ts.size()) +
                                                 " lists and tables: more than a read's counters hold"));
  const std::int64_t words = gpu::table_block_words(ls, ts, room);
  const std::int64_t first_word = gpu::table_block_words(ls, {}, room);  // the lists' words, ahead of the sections
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  python::ReadbackSlots::Slot* slot = nullptr;
  Status st = on_device(device, [&]() -> Status {
    const auto bytes = static_cast<std::size_t>(std::max<std::int64_t>(words, 1)) * sizeof(std::int64_t);
    Status r = python::readbacks().acquire(device, bytes, s, slot);
    if (r.ok())
      r = gpu::table_changes_to_host(ls, ts, room, slot->mapped, words, slot->counters,
                                     python::ReadbackSlots::kCounterWords, s);
    if (r.ok()) r = check(cudaEventRecord(slot->done, s), "cudaEventRecord(table changes)");
    // A kernel that may be queued unrecorded: waited for here, so that the slot is free when reused.
    if (!r.ok() && slot != nullptr) static_cast<void>(cudaStreamSynchronize(s));
    return r;
  });
  if (!st.ok()) {
    if (slot != nullptr) python::readbacks().release(slot);
    raise(st);
  }
  return std::make_unique<PendingTableRuns>(std::move(ts), room, first_word, slot);
}

void bind_table_runs(nb::module_& m) {
  // Docstrings put together once (nanobind copies them).
  static const std::string arguments =
      "lists and tables are (data pointer, 'bool' / 'int32' / 'int64', batch, length, batch stride, length stride, "
      "positions), a list of one batch (its values come back as int64 words, its positions flag unread). One "
      "kernel writes them into pinned memory, on `stream` of CUDA device `device`";
  static const std::string result =
      "([each table's runs as a masklens._core.TableRuns, or its change count where it exceeded room], the lists' "
      "values one after the other)";
  static const std::string finish_doc = "Waits for the read (the event recorded after its kernel, not the stream: "
                                        "work enqueued after it goes on) and returns " + result + "; called again, "
                                        "the same answer.";
  static const std::string begin_doc =
      "Enqueues the read of a definition's tables (gpu::table_changes_to_host, "
      "include/masklens/cuda/table_runs.hpp) without waiting: " + arguments + ", then an event. Returns a "
      "PendingTableRuns; its finish() waits. The lists and tables must stay alive until then (or be freed in "
      "`stream`'s order, as torch's caching allocator does).";

  nb::class_<PendingTableRuns>(m, "PendingTableRuns",
                               "A definition's tables read on the device, enqueued and not yet waited for "
                               "(table_runs_begin).")
      .def_prop_ro("finished", &PendingTableRuns::finished)
      .def_prop_ro("ready", &PendingTableRuns::ready, "Whether the read has completed (no wait).")
      .def("finish", &PendingTableRuns::finish, finish_doc.c_str());

  m.def("table_runs_begin", &begin_table_runs, "lists"_a, "tables"_a, "room"_a, "stream"_a, "device"_a,
        begin_doc.c_str());
}

}  // namespace

NB_MODULE(_cuda, m) {
  m.doc() = "masklens device scanner for CUDA tensors, on the caller's stream and memory";
  // Errors are masklens._core.MaskError, whichever module raises them.
  nb::object mask_error = nb::module_::import_("masklens._core").attr("MaskError");
  nb::register_exception_translator(
      [](const std::exception_ptr& p, void* payload) {
        try {
          std::rethrow_exception(p);
        } catch (const StatusError& e) {
          PyErr_SetString(static_cast<PyObject*>(payload), e.what());
        }
      },
      mask_error.release().ptr());  // kept for the interpreter's lifetime, as the module is

  bind_device(m);
  bind_scans(m);
  bind_block_masks(m);
  bind_uploads(m);
  bind_table_runs(m);
}
