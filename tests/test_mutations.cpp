// One flipped element anywhere must change the verdict: after the flip, the verdict is
// still exact for the flipped mask (or arbitrary) and never the old structure.
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "support/mask_gen.hpp"

using namespace masklens;
using namespace masklens::testing;

namespace {

struct Flips {
  std::int64_t tried = 0, structured_after = 0;
};

// Flips (q, k) of a bool [Q, K] mask, classifies, checks, and flips it back.
void flip_and_check(std::vector<std::uint8_t>& m, const MaskView& view, const MaskStructure& before,
                    std::int64_t q, std::int64_t k, Flips& flips) {
  auto& cell = m[static_cast<std::size_t>(q * view.k_len() + k)];
  cell ^= 1;
  auto after = inspect(view);
  REQUIRE(after.ok());
  ++flips.tried;
  // The old structure no longer describes the mask.
  CHECK(before.allows(0, q, k) != (cell != 0));
  if (after->kind != StructureKind::arbitrary) {
    ++flips.structured_after;
    INFO("flip (" << q << ", " << k << ") of " << describe(before) << " -> " << describe(*after));
    // Exact on the flipped row element by element, and on every row by span.
    for (std::int64_t kk = 0; kk < view.k_len(); ++kk)
      REQUIRE(after->allows(0, q, kk) == (m[static_cast<std::size_t>(q * view.k_len() + kk)] != 0));
    auto spans = scan(view);
    REQUIRE(spans.ok());
    for (std::int64_t qq = 0; qq < view.q_len(); ++qq)
      REQUIRE(after->row(0, qq).same_keys(spans->slice(0, 0)[static_cast<std::size_t>(qq)]));
  }
  cell ^= 1;
}

}  // namespace

TEST_SUITE("host") {

TEST_CASE("every single-element flip of structured masks up to 64x64") {
  Rng rng(test_seed(5));
  Flips flips;
  const std::int64_t sizes[][2] = {{1, 1}, {1, 8}, {8, 1}, {7, 7}, {8, 8}, {9, 13}, {16, 16}, {33, 20}, {64, 64}};
  for (const auto& size : sizes)
    for (int rep = 0; rep < 6; ++rep) {
      const MaskStructure spec = random_structure(rng, 1, size[0], size[1]);
      DenseMask dense = render(spec, 1, ElementType::boolean, Polarity::true_attends, Layout::contiguous, rng);
      auto* data = const_cast<std::uint8_t*>(dense.view.element_ptr(0, 0, 0, 0));
      std::vector<std::uint8_t> m(data, data + size[0] * size[1]);
      auto view = MaskView::contiguous(m.data(), ElementType::boolean, std::array<std::int64_t, 2>{size[0], size[1]});
      REQUIRE(view.ok());
      auto before = inspect(*view);
      REQUIRE(before.ok());
      REQUIRE(before->kind != StructureKind::arbitrary);
      for (std::int64_t q = 0; q < size[0]; ++q)
        for (std::int64_t k = 0; k < size[1]; ++k) flip_and_check(m, *view, *before, q, k, flips);
    }
  MESSAGE("exhaustive flips: " << flips.tried << " (" << flips.structured_after << " still structured, exact)");
  CHECK(flips.tried > 30000);
}

TEST_CASE("flips at corners and on both sides of every boundary of larger masks") {
  Rng rng(test_seed(6));
  Flips flips;
  for (auto [q_len, k_len] : {std::pair<std::int64_t, std::int64_t>{300, 300}, {129, 257}, {257, 129}, {1, 1000}}) {
    for (int rep = 0; rep < 4; ++rep) {
      const MaskStructure spec = random_structure(rng, 1, q_len, k_len);
      DenseMask dense = render(spec, 1, ElementType::boolean, Polarity::true_attends, Layout::contiguous, rng);
      auto* data = const_cast<std::uint8_t*>(dense.view.element_ptr(0, 0, 0, 0));
      std::vector<std::uint8_t> m(data, data + q_len * k_len);
      auto view = MaskView::contiguous(m.data(), ElementType::boolean, std::array<std::int64_t, 2>{q_len, k_len});
      auto before = inspect(*view);
      REQUIRE(before.ok());
      std::vector<std::pair<std::int64_t, std::int64_t>> spots = {
          {0, 0}, {0, k_len - 1}, {q_len - 1, 0}, {q_len - 1, k_len - 1}};
      for (std::int64_t q = 0; q < q_len; q += std::max<std::int64_t>(1, q_len / 40)) {
        const RowSpan r = before->row(0, q);
        if (r.empty()) continue;
        for (std::int64_t k : {r.first - 1, r.first, r.last, r.last + 1})
          if (k >= 0 && k < k_len) spots.push_back({q, k});
      }
      for (int i = 0; i < 200; ++i) spots.push_back({uniform(rng, 0, q_len - 1), uniform(rng, 0, k_len - 1)});
      for (auto [q, k] : spots) flip_and_check(m, *view, *before, q, k, flips);
    }
  }
  MESSAGE("boundary flips: " << flips.tried << " (" << flips.structured_after << " still structured, exact)");
}

}  // TEST_SUITE

TEST_SUITE("host") {

TEST_CASE("10^5 random flips on larger masks, rescanning only the flipped row") {
  Rng rng(test_seed(8));
  // MASKLENS_FLIPS shortens the run (sanitizer builds); the suite's count is 100000.
  const char* env = std::getenv("MASKLENS_FLIPS");
  const std::int64_t total = env ? std::atoll(env) : 100000;
  std::int64_t tried = 0, structured_after = 0;
  while (tried < total) {
    const std::int64_t q_len = uniform(rng, 100, 400), k_len = coin(rng) ? q_len : uniform(rng, 100, 400);
    const MaskStructure spec = random_structure(rng, 1, q_len, k_len);
    DenseMask dense = render(spec, 1, ElementType::boolean, Polarity::true_attends, Layout::contiguous, rng);
    auto* m = const_cast<std::uint8_t*>(dense.view.element_ptr(0, 0, 0, 0));
    auto table = scan(dense.view);
    REQUIRE(table.ok());
    auto before = classify(*table);
    REQUIRE(before.ok());
    for (int i = 0; i < 2000 && tried < total; ++i, ++tried) {
      const std::int64_t q = uniform(rng, 0, q_len - 1), k = uniform(rng, 0, k_len - 1);
      m[q * k_len + k] ^= 1;
      RowSpan& row = table->rows[static_cast<std::size_t>(q)];
      const RowSpan saved = row;
      row = masklens::detail::scan_row(dense.view, AdditiveBits{}, 0, 0, q);  // a byte mask
      auto after = classify(*table);
      REQUIRE(after.ok());
      // Never the old structure; if structured, exact on every row and on the flipped one element-wise.
      REQUIRE(before->allows(0, q, k) != (m[q * k_len + k] != 0));
      if (after->kind != StructureKind::arbitrary) {
        ++structured_after;
        for (std::int64_t r = 0; r < q_len; ++r) REQUIRE(after->row(0, r).same_keys(table->rows[static_cast<std::size_t>(r)]));
        for (std::int64_t c = 0; c < k_len; ++c) REQUIRE(after->allows(0, q, c) == (m[q * k_len + c] != 0));
      }
      m[q * k_len + k] ^= 1;
      row = saved;
    }
  }
  MESSAGE("random flips: " << tried << " (" << structured_after << " still structured, exact)");
  CHECK(tried == total);
}

}  // TEST_SUITE
