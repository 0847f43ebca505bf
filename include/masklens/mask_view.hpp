// MaskView: a non-owning, validated view of a 1-4-D attention mask promoted to
// [batch, heads, query, key] with torch SDPA's broadcasting rules. Views are cheap
// values (the mdspan habit); every precondition is checked once, in make(), and
// reported with the field and rule it broke.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <span>
#include <string>

#include "config.hpp"
#include "element.hpp"
#include "status.hpp"

namespace masklens {

// How to read element values; the shape and strides say where they are.
struct MaskEncoding {
  Polarity polarity = Polarity::true_attends;
  // Additive masks: a finite value at or below this is "masked" (exp underflows to 0
  // for any realistic logit). Covers -1e4 in bf16 (-9984), -1e9, -65504, finfo.min.
  float masked_threshold = -1000.0f;
};

inline constexpr int kMaxDims = 4;
enum Dim : int { kBatch = 0, kHeads = 1, kQuery = 2, kKey = 3 };

class MaskView {
 public:
  MaskView() = default;

  // shape and strides are in elements, outermost first, 1 to 4 dims; a 2-D mask is
  // [Q, K], a 3-D one [H, Q, K] (right-aligned, as broadcasting aligns it). A stride
  // of 0 broadcasts; a dimension of size 1 is read as stride 0.
  static Result<MaskView> make(const void* data, ElementType dtype, std::span<const std::int64_t> shape,
                               std::span<const std::int64_t> strides, MaskEncoding encoding = {}) {
    if (shape.empty() || shape.size() > kMaxDims)
      return error(ErrorCode::invalid_shape,
                   "shape must have 1 to 4 dims, got " + std::to_string(shape.size()));
    if (strides.size() != shape.size())
      return error(ErrorCode::invalid_stride, "strides must have as many entries as shape (" +
                                                  std::to_string(shape.size()) + "), got " +
                                                  std::to_string(strides.size()));
    MaskView v;
    v.data_ = data;
    v.dtype_ = dtype;
    v.encoding_ = encoding;
    const std::size_t offset = kDims - shape.size();
    for (std::size_t d = 0; d < kDims; ++d) {
      v.shape_[d] = 1;
      v.strides_[d] = 0;
    }
    static constexpr const char* kNames[kMaxDims] = {"batch", "heads", "query length", "key length"};
    for (std::size_t i = 0; i < shape.size(); ++i) {
      const std::size_t d = offset + i;
      const std::string where = "shape[" + std::to_string(i) + "] (" + kNames[d] + ")";
      if (shape[i] < 1)
        return error(ErrorCode::invalid_shape, where + " must be >= 1, got " + std::to_string(shape[i]));
      if (strides[i] < 0)
        return error(ErrorCode::invalid_stride, "strides[" + std::to_string(i) + "] must be >= 0, got " +
                                                    std::to_string(strides[i]) +
                                                    " (negative strides are not supported)");
      v.shape_[d] = shape[i];
      v.strides_[d] = shape[i] == 1 ? 0 : strides[i];
    }
    if (Status s = v.validate(); !s.ok()) return s;
    return v;
  }

  // A dense row-major (C order) mask.
  static Result<MaskView> contiguous(const void* data, ElementType dtype, std::span<const std::int64_t> shape,
                                     MaskEncoding encoding = {}) {
    std::array<std::int64_t, kMaxDims> strides{};
    std::int64_t running = 1;
    for (std::size_t i = shape.size(); i-- > 0 && i < kMaxDims;) {
      strides[i] = running;
      if (shape[i] > 0 && !mul_fits(running, shape[i]))
        return error(ErrorCode::invalid_shape, "shape's element count overflows 64 bits");
      running *= shape[i] > 0 ? shape[i] : 1;
    }
    return make(data, dtype, shape, std::span<const std::int64_t>(strides.data(), shape.size()), encoding);
  }

  // Expands size-1 batch/head dims to the call's batch and heads (stride 0), as SDPA
  // broadcasts the mask against [B, H, Q, K].
  [[nodiscard]] Result<MaskView> broadcast_to(std::int64_t batch, std::int64_t heads) const {
    MaskView v = *this;
    const std::int64_t want[2] = {batch, heads};
    for (std::size_t d = 0; d < 2; ++d) {
      if (want[d] < 1)
        return error(ErrorCode::invalid_shape, std::string(d == 0 ? "batch" : "heads") + " must be >= 1, got " +
                                                   std::to_string(want[d]));
      if (shape_[d] == want[d]) continue;
      if (shape_[d] != 1)
        return error(ErrorCode::invalid_shape, std::string("cannot broadcast mask ") +
                                                   (d == 0 ? "batch " : "heads ") + std::to_string(shape_[d]) +
                                                   " to " + std::to_string(want[d]) + " (only size 1 broadcasts)");
      v.shape_[d] = want[d];
      v.strides_[d] = 0;
    }
    return v;
  }

