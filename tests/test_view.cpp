// MaskView: promotion to [B, H, Q, K], broadcasting, and every rejected view with the
// field and rule its message names.
#include <doctest/doctest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <masklens/masklens.hpp>

using namespace masklens;

TEST_SUITE("host") {

TEST_CASE("views are promoted to [B, H, Q, K] as SDPA broadcasts them") {
  std::vector<std::uint8_t> bytes(64, 1);
  SUBCASE("2-D is [Q, K]") {
    const std::int64_t shape[] = {4, 16}, strides[] = {16, 1};
    auto v = MaskView::make(bytes.data(), ElementType::boolean, shape, strides);
    REQUIRE(v.ok());
    CHECK(v->shape() == std::array<std::int64_t, 4>{1, 1, 4, 16});
    CHECK(v->stride(kBatch) == 0);
    CHECK(v->stride(kHeads) == 0);
  }
  SUBCASE("3-D is [H, Q, K]") {
    const std::int64_t shape[] = {2, 2, 16};
    auto v = MaskView::contiguous(bytes.data(), ElementType::boolean, shape);
    REQUIRE(v.ok());
    CHECK(v->shape() == std::array<std::int64_t, 4>{1, 2, 2, 16});
    CHECK(v->stride(kHeads) == 32);
  }
  SUBCASE("1-D is one row of keys") {
    const std::int64_t shape[] = {64};
    auto v = MaskView::contiguous(bytes.data(), ElementType::boolean, shape);
    REQUIRE(v.ok());
    CHECK(v->q_len() == 1);
    CHECK(v->k_len() == 64);
  }
  SUBCASE("size-1 dims read as stride 0, and broadcast_to expands them") {
    const std::int64_t shape[] = {1, 1, 4, 16};
    auto v = MaskView::contiguous(bytes.data(), ElementType::boolean, shape);
    REQUIRE(v.ok());
    auto b = v->broadcast_to(8, 4);
    REQUIRE(b.ok());
    CHECK(b->batch() == 8);
    CHECK(b->heads() == 4);
    CHECK(b->stride(kBatch) == 0);
    auto bad = b->broadcast_to(3, 4);
    REQUIRE_FALSE(bad.ok());
    CHECK(bad.status().message().find("cannot broadcast mask batch 8 to 3") != std::string::npos);
  }
}

TEST_CASE("bad views are rejected with a message naming the field and the rule") {
  alignas(16) static std::uint8_t bytes[256] = {};
  struct Bad {
    const char* name;
    const void* data;
    ElementType dtype;
    std::vector<std::int64_t> shape, strides;
    MaskEncoding enc;
    ErrorCode code;
    const char* message;
  };
  const MaskEncoding plain{};
  MaskEncoding masks_true{};
  masks_true.polarity = Polarity::true_masks;
  MaskEncoding nan_threshold{};
  nan_threshold.masked_threshold = std::numeric_limits<float>::quiet_NaN();
  MaskEncoding positive_threshold{};
  positive_threshold.masked_threshold = 1.0f;
  // The edges of "finite and negative": both infinities and both zeros are refused.
  MaskEncoding minus_inf_threshold{}, plus_inf_threshold{}, zero_threshold{}, minus_zero_threshold{};
  minus_inf_threshold.masked_threshold = -std::numeric_limits<float>::infinity();
  plus_inf_threshold.masked_threshold = std::numeric_limits<float>::infinity();
  zero_threshold.masked_threshold = 0.0f;
  minus_zero_threshold.masked_threshold = -0.0f;
  const std::vector<Bad> cases = {
      {"null data", nullptr, ElementType::boolean, {4, 4}, {4, 1}, plain, ErrorCode::invalid_argument, "data is null"},
      {"misaligned fp16", bytes + 1, ElementType::float16, {4, 4}, {4, 1}, plain, ErrorCode::misaligned_pointer,
       "not aligned to its element size (2 bytes for float16)"},
      {"misaligned fp32", bytes + 2, ElementType::float32, {4, 4}, {4, 1}, plain, ErrorCode::misaligned_pointer,
       "4 bytes for float32"},
      {"no dims", bytes, ElementType::boolean, {}, {}, plain, ErrorCode::invalid_shape, "1 to 4 dims, got 0"},
      {"five dims", bytes, ElementType::boolean, {1, 1, 1, 2, 2}, {4, 4, 4, 2, 1}, plain, ErrorCode::invalid_shape,
       "1 to 4 dims, got 5"},
      {"stride count", bytes, ElementType::boolean, {4, 4}, {1}, plain, ErrorCode::invalid_stride,
       "as many entries as shape"},
      {"zero query length", bytes, ElementType::boolean, {0, 4}, {4, 1}, plain, ErrorCode::invalid_shape,
       "shape[0] (query length) must be >= 1, got 0"},
      {"negative key length", bytes, ElementType::boolean, {4, -4}, {4, 1}, plain, ErrorCode::invalid_shape,
       "shape[1] (key length) must be >= 1, got -4"},
      {"zero batch", bytes, ElementType::boolean, {0, 1, 4, 4}, {16, 16, 4, 1}, plain, ErrorCode::invalid_shape,
       "shape[0] (batch)"},
      {"negative stride", bytes, ElementType::boolean, {4, 4}, {-4, 1}, plain, ErrorCode::invalid_stride,
       "strides[0] must be >= 0, got -4"},
      {"overflowing extent", bytes, ElementType::boolean, {4, 4}, {INT64_MAX / 2, 1}, plain,
       ErrorCode::invalid_stride, "overflows 64 bits"},
      {"overflowing byte extent", bytes, ElementType::float32, {2, 4}, {INT64_MAX / 3, 1}, plain,
       ErrorCode::invalid_stride, "byte offset overflows"},
      {"unknown dtype", bytes, static_cast<ElementType>(42), {4, 4}, {4, 1}, plain, ErrorCode::unsupported_dtype,
       "not a mask element type"},
      {"polarity on additive", bytes, ElementType::bfloat16, {4, 4}, {4, 1}, masks_true, ErrorCode::invalid_argument,
       "true_masks applies to boolean/integer masks"},
      {"NaN threshold", bytes, ElementType::float32, {4, 4}, {4, 1}, nan_threshold, ErrorCode::invalid_argument,
       "masked_threshold must be finite and negative"},
      {"positive threshold", bytes, ElementType::float32, {4, 4}, {4, 1}, positive_threshold,
       ErrorCode::invalid_argument, "masked_threshold must be finite and negative"},
      {"-inf threshold", bytes, ElementType::float32, {4, 4}, {4, 1}, minus_inf_threshold,
       ErrorCode::invalid_argument, "masked_threshold must be finite and negative"},
      {"+inf threshold", bytes, ElementType::float16, {4, 4}, {4, 1}, plus_inf_threshold,
       ErrorCode::invalid_argument, "masked_threshold must be finite and negative"},
      {"zero threshold", bytes, ElementType::bfloat16, {4, 4}, {4, 1}, zero_threshold,
       ErrorCode::invalid_argument, "masked_threshold must be finite and negative"},
      {"-0 threshold", bytes, ElementType::float32, {4, 4}, {4, 1}, minus_zero_threshold,
       ErrorCode::invalid_argument, "masked_threshold must be finite and negative"},
  };
  for (const Bad& c : cases) {
    INFO(c.name);
    auto v = MaskView::make(c.data, c.dtype, c.shape, c.strides, c.enc);
    REQUIRE_FALSE(v.ok());
    CHECK(v.status().code() == c.code);
    CHECK_MESSAGE(v.status().message().find(c.message) != std::string::npos, v.status().message());
  }
  SUBCASE("the most negative finite threshold and the smallest negative one are accepted") {
    for (const float t : {std::numeric_limits<float>::lowest(), -std::numeric_limits<float>::denorm_min()}) {
      MaskEncoding enc{};
      enc.masked_threshold = t;
      const std::int64_t shape[] = {4, 4};
      CHECK(MaskView::contiguous(bytes, ElementType::float32, shape, enc).ok());
    }
  }
  SUBCASE("contiguous() rejects shapes whose element count overflows") {
    const std::int64_t shape[] = {INT64_MAX / 2, 4};
    auto v = MaskView::contiguous(bytes, ElementType::boolean, shape);
    REQUIRE_FALSE(v.ok());
    CHECK(v.status().code() == ErrorCode::invalid_shape);
  }
  SUBCASE("a default view does not scan") {
    auto r = scan(MaskView{});
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().message().find("data is null") != std::string::npos);
  }
}

TEST_CASE("Result carries the status text") {
  Result<int> r = error(ErrorCode::parse_error, "bad token");
  CHECK_FALSE(r.ok());
  CHECK(r.status().to_string() == "parse_error: bad token");
  Result<int> ok = 3;
  CHECK(*ok == 3);
}

}  // TEST_SUITE
