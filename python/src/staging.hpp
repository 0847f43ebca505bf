// Pinned host memory masklens._cuda stages its copies through: the head of a device
// scan crossing to the host (one buffer per thread), small host tables crossing to a
// device (a ring of slots per device) and a definition's tables' changes crossing to the
// host for a reader that waits later (a slot per pending read). Part of the binding, not of the library: the
// library's entry points take the caller's host memory, and a framework stages it as it
// sees fit.
#pragma once

#include <cuda_runtime.h>

#include <masklens/cuda/check.cuh>
#include <masklens/status.hpp>

#include <cstddef>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

namespace masklens::python {

using masklens::gpu::detail::check;

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

inline PinnedStaging& staging() {
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

inline UploadStaging& uploads() {
  static auto* staging = new UploadStaging;  // never destroyed: see above
  return *staging;
}

// Pinned host memory a definition's table read (masklens/cuda/table_runs.hpp) writes
// into from the device while its reader goes on and waits later (read when the first
// attention layer needs the tables rather than in the mask function, where the wait would
// drain the stream): one slot per pending read, with the read's device counters and the
// event recorded after its kernel. A released slot goes back to its device's free list at
// once (a read dropped unwaited may leave its kernel queued), and is reused only once that
// event has completed; where none has, a new slot is made. Slots are never freed: at most
// as many exist as reads were pending at once. Never destroyed: a process's exit may find
// the driver unloaded.
class ReadbackSlots {
 public:
  // A slot holds at least this much (a definition's tables take a few KiB each), so that a
  // slot seldom grows: growing frees pinned memory, which synchronises the device.
  static constexpr std::size_t kMinBytes = 64 << 10;
  // Device counter words a slot holds: 60 launches of a read, 960 lists and tables.
  static constexpr std::int64_t kCounterWords = 1020;

  struct Slot {
    PinnedBuffer buffer;
    std::int64_t* mapped = nullptr;      // the device's view of buffer.data (cudaHostGetDevicePointer)
    const void* mapped_for = nullptr;    // the buffer.data it was asked for
    std::uint64_t* counters = nullptr;   // kCounterWords of device memory, zero between reads
    cudaEvent_t done = nullptr;  // recorded after the slot's read (never recorded: complete); of `device`
    int device = 0;
  };

  // A slot of the current device `device` holding `bytes` whose last read has completed: a
  // free one that is big enough and whose event says so, else a new one, its counters
  // allocated and zeroed in `stream`'s order (never a wait: the caller's stream is not to
  // be drained here). Device memory the pool cannot give is out_of_memory, not a device
  // error: the caller reads the tables another way. A stream capturing a CUDA graph is
  // refused (invalid_argument): a replay would write a slot later reads reuse, and counters
  // allocated in a capture belong to the graph.
  Status acquire(int device, std::size_t bytes, cudaStream_t stream, Slot*& out) {
    out = nullptr;
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    if (Status st = check(cudaStreamIsCapturing(stream, &capturing), "cudaStreamIsCapturing"); !st.ok()) return st;
    if (capturing != cudaStreamCaptureStatusNone)
      return error(ErrorCode::invalid_argument,
                   "the stream is capturing a CUDA graph: a definition's tables are read before the capture");
    Slot* slot = nullptr;
    {
      const std::lock_guard<std::mutex> hold(lock_);
      std::vector<Slot*>& free = free_[device];
      for (auto it = free.begin(); it != free.end(); ++it) {
        // Big enough (growing frees pinned memory, which synchronises the device) and done.
        if ((*it)->buffer.bytes < bytes) continue;
        const cudaError_t e = cudaEventQuery((*it)->done);
        if (e == cudaErrorNotReady) continue;
        if (e != cudaSuccess) return check(e, "cudaEventQuery(readback slot)");
        slot = *it;
        free.erase(it);
        break;
      }
    }
    Status st;
    if (slot == nullptr) {
      st = make(device, stream, slot);
      if (!st.ok()) return st;
    }
    st = slot->buffer.hold(bytes, bytes > kMinBytes ? bytes : kMinBytes, "cudaMallocHost(readback staging)");
    if (st.ok() && slot->mapped_for != slot->buffer.data) {
      void* mapped = nullptr;
      st = check(cudaHostGetDevicePointer(&mapped, slot->buffer.data, 0), "cudaHostGetDevicePointer(readback)");
      slot->mapped = static_cast<std::int64_t*>(mapped);
      slot->mapped_for = st.ok() ? slot->buffer.data : nullptr;
    }
    if (!st.ok()) {
      // A slot whose buffer failed to grow serves a smaller read later; one that holds none
      // would serve none, and goes (a host out of pinned memory must not pile up slots).
      if (slot->buffer.bytes == 0)
        destroy(slot, stream);
      else
        release(slot);
      return st;
    }
    out = slot;
    return st;
  }

  void release(Slot* slot) {
    const std::lock_guard<std::mutex> hold(lock_);
    free_[slot->device].push_back(slot);
  }

 private:
  static Status make(int device, cudaStream_t stream, Slot*& out) {
    auto* slot = new Slot;
    slot->device = device;
    void* counters = nullptr;
    const std::size_t bytes = kCounterWords * sizeof(std::uint64_t);
    Status st = check(cudaEventCreateWithFlags(&slot->done, cudaEventDisableTiming), "cudaEventCreateWithFlags(readback)");
    if (st.ok()) {
      const cudaError_t e = cudaMallocAsync(&counters, bytes, stream);
      if (e != cudaSuccess) counters = nullptr;  // unspecified on failure: nothing to free
      if (e == cudaErrorMemoryAllocation) {
        static_cast<void>(cudaGetLastError());  // not sticky: torch's next check must not find it
        st = error(ErrorCode::out_of_memory, "cudaMallocAsync(table read counters): out of device memory");
      } else {
        st = check(e, "cudaMallocAsync(table read counters)");
      }
    }
    if (st.ok()) st = check(cudaMemsetAsync(counters, 0, bytes, stream), "cudaMemsetAsync(table read counters)");
    // The slot is done only once its counters are zero: a slot released unused (its host
    // buffer failed) and taken by a read on another stream waits for that.
    if (st.ok()) st = check(cudaEventRecord(slot->done, stream), "cudaEventRecord(readback counters)");
    slot->counters = static_cast<std::uint64_t*>(counters);
    if (!st.ok()) {
      destroy(slot, stream);
      return st;
    }
    out = slot;
    return st;
  }

  // A slot no read holds, freed: its counters in `stream`'s order (after the memset that
  // zeroed them), its event once recorded work completes.
  static void destroy(Slot* slot, cudaStream_t stream) {
    if (slot->counters != nullptr) static_cast<void>(cudaFreeAsync(slot->counters, stream));
    if (slot->done != nullptr) static_cast<void>(cudaEventDestroy(slot->done));
    delete slot;
  }

  std::mutex lock_;
  std::map<int, std::vector<Slot*>> free_;
};

inline ReadbackSlots& readbacks() {
  static auto* slots = new ReadbackSlots;  // never destroyed: see above
  return *slots;
}

}  // namespace masklens::python
