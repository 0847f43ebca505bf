// decide() allocates nothing beyond its result on the single-call path: every heap
// block made during the call is one the returned Policy holds. A program of its own,
// because it replaces the global operator new to count.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <masklens/masklens.hpp>

#include "support/allocation_count.hpp"
#include "support/calls.hpp"

using namespace masklens;
using masklens::testing::g_allocations;
using masklens::testing::owned_blocks;
using masklens::testing::seed_call;

namespace {

// Allocations made by one decide() call beyond the blocks its result owns.
long extra_allocations(const MaskStructure& s, const Environment& e) {
  const AttentionCall c = seed_call();
  const long before = g_allocations.load();
  const Result<Policy> p = decide(s, c, e);
  const long made = g_allocations.load() - before;
  REQUIRE(p.ok());
  REQUIRE(p->plan.empty());
  return made - owned_blocks(*p);
}

}  // namespace

TEST_CASE("single-call decisions allocate only what the result holds") {
  constexpr std::int64_t L = 69632;
  const MaskStructure causal = make_structure(StructureKind::causal, 1, L, L);
  Environment unversioned = testing::h200();  // every family offered, none installed: all refused
  unversioned.available = kEveryFamily;
  MaskStructure docs = make_structure(StructureKind::causal, 2, L, L);
  docs.segments = {{0, 1000, 30000, L}, {0, L}};
  MaskStructure decode = make_structure(StructureKind::full, 3, 1, 4096);
  decode.kv_valid = {{0, 4096}, {100, 4096}, {7, 4096}};
  MaskStructure window = make_structure(StructureKind::sliding_window, 1, L, L);
  window.window = 4096;
  MaskStructure bias = make_structure(StructureKind::arbitrary, 1, 4096, 4096);
  bias.bias = true;

  CHECK(extra_allocations(causal, testing::h200()) == 0);
  CHECK(extra_allocations(causal, with_every_family()) == 0);
  CHECK(extra_allocations(causal, unversioned) == 0);
  CHECK(extra_allocations(docs, with_every_family()) == 0);
  CHECK(extra_allocations(decode, with_every_family()) == 0);
  CHECK(extra_allocations(window, with_every_family()) == 0);
  CHECK(extra_allocations(bias, testing::h200()) == 0);
}

TEST_CASE("the counter sees allocations (the check above can fail)") {
  const long before = g_allocations.load();
  auto* p = new std::vector<int>(100);
  CHECK(g_allocations.load() - before == 2);
  delete p;
}
