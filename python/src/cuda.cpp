// masklens._cuda: the device scanner (include/masklens/cuda/scan.hpp) for CUDA tensors,
// built only where Meson finds nvcc. A module of its own so that masklens._core never
// needs the CUDA runtime: where this one cannot be loaded, the package still imports
// and copies CUDA masks to the host instead (masklens._scan).
//
// Memory comes from the caller (torch's caching allocator, in Python): scan.hpp's
// two-phase convention. query_runs() gives the temporary sizes of the scan and of the
// run reduction (cuda/runs.hpp); masklens._core.DeviceRuns lays out one block from them
// (device_runs.hpp); scan_runs() scans into it, reduces the spans to runs, copies the
// run count and the first 256 runs into host memory DeviceRuns owns, and synchronises
// the caller's stream once; copy_rest() brings more runs, where there are, with a
// second. O(runs) cross to the host, not O(rows). No allocation, no device-wide
// synchronisation.
//
// query_runs_tiles() / scan_runs_tiles() do the same from a scan that also counts the
// mask's tiles in its one read (cuda/tiles.hpp) and writes torch BlockMask's eight int32
// arrays into device tensors the caller allocated (masklens._block_mask.device_scan_tiles):
// the same block, its scan temporary sized for the tile counts.
#include <cuda_runtime.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <masklens/cuda/check.cuh>
#include <masklens/cuda/load_kernels.hpp>
#include <masklens/cuda/runs.hpp>
#include <masklens/cuda/scan.hpp>
#include <masklens/cuda/tiles.hpp>

#include <cstdint>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "device_runs.hpp"
#include "device_view.hpp"
#include "status_error.hpp"

namespace nb = nanobind;
using namespace nb::literals;
using namespace masklens;
using masklens::python::raise;
using masklens::python::StatusError;
using masklens::python::take;

// Every CUDA call checked as scan.cu checks its own ("cudaSetDevice:
// cudaErrorInvalidDevice: invalid device ordinal"), with the same helpers.
using masklens::gpu::detail::check;
using masklens::gpu::detail::keep_first;

namespace {

// Both size queries; neither makes a CUDA call.
std::pair<std::size_t, std::size_t> sizes_of(const MaskView& view) {
  std::size_t scan_temp = 0, reduce_temp = 0;
  const std::int64_t rows = gpu::span_rows(view);
  if (Status st = gpu::scan_spans(nullptr, scan_temp, view, nullptr); !st.ok()) raise(st);
  if (Status st = gpu::reduce_runs(nullptr, reduce_temp, nullptr, rows, view.q_len(), nullptr, 1, nullptr); !st.ok())
    raise(st);
  return {scan_temp, reduce_temp};
}

// The size query of the scan that counts tiles too (no CUDA call): it takes the scan's
// place in the block, so the layout is scan_runs()'s with its temporary storage.
std::size_t tiles_temp_of(const MaskView& view, TileSize size) {
  std::size_t temp = 0;
  if (Status st = gpu::scan_spans_tiles(nullptr, temp, view, size, nullptr, BlockMaskArrays{}); !st.ok()) raise(st);
  return temp;
}

// The block of `view` as masklens._core.DeviceRuns laid it out, checked against the
// caller's pointer and size. `tiles` (when given) is the tile size of scan_runs_tiles().
python::RunsBlock checked_block(const MaskView& view, std::uintptr_t d_block, std::size_t block_bytes,
                                const TileSize* tiles = nullptr) {
  auto [scan_temp, reduce_temp] = sizes_of(view);
  if (tiles != nullptr) scan_temp = tiles_temp_of(view, *tiles);
  const python::RunsBlock b = python::runs_block(gpu::span_rows(view), scan_temp, reduce_temp);
  if (d_block == 0) raise(error(ErrorCode::invalid_argument, "device block is null"));
  if (d_block % 256 != 0) raise(error(ErrorCode::misaligned_pointer, "device block is not 256-byte aligned"));
  if (block_bytes != b.bytes)
    raise(error(ErrorCode::invalid_argument, "device block holds " + std::to_string(block_bytes) +
                                                 " bytes; this view's layout needs " + std::to_string(b.bytes)));
  return b;
}

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

// A buffer of pinned host memory, grown by freeing it and allocating anew (its contents
// need not survive: each use writes it whole). Freed by its owner, if ever.
struct PinnedBuffer {
  void* data = nullptr;
  std::size_t bytes = 0;

