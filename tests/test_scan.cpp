// The host scanner against the element-by-element definition of a RowSpan, for every
// element type, value encoding, stride and thread count.
#include <doctest/doctest.h>

#include <sys/mman.h>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "support/mask_gen.hpp"

using namespace masklens;
using namespace masklens::testing;

namespace {

// RowSpan of one row straight from the definition.
RowSpan reference_row(const MaskView& v, std::int64_t b, std::int64_t h, std::int64_t q) {
  RowSpan s;
  for (std::int64_t k = 0; k < v.k_len(); ++k) {
    const ElementClass c = v.at(b, h, q, k);
    if (c == ElementClass::bias) s.flags |= kRowBias;
    if (c == ElementClass::finite_masked) s.flags |= kRowFiniteMasked;
    if (attends(c)) s = merge(s, RowSpan::interval(k, k));
  }
  return s;
}

void check_against_reference(const MaskView& v, const SpanTable& t) {
  for (std::int64_t b = 0; b < v.batch(); ++b)
    for (std::int64_t h = 0; h < v.heads(); ++h) {
      const auto rows = t.slice(b, h);
      for (std::int64_t q = 0; q < v.q_len(); ++q) {
        const RowSpan want = reference_row(v, b, h, q), got = rows[static_cast<std::size_t>(q)];
        REQUIRE(got.count == want.count);
        REQUIRE(got.same_keys(want));
        REQUIRE(got.flags == want.flags);
      }
    }
}

}  // namespace

