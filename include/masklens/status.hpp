// Status and Result<T>: how every layer reports failure. No exception crosses the
// public API, so a C or Python binding can forward the code and message as values.
#pragma once

#include <new>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

namespace masklens {

enum class ErrorCode {
  ok = 0,
  invalid_argument,   // a parameter outside its documented domain
  invalid_shape,      // sizes that are zero, negative, too many dims or overflowing
  invalid_stride,     // negative strides or an extent that overflows 64 bits
  misaligned_pointer, // data not aligned to its element size
  unsupported_dtype,  // an element type this operation does not read
  invalid_value,      // an element that has no meaning as a mask (NaN, +inf)
  out_of_memory,
  io_error,
  parse_error,
  device_error,       // a CUDA runtime call failed
};

constexpr std::string_view to_string(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::ok: return "ok";
    case ErrorCode::invalid_argument: return "invalid_argument";
    case ErrorCode::invalid_shape: return "invalid_shape";
    case ErrorCode::invalid_stride: return "invalid_stride";
    case ErrorCode::misaligned_pointer: return "misaligned_pointer";
    case ErrorCode::unsupported_dtype: return "unsupported_dtype";
    case ErrorCode::invalid_value: return "invalid_value";
    case ErrorCode::out_of_memory: return "out_of_memory";
    case ErrorCode::io_error: return "io_error";
    case ErrorCode::parse_error: return "parse_error";
    case ErrorCode::device_error: return "device_error";
  }
  return "unknown";
}

// A code and a message that names the argument and the rule it broke.
class Status {
 public:
  Status() = default;
  Status(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}

  [[nodiscard]] bool ok() const noexcept { return code_ == ErrorCode::ok; }
  [[nodiscard]] ErrorCode code() const noexcept { return code_; }
  [[nodiscard]] const std::string& message() const noexcept { return message_; }
  // "invalid_shape: shape[2] (query length) must be >= 1, got 0"
  [[nodiscard]] std::string to_string() const {
    return ok() ? std::string("ok") : std::string(masklens::to_string(code_)) + ": " + message_;
  }

 private:
  ErrorCode code_ = ErrorCode::ok;
  std::string message_;
};

inline Status error(ErrorCode code, std::string message) { return Status(code, std::move(message)); }

// A value or the Status that explains why there is none (std::expected is C++23).
template <class T>
class Result {
 public:
  Result(T value) : state_(std::in_place_index<0>, std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : state_(std::in_place_index<1>, std::move(status)) {  // NOLINT
    if (std::get<1>(state_).ok())
      std::get<1>(state_) = Status(ErrorCode::invalid_argument, "Result built from an ok Status without a value");
  }

  [[nodiscard]] bool ok() const noexcept { return state_.index() == 0; }
  explicit operator bool() const noexcept { return ok(); }

  // Precondition: ok(). Checked: calling value() on an error is a programming error
  // and reports through std::bad_variant_access rather than undefined behaviour.
  T& value() & { return std::get<0>(state_); }
  const T& value() const& { return std::get<0>(state_); }
  T&& value() && { return std::get<0>(std::move(state_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  [[nodiscard]] Status status() const { return ok() ? Status() : std::get<1>(state_); }

 private:
  std::variant<T, Status> state_;
};

// Runs f() and turns an allocation failure into a Status, so entry points that build
// vectors keep the "no exception crosses the API" promise.
template <class F>
auto catch_alloc(F&& f) noexcept -> decltype(f()) {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    return Status(ErrorCode::out_of_memory, "allocation failed");
  } catch (const std::length_error&) {
    return Status(ErrorCode::out_of_memory, "allocation too large");
  }
}

}  // namespace masklens