  // At least `bytes` (an allocation of `allocate` bytes where it is smaller), or the
  // failing call, named `what`.
  Status hold(std::size_t bytes_needed, std::size_t allocate, const char* what) {
    if (bytes >= bytes_needed) return {};
    if (data != nullptr) static_cast<void>(cudaFreeHost(data));
    data = nullptr;
    bytes = 0;
    Status st = check(cudaMallocHost(&data, allocate), what);
    if (st.ok()) bytes = allocate;
    return st;
  }
};

// Pinned host memory the head crosses through: a device-to-host copy into pageable
// memory is staged by the driver and waited for (0.1 ms and more for a head of 16 KiB
// on an H200 host, against microseconds from pinned memory). One buffer per thread (the
// GIL is released around the copies), grown as needed and kept for the thread's life;
// its cudaFreeHost may meet a driver already unloaded at process exit, which is harmless
// and ignored.
class PinnedStaging {
 public:
  PinnedStaging() = default;
  PinnedStaging(const PinnedStaging&) = delete;
  PinnedStaging& operator=(const PinnedStaging&) = delete;
  ~PinnedStaging() {
    if (buffer_.data != nullptr) static_cast<void>(cudaFreeHost(buffer_.data));
  }
  // `bytes` of pinned memory for this thread, or the failing call.
  Status reserve(std::size_t bytes, void*& out) {
    Status st = buffer_.hold(bytes, bytes, "cudaMallocHost(pinned head staging)");
    out = buffer_.data;
    return st;
  }

 private:
  PinnedBuffer buffer_;
};

PinnedStaging& staging() {
  thread_local PinnedStaging buffer;
  return buffer;
}

// Pinned host memory that small host tables cross to a device through, enqueued without
// waiting: a copy from pageable memory is staged by the driver and can wait for the
// copies before it (0.1-1 ms for 64-256 KiB on an H200 host). Slots per device, each
// reused once the event recorded after its copy has completed; where every slot's copy
// is still queued (a host running ahead of its GPU) the ring grows, up to kMaxSlots,
// before it waits for the oldest. Never destroyed: a process's exit may find the driver
// unloaded.
class UploadStaging {
 public:
  static constexpr std::size_t kSlots = 4;      // slots reserve() allocates: the tables of a BlockMask or two
  // Copies in flight a device may have before one waits; with slots grown to the largest
  // table they carried (tile states of a report: up to a few MiB), this caps the pinned
  // memory a host running ahead of its GPU holds.
  static constexpr std::size_t kMaxSlots = 16;
  static constexpr std::size_t kMinBytes = 1 << 20;

  // Copies `bytes` at `host` to `d_dst` on stream `s` of the current device `device`. Not
  // while `s` captures a graph: a replay would copy from a slot later uploads reuse.
  Status upload(int device, const void* host, std::size_t bytes, void* d_dst, cudaStream_t s) {
    if (bytes == 0) return {};
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    if (Status st = check(cudaStreamIsCapturing(s, &capturing), "cudaStreamIsCapturing"); !st.ok()) return st;
    if (capturing != cudaStreamCaptureStatusNone)
      return error(ErrorCode::invalid_argument,
                   "the stream is capturing a CUDA graph: a host table's upload cannot be captured (a replay would "
                   "read staging memory later copies reuse); build the BlockMask before the capture");
    const std::lock_guard<std::mutex> hold(lock_);
    Slot* slot = nullptr;
    Status st = free_slot(rings_[device], slot);
    if (st.ok()) st = grow(*slot, bytes);
    if (!st.ok()) return st;
    std::memcpy(slot->buffer.data, host, bytes);
    st = check(cudaMemcpyAsync(d_dst, slot->buffer.data, bytes, cudaMemcpyHostToDevice, s),
               "cudaMemcpyAsync(to the device)");
    if (st.ok()) {
      st = check(cudaEventRecord(slot->done, s), "cudaEventRecord(upload)");
      // Unrecorded, the event would call the slot free while its copy may be queued.
      if (!st.ok()) static_cast<void>(cudaStreamSynchronize(s));
    }
    return st;
  }