TEST_SUITE("host") {

TEST_CASE("element values: additive encodings") {
  CHECK(classify_additive(0.0f, -1000) == ElementClass::allowed);
  CHECK(classify_additive(-0.0f, -1000) == ElementClass::allowed);
  CHECK(classify_additive(-std::numeric_limits<float>::infinity(), -1000) == ElementClass::masked);
  CHECK(classify_additive(-1e9f, -1000) == ElementClass::finite_masked);
  CHECK(classify_additive(-1000.0f, -1000) == ElementClass::finite_masked);
  CHECK(classify_additive(-999.0f, -1000) == ElementClass::bias);
  CHECK(classify_additive(0.5f, -1000) == ElementClass::bias);
  CHECK(classify_additive(std::numeric_limits<float>::quiet_NaN(), -1000) == ElementClass::invalid);
  CHECK(classify_additive(std::numeric_limits<float>::infinity(), -1000) == ElementClass::invalid);
  CHECK(classify_additive(std::numeric_limits<float>::lowest(), -1000) == ElementClass::finite_masked);
  // bf16 -10000 rounds to -9984; fp16 -65504 is its finfo.min.
  CHECK(bfloat16_to_float(0xC61C) == -9984.0f);
  CHECK(float16_to_float(0xFBFF) == -65504.0f);
  CHECK(float16_to_float(0x0001) == std::ldexp(1.0f, -24));  // smallest subnormal
  CHECK(float16_to_float(0x3C00) == 1.0f);
  CHECK(std::isnan(float16_to_float(0x7E00)));
  CHECK(std::isinf(float16_to_float(0xFC00)));
}

TEST_CASE("every 16-bit pattern decodes exactly like a float conversion") {
  for (std::uint32_t bits = 0; bits < 0x10000; ++bits) {
    const auto h = static_cast<std::uint16_t>(bits);
    const float f = float16_to_float(h);
    // Rebuild binary16 from the float and compare (NaN payloads aside).
    if (std::isnan(f)) {
      CHECK(((h >> 10) & 0x1f) == 0x1f);
      continue;
    }
    const int exp = (h >> 10) & 0x1f;
    const int man = h & 0x3ff;
    const float mag = exp == 0 ? std::ldexp(static_cast<float>(man), -24)
                    : exp == 31 ? std::numeric_limits<float>::infinity()
                                : std::ldexp(static_cast<float>(man | 0x400), exp - 25);
    REQUIRE(f == ((h & 0x8000) ? -mag : mag));
  }
}

TEST_CASE("scanner matches the element-wise reference on random masks of every type and layout") {
  Rng rng(test_seed(11));
  const ElementType types[] = {ElementType::boolean, ElementType::uint8, ElementType::int8,
                               ElementType::float16, ElementType::bfloat16, ElementType::float32};
  for (int i = 0; i < 400; ++i) {
    const std::int64_t q_len = uniform(rng, 1, 40), k_len = uniform(rng, 1, 300);
    // Random noise, not structure: holes, runs and values anywhere, including word edges.
    MaskStructure spec = random_structure(rng, 1, q_len, k_len);
    DenseMask dense = render(spec, uniform(rng, 1, 2), types[uniform(rng, 0, 5)],
                             coin(rng) ? Polarity::true_masks : Polarity::true_attends,
                             static_cast<Layout>(uniform(rng, 0, 3)), rng, 0.2);
    // Punch random holes so rows are often not intervals.
    auto* raw = const_cast<std::uint8_t*>(dense.view.element_ptr(0, 0, 0, 0));
    const int esize = element_size(dense.view.dtype());
    for (int flip = 0; flip < 5; ++flip) {
      const std::int64_t q = uniform(rng, 0, q_len - 1), k = uniform(rng, 0, k_len - 1);
      const bool was = attends(dense.view.at(0, 0, q, k));
      write_value(raw + dense.view.offset(0, 0, q, k) * esize, dense.view.dtype(), dense.view.encoding().polarity,
                  was ? Value::masked : Value::allowed, flip);
    }
    for (int threads : {1, 3}) {
      auto t = scan(dense.view, ScanOptions{threads});
      REQUIRE(t.ok());
      INFO(dense.describe << " threads " << threads);
      check_against_reference(dense.view, *t);
    }
  }
}

TEST_CASE("additive rows 16 bytes at a time: every value, in every lane, as the element-wise reference") {
  struct Type {
    ElementType dtype;
    std::uint32_t neg_inf, lowest;  // -inf and the most negative finite value (finfo.min)
  };
  const Type types[] = {{ElementType::float16, 0xfc00, 0xfbff},
                        {ElementType::bfloat16, 0xff80, 0xff7f},
                        {ElementType::float32, 0xff800000u, 0xff7fffffu}};
  Rng rng(test_seed(12));
  std::int64_t rows = 0;
  for (const Type& type : types) {
    const int esize = element_size(type.dtype);
    for (const float threshold : {-1000.0f, -1.0f, -65504.0f, -3.0e38f, -1e-3f}) {
      MaskEncoding enc;
      enc.masked_threshold = threshold;
      const AdditiveBits bits = additive_bits(type.dtype, threshold);
      // Around the threshold's magnitude and the special values, in both signs.
      const std::uint32_t sign = bits.sign;
      const std::uint32_t pool[] = {0, sign, type.neg_inf, type.lowest, sign | bits.thr_mag, sign | (bits.thr_mag - 1)};
      // 16-bit types: every pattern once per threshold (a stride elsewhere); fp32: random and near the threshold.
      const std::int64_t patterns = esize == 2 ? 65536 : 20000;
      const std::int64_t step = esize == 2 && threshold != -1000.0f ? 5 : 1;
      // Long rows of one repeated masked value (the scanner skips words equal to one it
      // has classified), with zero runs and a special value after the repetition began.
      for (int i = 0; i < 300; ++i) {
        const std::int64_t k_len = uniform(rng, 8, 300);
        const std::uint32_t masked = pool[uniform(rng, 2, 5)];
        std::vector<std::uint32_t> values(static_cast<std::size_t>(k_len), masked);
        const std::int64_t zeros_at = uniform(rng, 0, k_len - 1);
        std::fill(values.begin() + zeros_at, values.begin() + std::min(k_len, zeros_at + uniform(rng, 0, 20)), 0u);
        const std::uint32_t special = esize == 2 ? static_cast<std::uint32_t>(uniform(rng, 0, 65535))
                                                 : static_cast<std::uint32_t>(rng());
        values[static_cast<std::size_t>(uniform(rng, k_len / 2, k_len - 1))] = special;
        std::vector<std::uint16_t> narrow(values.begin(), values.end());
        const auto* row = esize == 2 ? reinterpret_cast<const std::uint8_t*>(narrow.data())
                                     : reinterpret_cast<const std::uint8_t*>(values.data());
        const RowSpan fast = esize == 2 ? detail::scan_additive_row<2>(row, k_len, bits)
                                        : detail::scan_additive_row<4>(row, k_len, bits);
        const RowSpan want = detail::scan_generic_row(row, k_len, esize, type.dtype, enc);
        INFO(to_string(type.dtype) << " threshold " << threshold << " repeated 0x" << std::hex << masked
                                   << " special 0x" << special);
        REQUIRE(fast.count == want.count);
        REQUIRE(fast.same_keys(want));
        REQUIRE(fast.flags == want.flags);
        ++rows;
      }
      for (std::int64_t i = 0; i < patterns; i += step) {
        std::uint32_t special = static_cast<std::uint32_t>(i);
        if (esize == 4)
          special = i % 3 == 0 ? static_cast<std::uint32_t>(rng())
                               : ((sign | bits.thr_mag) + static_cast<std::uint32_t>(uniform(rng, -2, 2))) ^
                                     (coin(rng) ? sign : 0u);
        const std::int64_t k_len = uniform(rng, 1, 40), offset = uniform(rng, 0, 3);
        std::vector<std::uint32_t> values(static_cast<std::size_t>(offset + k_len));
        for (auto& v : values) v = pool[uniform(rng, 0, 5)];
        values[static_cast<std::size_t>(offset + uniform(rng, 0, k_len - 1))] = special;
        if (coin(rng, 0.3)) values[static_cast<std::size_t>(offset + uniform(rng, 0, k_len - 1))] = special;
        std::vector<std::uint16_t> narrow(values.begin(), values.end());
        const auto* row = esize == 2 ? reinterpret_cast<const std::uint8_t*>(narrow.data() + offset)
                                     : reinterpret_cast<const std::uint8_t*>(values.data() + offset);
        const RowSpan fast = esize == 2 ? detail::scan_additive_row<2>(row, k_len, bits)
                                        : detail::scan_additive_row<4>(row, k_len, bits);
        const RowSpan want = detail::scan_generic_row(row, k_len, esize, type.dtype, enc);
        INFO(to_string(type.dtype) << " threshold " << threshold << " special 0x" << std::hex << special);
        REQUIRE(fast.count == want.count);
        REQUIRE(fast.same_keys(want));
        REQUIRE(fast.flags == want.flags);
        ++rows;
      }
    }
  }
  MESSAGE(rows << " additive rows compared");
}

TEST_CASE("byte rows: every single attending key and every run, at every offset around word edges") {
  for (std::int64_t k_len : {1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 255, 256, 257, 2049}) {
    std::vector<std::uint8_t> row(static_cast<std::size_t>(k_len) + 16, 0);
    for (std::int64_t a = 0; a < k_len; a += (k_len > 300 ? 37 : 1))
      for (std::int64_t len : {std::int64_t{1}, std::int64_t{2}, k_len - a}) {
        if (a + len > k_len || len < 1) continue;
        std::fill(row.begin(), row.end(), 0);
        std::fill(row.begin() + a, row.begin() + a + len, 1);
        for (const Polarity pol : {Polarity::true_attends, Polarity::true_masks}) {
          if (pol == Polarity::true_masks)
            for (auto& x : row) x = static_cast<std::uint8_t>(x ? 0 : 7);
          const RowSpan s = detail::scan_byte_row(row.data(), k_len, pol);
          REQUIRE(s.first == a);
          REQUIRE(s.last == a + len - 1);
          REQUIRE(s.count == len);
          if (pol == Polarity::true_masks)
            for (auto& x : row) x = static_cast<std::uint8_t>(x ? 0 : 1);
        }
      }
  }
}

TEST_CASE("NaN and +inf in additive masks are errors naming the element") {
  std::vector<float> m(6 * 5, 0.0f);
  const std::int64_t shape[] = {6, 5};
  SUBCASE("NaN") {
    m[3 * 5 + 2] = std::numeric_limits<float>::quiet_NaN();
    auto v = MaskView::contiguous(m.data(), ElementType::float32, shape);
    REQUIRE(v.ok());
    auto r = inspect(*v);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == ErrorCode::invalid_value);
    CHECK(r.status().message().find("[0, 0, 3, 2] is NaN or +inf") != std::string::npos);
  }
  SUBCASE("+inf") {
    m[5 * 5 + 4] = std::numeric_limits<float>::infinity();
    auto v = MaskView::contiguous(m.data(), ElementType::float32, shape);
    auto r = inspect(*v);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().message().find("[0, 0, 5, 4]") != std::string::npos);
  }
}

