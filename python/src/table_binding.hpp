// A definition's table as both extension modules take it from Python, and its runs as they
// hand them back: masklens._table_runs describes a table (a tensor's memory) as (data
// pointer, 'bool' / 'int32' / 'int64', batch, length, batch stride, length stride,
// positions), and gets runs as (batches, length, batch, start, end, value).
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <masklens/definition.hpp>
#include <masklens/table_runs.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "status_error.hpp"

namespace masklens::python {

namespace nb = nanobind;

inline TableView table_view_from(nb::handle h) {
  const auto t = nb::cast<nb::tuple>(h);
  if (t.size() != 7)
    raise(error(ErrorCode::invalid_argument,
                "a table is (data, element, batch, length, batch_stride, length_stride, positions)"));
  TableView v;
  v.data = reinterpret_cast<const void*>(nb::cast<std::uintptr_t>(t[0]));
  const auto element = nb::cast<std::string>(t[1]);
  if (element == "bool") v.element = TableElement::boolean;
  else if (element == "int32") v.element = TableElement::int32;
  else if (element == "int64") v.element = TableElement::int64;
  else raise(error(ErrorCode::unsupported_dtype, "a table of " + element + " (bool, int32 or int64)"));
  v.batch = nb::cast<std::int64_t>(t[2]), v.length = nb::cast<std::int64_t>(t[3]);
  v.batch_stride = nb::cast<std::int64_t>(t[4]), v.length_stride = nb::cast<std::int64_t>(t[5]);
  v.positions = nb::cast<bool>(t[6]);
  return v;
}

// int64 numpy array owning a copy of `v`.
inline nb::ndarray<nb::numpy, std::int64_t, nb::ndim<1>> int64_array(std::vector<std::int64_t> v) {
  auto* data = new std::vector<std::int64_t>(std::move(v));
  nb::capsule owner(data, [](void* p) noexcept { delete static_cast<std::vector<std::int64_t>*>(p); });
  const std::size_t shape[1] = {data->size()};
  return {data->data(), 1, shape, owner};
}

inline nb::tuple runs_tuple(definition::TableRuns r) {
  return nb::make_tuple(r.batches, r.length, int64_array(std::move(r.batch)), int64_array(std::move(r.start)),
                        int64_array(std::move(r.end)), int64_array(std::move(r.value)));
}

}  // namespace masklens::python