  // The first kSlots slots of the current device `device` hold `bytes` (a first upload
  // then allocates nothing).
  Status reserve(int device, std::size_t bytes) {
    const std::lock_guard<std::mutex> hold(lock_);
    std::vector<Slot>& ring = rings_[device];
    Status st;
    while (st.ok() && ring.size() < kSlots) st = add(ring);
    for (std::size_t i = 0; st.ok() && i < kSlots; ++i) st = grow(ring[i], bytes);
    return st;
  }

 private:
  struct Slot {
    PinnedBuffer buffer;
    cudaEvent_t done = nullptr;  // recorded after the slot's last copy (never recorded: complete)
  };

  static Status add(std::vector<Slot>& ring) {
    Slot slot;
    Status st = check(cudaEventCreateWithFlags(&slot.done, cudaEventDisableTiming), "cudaEventCreateWithFlags(upload)");
    if (st.ok()) ring.push_back(slot);
    return st;
  }

  // A slot whose last copy has finished: the first found, else a new one, else the
  // oldest after waiting for it.
  Status free_slot(std::vector<Slot>& ring, Slot*& slot) {
    for (Slot& s : ring) {
      const cudaError_t e = cudaEventQuery(s.done);
      if (e == cudaSuccess) {
        slot = &s;
        return {};
      }
      if (e != cudaErrorNotReady) return check(e, "cudaEventQuery(upload slot)");
    }
    if (ring.size() < kMaxSlots) {
      Status st = add(ring);
      if (st.ok()) slot = &ring.back();
      return st;
    }
    slot = &ring[oldest_++ % ring.size()];
    return check(cudaEventSynchronize(slot->done), "cudaEventSynchronize(upload slot)");
  }

  static Status grow(Slot& slot, std::size_t bytes) {
    return slot.buffer.hold(bytes, bytes > kMinBytes ? bytes : kMinBytes, "cudaMallocHost(upload staging)");
  }

  std::mutex lock_;
  std::map<int, std::vector<Slot>> rings_;
  std::size_t oldest_ = 0;  // where a full ring waits next
};

UploadStaging& uploads() {
  static auto* staging = new UploadStaging;  // never destroyed: see above
  return *staging;
}

// A scan whose head copy is enqueued and not yet waited for (wait_runs(): at once for
// wait=True, by the caller for wait=False): one per thread, as the pinned staging its
// head is copied into is the thread's.
struct PendingHead {
  bool pending = false;
  const void* pinned = nullptr;  // the thread's staging, written by the enqueued copy
  std::uintptr_t h_head = 0;     // the caller's host head (masklens._core.DeviceRuns')
  std::size_t head_bytes = 0, count_at = 0;
  cudaStream_t stream = nullptr;
  int device = 0;
};

PendingHead& pending_head() {
  thread_local PendingHead head;
  return head;
}

}  // namespace

// The host head buffer scan_runs() and scan_runs_tiles() copy the count and first runs to.
void check_head(const python::RunsBlock& b, std::uintptr_t h_head, std::size_t head_bytes) {
  if (h_head == 0) raise(error(ErrorCode::invalid_argument, "host head buffer is null"));
  if (head_bytes != b.head_bytes())
    raise(error(ErrorCode::invalid_argument, "host head buffer holds " + std::to_string(head_bytes) +
                                                 " bytes; this view's block copies " + std::to_string(b.head_bytes())));
}