TEST_CASE("finite-masked rows are empty rows with their own count; bias is reported") {
  // Row 0: all -1e9 (dense math attends uniformly), row 1: all -inf, row 2: 0 and a bias.
  std::vector<float> m = {-1e9f, -1e9f, -1e9f, -INFINITY, -INFINITY, -INFINITY, 0.0f, 0.5f, -INFINITY};
  const std::int64_t shape[] = {3, 3};
  auto v = MaskView::contiguous(m.data(), ElementType::float32, shape);
  auto r = inspect(*v);
  REQUIRE(r.ok());
  CHECK(r->empty_rows == 2);
  CHECK(r->finite_masked_rows == 1);
  CHECK(r->bias);
  // A custom threshold makes -1e9 a bias instead.
  MaskEncoding enc;
  enc.masked_threshold = -2e9f;
  auto v2 = MaskView::contiguous(m.data(), ElementType::float32, shape, enc);
  auto r2 = inspect(*v2);
  REQUIRE(r2.ok());
  CHECK(r2->empty_rows == 1);
  CHECK(r2->finite_masked_rows == 0);
}

TEST_CASE("stride-0 slices are scanned once; counts cover every logical slice") {
  std::vector<std::uint8_t> m(8 * 8);
  for (int q = 0; q < 8; ++q)
    for (int k = 0; k < 8; ++k) m[static_cast<std::size_t>(q * 8 + k)] = k <= q && k >= 3;
  const std::int64_t shape[] = {1, 1, 8, 8};
  auto v = MaskView::contiguous(m.data(), ElementType::boolean, shape)->broadcast_to(5, 3);
  REQUIRE(v.ok());
  auto t = scan(*v);
  REQUIRE(t.ok());
  CHECK(t->distinct_slices() == 1);
  CHECK(t->rows.size() == 8);
  auto s = classify(*t);
  REQUIRE(s.ok());
  CHECK(s->empty_rows == 3 * 15);
  CHECK(s->kind == StructureKind::causal);
  CHECK(s->kv_valid.size() == 1);  // one entry for every batch: the batch is broadcast
}

