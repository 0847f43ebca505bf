// masklens._cuda: the device scanner (include/masklens/cuda/scan.hpp) for CUDA tensors,
// built only where Meson finds nvcc. A module of its own so that masklens._core never
// needs the CUDA runtime: where this one cannot be loaded, the package still imports
// and copies CUDA masks to the host instead (masklens._cache).
//
// Memory comes from the caller (torch's caching allocator, in Python): scan.hpp's
// two-phase convention. query() says how many bytes of temporary storage and of spans
// a view needs; scan() enqueues the kernel on the caller's stream, copies the spans
// into host memory the caller owns (a masklens._core.DeviceScan), and synchronises that
// stream once. No allocation, no device-wide synchronisation.
#include <cuda_runtime.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <masklens/cuda/check.cuh>
#include <masklens/cuda/scan.hpp>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

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

  m.def("built_with_cuda", &gpu::built_with_cuda);
  m.def(
      "device_count", [] { return take(gpu::device_count()); },
      "CUDA devices this process can use; MaskError (device_error) naming the call when none.");

  m.def(
      "query",
      [](std::uintptr_t data, const std::string& dtype, const std::vector<std::int64_t>& shape,
         const std::vector<std::int64_t>& strides, float masked_threshold) {
        const MaskView view = take(python::view_of(data, dtype, shape, strides, masked_threshold));
        std::size_t temp_bytes = 0;
        if (Status st = gpu::scan_spans(nullptr, temp_bytes, view, nullptr); !st.ok()) raise(st);
        const auto span_bytes = static_cast<std::size_t>(gpu::span_rows(view)) * sizeof(RowSpan);
        return std::make_pair(temp_bytes, span_bytes);
      },
      "data"_a, "dtype"_a, "shape"_a, "strides"_a, "masked_threshold"_a,
      "(temporary storage bytes, span bytes) the scan of this view needs: the size query. No CUDA call.");

  m.def(
      "scan",
      [](std::uintptr_t data, const std::string& dtype, const std::vector<std::int64_t>& shape,
         const std::vector<std::int64_t>& strides, float masked_threshold, std::uintptr_t d_temp,
         std::size_t temp_bytes, std::uintptr_t d_spans, std::uintptr_t h_spans, std::size_t span_bytes,
         std::uintptr_t stream, int device) {
        const MaskView view = take(python::view_of(data, dtype, shape, strides, masked_threshold));
        const auto bytes = static_cast<std::size_t>(gpu::span_rows(view)) * sizeof(RowSpan);
        if (span_bytes != bytes)
          raise(error(ErrorCode::invalid_argument, "span buffers hold " + std::to_string(span_bytes) +
                                                       " bytes; this view needs " + std::to_string(bytes)));
        if (h_spans == 0) raise(error(ErrorCode::invalid_argument, "host span buffer is null"));
        // gpu::Stream and cudaStream_t are the same type (CUstream_st*).
        const cudaStream_t cuda_stream = reinterpret_cast<cudaStream_t>(stream);
        Status st;
        {
          nb::gil_scoped_release unlocked;
          // The stream belongs to the tensor's device; launches go to the current one.
          int previous = -1;
          st = check(cudaGetDevice(&previous), "cudaGetDevice");
          const bool switched = st.ok() && previous != device;
          if (switched) st = check(cudaSetDevice(device), "cudaSetDevice");
          if (st.ok())
            st = gpu::scan_spans(reinterpret_cast<void*>(d_temp), temp_bytes, view,
                                 reinterpret_cast<RowSpan*>(d_spans), cuda_stream);
          if (st.ok())
            st = check(cudaMemcpyAsync(reinterpret_cast<void*>(h_spans), reinterpret_cast<const void*>(d_spans), bytes,
                                       cudaMemcpyDeviceToHost, cuda_stream),
                       "cudaMemcpyAsync(spans to the host)");
          // The one synchronisation: the host reads the spans only after it.
          if (st.ok())
            st = check(cudaStreamSynchronize(cuda_stream), "cudaStreamSynchronize");
          if (switched) keep_first(st, check(cudaSetDevice(previous), "cudaSetDevice(back)"));
        }
        if (!st.ok()) raise(st);
      },
      "data"_a, "dtype"_a, "shape"_a, "strides"_a, "masked_threshold"_a, "d_temp"_a, "temp_bytes"_a, "d_spans"_a,
      "h_spans"_a, "span_bytes"_a, "stream"_a, "device"_a,
      "Scans the device view into d_spans on `stream` (a cudaStream_t as an int; 0 is the legacy default stream), "
      "copies the spans to h_spans and synchronises the stream once. Every pointer is the caller's.");
}