// The second half of the scan this thread enqueued (scan_reduce_copy, which calls it for
// wait=True; the caller does for wait=False): the stream synchronised, the head copied to
// its host buffer, the run count.
std::int64_t wait_runs(std::uintptr_t h_head) {
  PendingHead& pending = pending_head();
  if (!pending.pending)
    raise(error(ErrorCode::invalid_argument, "no scan enqueued with wait=False is pending on this thread"));
  if (h_head != pending.h_head)  // the caller's head buffer, still theirs: the copy lands there
    raise(error(ErrorCode::invalid_argument, "h_head is not the head buffer of the scan pending on this thread"));
  const PendingHead head = pending;
  pending = PendingHead{};  // waited for, whatever the outcome: the next scan may start
  Status st = on_device(head.device, [&]() -> Status {
    Status r = check(cudaStreamSynchronize(head.stream), "cudaStreamSynchronize");
    if (r.ok()) std::memcpy(reinterpret_cast<void*>(head.h_head), head.pinned, head.head_bytes);
    return r;
  });
  if (!st.ok()) raise(st);
  std::int64_t count = 0;
  std::memcpy(&count, reinterpret_cast<const void*>(head.h_head + head.count_at), sizeof count);
  return count;
}

// What scan_runs() and scan_runs_tiles() share around their scan, on `device` with the GIL
// released: scan(scan temporary, its bytes, the block's spans, stream), the head zeroed
// (the head copy reads bytes the kernels may leave unwritten, the count's padding and runs
// past the count: zeroed, initcheck sees no unwritten byte copied), the run reduction, the one copy of the count and the first runs to h_head (through this
// thread's pinned staging), then, with wait, wait_runs(): the one synchronisation of the
// stream. Returns the run count; with wait false, nothing past the enqueued copy: the
// caller's wait_runs() synchronises and returns the count (meanwhile the caller's thread
// is free, for host work the scan's results are not needed for).
template <class Scan>
std::optional<std::int64_t> scan_reduce_copy(const python::RunsBlock& b, std::uintptr_t d_block, std::int64_t q_len,
                                             std::uintptr_t h_head, std::uintptr_t stream, int device, bool wait,
                                             Scan&& scan) {
  PendingHead& pending = pending_head();
  if (pending.pending)
    raise(error(ErrorCode::invalid_argument,
                "a scan enqueued with wait=False on this thread was not waited for: call wait_runs(h_head) first"));
  auto* base = reinterpret_cast<std::uint8_t*>(d_block);
  const cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);  // gpu::Stream is the same type
  void* pinned = nullptr;
  Status st = on_device(device, [&]() -> Status {
    std::size_t scan_temp = b.scan_temp_bytes, reduce_temp = b.reduce_temp_bytes;
    Status r = scan(base + b.scan_temp_at, scan_temp, reinterpret_cast<RowSpan*>(base + b.spans_at), s);
    // The head is zeroed after the scan's launches (the scan writes none of it): a call
    // enqueued before the scan delays the read by its host time.
    if (r.ok()) r = check(cudaMemsetAsync(base, 0, b.head_bytes(), s), "cudaMemsetAsync(run count and first runs)");
    if (r.ok())
      r = gpu::reduce_runs(base + b.reduce_temp_at, reduce_temp, reinterpret_cast<const RowSpan*>(base + b.spans_at),
                           b.rows, q_len, reinterpret_cast<SpanRun*>(base + b.runs_at), b.room,
                           reinterpret_cast<std::int64_t*>(base + b.count_at),
                           reinterpret_cast<std::int64_t*>(base + b.first_invalid_at), s);
    if (r.ok()) r = staging().reserve(b.head_bytes(), pinned);
    if (r.ok())
      r = check(cudaMemcpyAsync(pinned, base, b.head_bytes(), cudaMemcpyDeviceToHost, s),
                "cudaMemcpyAsync(run count and first runs to the host)");
    return r;
  });
  if (!st.ok()) raise(st);
  pending = PendingHead{true, pinned, h_head, b.head_bytes(), b.count_at, s, device};
  if (!wait) return std::nullopt;
  return wait_runs(h_head);
}