TEST_CASE("64-bit indexing: Q x K beyond 2^32 through a stride-0 query dimension") {
  // One row of 8200 keys read for 2^19 + 3 rows: Q*K = 4.3e9 elements, 8 KiB of memory.
  constexpr std::int64_t q_len = (std::int64_t{1} << 19) + 3, k_len = 8200;
  static_assert(q_len * k_len > (std::int64_t{1} << 32), "the case must cross 32-bit element indexing");
  std::vector<std::uint8_t> row(static_cast<std::size_t>(k_len), 1);
  row[0] = 0;
  const std::int64_t shape[] = {q_len, k_len}, strides[] = {0, 1};
  auto v = MaskView::make(row.data(), ElementType::boolean, shape, strides);
  REQUIRE(v.ok());
  auto t = scan(*v, ScanOptions{0});
  REQUIRE(t.ok());
  REQUIRE(t->rows.size() == static_cast<std::size_t>(q_len));
  // Rows past element 2^32 (the last one, and the first one there) read the same row.
  const std::int64_t first_past = ((std::int64_t{1} << 32) + k_len - 1) / k_len;
  for (const std::int64_t q : {std::int64_t{0}, first_past, q_len - 1}) {
    INFO("row " << q);
    CHECK(t->rows[static_cast<std::size_t>(q)].same_keys(RowSpan::interval(1, k_len - 1)));
  }
  auto s = classify(*t);
  REQUIRE(s.ok());
  CHECK(s->kind == StructureKind::full);
  REQUIRE(s->has_kv_valid());
  CHECK(s->kv_valid[0] == KeyRange{1, k_len});
  // The last row's offset needs more than 32 bits when the query stride is real.
  const std::int64_t big_shape[] = {q_len, k_len}, big_strides[] = {k_len, 1};
  auto big = MaskView::make(row.data(), ElementType::boolean, big_shape, big_strides);
  REQUIRE(big.ok());
  CHECK(big->offset(0, 0, q_len - 1, k_len - 1) == (q_len - 1) * k_len + k_len - 1);
  CHECK(big->extent_bytes() == q_len * k_len);
}

