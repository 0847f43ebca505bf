// Public entry points called from several threads at once give the results one
// thread gives (the library holds no shared mutable state), and the threaded scanner
// equals the single-threaded one.
#include <doctest/doctest.h>

#include <thread>
#include <vector>

#include "support/mask_gen.hpp"

using namespace masklens;
using namespace masklens::testing;

TEST_SUITE("host") {

TEST_CASE("inspect and decide from 8 threads at once equal one thread") {
  Rng rng(test_seed(17));
  std::vector<DenseMask> masks;
  std::vector<MaskStructure> expected;
  std::vector<std::size_t> expected_rejections;
  for (int i = 0; i < 24; ++i) {
    const std::int64_t q = uniform(rng, 1, 120), k = coin(rng) ? q : uniform(rng, 1, 120);
    MaskStructure spec = random_structure(rng, uniform(rng, 1, 2), q, k);
    masks.push_back(render(spec, 2, ElementType::bfloat16, Polarity::true_attends, Layout::contiguous, rng));
    auto v = inspect(masks.back().view);
    REQUIRE(v.ok());
    expected.push_back(*v);
    auto p = decide(*v, AttentionCall{});
    REQUIRE(p.ok());
    expected_rejections.push_back(p->rejected.size());
  }
  std::vector<int> mismatches(8, 0);
  {
    std::vector<std::jthread> pool;
    for (int t = 0; t < 8; ++t)
      pool.emplace_back([&, t] {
        for (int round = 0; round < 20; ++round)
          for (std::size_t i = 0; i < masks.size(); ++i) {
            auto v = inspect(masks[i].view, ScanOptions{1 + (t % 3)});
            // A failed inspect is a mismatch; its error must not be dereferenced.
            if (!v.ok() || describe(*v) != describe(expected[i])) {
              ++mismatches[static_cast<std::size_t>(t)];
              continue;
            }
            auto p = decide(*v, AttentionCall{});
            if (!p.ok() || p->rejected.size() != expected_rejections[i]) ++mismatches[static_cast<std::size_t>(t)];
          }
      });
  }
  for (int m : mismatches) CHECK(m == 0);
}

TEST_CASE("the threaded scanner equals the single-threaded one on large masks") {
  Rng rng(test_seed(18));
  for (int i = 0; i < 6; ++i) {
    MaskStructure spec = random_structure(rng, 2, 700, 900);
    DenseMask dense = render(spec, 3, ElementType::boolean, Polarity::true_attends, Layout::contiguous, rng);
    auto one = scan(dense.view, ScanOptions{1});
    REQUIRE(one.ok());
    for (int threads : {2, 5, 0}) {
      auto many = scan(dense.view, ScanOptions{threads});
      REQUIRE(many.ok());
      REQUIRE(many->rows.size() == one->rows.size());
      for (std::size_t r = 0; r < one->rows.size(); ++r) {
        REQUIRE(many->rows[r].same_keys(one->rows[r]));
        REQUIRE(many->rows[r].flags == one->rows[r].flags);
      }
    }
  }
}

}  // TEST_SUITE
