// A failed Status on its way to Python: both extension modules throw it, and each maps
// it to its own exception type (masklens.MaskError, a RuntimeError, the type torch
// raises for bad attention inputs); the message starts with the error code.
#pragma once

#include <stdexcept>
#include <utility>

#include <masklens/status.hpp>

namespace masklens::python {

struct StatusError : std::runtime_error {
  explicit StatusError(const Status& s) : std::runtime_error(s.to_string()) {}
};

[[noreturn]] inline void raise(const Status& s) { throw StatusError(s); }

template <class T>
T take(Result<T> r) {
  if (!r) raise(r.status());
  return std::move(r).value();
}

}  // namespace masklens::python