TEST_CASE("64-bit indexing: strides beyond 2^31 over a sparse mapping") {
  // 7 GiB of address space, untouched pages cost nothing: rows sit 2^31 + 8 and
  // 2^32 + 24 bytes apart, so any 32-bit offset arithmetic would read the wrong row.
  constexpr std::size_t span = std::size_t{7} << 30;  // the last row ends at 2^32 + 2^31 + 4128
  constexpr std::int64_t k_len = 4096, row_stride = (std::int64_t{1} << 31) + 8,
                         batch_stride = (std::int64_t{1} << 32) + 24;
  static_assert(row_stride > (std::int64_t{1} << 31) && batch_stride > (std::int64_t{1} << 32),
                "the strides must cross 32-bit byte offsets");
  static_assert(batch_stride + row_stride + k_len <= static_cast<std::int64_t>(span));
  // A 64-bit Linux reserves this much address space unless `ulimit -v` caps it; a run
  // where it cannot must say so as a failure, not pass without having read a byte.
  void* base = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  const std::string why = base == MAP_FAILED ? std::strerror(errno) : "";
  REQUIRE_MESSAGE(base != MAP_FAILED,
                  "mmap of 7 GiB of address space (MAP_NORESERVE) failed: " << why << " (is `ulimit -v` set?)");
  const std::unique_ptr<void, void (*)(void*)> unmap(base, [](void* p) { munmap(p, span); });
  auto* bytes = static_cast<std::uint8_t*>(base);
  // Two batches of causal 2 x 4096 rows ([q, k] <= q + 4094: bottom-right causal), batch 1 keys from 100.
  for (std::int64_t b = 0; b < 2; ++b)
    for (std::int64_t q = 0; q < 2; ++q)
      for (std::int64_t k = 0; k < k_len; ++k)
        bytes[b * batch_stride + q * row_stride + k] = k <= q + k_len - 2 && (b == 0 || k >= 100);
  const std::int64_t shape[] = {2, 1, 2, k_len}, strides[] = {batch_stride, 0, row_stride, 1};
  auto view = MaskView::make(bytes, ElementType::boolean, shape, strides);
  REQUIRE(view.ok());
  auto t = scan(*view, ScanOptions{2});
  REQUIRE(t.ok());
  REQUIRE(t->rows.size() == 4);
  // Each row read at its own 64-bit offset: a wrapped offset lands on zeroed pages.
  CHECK(t->slice(0, 0)[0].same_keys(RowSpan::interval(0, k_len - 2)));
  CHECK(t->slice(0, 0)[1].same_keys(RowSpan::interval(0, k_len - 1)));
  CHECK(t->slice(1, 0)[0].same_keys(RowSpan::interval(100, k_len - 2)));
  CHECK(t->slice(1, 0)[1].same_keys(RowSpan::interval(100, k_len - 1)));
  auto s = classify(*t);
  REQUIRE(s.ok());
  CHECK(s->kind == StructureKind::causal);
  CHECK(s->alignment == Alignment::bottom_right);
  REQUIRE(s->has_kv_valid());
  CHECK(s->kv_valid[1] == KeyRange{100, k_len});
}

}  // TEST_SUITE