namespace {

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

// The device scan in two phases on the caller's block (masklens._core.DeviceRuns lays it
// out): the size queries, the scans (with tiles or not), the wait and the runs past the
// first copy.
void bind_scans(nb::module_& m) {
  // The size queries of both phases (no CUDA call): (scan temporary bytes, run
  // reduction temporary bytes), for masklens._core.DeviceRuns to lay out the block.
  m.def(
      "query_runs",
      [](std::uintptr_t data, const std::string& dtype, const std::vector<std::int64_t>& shape,
         const std::vector<std::int64_t>& strides, float masked_threshold) {
        const MaskView view = take(python::view_of(data, dtype, shape, strides, masked_threshold));
        return sizes_of(view);
      },
      "data"_a, "dtype"_a, "shape"_a, "strides"_a, "masked_threshold"_a,
      "(scan temporary storage bytes, run reduction temporary storage bytes) of this view: the size query. "
      "No CUDA call.");

  m.def(
      "scan_runs",
      [](std::uintptr_t data, const std::string& dtype, const std::vector<std::int64_t>& shape,
         const std::vector<std::int64_t>& strides, float masked_threshold, std::uintptr_t d_block,
         std::size_t block_bytes, std::uintptr_t h_head, std::size_t head_bytes, std::uintptr_t stream, int device) {
        const MaskView view = take(python::view_of(data, dtype, shape, strides, masked_threshold));
        const python::RunsBlock b = checked_block(view, d_block, block_bytes);
        check_head(b, h_head, head_bytes);
        return *scan_reduce_copy(b, d_block, view.q_len(), h_head, stream, device, true,
                                 [&](void* temp, std::size_t& temp_bytes, RowSpan* rows, cudaStream_t s) {
                                   return gpu::scan_spans(temp, temp_bytes, view, rows, s);
                                 });
      },
      "data"_a, "dtype"_a, "shape"_a, "strides"_a, "masked_threshold"_a, "d_block"_a, "block_bytes"_a, "h_head"_a,
      "head_bytes"_a, "stream"_a, "device"_a,
      "Scans the device view into the block's spans on `stream` (a cudaStream_t as an int; 0 is the legacy default "
      "stream), reduces them to runs, copies the count and the first runs to h_head and synchronises the stream "
      "once. Returns the run count. Every pointer is the caller's; the layout is masklens._core.DeviceRuns'.");

  // The scan that also summarises tiles (cuda/tiles.hpp): the same block, its scan
  // temporary sized by scan_spans_tiles(), and torch BlockMask's eight int32 arrays
  // written into the caller's device tensors.
  m.def(
      "query_runs_tiles",
      [](std::uintptr_t data, const std::string& dtype, const std::vector<std::int64_t>& shape,
         const std::vector<std::int64_t>& strides, float masked_threshold, std::int64_t block_q, std::int64_t block_k) {
        const MaskView view = take(python::view_of(data, dtype, shape, strides, masked_threshold));
        const TileSize size{block_q, block_k};
        const std::size_t scan_temp = tiles_temp_of(view, size);  // checks the tile size and the grid
        const TileGrid g = take(tile_grid_for(view, size));
        return std::make_pair(std::make_pair(scan_temp, sizes_of(view).second),
                              std::vector<std::int64_t>{g.distinct_batch, g.distinct_heads, g.q_tiles(), g.k_tiles()});
      },
      "data"_a, "dtype"_a, "shape"_a, "strides"_a, "masked_threshold"_a, "block_q"_a, "block_k"_a,
      "((scan-with-tiles temporary bytes, run reduction temporary bytes), [distinct batch, distinct heads, q tiles, "
      "k tiles]) of this view at this tile size: the size query of scan_runs_tiles() and the grid its BlockMask arrays "
      "span ([B', H', q tiles] counts, [B', H', q tiles, k tiles] indices, the q side transposed). No CUDA call.");

  m.def(
      "scan_runs_tiles",
      [](std::uintptr_t data, const std::string& dtype, const std::vector<std::int64_t>& shape,
         const std::vector<std::int64_t>& strides, float masked_threshold, std::int64_t block_q, std::int64_t block_k,
         std::uintptr_t d_block, std::size_t block_bytes, std::uintptr_t h_head, std::size_t head_bytes,
         const std::vector<std::uintptr_t>& arrays, const std::vector<std::size_t>& array_bytes, std::uintptr_t stream,
         int device, std::uintptr_t d_states, std::size_t states_bytes, bool wait) {
        const MaskView view = take(python::view_of(data, dtype, shape, strides, masked_threshold));
        const TileSize size{block_q, block_k};
        const python::RunsBlock b = checked_block(view, d_block, block_bytes, &size);
        const TileGrid g = take(tile_grid_for(view, size));
        check_head(b, h_head, head_bytes);
        const BlockMaskArrays d_block_mask = block_mask_arrays(g, arrays, array_bytes);
        if (d_states != 0) check_states(g, states_bytes);
        auto* states = reinterpret_cast<TileState*>(d_states);
        // As scan_runs(), the scan now counting the tiles and writing the BlockMask too.
        return scan_reduce_copy(b, d_block, view.q_len(), h_head, stream, device, wait,
                                [&](void* temp, std::size_t& temp_bytes, RowSpan* rows, cudaStream_t s) {
                                  return gpu::scan_spans_tiles(temp, temp_bytes, view, size, rows, d_block_mask,
                                                               states, s);
                                });
      },
      "data"_a, "dtype"_a, "shape"_a, "strides"_a, "masked_threshold"_a, "block_q"_a, "block_k"_a, "d_block"_a,
      "block_bytes"_a, "h_head"_a, "head_bytes"_a, "arrays"_a, "array_bytes"_a, "stream"_a, "device"_a,
      "d_states"_a = 0, "states_bytes"_a = 0, "wait"_a = true,
      "scan_runs() reading the mask once for its tiles too: the block laid out with query_runs_tiles()' scan "
      "temporary, and torch BlockMask's eight int32 arrays (device addresses, in the order kv_num_blocks, kv_indices, "
      "full_kv_num_blocks, full_kv_indices, q_num_blocks, q_indices, full_q_num_blocks, full_q_indices, each "
      "contiguous over the grid query_runs_tiles() gives, with its size in bytes) written on the device; with "
      "d_states (a device address, states_bytes = one byte a tile), each tile's state too ([slice][q tile][k tile], "
      "0 empty, 1 partial, 2 full). Returns the run count; copy_rest() (with the same block) brings runs past the "
      "first copy. wait=False: returns None once everything is enqueued, before the synchronisation; wait_runs() "
      "on the same thread then synchronises and returns the count (no other scan may start on the thread before). "
      "Every argument is checked before any CUDA call.");

  m.def("wait_runs", &wait_runs, "h_head"_a,
        "The run count of the scan this thread enqueued with wait=False (scan_runs_tiles()): synchronises its "
        "stream and copies the head to h_head, the host head buffer that scan was given (it must still be alive). "
        "MaskError (invalid_argument) where none is pending or h_head is another buffer; after a CUDA error (raised "
        "here) none is pending.");

  m.def(
      "copy_rest",
      [](std::uintptr_t data, const std::string& dtype, const std::vector<std::int64_t>& shape,
         const std::vector<std::int64_t>& strides, float masked_threshold, std::uintptr_t d_block,
         std::size_t block_bytes, std::uintptr_t d_more, std::int64_t count, std::uintptr_t h_rest,
         std::size_t rest_bytes, std::uintptr_t stream, int device, std::int64_t block_q, std::int64_t block_k) {
        const MaskView view = take(python::view_of(data, dtype, shape, strides, masked_threshold));
        const TileSize size{block_q, block_k};  // block_q = 0: the block of scan_runs()
        const python::RunsBlock b = checked_block(view, d_block, block_bytes, block_q == 0 ? nullptr : &size);
        if (count <= b.eager || count > b.rows)
          raise(error(ErrorCode::invalid_argument, "copy_rest is for counts in (" + std::to_string(b.eager) + ", " +
                                                       std::to_string(b.rows) + "], got " + std::to_string(count)));
        const auto bytes = static_cast<std::size_t>(count - b.eager) * sizeof(SpanRun);
        if (h_rest == 0 || rest_bytes != bytes)
          raise(error(ErrorCode::invalid_argument, "host run buffer must hold " + std::to_string(bytes) +
                                                       " bytes, got " + std::to_string(h_rest == 0 ? 0 : rest_bytes)));
        if (count > b.room && d_more == 0)
          raise(error(ErrorCode::invalid_argument, std::to_string(count) + " runs exceed the block's room (" +
                                                       std::to_string(b.room) + "): pass device room for them all"));
        auto* base = reinterpret_cast<std::uint8_t*>(d_block);
        const cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
        Status st = on_device(device, [&]() -> Status {
          Status r;
          const SpanRun* from = reinterpret_cast<const SpanRun*>(base + b.runs_at);
          if (count > b.room) {  // reduce again into room for every run (the spans are still there)
            std::size_t reduce_temp = b.reduce_temp_bytes;
            r = gpu::reduce_runs(base + b.reduce_temp_at, reduce_temp,
                                 reinterpret_cast<const RowSpan*>(base + b.spans_at), b.rows, view.q_len(),
                                 reinterpret_cast<SpanRun*>(d_more), count,
                                 reinterpret_cast<std::int64_t*>(base + b.count_at), nullptr, s);
            from = reinterpret_cast<const SpanRun*>(d_more);
          }
          if (r.ok())
            r = check(cudaMemcpyAsync(reinterpret_cast<void*>(h_rest), from + b.eager, bytes,
                                      cudaMemcpyDeviceToHost, s),
                      "cudaMemcpyAsync(runs to the host)");
          if (r.ok()) r = check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
          return r;
        });
        if (!st.ok()) raise(st);
      },
      "data"_a, "dtype"_a, "shape"_a, "strides"_a, "masked_threshold"_a, "d_block"_a, "block_bytes"_a, "d_more"_a,
      "count"_a, "h_rest"_a, "rest_bytes"_a, "stream"_a, "device"_a, "block_q"_a = 0, "block_k"_a = 0,
      "After scan_runs() returned more runs than came with the count: copies runs [eager, count) to h_rest "
      "(reducing again into d_more, device room for `count` runs, where they exceed the block's room) and "
      "synchronises the stream: the second synchronisation. After scan_runs_tiles(), pass its block_q and block_k "
      "(its block's layout).");
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
          Status r = uploads().upload(device, reinterpret_cast<const void*>(h_ranges), ranges_bytes, ranges, s);
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
          return uploads().upload(device, reinterpret_cast<const void*>(h_data), bytes,
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
        if (Status st = on_device(device, [&] { return uploads().reserve(device, bytes); }); !st.ok()) raise(st);
      },
      "device"_a, "bytes"_a = UploadStaging::kMinBytes,
      "Allocates every upload() slot of CUDA device `device` at `bytes` now (masklens.load_kernels does), so that a "
      "first BlockMask allocates no pinned memory.");
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
}