  [[nodiscard]] const void* data() const noexcept { return data_; }
  [[nodiscard]] ElementType dtype() const noexcept { return dtype_; }
  [[nodiscard]] const MaskEncoding& encoding() const noexcept { return encoding_; }
  [[nodiscard]] std::int64_t shape(int d) const noexcept { return shape_[dim(d)]; }
  [[nodiscard]] std::int64_t stride(int d) const noexcept { return strides_[dim(d)]; }
  [[nodiscard]] std::int64_t batch() const noexcept { return shape_[kBatch]; }
  [[nodiscard]] std::int64_t heads() const noexcept { return shape_[kHeads]; }
  [[nodiscard]] std::int64_t q_len() const noexcept { return shape_[kQuery]; }
  [[nodiscard]] std::int64_t k_len() const noexcept { return shape_[kKey]; }
  [[nodiscard]] const std::array<std::int64_t, kMaxDims>& shape() const noexcept { return shape_; }
  [[nodiscard]] const std::array<std::int64_t, kMaxDims>& strides() const noexcept { return strides_; }

  // Element offset (in elements) of [b, h, q, k]; indices are in range by precondition.
  [[nodiscard]] std::int64_t offset(std::int64_t b, std::int64_t h, std::int64_t q, std::int64_t k) const noexcept {
    return b * strides_[0] + h * strides_[1] + q * strides_[2] + k * strides_[3];
  }
  [[nodiscard]] const std::uint8_t* element_ptr(std::int64_t b, std::int64_t h, std::int64_t q,
                                                std::int64_t k) const noexcept {
    return static_cast<const std::uint8_t*>(data_) + offset(b, h, q, k) * element_size(dtype_);
  }
  // Bytes from data() to the end of the last element: what a copy of the mask must hold.
  [[nodiscard]] std::int64_t extent_bytes() const noexcept {
    std::int64_t last = 0;
    for (std::size_t d = 0; d < kDims; ++d) last += (shape_[d] - 1) * strides_[d];
    return (last + 1) * element_size(dtype_);
  }
  [[nodiscard]] ElementClass at(std::int64_t b, std::int64_t h, std::int64_t q, std::int64_t k) const noexcept {
    return classify_element(element_ptr(b, h, q, k), dtype_, encoding_.polarity, encoding_.masked_threshold);
  }

 private:
  // The arrays' index type: dims are counted as int in the API (Dim, shape(int)).
  static constexpr std::size_t kDims = kMaxDims;
  static constexpr std::size_t dim(int d) noexcept { return static_cast<std::size_t>(d); }

  static bool mul_fits(std::int64_t a, std::int64_t b) noexcept {
    return a == 0 || b <= INT64_MAX / a;
  }

  Status validate() const {
    switch (dtype_) {
      case ElementType::boolean: case ElementType::uint8: case ElementType::int8:
      case ElementType::float16: case ElementType::bfloat16: case ElementType::float32: break;
      default: return error(ErrorCode::unsupported_dtype, "dtype " + std::to_string(static_cast<int>(dtype_)) +
                                                              " is not a mask element type");
    }
    if (data_ == nullptr) return error(ErrorCode::invalid_argument, "data is null");
    const auto size = static_cast<std::uintptr_t>(element_size(dtype_));
    if (reinterpret_cast<std::uintptr_t>(data_) % size != 0)
      return error(ErrorCode::misaligned_pointer, "data is not aligned to its element size (" +
                                                      std::to_string(size) + " bytes for " +
                                                      std::string(to_string(dtype_)) + ")");
    if (is_additive(dtype_)) {
      if (encoding_.polarity != Polarity::true_attends)
        return error(ErrorCode::invalid_argument,
                     "polarity true_masks applies to boolean/integer masks, not additive " +
                         std::string(to_string(dtype_)));
      // Finite and negative, written with comparisons (NaN fails both) to keep <cmath>
      // out of what every consumer parses.
      const float t = encoding_.masked_threshold;
      if (!(t >= std::numeric_limits<float>::lowest() && t < 0.0f))
        return error(ErrorCode::invalid_argument, "masked_threshold must be finite and negative, got " +
                                                      std::to_string(encoding_.masked_threshold));
    }
    // The largest element offset, and then its byte offset, must fit in 64 bits.
    std::int64_t extent = 0;
    for (std::size_t d = 0; d < kDims; ++d) {
      if (!mul_fits(shape_[d] - 1, strides_[d]) || extent > INT64_MAX - (shape_[d] - 1) * strides_[d])
        return error(ErrorCode::invalid_stride, "the largest element offset overflows 64 bits");
      extent += (shape_[d] - 1) * strides_[d];
    }
    if (!mul_fits(extent + 1, static_cast<std::int64_t>(size)))
      return error(ErrorCode::invalid_stride, "the largest byte offset overflows 64 bits");
    if (static_cast<std::uint64_t>(extent) * size >= UINTPTR_MAX - reinterpret_cast<std::uintptr_t>(data_))
      return error(ErrorCode::invalid_stride, "the mask's extent runs past the end of the address space");
    return {};
  }

  const void* data_ = nullptr;
  ElementType dtype_ = ElementType::boolean;
  MaskEncoding encoding_{};
  std::array<std::int64_t, kMaxDims> shape_{1, 1, 1, 1};
  std::array<std::int64_t, kMaxDims> strides_{0, 0, 0, 0};
};

}  // namespace masklens
